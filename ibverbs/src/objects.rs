//! Verbs objects: PDs, MRs, completion channels, CQs, QPs, SRQs, AHs and async events. Each
//! is a box whose first field is the C struct the program holds.

use core::ffi::{c_int, c_uint, c_void};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::Duration;

use ferroce::transport::{
    AccessFlags, AhAttr, AsyncEvent, Mtu, QpAttr, QpAttrMask, QpCap, QpState, QpType, SrqAttr,
};
use ferroce::{AsyncEventRecord, QpInitAttr};

use crate::abi::*;
use crate::device::{Ctx, ctx_of};
use crate::{errno_of, set_errno};

const NULL: *mut c_void = core::ptr::null_mut();

/// A PD.
#[repr(C)]
pub struct Pd {
    /// What the program sees.
    pub ibv: ibv_pd,
    /// The ferroce PD.
    pub pd: ferroce::ProtectionDomain,
}

/// An MR.
#[repr(C)]
pub struct Mr {
    /// What the program sees.
    pub ibv: ibv_mr,
    /// The ferroce region over the caller's memory.
    pub mr: ferroce::MemoryRegion,
}

/// A completion channel.
#[repr(C)]
pub struct Channel {
    /// What the program sees.
    pub ibv: ibv_comp_channel,
    /// The ferroce channel.
    pub ch: ferroce::CompletionChannel,
}

/// A CQ: every CQ has the `ibv_cq_ex` layout (an `ibv_cq` followed by the polling API).
#[repr(C)]
pub struct Cq {
    /// What the program sees.
    pub ibv: ibv_cq_ex,
    /// The ferroce CQ.
    pub cq: ferroce::CompletionQueue,
    /// The completion `ibv_start_poll`/`ibv_next_poll` made current (the `ibv_wc_read_*` source).
    pub current: parking_lot::Mutex<ferroce::transport::WorkCompletion>,
}

/// A QP: every QP carries the `ibv_qp_ex` slots; `ibv_qp_to_qp_ex` hands them out for QPs
/// created with send-ops flags, as libibverbs does.
#[repr(C)]
pub struct Qp {
    /// What the program sees (`ibv.qp_base` is the `ibv_qp`).
    pub ibv: ibv_qp_ex,
    /// The ferroce QP.
    pub qp: ferroce::QueuePair,
    /// `sq_sig_all` as created (for `ibv_query_qp`).
    pub sq_sig_all: c_int,
    /// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` (the `ibv_wr_*` API is on).
    pub ex: bool,
    /// The `ibv_wr_*` batch between `ibv_wr_start` and `ibv_wr_complete`.
    pub batch: parking_lot::Mutex<crate::wr::Batch>,
}

/// An SRQ.
#[repr(C)]
pub struct Srq {
    /// What the program sees.
    pub ibv: ibv_srq,
    /// The ferroce SRQ.
    pub srq: ferroce::SharedReceiveQueue,
}

