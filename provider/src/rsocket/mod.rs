//! rsockets: librdmacm's sockets over RDMA (`rsocket`, `rconnect`, `rsend`, ...), speaking
//! rdma-core's rsocket protocol: stream sockets over an RC QP ([`proto`], [`stream`]),
//! datagram sockets over UD QPs and a UDP socket ([`dgram_proto`], [`dgram`]).

pub mod dgram;
pub mod dgram_proto;
pub mod proto;
pub mod stream;
