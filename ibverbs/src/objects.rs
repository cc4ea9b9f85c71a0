//! The verbs objects' layouts: PDs, MRs, completion channels, CQs, QPs, SRQs and AHs, each a
//! box whose first field is the C struct the program holds, and the accessors from a C
//! pointer to ferroce's state. The verbs of each object are in its own module ([`crate::pd`],
//! [`crate::mr`], [`crate::channel`], [`crate::cq`], [`crate::qp`], [`crate::srq`],
//! [`crate::ah`]; async events in [`crate::event`]).

use core::ffi::{c_int, c_void};

use crate::abi::*;
use crate::handle::{EventAcks, Obj};
use crate::set_errno;

pub(crate) const NULL: *mut c_void = core::ptr::null_mut();

/// A PD: `ibv_pd`, then [`PdInner`] (see [`crate::handle`] for the access rules).
pub type Pd = Obj<ibv_pd, PdInner>;

/// ferroce's state of a PD.
pub struct PdInner {
    /// The ferroce PD.
    pub pd: ferroce::ProtectionDomain,
}

/// An MR: `ibv_mr`, then [`MrInner`].
pub type Mr = Obj<ibv_mr, MrInner>;

/// ferroce's state of an MR.
pub struct MrInner {
    /// The ferroce region over the caller's memory (replaced by `ibv_rereg_mr`).
    pub mr: parking_lot::Mutex<ferroce::MemoryRegion>,
}

/// A memory window: `ibv_mw`, then [`MwInner`].
pub type Mw = Obj<ibv_mw, MwInner>;

/// ferroce's state of a memory window.
pub struct MwInner {
    /// The ferroce window.
    pub mw: ferroce::MemoryWindow,
}

/// A completion channel: `ibv_comp_channel`, then [`ChannelInner`].
pub type Channel = Obj<ibv_comp_channel, ChannelInner>;

/// ferroce's state of a completion channel.
pub struct ChannelInner {
    /// The ferroce channel.
    pub ch: ferroce::CompletionChannel,
}

/// A CQ: every CQ has the `ibv_cq_ex` layout (an `ibv_cq` followed by the polling API), then
/// [`CqInner`].
pub type Cq = Obj<ibv_cq_ex, CqInner>;

/// ferroce's state of a CQ.
pub struct CqInner {
    /// The ferroce CQ.
    pub cq: ferroce::CompletionQueue,
    /// The completion `ibv_start_poll`/`ibv_next_poll` made current (the `ibv_wc_read_*` source).
    pub current: parking_lot::Mutex<ferroce::transport::WorkCompletion>,
    /// Completion events returned by `ibv_get_cq_event` / acknowledged by `ibv_ack_cq_events`.
    pub comp_events: EventAcks,
    /// Async events (`IBV_EVENT_CQ_ERR`) returned / acknowledged.
    pub async_events: EventAcks,
}

/// A QP: every QP carries the `ibv_qp_ex` slots (`ibv_qp_to_qp_ex` hands them out for QPs
/// created with send-ops flags, as libibverbs does), then [`QpInner`].
pub type Qp = Obj<ibv_qp_ex, QpInner>;

/// ferroce's state of a QP.
pub struct QpInner {
    /// The ferroce QP.
    pub qp: ferroce::QueuePair,
    /// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` (the `ibv_wr_*` API is on).
    pub ex: bool,
    /// The `ibv_wr_*` batch between `ibv_wr_start` and `ibv_wr_complete`.
    pub batch: parking_lot::Mutex<crate::wr::Batch>,
    /// Async events returned by `ibv_get_async_event` / acknowledged.
    pub events: EventAcks,
    /// Opened by `ibv_open_qp` (a second handle on an XRC receive QP): not in the context's
    /// QP table, which holds the QP's own handle.
    pub opened: bool,
}

/// An SRQ: `ibv_srq`, then [`SrqInner`].
pub type Srq = Obj<ibv_srq, SrqInner>;

/// ferroce's state of an SRQ.
pub struct SrqInner {
    /// The ferroce SRQ.
    pub srq: ferroce::SharedReceiveQueue,
    /// Async events returned / acknowledged.
    pub events: EventAcks,
}

/// An XRC domain: `ibv_xrcd`, then [`XrcdInner`].
pub type Xrcd = Obj<ibv_xrcd, XrcdInner>;

