//! Verbs objects: PDs, MRs, completion channels, CQs, QPs, SRQs, AHs and async events. Each
//! is a box whose first field is the C struct the program holds.

use core::ffi::{c_int, c_uint, c_void};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::Ordering;
use std::time::Duration;

use ferroce::transport::{
    AccessFlags, AhAttr, AsyncEvent, Mtu, QpAttr, QpAttrMask, QpCap, QpState, QpType, SrqAttr,
};
use ferroce::{AsyncEventRecord, QpInitAttr};

use crate::abi::*;
use crate::device::{Ctx, ctx_of};
use crate::handle::{EventAcks, Obj, atomic_i32, publish_u32};
use crate::{errno_of, set_errno};

const NULL: *mut c_void = core::ptr::null_mut();

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
    /// The ferroce region over the caller's memory.
    pub mr: ferroce::MemoryRegion,
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
    /// `sq_sig_all` as created (for `ibv_query_qp`).
    pub sq_sig_all: c_int,
    /// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` (the `ibv_wr_*` API is on).
    pub ex: bool,
    /// The `ibv_wr_*` batch between `ibv_wr_start` and `ibv_wr_complete`.
    pub batch: parking_lot::Mutex<crate::wr::Batch>,
    /// Async events returned by `ibv_get_async_event` / acknowledged.
    pub events: EventAcks,
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

fn next_handle() -> u32 {
    static NEXT: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(1);
    NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed)
}

fn fail<T>(e: c_int) -> *mut T {
    set_errno(e);
    core::ptr::null_mut()
}

// ---- PD ----

/// `ibv_alloc_pd`.
///
/// # Safety
/// `context` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    if context.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: `context` came from this library's ibv_open_device and is not closed (verbs forbids using a closed context), so it is the context of a live Ctx.
    let c = unsafe { ctx_of(context) };
    let pd = c.ctx.alloc_pd();
    c.children.fetch_add(1, Ordering::SeqCst);
    Pd::into_raw(
        ibv_pd {
            context,
            handle: next_handle(),
        },
        PdInner { pd },
    )
}

/// `ibv_dealloc_pd`: EBUSY while MRs, QPs, SRQs or AHs use it.
///
/// # Safety
/// `pd` is live and not used again on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    if pd.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `pd` is a PD of this library the program has not deallocated (verbs' rule).
    let p = unsafe { pd_of(pd) };
    if p.pd.in_use() {
        return libc::EBUSY;
    }
    // SAFETY: the live PD's `context` is written only at creation; its context outlives it (closing a context with live PDs keeps it allocated).
    unsafe { ctx_of((*pd).context) }
        .children
        .fetch_sub(1, Ordering::SeqCst);
    // SAFETY: nothing of ferroce refers to the PD any more (no child: checked above), and the program gives up `pd` with this call.
    unsafe { Pd::free(pd) };
    0
}

// ---- MR ----

/// Access bits ferroce implements; MW_BIND is accepted (no memory windows exist to bind) and the
/// optional range (relaxed ordering, ...) may be ignored by definition.
const ACCESS_KNOWN: c_uint = 0x1f;
const ACCESS_OPTIONAL_RANGE: c_uint = 0x3ff << 20;

unsafe fn reg(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    if pd.is_null() || (addr.is_null() && length != 0) {
        return fail(libc::EINVAL);
    }
    if iova != addr as u64 {
        // ferroce regions are addressed by their virtual address (rxe's default too).
        return fail(libc::EOPNOTSUPP);
    }
    let access = access & !ACCESS_OPTIONAL_RANGE;
    if access & !ACCESS_KNOWN != 0 {
        // ZERO_BASED, ON_DEMAND, HUGETLB: not offered (query_device_ex reports no ODP).
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: `pd` is a PD of this library the program has not deallocated (verbs' rule).
    let p = unsafe { pd_of(pd) };
    let flags = AccessFlags(access & 0xf);
    // SAFETY: verbs' ibv_reg_mr contract makes addr..addr+length valid for reads and writes until ibv_dereg_mr returns (which is when the region's dereg returns), and a C program's memory is outside Rust's references; the aligned words around it lie in the same pages.
    let r = unsafe { p.pd.reg_mr_raw(addr.cast(), length, flags) };
    match r {
        Ok(mr) => Mr::into_raw(
            ibv_mr {
                // SAFETY: a live PD's `context` is written only at creation.
                context: unsafe { (*pd).context },
                pd,
                addr,
                length,
                handle: mr.lkey(),
                lkey: mr.lkey(),
                rkey: mr.rkey(),
            },
            MrInner { mr },
        ),
        Err(e) => fail(errno_of(&e)),
    }
}

/// `ibv_reg_mr`.
///
/// # Safety
/// `pd` is live; `addr..addr+length` stays valid until `ibv_dereg_mr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: this function's contract (a live PD, memory valid until ibv_dereg_mr) is reg's.
    unsafe { reg(pd, addr, length, addr as u64, access as c_uint) }
}

/// `ibv_reg_mr_iova` (the IOVA must equal the address).
///
/// # Safety
/// As [`ibv_reg_mr`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: this function's contract (a live PD, memory valid until ibv_dereg_mr) is reg's.
    unsafe { reg(pd, addr, length, iova, access as c_uint) }
}

