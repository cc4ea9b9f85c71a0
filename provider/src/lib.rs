//! ferroce: a user-space RDMA verbs provider speaking RoCEv2 over plain UDP sockets.
//!
//! Today this crate holds the packet tooling the `ferroce` binary is built on:
//!
//! * [`pcap`]: reading and writing classic pcap files;
//! * [`frame`]: Ethernet / IPv4 / IPv6 / UDP framing around RoCEv2 payloads (via `pnet_packet`);
//! * [`decode`]: the per-packet decoding behind `ferroce pcap`.
//!
//! The verbs API (devices, PDs, MRs, CQs, QPs) and its UDP runtime come with the provider
//! issue; the wire format lives in [`ferroce_wire`].

pub mod decode;
pub mod frame;
pub mod pcap;

pub use ferroce_wire as wire;
