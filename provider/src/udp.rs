//! The UDP datagram path the runtime sends and receives through: batched `sendmmsg` and
//! `recvmmsg` over a socket's descriptor, and `poll`. Public for tools that measure the same
//! path without the transport (`ferroce udp-ceiling`).

pub use crate::sys::{RecvBatch, SendBatch, poll_fds};