/// `ibv_reg_mr_iova2` (what verbs.h's `ibv_reg_mr` macro calls for non-constant access).
///
/// # Safety
/// As [`ibv_reg_mr`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    // SAFETY: this function's contract (a live PD, memory valid until ibv_dereg_mr) is reg's.
    unsafe { reg(pd, addr, length, iova, access) }
}

/// `ibv_dereg_mr`: the keys die at once.
///
/// # Safety
/// `mr` is live and not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    if mr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `mr` is an MR of this library the program has not deregistered (verbs' rule).
    let m = unsafe { Mr::rust(mr) };
    // When dereg returns, no copy into or out of the program's memory runs or can start.
    m.mr.clone().dereg();
    // SAFETY: nothing of ferroce refers to the Mr box (MRs are in no table of this crate), and the program gives up `mr` with this call.
    unsafe { Mr::free(mr) };
    0
}

// ---- completion channel and CQ ----

/// `ibv_create_comp_channel`: its `fd` is readable while an event is pending.
///
/// # Safety
/// `context` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    if context.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: `context` came from this library's ibv_open_device and is not closed (verbs forbids using a closed context), so it is the context of a live Ctx.
    let c = unsafe { ctx_of(context) };
    match c.ctx.create_comp_channel() {
        Ok(ch) => {
            c.children.fetch_add(1, Ordering::SeqCst);
            Channel::into_raw(
                ibv_comp_channel {
                    context,
                    fd: ch.fd(),
                    refcnt: 0,
                },
                ChannelInner { ch },
            )
        }
        Err(e) => fail(errno_of(&e)),
    }
}

/// `ibv_destroy_comp_channel`: EBUSY while CQs use it.
///
/// # Safety
/// `channel` is live and not used again on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    if channel.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `channel` is a channel of this library the program has not destroyed.
    let ch = unsafe { ch_of(channel) };
    if ch.ch.in_use() {
        return libc::EBUSY;
    }
    // SAFETY: a live channel's `context` is written only at creation, and outlives it.
    unsafe { ctx_of((*channel).context) }
        .children
        .fetch_sub(1, Ordering::SeqCst);
    // SAFETY: no CQ uses the channel (checked above), so nothing of ferroce refers to it, and the program gives up `channel` with this call.
    unsafe { Channel::free(channel) };
    0
}

/// `ibv_create_cq`.
///
/// # Safety
/// `context` is live; `channel` is NULL or a live channel of the same context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    if cqe <= 0 || comp_vector < 0 {
        return fail(libc::EINVAL);
    }
    // SAFETY: this function's contract (a live context, a NULL or live channel) is create_cq's.
    unsafe { create_cq(context, cqe as u32, cq_context, channel, comp_vector as u32) }.cast()
}

/// Creates a CQ (both `ibv_create_cq` and `ibv_create_cq_ex` come here).
///
/// # Safety
/// `context` is live; `channel` is NULL or a live channel of the same context.
pub(crate) unsafe fn create_cq(
    context: *mut ibv_context,
    cqe: u32,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: u32,
) -> *mut ibv_cq_ex {
    if context.is_null() || cqe == 0 || comp_vector != 0 {
        return fail(libc::EINVAL);
    }
    // SAFETY: `context` came from this library's ibv_open_device and is not closed (verbs forbids using a closed context), so it is the context of a live Ctx.
    let c = unsafe { ctx_of(context) };
    // SAFETY: a non-NULL channel is one of this library's, not destroyed (caller's contract).
    let ch = (!channel.is_null()).then(|| unsafe { &ch_of(channel).ch });
    match c.ctx.create_cq(cqe, ch) {
        Ok(cq) => {
            let handle = cq.handle();
            let face = crate::cq_ex::cq_ex(context, channel, cq_context, handle, cq.cqe() as c_int);
            let p = Cq::into_raw(
                face,
                CqInner {
                    cq,
                    current: parking_lot::Mutex::new(Default::default()),
                    comp_events: EventAcks::default(),
                    async_events: EventAcks::default(),
                },
            );
            c.cqs.lock().insert(handle, p as usize);
            c.children.fetch_add(1, Ordering::SeqCst);
            p.cast()
        }
        Err(e) => fail(errno_of(&e)),
    }
}

