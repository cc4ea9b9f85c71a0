//! Queue pairs: `ibv_create_qp`/`_ex`, `ibv_modify_qp`, `ibv_query_qp`, `ibv_destroy_qp`.

use core::ffi::c_int;
use std::sync::atomic::Ordering;

use ferroce::QpInitAttr;
use ferroce::transport::{QpAttrMask, QpCap, QpState, QpType};

use crate::abi::*;
use crate::convert::*;
use crate::device::ctx_of;
use crate::errno_of;
use crate::handle::{EventAcks, atomic_i32};
use crate::objects::*;

/// Publishes a QP's state in the C-visible `ibv_qp.state` (atomically: other threads may post
/// or read it meanwhile).
///
/// # Safety
/// `qp` is a live QP of ours.
pub(crate) unsafe fn publish_state(qp: *mut ibv_qp, state: QpState) {
    // SAFETY: `state` is an aligned c_int (i32) field of the live QP that ferroce writes only atomically.
    unsafe { atomic_i32(&raw mut (*qp).state) }.store(state as c_int, Ordering::SeqCst);
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
    // An XRC send QP has no receive side: its recv_cq may be NULL (ferroce's QP reports
    // nothing there).
    let xrc_send = qp_type == QpType::XrcSend as c_int;
    let rcq_ptr = if xrc_send && recv_cq.is_null() {
        send_cq
    } else {
        recv_cq
    };
    if pd.is_null() || send_cq.is_null() || rcq_ptr.is_null() || (xrc_send && !srq.is_null()) {
        return fail(libc::EINVAL);
    }
    let Some(qt) = qp_type_of(qp_type) else {
        log::debug!("ibv_create_qp: QP type {qp_type} (raw packet, driver QPs) is not offered");
        return fail(libc::EOPNOTSUPP);
    };
    if qt == QpType::XrcRecv {
        log::debug!(
            "ibv_create_qp: an XRC_RECV QP is created by ibv_create_qp_ex with \
             IBV_QP_INIT_ATTR_XRCD (EINVAL)"
        );
        return fail(libc::EINVAL);
    }
    // SAFETY: `pd`, `send_cq` and `rcq_ptr` are non-NULL (checked above) and, by verbs' rule for ibv_create_qp, objects of this library not yet destroyed: each points to its live Obj.
    let (p, scq, rcq) = unsafe { (pd_of(pd), cq_of(send_cq), cq_of(rcq_ptr)) };
    // SAFETY: a non-NULL srq is an SRQ of this library the program has not destroyed.
    let s = (!srq.is_null()).then(|| unsafe { &srq_of(srq).srq });
    let init = QpInitAttr {
        qp_type: qt,
        send_cq: &scq.cq,
        recv_cq: &rcq.cq,
        srq: s,
        cap: QpCap {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: if s.is_some() || xrc_send {
                0
            } else {
                cap.max_recv_wr
            },
            max_send_sge: cap.max_send_sge,
            max_recv_sge: if s.is_some() || xrc_send {
                0
            } else {
                cap.max_recv_sge
            },
            max_inline_data: cap.max_inline_data,
        },
        sq_sig_all: sq_sig_all != 0,
    };
    let qp = match p.pd.create_qp(&init) {
        Ok(q) => q,
        Err(e) => return fail(errno_of(&e)),
    };
    // SAFETY: a live PD's `context` is written only at creation.
    let context = unsafe { (*pd).context };
    let c = QpHandle {
        context,
        qp_context,
        pd,
        cqs: (send_cq, recv_cq),
        srq,
        qp_type,
    };
    // SAFETY: the context is live while the PD is (this function's contract).
    unsafe { publish_qp(c, qp, ex, false) }
}

/// What a QP's `ibv_qp` shows besides its number and state.
pub(crate) struct QpHandle {
    pub(crate) context: *mut ibv_context,
    pub(crate) qp_context: *mut core::ffi::c_void,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) cqs: (*mut ibv_cq, *mut ibv_cq),
    pub(crate) srq: *mut ibv_srq,
    pub(crate) qp_type: c_int,
}