/// ferroce's state of an XRC domain handle.
pub struct XrcdInner {
    /// The ferroce domain.
    pub xrcd: ferroce::XrcDomain,
    /// The file it was opened by (device, inode), if any: its entry in the open-domain table.
    pub file: Option<(u64, u64)>,
}

/// The state of an XRC domain the program holds.
///
/// # Safety
/// `x` was returned by this library's `ibv_open_xrcd` and not yet closed.
pub(crate) unsafe fn xrcd_of<'a>(x: *mut ibv_xrcd) -> &'a XrcdInner {
    // SAFETY: such a pointer is the C struct of a live Obj<ibv_xrcd, XrcdInner>.
    unsafe { Xrcd::rust(x) }
}

/// An AH: `ibv_ah`, then [`AhInner`].
pub type Ah = Obj<ibv_ah, AhInner>;

/// ferroce's state of an AH.
pub struct AhInner {
    /// The ferroce AH.
    pub ah: ferroce::AddressHandle,
}

/// The state of a PD the program holds.
///
/// # Safety
/// `pd` was returned by this library's `ibv_alloc_pd` and not yet deallocated.
pub(crate) unsafe fn pd_of<'a>(pd: *mut ibv_pd) -> &'a PdInner {
    // SAFETY: such a pointer is the C struct of a live Obj<ibv_pd, PdInner>.
    unsafe { Pd::rust(pd) }
}

/// The state of a completion channel the program holds.
///
/// # Safety
/// `ch` was returned by this library's `ibv_create_comp_channel` and not yet destroyed.
pub(crate) unsafe fn ch_of<'a>(ch: *mut ibv_comp_channel) -> &'a ChannelInner {
    // SAFETY: such a pointer is the C struct of a live Obj<ibv_comp_channel, ChannelInner>.
    unsafe { Channel::rust(ch) }
}

/// The state of a CQ the program holds.
///
/// # Safety
/// `cq` was returned by this library's `ibv_create_cq`/`_ex` and not yet destroyed.
pub(crate) unsafe fn cq_of<'a>(cq: *mut ibv_cq) -> &'a CqInner {
    // SAFETY: every CQ is an Obj<ibv_cq_ex, CqInner> whose ibv_cq_ex starts with the ibv_cq the program holds; it is live by the caller's contract.
    unsafe { Cq::rust(cq.cast()) }
}

/// The state of a QP the program holds.
///
/// # Safety
/// `qp` was returned by this library's `ibv_create_qp`/`_ex` and not yet destroyed.
pub(crate) unsafe fn qp_of<'a>(qp: *mut ibv_qp) -> &'a QpInner {
    // SAFETY: every QP is an Obj<ibv_qp_ex, QpInner> whose ibv_qp_ex starts with the ibv_qp the program holds; it is live by the caller's contract.
    unsafe { Qp::rust(qp.cast()) }
}

/// The state of an SRQ the program holds.
///
/// # Safety
/// `srq` was returned by this library's `ibv_create_srq` and not yet destroyed.
pub(crate) unsafe fn srq_of<'a>(srq: *mut ibv_srq) -> &'a SrqInner {
    // SAFETY: such a pointer is the C struct of a live Obj<ibv_srq, SrqInner>.
    unsafe { Srq::rust(srq) }
}

/// The state of an AH the program holds.
///
/// # Safety
/// `ah` was returned by this library's `ibv_create_ah` and not yet destroyed.
pub(crate) unsafe fn ah_of<'a>(ah: *mut ibv_ah) -> &'a AhInner {
    // SAFETY: such a pointer is the C struct of a live Obj<ibv_ah, AhInner>.
    unsafe { Ah::rust(ah) }
}

pub(crate) fn next_handle() -> u32 {
    static NEXT: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(1);
    NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed)
}

/// A creation verb's refusal: NULL with errno `e`, and a debug line naming the verb (by its
/// place in this library) and errno; the specific reason, where there is one, was logged
/// just before.
#[track_caller]
pub(crate) fn fail<T>(e: c_int) -> *mut T {
    let at = std::panic::Location::caller();
    log::debug!(
        "{}:{}: refused with {} ({e})",
        at.file(),
        at.line(),
        crate::errno_name(e)
    );
    set_errno(e);
    core::ptr::null_mut()
}