/// `ibv_destroy_cq`: EBUSY while a QP uses it; otherwise it waits, as rdma-core does, until
/// every completion event `ibv_get_cq_event` returned for it and every async event
/// `ibv_get_async_event` returned for it has been acknowledged, then frees it.
///
/// # Safety
/// `cq` is live and not used again on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `cq` is a CQ of this library the program has not destroyed (verbs' rule).
    let q = unsafe { cq_of(cq) };
    if q.cq.in_use() {
        log::debug!("ibv_destroy_cq: a QP still uses the CQ (EBUSY)");
        return libc::EBUSY;
    }
    // SAFETY: a live CQ's `context` and `handle` are written only at creation; the context outlives the CQ.
    let (c, handle) = unsafe { (ctx_of((*cq).context), (*cq).handle) };
    // Out of the table first: from now on no event can be handed out for this CQ, so the
    // counts below only grow by acknowledgements.
    c.cqs.lock().remove(&handle);
    q.comp_events.wait_all_acked();
    q.async_events.wait_all_acked();
    c.children.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: the CQ is in no table, no QP uses it, every event handed out for it has been acknowledged (so no thread holds it from an event), and the program gives it up here.
    unsafe { Cq::free(cq.cast()) };
    0
}

/// `ibv_resize_cq`: ferroce CQs do not change size (EOPNOTSUPP, unless already that large).
///
/// # Safety
/// `cq` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    if cq.is_null() || cqe <= 0 {
        return libc::EINVAL;
    }
    // SAFETY: `cq` is a live CQ of this library; its `cqe` is written only at creation.
    if unsafe { (*cq).cqe } >= cqe {
        return 0;
    }
    libc::EOPNOTSUPP
}

fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL on any fd is harmless; a bad fd gives -1.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// `ibv_get_cq_event`: blocks for the next event (or fails with EAGAIN at once when the
/// channel's fd was made non-blocking).
///
/// # Safety
/// `channel` is live; `cq` and `cq_context` are valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    if channel.is_null() || cq.is_null() || cq_context.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: `channel` is a channel of this library the program has not destroyed.
    let ch = unsafe { ch_of(channel) };
    // SAFETY: a live channel's `fd` and `context` are written only at creation; the context outlives the channel.
    let (fd, c) = unsafe { ((*channel).fd, ctx_of((*channel).context)) };
    let nb = nonblocking(fd);
    loop {
        let got = if nb {
            ch.ch.get_event_timeout(Duration::ZERO)
        } else {
            Some(ch.ch.get_event())
        };
        let Some(event_cq) = got else {
            set_errno(libc::EAGAIN);
            return -1;
        };
        let found = {
            let table = c.cqs.lock();
            table.get(&event_cq.handle()).map(|&p| {
                let p = p as *mut ibv_cq;
                // SAFETY: CQs in the table are live (destroy removes them before freeing, under this lock); counting here, under the lock, makes destroy wait for it.
                unsafe { cq_of(p) }.comp_events.reported();
                p
            })
        };
        let Some(p) = found else {
            // The CQ was destroyed after its event was queued: not the program's any more.
            log::debug!("ibv_get_cq_event: event of a destroyed CQ dropped");
            continue;
        };
        // SAFETY: `p` stays live until this event is acknowledged (destroy waits for it); its `cq_context` is written only at creation; the out-pointers are valid for writing (this function's contract).
        unsafe {
            *cq = p;
            *cq_context = (*p).cq_context;
        }
        return 0;
    }
}

/// `ibv_ack_cq_events`.
///
/// # Safety
/// `cq` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    if cq.is_null() {
        return;
    }
    // SAFETY: `cq` is a live CQ of this library (the program acknowledges before destroying).
    let q = unsafe { cq_of(cq) };
    q.cq.ack_events(nevents);
    let total = q.comp_events.acked(nevents);
    // SAFETY: `comp_events_completed` is an aligned u32 of the live CQ that ferroce writes only atomically (acknowledgements may come from several threads).
    unsafe { publish_u32(&raw mut (*cq).comp_events_completed, total) };
}

/// Publishes a QP's state in the C-visible `ibv_qp.state` (atomically: other threads may post
/// or read it meanwhile).
///
/// # Safety
/// `qp` is a live QP of ours.
unsafe fn publish_state(qp: *mut ibv_qp, state: QpState) {
    // SAFETY: `state` is an aligned c_int (i32) field of the live QP that ferroce writes only atomically.
    unsafe { atomic_i32(&raw mut (*qp).state) }.store(state as c_int, Ordering::SeqCst);
}

// ---- QP ----

fn qp_type_of(t: c_int) -> Option<QpType> {
    QpType::from_raw(t as u32)
}