/// The `ibv_qp` of ferroce's `qp`, entered in its context's QP table unless it is a second
/// handle (`opened`, from `ibv_open_qp`).
///
/// # Safety
/// `c.context` is a live context of ours.
pub(crate) unsafe fn publish_qp(
    c: QpHandle,
    qp: ferroce::QueuePair,
    ex: bool,
    opened: bool,
) -> *mut ibv_qp {
    let QpHandle {
        context,
        qp_context,
        pd,
        cqs: (send_cq, recv_cq),
        srq,
        qp_type,
    } = c;
    let qpn = qp.qp_num();
    let state = qp.query().qp_state;
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
            state: state as c_int,
            qp_type,
            mutex: mutex_init(),
            cond: cond_init(),
            events_completed: 0,
        }),
        QpInner {
            qp,
            ex,
            batch: parking_lot::Mutex::new(crate::wr::Batch::default()),
            events: EventAcks::default(),
            opened,
        },
    );
    if !opened {
        // SAFETY: the context is live (this function's contract; closing keeps it allocated).
        unsafe { ctx_of(context) }
            .qps
            .lock()
            .insert(qpn, ptr as usize);
    }
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
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: attr is valid for reading and writing.
    let a = unsafe { &mut *attr };
    if a.qp_type == QpType::XrcRecv as c_int {
        // SAFETY: verbs' ibv_create_qp_ex contract: `context` is live and `attr` names a live XRC domain of it.
        return unsafe { crate::xrc::create_xrc_recv_qp(context, a) };
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
        log::debug!("ibv_create_qp_ex: comp_mask without IBV_QP_INIT_ATTR_PD (EINVAL)");
        return fail(libc::EINVAL);
    }
    // XRCD is for XRC_RECV QPs only, which took the branch above; as the kernel, another QP
    // type ignores it.
    let known = IBV_QP_INIT_ATTR_PD
        | IBV_QP_INIT_ATTR_XRCD
        | IBV_QP_INIT_ATTR_CREATE_FLAGS
        | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if a.comp_mask & !known != 0 {
        log::debug!(
            "ibv_create_qp_ex: comp_mask bits {:#x} (RSS, WQ tables, TSO, source QPN) are not offered (EOPNOTSUPP)",
            a.comp_mask & !known
        );
        return fail(libc::EOPNOTSUPP);
    }
    // Creation flags present but zero are no flags, as rxe takes them; of the rest ferroce has
    // BLOCK_SELF_MCAST_LB, and lacks scatter FCS, CVLAN stripping, source QPN, PCI write end
    // padding.
    let flags = if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 {
        a.create_flags
    } else {
        0
    };
    if flags & !IBV_QP_CREATE_BLOCK_SELF_MCAST_LB != 0 {
        log::debug!(
            "ibv_create_qp_ex: create_flags {:#x} are not offered (EOPNOTSUPP)",
            flags & !IBV_QP_CREATE_BLOCK_SELF_MCAST_LB
        );
        return fail(libc::EOPNOTSUPP);
    }
    let ex = a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
    if ex && a.send_ops_flags & !crate::wr::SEND_OPS_SUPPORTED != 0 {
        // TSO.
        log::debug!(
            "ibv_create_qp_ex: send_ops_flags {:#x} are not offered (EOPNOTSUPP)",
            a.send_ops_flags & !crate::wr::SEND_OPS_SUPPORTED
        );
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
    // SAFETY: a non-NULL result is the live QP just made.
    if !qp.is_null() && unsafe { apply_create_flags(qp, flags) } != 0 {
        // SAFETY: the QP was made above and is handed to nobody.
        unsafe { ibv_destroy_qp(qp) };
        return fail(libc::EINVAL);
    }
    a.cap = base.cap;
    qp
}

/// Applies the creation flags ferroce has to a QP just created (before it sends anything):
/// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`. Returns 0 or an errno.
///
/// # Safety
/// `qp` is a live QP of ours.
pub(crate) unsafe fn apply_create_flags(qp: *mut ibv_qp, flags: u32) -> c_int {
    if flags & IBV_QP_CREATE_BLOCK_SELF_MCAST_LB == 0 {
        return 0;
    }
    // SAFETY: `qp` is a live QP of ours (this function's contract).
    match unsafe { qp_of(qp) }.qp.block_self_multicast_loopback() {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
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
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if qp.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        let mask = attr_mask as u32;
        if mask & !MASK_KNOWN != 0 {
            log::debug!(
                "ibv_modify_qp: unknown attr_mask bits {:#x} (EINVAL)",
                mask & !MASK_KNOWN
            );
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
    })())
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
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
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
                sq_sig_all: c_int::from(q.qp.sq_sig_all()),
            });
        }
        0
    })())
}

