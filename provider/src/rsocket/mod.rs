//! rsockets: librdmacm's sockets over RDMA (`rsocket`, `rconnect`, `rsend`, ...), stream
//! sockets over an RC QP, speaking rdma-core's rsocket protocol ([`proto`]).

pub mod proto;
pub mod stream;