/// Creates a QP on `pd` from `a` (its `cap` is what the QP gets: ferroce allocates exactly the
/// requested sizes).
///
/// # Safety
/// `pd` is NULL or live; `a` names live CQs (and SRQ) of ours. `ex`: created with send-ops
/// flags (the `ibv_wr_*` API is on).
unsafe fn create_qp(pd: *mut ibv_pd, a: &mut ibv_qp_init_attr, ex: bool) -> *mut ibv_qp {
    let ibv_qp_init_attr {
        qp_context,
        send_cq,
        recv_cq,
        srq,
        cap,
        qp_type,
        sq_sig_all,
    } = *a;
    if pd.is_null() || send_cq.is_null() || recv_cq.is_null() {
        return fail(libc::EINVAL);
    }
    let Some(qt) = qp_type_of(qp_type) else {
        // XRC, raw packet, driver QPs.
        return fail(libc::EOPNOTSUPP);
    };
    // SAFETY: the program passes a PD and CQs of this library it has not destroyed (verbs' rule; checked non-NULL above).
    let (p, scq, rcq) = unsafe { (pd_of(pd), cq_of(send_cq), cq_of(recv_cq)) };
    // SAFETY: a non-NULL srq is an SRQ of this library the program has not destroyed.
    let s = (!srq.is_null()).then(|| unsafe { &srq_of(srq).srq });
    let init = QpInitAttr {
        qp_type: qt,
        send_cq: &scq.cq,
        recv_cq: &rcq.cq,
        srq: s,
        cap: QpCap {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: if s.is_some() { 0 } else { cap.max_recv_wr },
            max_send_sge: cap.max_send_sge,
            max_recv_sge: if s.is_some() { 0 } else { cap.max_recv_sge },
            max_inline_data: cap.max_inline_data,
        },
        sq_sig_all: sq_sig_all != 0,
    };
    let qp = match p.pd.create_qp(&init) {
        Ok(q) => q,
        Err(e) => return fail(errno_of(&e)),
    };
    let qpn = qp.qp_num();
    // SAFETY: a live PD's `context` is written only at creation.
    let context = unsafe { (*pd).context };
    let ptr = Qp::into_raw(
        crate::wr::qp_ex(ibv_qp {
            context,
            qp_context,
            pd,
            send_cq,
            recv_cq,
            srq,
            handle: qpn,
            qp_num: qpn,
            state: QpState::Reset as c_int,
            qp_type,
            mutex: mutex_init(),
            cond: cond_init(),
            events_completed: 0,
        }),
        QpInner {
            qp,
            sq_sig_all,
            ex,
            batch: parking_lot::Mutex::new(crate::wr::Batch::default()),
            events: EventAcks::default(),
        },
    );
    // SAFETY: the PD's context is live while the PD is (closing keeps it allocated).
    unsafe { ctx_of(context) }
        .qps
        .lock()
        .insert(qpn, ptr as usize);
    ptr.cast()
}

/// `ibv_create_qp` (RC, UC, UD): `init_attr.cap` is updated to what the QP got.
///
/// # Safety
/// `pd` is live; `init_attr` is valid and names live CQs (and SRQ) of the same context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    if init_attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: init_attr is valid for reading and writing, and names live objects of ours (this function's contract, which is create_qp's).
    unsafe { create_qp(pd, &mut *init_attr, false) }
}

/// `verbs_context.create_qp_ex` (behind verbs.h's `ibv_create_qp_ex`): the attributes of
/// `ibv_create_qp` plus the PD; creation flags, TSO, RSS and the `ibv_wr_*` send API are not
/// offered (EOPNOTSUPP).
pub(crate) unsafe extern "C" fn vctx_create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    let _ = context;
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: attr is valid for reading and writing.
    let a = unsafe { &mut *attr };
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
        return fail(libc::EINVAL);
    }
    if a.comp_mask & !(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    let ex = a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
    if ex && a.send_ops_flags & !crate::wr::SEND_OPS_SUPPORTED != 0 {
        // LOCAL_INV, BIND_MW, SEND_WITH_INV, TSO, ATOMIC_WRITE.
        return fail(libc::EOPNOTSUPP);
    }
    let mut base = ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    // SAFETY: verbs' ibv_create_qp_ex contract: the PD and the objects `attr` names are live objects of this library, which is create_qp's contract.
    let qp = unsafe { create_qp(a.pd, &mut base, ex) };
    a.cap = base.cap;
    qp
}

/// `ibv_qp_to_qp_ex`: the `ibv_qp_ex` of a QP created by `ibv_create_qp_ex` with send-ops
/// flags, NULL for any other (as libibverbs).
///
/// # Safety
/// `qp` is a live QP of ours.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    if qp.is_null() {
        return core::ptr::null_mut();
    }
    // SAFETY: `qp` is a QP of this library the program has not destroyed.
    if unsafe { qp_of(qp) }.ex {
        qp.cast()
    } else {
        core::ptr::null_mut()
    }
}