/// `ibv_destroy_qp`: outstanding work is dropped with the QP, as verbs does.
///
/// # Safety
/// `qp` is live and not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `qp` is a QP of this library the program has not destroyed; its `context` and `qp_num` are written only at creation, and the context outlives it.
        let (q, c, qpn) = unsafe { (qp_of(qp), ctx_of((*qp).context), (*qp).qp_num) };
        // Out of the table first: no async event can be handed out for it after this (a
        // handle from ibv_open_qp is in none; the table holds the QP's own).
        if !q.opened {
            c.qps.lock().remove(&qpn);
        }
        q.events.wait_all_acked();
        // SAFETY: the QP is in no table and every event handed out for it has been acknowledged, so no thread holds it; the program gives it up with this call.
        unsafe { Qp::free(qp.cast()) };
        0
    })())
}

/// `ibv_attach_mcast`: the UD QP receives what is sent to the multicast group `gid` (an
/// IPv4-mapped MGID for an IPv4 group, as rdma_cm gives it; `lid` is unused on RoCE). Returns 0
/// or an errno: EINVAL for a QP that is not UD or a GID that is not a group, ENOMEM past the
/// device's `max_mcast_qp_attach`/`max_mcast_grp`.
///
/// # Safety
/// `qp` is a live QP of this library; `gid` points to an `ibv_gid`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    crate::status((|| {
        let _ = lid;
        if qp.is_null() || gid.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `qp` is a QP of this library the program has not destroyed, and `gid` points to a readable ibv_gid (the caller's contract, checked non-null above).
        let (q, g) = unsafe { (qp_of(qp), crate::convert::gid_addr(&*gid)) };
        match q.qp.attach_mcast(g) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })())
}

/// `ibv_detach_mcast`: undoes [`ibv_attach_mcast`]; EINVAL if the QP is not attached.
///
/// # Safety
/// As [`ibv_attach_mcast`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    crate::status((|| {
        let _ = lid;
        if qp.is_null() || gid.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: as in ibv_attach_mcast: a live QP of this library and a readable ibv_gid.
        let (q, g) = unsafe { (qp_of(qp), crate::convert::gid_addr(&*gid)) };
        match q.qp.detach_mcast(g) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })())
}

/// `ferroce_qp_last_error`, a ferroce extension: why the QP's work failed — its first error
/// since RESET as one line ("REM_ACCESS_ERR (wr_id 50): 10.0.0.2 QPN 0x10004 answered PSN
/// 0x12 with a NAK: remote access error: ..."), written NUL-terminated into `buf` (at most
/// `len` bytes, cut if longer). Returns the whole line's length (as `snprintf`), 0 if the QP
/// has had no error, or -1 with errno EINVAL for a NULL QP. Find it with
/// `dlsym(RTLD_DEFAULT, "ferroce_qp_last_error")`: it exists only in ferroce's library.
///
/// # Safety
/// `qp` is a live QP of this library; `buf` is NULL or holds `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_qp_last_error(
    qp: *mut ibv_qp,
    buf: *mut core::ffi::c_char,
    len: usize,
) -> c_int {
    if qp.is_null() {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: `qp` is a QP of this library the program has not destroyed (checked non-null).
    let q = unsafe { qp_of(qp) };
    let Some(e) = q.qp.last_error() else {
        return 0;
    };
    let line = format!("{} (wr_id {}): {e}", status_name(e.status), e.wr_id);
    if !buf.is_null() && len > 0 {
        let n = line.len().min(len - 1);
        // SAFETY: `buf` holds `len` writable bytes (the caller's contract) and n + 1 <= len; the source is this function's own string, which cannot overlap it.
        unsafe {
            core::ptr::copy_nonoverlapping(line.as_ptr(), buf.cast::<u8>(), n);
            buf.add(n).write(0);
        }
    }
    c_int::try_from(line.len()).unwrap_or(c_int::MAX)
}

/// The C name of a completion status (`IBV_WC_REM_ACCESS_ERR` without its prefix).
fn status_name(s: ferroce::WcStatus) -> String {
    let upper: String = format!("{s:?}")
        .chars()
        .flat_map(|c| {
            let sep = c.is_ascii_uppercase().then_some('_');
            sep.into_iter()
                .chain(core::iter::once(c.to_ascii_uppercase()))
        })
        .collect();
    upper.trim_start_matches('_').to_owned()
}
