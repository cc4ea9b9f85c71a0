//! ferroce: a user-space RDMA verbs provider speaking RoCEv2 over plain UDP sockets.
//!
//! The API follows libibverbs: open a [`Device`] (a local IP address) to get a [`Context`],
//! allocate a [`ProtectionDomain`], register [`MemoryRegion`]s, create
//! [`CompletionQueue`]s and [`QueuePair`]s, walk the QPs through INIT → RTR → RTS with
//! [`QueuePair::modify`], post work requests and poll completions. Handles are `Send + Sync`,
//! carry no lifetimes, and keep their parents alive; the explicit `destroy`/`dealloc` calls
//! refuse with [`Error::Busy`] while children live, as verbs returns EBUSY.
//!
//! # Memory regions and the network
//!
//! A registered region is shared with the network the way an HCA shares DMA memory. ferroce's
//! runtime thread copies bytes into the region when a peer's RDMA WRITE, SEND or READ response
//! arrives and out of it when a SEND/WRITE goes out or a peer's READ is answered — at any time,
//! concurrently with the program, for as long as the region is registered and a QP may touch it.
//! So:
//!
//! * Safe code never gets a Rust reference (`&[u8]`/`&mut [u8]`) into region memory. It reads
//!   and writes through [`MemoryRegion::read`], [`MemoryRegion::write`] and
//!   [`MemoryRegion::atomic_load`], which copy (atomics use 64-bit atomic instructions, so they
//!   are atomic with respect to remote atomics).
//! * What those copies see while the network also writes the same bytes is unspecified, as on
//!   real hardware: synchronise through completions (a receive completion, the completion of
//!   your own READ, an application-level message) before trusting the bytes.
//! * Work requests name memory by address and lkey, as in verbs. Keys are checked on every use
//!   against the live table; a deregistered region's keys fail at once (`LocProtErr` locally,
//!   `RemAccessErr` remotely), and its memory is freed only when the last handle is dropped —
//!   never while the runtime is copying.
//! * [`ProtectionDomain::reg_mr_raw`] registers caller memory and is `unsafe`: the caller
//!   promises the memory stays valid and accepts that the runtime writes it concurrently.
//!
//! # Example
//!
//! ```no_run
//! use ferroce::{AccessFlags, Device, QpCap, QpInitAttr, QpType, SendWr};
//!
//! let ctx = Device::find("127.0.0.1")?.open()?;
//! let pd = ctx.alloc_pd();
//! let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! let cq = ctx.create_cq(64, None)?;
//! let cap = QpCap { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 };
//! let qp = pd.create_qp(&QpInitAttr { qp_type: QpType::Rc, send_cq: &cq, recv_cq: &cq, srq: None, cap, sq_sig_all: false })?;
//! // Send `qp.endpoint(psn)` and `mr.remote()` to the peer (`to_bytes`), get its own back,
//! // then `qp.connect(psn, &peer)` and post, e.g. `SendWr::write(1, mr.sge(0, 64), peer_mr.at(0))`.
//! # let _ = (mr, qp, SendWr::new(0, ferroce::WrOpcode::Send));
//! # Ok::<(), ferroce::Error>(())
//! ```

mod backend;
pub mod cm;
mod connect;
pub mod context;
pub mod cq;
pub mod device;
mod dma;
/// Region copies for the `dma` benchmark only (not an API).
#[doc(hidden)]
pub use dma::{bench_read, bench_write};
mod driver;
mod encap;
mod error;
mod events;
mod explain;
pub mod faults;
pub mod fork;
pub mod gsi;
mod host;
mod idle;
mod mcast;
mod mmsg;
mod mr;
pub mod mw;
pub mod pcap;
pub mod qp;
pub mod rsocket;
mod shard;
mod sys;
pub mod udp;
pub mod xrc;

pub use connect::{QpEndpoint, RemoteMemory};
pub use context::{
    AddressHandle, Context, DeviceAttr, MemoryRegion, MrAdvice, OpenOptions, PortAttr,
    ProtectionDomain,
};
pub use cq::{CompletionChannel, CompletionQueue};
pub use device::{
    Device, GsiService, LiveQp, LiveQpError, ProcessCounters, ProcessQps, UVERBS_NODE,
    create_uverbs_node, device_list, devices,
};
pub use driver::RuntimeCounters;
pub use error::{Error, Result};
pub use events::AsyncEventRecord;
pub use explain::explain_counter;
pub use ferroce_transport as transport;
/// The verbs vocabulary, at the crate root: what a program needs besides the handles.
pub use ferroce_transport::{
    AccessFlags, AhAttr, Mtu, QpAttr, QpAttrMask, QpCap, QpModify, QpState, QpType, RecvWr,
    RemoteAddr, SendFlags, SendWr, Sge, WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
pub use ferroce_wire as wire;
pub use gsi::GsiRoute;
pub use mw::{MemoryWindow, MwType};
pub use qp::{QpBuilder, QpInitAttr, QueuePair, SharedReceiveQueue, WeakQueuePair};
pub use xrc::XrcDomain;