/// The IP address a GID stands for (`::ffff:a.b.c.d` is IPv4).
pub fn gid_addr(g: &ibv_gid) -> IpAddr {
    let v6 = Ipv6Addr::from(g.raw);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// `ibv_ah_attr` → ferroce's AH attributes; RoCE needs the GRH (is_global).
pub fn ah_attr_from(a: &ibv_ah_attr) -> Result<AhAttr, c_int> {
    if a.is_global == 0 {
        return Err(libc::EINVAL);
    }
    Ok(AhAttr {
        dest: gid_addr(&a.grh.dgid),
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label,
        sgid_index: a.grh.sgid_index,
    })
}

fn ah_attr_to(a: &AhAttr) -> ibv_ah_attr {
    let raw = match a.dest {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    };
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        is_global: 1,
        port_num: 1,
        ..ibv_ah_attr::default()
    }
}

fn qp_attr_from(a: &ibv_qp_attr, mask: QpAttrMask) -> Result<QpAttr, c_int> {
    let state = |v: c_int| QpState::from_raw(v as u32).ok_or(libc::EINVAL);
    let mut q = QpAttr::default();
    if mask.contains(QpAttrMask::STATE) {
        q.qp_state = state(a.qp_state)?;
    }
    if mask.contains(QpAttrMask::CUR_STATE) {
        q.cur_qp_state = state(a.cur_qp_state)?;
    }
    if mask.contains(QpAttrMask::PATH_MTU) {
        q.path_mtu = Mtu::from_raw(a.path_mtu as u32).ok_or(libc::EINVAL)?;
    }
    if mask.contains(QpAttrMask::AV) {
        q.ah_attr = Some(ah_attr_from(&a.ah_attr)?);
    }
    q.qkey = a.qkey;
    q.rq_psn = a.rq_psn;
    q.sq_psn = a.sq_psn;
    q.dest_qp_num = a.dest_qp_num;
    q.qp_access_flags = AccessFlags(a.qp_access_flags);
    q.cap = QpCap {
        max_send_wr: a.cap.max_send_wr,
        max_recv_wr: a.cap.max_recv_wr,
        max_send_sge: a.cap.max_send_sge,
        max_recv_sge: a.cap.max_recv_sge,
        max_inline_data: a.cap.max_inline_data,
    };
    q.pkey_index = a.pkey_index;
    q.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    q.max_rd_atomic = a.max_rd_atomic;
    q.max_dest_rd_atomic = a.max_dest_rd_atomic;
    q.min_rnr_timer = a.min_rnr_timer;
    q.port_num = a.port_num;
    q.timeout = a.timeout;
    q.retry_cnt = a.retry_cnt;
    q.rnr_retry = a.rnr_retry;
    Ok(q)
}

/// Attribute bits ferroce has no use for (alternate path, path migration, rate limit): verbs
/// on a RoCE device without APM ignores or rejects them; here they are rejected as EINVAL only
/// when the state machine does (the engine checks the mask).
const MASK_KNOWN: u32 = (1 << 21) - 1;

/// `ibv_modify_qp`.
///
/// # Safety
/// `qp` is live; `attr` is valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    if qp.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    let mask = attr_mask as u32;
    if mask & !MASK_KNOWN != 0 {
        return libc::EINVAL;
    }
    // SAFETY: `qp` is a QP of this library the program has not destroyed; `attr` is valid for reading (this function's contract).
    let (q, a) = unsafe { (qp_of(qp), &*attr) };
    let mask = QpAttrMask(mask);
    let qa = match qp_attr_from(a, mask) {
        Ok(x) => x,
        Err(e) => return e,
    };
    match q.qp.modify(&qa, mask) {
        Ok(()) => {
            // SAFETY: `qp` is a live QP of this library (checked by qp_of's contract above).
            unsafe { publish_state(qp, q.qp.query().qp_state) };
            0
        }
        Err(e) => {
            log::debug!("ibv_modify_qp({:#x}): {e}", q.qp.qp_num());
            errno_of(&e)
        }
    }
}

