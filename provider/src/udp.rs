//! The UDP datagram path the runtime sends and receives through: batched `sendmmsg` (with `UDP_SEGMENT`
//! trains) and `recvmmsg` (with `UDP_GRO`) over a socket's descriptor, and `poll`. Public for tools that measure the same
//! path without the transport (`ferroce udp-ceiling`).

pub use crate::mmsg::{
    FALLBACK_SEGMENTS, FULL_BYTES, GRO_SLOT, MAX_SEGMENTS, MAX_TRAIN_BYTES, RecvBatch,
    Segmentation, Segments, SendBatch, enable_ecn, enable_gro, enable_recv_tos,
};
pub use crate::sys::{poll_fds, process_cpu_time, set_dont_fragment};