/// An AH.
#[repr(C)]
pub struct Ah {
    /// What the program sees.
    pub ibv: ibv_ah,
    /// The ferroce AH.
    pub ah: ferroce::AddressHandle,
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
    // SAFETY: the context is live.
    let c = unsafe { ctx_of(context) };
    let pd = c.ctx.alloc_pd();
    c.children.fetch_add(1, Ordering::SeqCst);
    let b = Box::new(Pd {
        ibv: ibv_pd {
            context,
            handle: next_handle(),
        },
        pd,
    });
    Box::into_raw(b).cast()
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
    // SAFETY: pd is a live Pd of ours.
    let p = unsafe { &*pd.cast::<Pd>() };
    if p.pd.in_use() {
        return libc::EBUSY;
    }
    // SAFETY: the PD's context is live.
    unsafe { ctx_of(p.ibv.context) }
        .children
        .fetch_sub(1, Ordering::SeqCst);
    // SAFETY: the Pd box ends here.
    drop(unsafe { Box::from_raw(pd.cast::<Pd>()) });
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
    // SAFETY: pd is a live Pd of ours.
    let p = unsafe { &*pd.cast::<Pd>() };
    let flags = AccessFlags(access & 0xf);
    // SAFETY: verbs' contract: the caller keeps addr..addr+length valid until ibv_dereg_mr,
    // and the memory is written by the network meanwhile.
    let r = unsafe { p.pd.reg_mr_raw(addr.cast(), length, flags) };
    match r {
        Ok(mr) => {
            let b = Box::new(Mr {
                ibv: ibv_mr {
                    context: p.ibv.context,
                    pd,
                    addr,
                    length,
                    handle: mr.lkey(),
                    lkey: mr.lkey(),
                    rkey: mr.rkey(),
                },
                mr,
            });
            Box::into_raw(b).cast()
        }
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
    // SAFETY: forwarded contract.
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
    // SAFETY: forwarded contract.
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
    // SAFETY: forwarded contract.
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
    // SAFETY: the Mr box ends here.
    let b = unsafe { Box::from_raw(mr.cast::<Mr>()) };
    b.mr.dereg();
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
    // SAFETY: the context is live.
    let c = unsafe { ctx_of(context) };
    match c.ctx.create_comp_channel() {
        Ok(ch) => {
            c.children.fetch_add(1, Ordering::SeqCst);
            let b = Box::new(Channel {
                ibv: ibv_comp_channel {
                    context,
                    fd: ch.fd(),
                    refcnt: 0,
                },
                ch,
            });
            Box::into_raw(b).cast()
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
    // SAFETY: channel is a live Channel of ours.
    let ch = unsafe { &*channel.cast::<Channel>() };
    if ch.ch.in_use() {
        return libc::EBUSY;
    }
    // SAFETY: the channel's context is live.
    unsafe { ctx_of(ch.ibv.context) }
        .children
        .fetch_sub(1, Ordering::SeqCst);
    // SAFETY: the box ends here.
    drop(unsafe { Box::from_raw(channel.cast::<Channel>()) });
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
    // SAFETY: forwarded contract.
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
    // SAFETY: the context is live.
    let c = unsafe { ctx_of(context) };
    // SAFETY: channel is NULL or a live Channel of ours.
    let ch = (!channel.is_null()).then(|| unsafe { &(*channel.cast::<Channel>()).ch });
    match c.ctx.create_cq(cqe, ch) {
        Ok(cq) => {
            let handle = cq.handle();
            let b = Box::new(Cq {
                ibv: crate::cq_ex::cq_ex(context, channel, cq_context, handle, cq.cqe() as c_int),
                cq,
                current: parking_lot::Mutex::new(Default::default()),
            });
            let p = Box::into_raw(b);
            c.cqs.lock().insert(handle, p as usize);
            c.children.fetch_add(1, Ordering::SeqCst);
            p.cast()
        }
        Err(e) => fail(errno_of(&e)),
    }
}

/// `ibv_destroy_cq`: EBUSY while a QP uses it or its events are unacknowledged.
///
/// # Safety
/// `cq` is live and not used again on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: cq is a live Cq of ours.
    let q = unsafe { &*cq.cast::<Cq>() };
    if let Err(e) = q.cq.clone().destroy() {
        return errno_of(&e);
    }
    // SAFETY: the CQ's context outlives it.
    let c = unsafe { ctx_of(q.ibv.context) };
    c.cqs.lock().remove(&q.ibv.handle);
    c.children.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: the box ends here.
    drop(unsafe { Box::from_raw(cq.cast::<Cq>()) });
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
    // SAFETY: cq is a live Cq of ours.
    if unsafe { &*cq.cast::<Cq>() }.ibv.cqe >= cqe {
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
    // SAFETY: channel is a live Channel of ours.
    let ch = unsafe { &*channel.cast::<Channel>() };
    let got = if nonblocking(ch.ibv.fd) {
        ch.ch.get_event_timeout(Duration::ZERO)
    } else {
        Some(ch.ch.get_event())
    };
    let Some(event_cq) = got else {
        set_errno(libc::EAGAIN);
        return -1;
    };
    // SAFETY: the channel's context is live.
    let c = unsafe { ctx_of(ch.ibv.context) };
    let Some(&p) = c.cqs.lock().get(&event_cq.handle()) else {
        // The CQ was destroyed after its event was queued.
        set_errno(libc::EAGAIN);
        return -1;
    };
    let p = p as *mut Cq;
    // SAFETY: p is a live Cq (it is in the table); the out-pointers are valid.
    unsafe {
        *cq = p.cast();
        *cq_context = (*p).ibv.cq_context;
    }
    0
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
    // SAFETY: cq is a live Cq of ours.
    let q = unsafe { &*cq.cast::<Cq>() };
    q.cq.ack_events(nevents);
    // SAFETY: the counter is an aligned u32 of the live CQ; updated atomically, since other
    // threads may acknowledge events of the same CQ (libibverbs takes cq->mutex for this).
    unsafe { AtomicU32::from_ptr(&raw mut (*cq).comp_events_completed) }
        .fetch_add(nevents, Ordering::SeqCst);
}

/// Publishes a QP's state in the C-visible `ibv_qp.state` (atomically: other threads may post
/// or read it meanwhile).
///
/// # Safety
/// `qp` is a live QP of ours.
unsafe fn publish_state(qp: *mut ibv_qp, state: QpState) {
    // SAFETY: `state` is an aligned c_int (i32) field of the live QP.
    unsafe { AtomicI32::from_ptr(&raw mut (*qp).state) }.store(state as c_int, Ordering::SeqCst);
}

// ---- QP ----

fn qp_type_of(t: c_int) -> Option<QpType> {
    QpType::from_raw(t as u32)
}

/// Creates a QP on `pd` from `a` (its `cap` is what the QP gets: ferroce allocates exactly the
/// requested sizes).
///
/// # Safety
/// `pd` is NULL or live; `a` names live CQs (and SRQ) of ours.
unsafe fn create_qp(pd: *mut ibv_pd, a: &mut ibv_qp_init_attr) -> *mut ibv_qp {
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
    // SAFETY: the program passes live objects of ours.
    let (p, scq, rcq) = unsafe {
        (
            &*pd.cast::<Pd>(),
            &*send_cq.cast::<Cq>(),
            &*recv_cq.cast::<Cq>(),
        )
    };
    // SAFETY: srq is NULL or a live Srq of ours.
    let s = (!srq.is_null()).then(|| unsafe { &(*srq.cast::<Srq>()).srq });
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
    let b = Box::new(Qp {
        ibv: crate::wr::qp_ex(ibv_qp {
            context: p.ibv.context,
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
        qp,
        sq_sig_all,
        ex: false,
        batch: parking_lot::Mutex::new(crate::wr::Batch::default()),
    });
    let ptr = Box::into_raw(b);
    // SAFETY: the PD's context is live.
    unsafe { ctx_of(p.ibv.context) }
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
    // SAFETY: init_attr is valid for reading and writing; the rest is forwarded.
    unsafe { create_qp(pd, &mut *init_attr) }
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
    // SAFETY: forwarded contract.
    let qp = unsafe { create_qp(a.pd, &mut base) };
    a.cap = base.cap;
    if ex && !qp.is_null() {
        // SAFETY: qp is the Qp box create_qp just made.
        unsafe { (*qp.cast::<Qp>()).ex = true };
    }
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
    // SAFETY: a live Qp of ours.
    if unsafe { (*qp.cast::<Qp>()).ex } {
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
    // SAFETY: qp is a live Qp of ours; attr is valid.
    let (q, a) = unsafe { (&*qp.cast::<Qp>(), &*attr) };
    let mask = QpAttrMask(mask);
    let qa = match qp_attr_from(a, mask) {
        Ok(x) => x,
        Err(e) => return e,
    };
    match q.qp.modify(&qa, mask) {
        Ok(()) => {
            // SAFETY: qp is live.
            unsafe { publish_state(qp, q.qp.query().qp_state) };
            0
        }
        Err(e) => {
            log::debug!("ibv_modify_qp({:#x}): {e}", q.ibv.qp_base.qp_num);
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
    // SAFETY: qp is a live Qp of ours.
    let q = unsafe { &*qp.cast::<Qp>() };
    let a = q.qp.query();
    // SAFETY: qp is live.
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
    // SAFETY: both out-pointers are valid for writing.
    unsafe {
        attr.write(out);
        init_attr.write(ibv_qp_init_attr {
            qp_context: q.ibv.qp_base.qp_context,
            send_cq: q.ibv.qp_base.send_cq,
            recv_cq: q.ibv.qp_base.recv_cq,
            srq: q.ibv.qp_base.srq,
            cap,
            qp_type: q.ibv.qp_base.qp_type,
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
    // SAFETY: the box ends here.
    let b = unsafe { Box::from_raw(qp.cast::<Qp>()) };
    // SAFETY: the QP's context outlives it.
    unsafe { ctx_of(b.ibv.qp_base.context) }
        .qps
        .lock()
        .remove(&b.ibv.qp_base.qp_num);
    drop(b);
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
    // SAFETY: live PD of ours; init valid.
    let (p, a) = unsafe { (&*pd.cast::<Pd>(), &mut *init) };
    let r = p.pd.create_srq(SrqAttr {
        max_wr: a.attr.max_wr,
        max_sge: a.attr.max_sge.max(1),
        srq_limit: a.attr.srq_limit,
    });
    match r {
        Ok(srq) => {
            let num = srq.srq_num();
            let b = Box::new(Srq {
                ibv: ibv_srq {
                    context: p.ibv.context,
                    srq_context: a.srq_context,
                    pd,
                    handle: num,
                    mutex: mutex_init(),
                    cond: cond_init(),
                    events_completed: 0,
                },
                srq,
            });
            let ptr = Box::into_raw(b);
            // SAFETY: the PD's context is live.
            unsafe { ctx_of(p.ibv.context) }
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
    // SAFETY: live SRQ of ours; attr valid.
    let (s, a) = unsafe { (&*srq.cast::<Srq>(), &*attr) };
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
    // SAFETY: live SRQ of ours; attr valid.
    let a = unsafe { &*srq.cast::<Srq>() }.srq.query();
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
    // SAFETY: the box ends here.
    let b = unsafe { Box::from_raw(srq.cast::<Srq>()) };
    // SAFETY: the SRQ's context outlives it.
    unsafe { ctx_of(b.ibv.context) }
        .srqs
        .lock()
        .remove(&b.ibv.handle);
    drop(b);
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
    // SAFETY: live PD of ours; attr valid.
    let (p, a) = unsafe { (&*pd.cast::<Pd>(), &*attr) };
    let aa = match ah_attr_from(a) {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    match p.pd.create_ah(aa) {
        Ok(ah) => Box::into_raw(Box::new(Ah {
            ibv: ibv_ah {
                context: p.ibv.context,
                pd,
                handle: 0,
            },
            ah,
        }))
        .cast(),
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
    // SAFETY: the box ends here.
    drop(unsafe { Box::from_raw(ah.cast::<Ah>()) });
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
    // SAFETY: forwarded contract.
    if unsafe { ibv_init_ah_from_wc(NULL.cast(), port_num, wc, grh, &mut a) } != 0 {
        return core::ptr::null_mut();
    }
    // SAFETY: forwarded contract.
    unsafe { ibv_create_ah(pd, &mut a) }
}

// ---- async events ----

/// `ibv_get_async_event`: blocks for the next event (EAGAIN at once when `async_fd` was made
/// non-blocking).
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
    // SAFETY: the context is live.
    let c: &Ctx = unsafe { ctx_of(context) };
    let nb = nonblocking(c.vctx.context.async_fd);
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
        let lookup = |m: &parking_lot::Mutex<std::collections::HashMap<u32, usize>>, k: u32| {
            m.lock().get(&k).copied()
        };
        let (element, ty) = match rec {
            AsyncEventRecord::Engine(AsyncEvent::CommEst { qpn }) => (lookup(&c.qps, qpn), 4),
            AsyncEventRecord::Engine(AsyncEvent::SqDrained { qpn }) => (lookup(&c.qps, qpn), 5),
            AsyncEventRecord::Engine(AsyncEvent::QpLastWqeReached { qpn }) => {
                (lookup(&c.qps, qpn), 16)
            }
            AsyncEventRecord::Engine(AsyncEvent::SrqLimitReached { srqn }) => {
                (lookup(&c.srqs, srqn), 15)
            }
            AsyncEventRecord::CqErr { cq } => (lookup(&c.cqs, cq), 0),
        };
        // An event of an object destroyed meanwhile is dropped.
        if let Some(p) = element {
            // SAFETY: event is valid for writing.
            unsafe {
                event.write(ibv_async_event {
                    element: p as *mut c_void,
                    event_type: ty,
                })
            };
            return 0;
        }
    }
}

/// `ibv_ack_async_event`: nothing to release here.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    let _ = event;
}