/// `ibv_query_qp`: every attribute, whatever the mask.
///
/// # Safety
/// `qp` is live; `attr` and `init_attr` are valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    let _ = attr_mask;
    if qp.is_null() || attr.is_null() || init_attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `qp` is a QP of this library the program has not destroyed.
    let q = unsafe { qp_of(qp) };
    let a = q.qp.query();
    // SAFETY: `qp` is a live QP of this library (as for qp_of above).
    unsafe { publish_state(qp, a.qp_state) };
    let cap = ibv_qp_cap {
        max_send_wr: a.cap.max_send_wr,
        max_recv_wr: a.cap.max_recv_wr,
        max_send_sge: a.cap.max_send_sge,
        max_recv_sge: a.cap.max_recv_sge,
        max_inline_data: a.cap.max_inline_data,
    };
    let out = ibv_qp_attr {
        qp_state: a.qp_state as c_int,
        cur_qp_state: a.qp_state as c_int,
        path_mtu: a.path_mtu as c_int,
        path_mig_state: 0, // IBV_MIG_MIGRATED: no automatic path migration
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags.0,
        cap,
        ah_attr: a.ah_attr.as_ref().map(ah_attr_to).unwrap_or_default(),
        alt_ah_attr: ibv_ah_attr::default(),
        pkey_index: a.pkey_index,
        alt_pkey_index: 0,
        en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
        sq_draining: u8::from(a.sq_draining),
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num.max(1),
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: 0,
        alt_timeout: 0,
        rate_limit: 0,
    };
    // SAFETY: both out-pointers are valid for writing (this function's contract); the QP's context, CQ, SRQ and type fields are written only at creation.
    unsafe {
        attr.write(out);
        init_attr.write(ibv_qp_init_attr {
            qp_context: (*qp).qp_context,
            send_cq: (*qp).send_cq,
            recv_cq: (*qp).recv_cq,
            srq: (*qp).srq,
            cap,
            qp_type: (*qp).qp_type,
            sq_sig_all: q.sq_sig_all,
        });
    }
    0
}

/// `ibv_destroy_qp`: outstanding work is dropped with the QP, as verbs does.
///
/// # Safety
/// `qp` is live and not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `qp` is a QP of this library the program has not destroyed; its `context` and `qp_num` are written only at creation, and the context outlives it.
    let (q, c, qpn) = unsafe { (qp_of(qp), ctx_of((*qp).context), (*qp).qp_num) };
    // Out of the table first: no async event can be handed out for it after this.
    c.qps.lock().remove(&qpn);
    q.events.wait_all_acked();
    // SAFETY: the QP is in no table and every event handed out for it has been acknowledged, so no thread holds it; the program gives it up with this call.
    unsafe { Qp::free(qp.cast()) };
    0
}

// ---- SRQ ----

/// `ibv_create_srq`: `srq_init_attr.attr` is updated to what the SRQ got.
///
/// # Safety
/// `pd` is live; `init` is valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    if pd.is_null() || init.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: `pd` is a PD of this library the program has not deallocated; `init` is valid for reading and writing (this function's contract).
    let (p, a) = unsafe { (pd_of(pd), &mut *init) };
    let r = p.pd.create_srq(SrqAttr {
        max_wr: a.attr.max_wr,
        max_sge: a.attr.max_sge.max(1),
        srq_limit: a.attr.srq_limit,
    });
    match r {
        Ok(srq) => {
            let num = srq.srq_num();
            // SAFETY: a live PD's `context` is written only at creation.
            let context = unsafe { (*pd).context };
            let ptr = Srq::into_raw(
                ibv_srq {
                    context,
                    srq_context: a.srq_context,
                    pd,
                    handle: num,
                    mutex: mutex_init(),
                    cond: cond_init(),
                    events_completed: 0,
                },
                SrqInner {
                    srq,
                    events: EventAcks::default(),
                },
            );
            // SAFETY: the PD's context is live while the PD is.
            unsafe { ctx_of(context) }
                .srqs
                .lock()
                .insert(num, ptr as usize);
            ptr.cast()
        }
        Err(e) => fail(errno_of(&e)),
    }
}

/// `ibv_modify_srq`: arming the limit (IBV_SRQ_LIMIT); resizing (IBV_SRQ_MAX_WR) is not offered.
///
/// # Safety
/// `srq` is live; `attr` is valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    if srq.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    if mask & 1 != 0 {
        return libc::EOPNOTSUPP;
    }
    // SAFETY: `srq` is an SRQ of this library the program has not destroyed; `attr` is valid for reading (this function's contract).
    let (s, a) = unsafe { (srq_of(srq), &*attr) };
    if mask & 2 != 0 {
        if let Err(e) = s.srq.arm_limit(a.srq_limit) {
            return errno_of(&e);
        }
    }
    0
}

/// `ibv_query_srq`.
///
/// # Safety
/// `srq` is live; `attr` is valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    if srq.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `srq` is an SRQ of this library the program has not destroyed.
    let a = unsafe { srq_of(srq) }.srq.query();
    // SAFETY: attr is valid for writing.
    unsafe {
        attr.write(ibv_srq_attr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        })
    };
    0
}

/// `ibv_destroy_srq`.
///
/// # Safety
/// `srq` is live and not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `srq` is an SRQ of this library the program has not destroyed; its `context` and `handle` are written only at creation, and the context outlives it.
    let (s, c, handle) = unsafe { (srq_of(srq), ctx_of((*srq).context), (*srq).handle) };
    // Out of the table first: no async event can be handed out for it after this.
    c.srqs.lock().remove(&handle);
    s.events.wait_all_acked();
    // SAFETY: the SRQ is in no table and every event handed out for it has been acknowledged; the program gives it up with this call.
    unsafe { Srq::free(srq) };
    0
}

// ---- AH ----

/// `ibv_create_ah` (the GRH is required: RoCE addresses by GID).
///
/// # Safety
/// `pd` is live; `attr` is valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    if pd.is_null() || attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: `pd` is a PD of this library the program has not deallocated; `attr` is valid for reading (this function's contract).
    let (p, a) = unsafe { (pd_of(pd), &*attr) };
    let aa = match ah_attr_from(a) {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    match p.pd.create_ah(aa) {
        Ok(ah) => Ah::into_raw(
            ibv_ah {
                // SAFETY: a live PD's `context` is written only at creation.
                context: unsafe { (*pd).context },
                pd,
                handle: 0,
            },
            AhInner { ah },
        ),
        Err(e) => fail(errno_of(&e)),
    }
}

/// `ibv_destroy_ah`.
///
/// # Safety
/// `ah` is live and not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    if ah.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `ah` is an AH of this library the program has not destroyed; AHs are in no table and have no events, so nothing else refers to it; the program gives it up here.
    unsafe { Ah::free(ah) };
    0
}

/// The source of a UD receive, from the 40-byte GRH area verbs puts first in the buffer: for
/// RoCEv2 over IPv4 its last 20 bytes are the IPv4 header, otherwise it is an IPv6 header
/// (the same layout as a GRH).
fn ah_attr_from_grh(grh: &[u8; 40]) -> ibv_ah_attr {
    let v4 = &grh[20..40];
    let (src, tclass, hop) = if v4[0] >> 4 == 4 {
        let s = std::net::Ipv4Addr::new(v4[12], v4[13], v4[14], v4[15]);
        (s.to_ipv6_mapped().octets(), v4[1], v4[8])
    } else {
        let mut s = [0u8; 16];
        s.copy_from_slice(&grh[8..24]);
        let vtf = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
        (s, ((vtf >> 20) & 0xff) as u8, grh[7])
    };
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: src },
            flow_label: 0,
            sgid_index: 1,
            hop_limit: hop,
            traffic_class: tclass,
        },
        is_global: 1,
        port_num: 1,
        ..ibv_ah_attr::default()
    }
}

/// `ibv_init_ah_from_wc`: the AH that answers a UD receive (needs IBV_WC_GRH).
///
/// # Safety
/// `wc`, `grh` (40 bytes) and `ah_attr` are valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    let _ = (context, port_num);
    if wc.is_null() || grh.is_null() || ah_attr.is_null() {
        return -1;
    }
    // SAFETY: wc is valid.
    if unsafe { (*wc).wc_flags } & 1 == 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: grh points at the 40 bytes at the start of the receive buffer.
    let bytes = unsafe { &*grh.cast::<[u8; 40]>() };
    // SAFETY: ah_attr is valid for writing.
    unsafe { ah_attr.write(ah_attr_from_grh(bytes)) };
    0
}

/// `ibv_create_ah_from_wc`.
///
/// # Safety
/// As [`ibv_init_ah_from_wc`], and `pd` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    let mut a = ibv_ah_attr::default();
    if pd.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: ibv_create_ah_from_wc's contract: `wc` is valid and `grh` points at the 40-byte GRH area of that receive (ibv_init_ah_from_wc's contract); `a` is a local.
    if unsafe { ibv_init_ah_from_wc(NULL.cast(), port_num, wc, grh, &mut a) } != 0 {
        return core::ptr::null_mut();
    }
    // SAFETY: `pd` is a live PD of ours (this function's contract); `a` is a local.
    unsafe { ibv_create_ah(pd, &mut a) }
}

// ---- async events ----

/// The object an async event is about, as `ibv_async_event.element` holds it.
#[derive(Clone, Copy)]
enum Element {
    Qp(*mut ibv_qp),
    Srq(*mut ibv_srq),
    Cq(*mut ibv_cq),
}

/// `enum ibv_event_type` values ferroce reports.
const IBV_EVENT_CQ_ERR: c_int = 0;
const IBV_EVENT_COMM_EST: c_int = 4;
const IBV_EVENT_SQ_DRAINED: c_int = 5;
const IBV_EVENT_SRQ_LIMIT_REACHED: c_int = 15;
const IBV_EVENT_QP_LAST_WQE_REACHED: c_int = 16;

/// Finds the object of an event in its table and counts the event as handed out, under the
/// table's lock, so that the object's destroy (which leaves the table under the same lock
/// first) waits for its acknowledgement. None: the object was destroyed meanwhile.
fn report(c: &Ctx, rec: AsyncEventRecord) -> Option<(Element, c_int)> {
    let qp = |qpn: u32, ty: c_int| {
        let t = c.qps.lock();
        t.get(&qpn).map(|&p| {
            let p = p as *mut ibv_qp;
            // SAFETY: QPs in the table are live (destroy removes them, under this lock, before it waits and frees).
            unsafe { qp_of(p) }.events.reported();
            (Element::Qp(p), ty)
        })
    };
    match rec {
        AsyncEventRecord::Engine(AsyncEvent::CommEst { qpn }) => qp(qpn, IBV_EVENT_COMM_EST),
        AsyncEventRecord::Engine(AsyncEvent::SqDrained { qpn }) => qp(qpn, IBV_EVENT_SQ_DRAINED),
        AsyncEventRecord::Engine(AsyncEvent::QpLastWqeReached { qpn }) => {
            qp(qpn, IBV_EVENT_QP_LAST_WQE_REACHED)
        }
        AsyncEventRecord::Engine(AsyncEvent::SrqLimitReached { srqn }) => {
            let t = c.srqs.lock();
            t.get(&srqn).map(|&p| {
                let p = p as *mut ibv_srq;
                // SAFETY: SRQs in the table are live, as QPs above.
                unsafe { srq_of(p) }.events.reported();
                (Element::Srq(p), IBV_EVENT_SRQ_LIMIT_REACHED)
            })
        }
        AsyncEventRecord::CqErr { cq } => {
            let t = c.cqs.lock();
            t.get(&cq).map(|&p| {
                let p = p as *mut ibv_cq;
                // SAFETY: CQs in the table are live, as QPs above.
                unsafe { cq_of(p) }.async_events.reported();
                (Element::Cq(p), IBV_EVENT_CQ_ERR)
            })
        }
    }
}

/// `ibv_get_async_event`: blocks for the next event (EAGAIN at once when `async_fd` was made
/// non-blocking). The object it names stays allocated until the event is acknowledged.
///
/// # Safety
/// `context` is live; `event` is valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    if context.is_null() || event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: `context` came from this library's ibv_open_device and is not closed; its `async_fd` is written only at open.
    let (c, fd) = unsafe { (ctx_of(context), (*context).async_fd) };
    let nb = nonblocking(fd);
    loop {
        let wait = if nb {
            Duration::ZERO
        } else {
            Duration::from_secs(3600)
        };
        let Some(rec) = c.ctx.get_async_event(wait) else {
            if nb {
                set_errno(libc::EAGAIN);
                return -1;
            }
            continue;
        };
        // An event of an object destroyed meanwhile is dropped.
        let Some((element, ty)) = report(c, rec) else {
            log::debug!("ibv_get_async_event: {rec:?} of a destroyed object dropped");
            continue;
        };
        let element = match element {
            Element::Qp(p) => p.cast::<c_void>(),
            Element::Srq(p) => p.cast(),
            Element::Cq(p) => p.cast(),
        };
        // SAFETY: `event` is valid for writing (this function's contract).
        unsafe {
            event.write(ibv_async_event {
                element,
                event_type: ty,
            })
        };
        return 0;
    }
}

/// `ibv_ack_async_event`: the event's object may now be destroyed (its destroy waits for this).
///
/// # Safety
/// `event` was filled by `ibv_get_async_event` and is acknowledged once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: `event` is valid for reading (this function's contract).
    let ev = unsafe { event.read() };
    // SAFETY: the element of an unacknowledged event is live (its destroy waits for this acknowledgement); its type follows from the event type ibv_get_async_event chose; the counters are aligned u32 fields that ferroce writes only atomically.
    unsafe {
        match ev.event_type {
            IBV_EVENT_COMM_EST | IBV_EVENT_SQ_DRAINED | IBV_EVENT_QP_LAST_WQE_REACHED => {
                let p = ev.element.cast::<ibv_qp>();
                let n = qp_of(p).events.acked(1);
                publish_u32(&raw mut (*p).events_completed, n);
            }
            IBV_EVENT_SRQ_LIMIT_REACHED => {
                let p = ev.element.cast::<ibv_srq>();
                let n = srq_of(p).events.acked(1);
                publish_u32(&raw mut (*p).events_completed, n);
            }
            IBV_EVENT_CQ_ERR => {
                let p = ev.element.cast::<ibv_cq>();
                let n = cq_of(p).async_events.acked(1);
                publish_u32(&raw mut (*p).async_events_completed, n);
            }
            other => log::debug!("ibv_ack_async_event: event type {other} is not ferroce's"),
        }
    }
}
