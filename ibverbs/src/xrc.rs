//! XRC: `ibv_open_xrcd`/`ibv_close_xrcd`, `ibv_create_srq_ex` (basic and XRC SRQs),
//! `ibv_get_srq_num`, XRC_RECV QPs of `ibv_create_qp_ex` and `ibv_open_qp` — the
//! `verbs_context` slots verbs.h's inline functions call.
//!
//! A domain opened with a file is found again by that file (its device and inode) in this
//! process, as the kernel does: a second `ibv_open_xrcd` on the same file reaches the same
//! domain (EINVAL with `O_EXCL`), and without `O_CREAT` an unknown one is EAGAIN. Domains are
//! per process here (see docs/semantics.md).

use core::ffi::c_int;

use ferroce::transport::SrqAttr;
use parking_lot::Mutex;

use crate::abi::*;
use crate::device::ctx_of;
use crate::errno_of;
use crate::handle::EventAcks;
use crate::objects::*;
use crate::qp::{QpHandle, publish_qp};

/// One domain opened by a file: (context, device, inode), the domain and its open handles.
type FileDomain = ((usize, u64, u64), ferroce::XrcDomain, usize);

/// The domains opened by a file and not yet closed by every handle.
static BY_FILE: Mutex<Vec<FileDomain>> = Mutex::new(Vec::new());

/// `verbs_context.open_xrcd` (`ibv_open_xrcd`).
pub(crate) unsafe extern "C" fn vctx_open_xrcd(
    context: *mut ibv_context,
    attr: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd {
    if context.is_null() || attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: verbs' contract: `context` is a live context of ours and `attr` is readable.
    let (c, a) = unsafe { (ctx_of(context), &*attr) };
    let want = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    if a.comp_mask & want != want || a.comp_mask & !want != 0 {
        log::debug!(
            "ibv_open_xrcd: comp_mask {:#x} must hold IBV_XRCD_INIT_ATTR_FD and _OFLAGS, nothing else (EINVAL)",
            a.comp_mask
        );
        return fail(libc::EINVAL);
    }
    if a.oflags & !(libc::O_CREAT | libc::O_EXCL) != 0 {
        log::debug!(
            "ibv_open_xrcd: oflags {:#x} beyond O_CREAT | O_EXCL (EINVAL)",
            a.oflags
        );
        return fail(libc::EINVAL);
    }
    let create = a.oflags & libc::O_CREAT != 0;
    let file = if a.fd == -1 {
        None
    } else {
        // SAFETY: `struct stat` is plain integers, for which all-zero bytes are a valid value.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: `st` is a valid stat buffer for the call to fill.
        if unsafe { libc::fstat(a.fd, &mut st) } != 0 {
            log::debug!("ibv_open_xrcd: fd {} is not an open file (EBADF)", a.fd);
            return fail(libc::EBADF);
        }
        Some((st.st_dev, st.st_ino))
    };
    let xrcd = match file {
        None => {
            if !create {
                log::debug!("ibv_open_xrcd: no file and no O_CREAT: nothing to open (EAGAIN)");
                return fail(libc::EAGAIN);
            }
            c.ctx.open_xrcd()
        }
        Some((dev, ino)) => {
            let key = (context as usize, dev, ino);
            let mut t = BY_FILE.lock();
            match t.iter_mut().find(|e| e.0 == key) {
                Some(e) if a.oflags & libc::O_EXCL != 0 && create => {
                    let _ = e;
                    log::debug!("ibv_open_xrcd: the file's domain exists and O_EXCL (EINVAL)");
                    return fail(libc::EINVAL);
                }
                Some(e) => {
                    e.2 += 1;
                    e.1.clone()
                }
                None if !create => {
                    log::debug!("ibv_open_xrcd: the file has no domain and no O_CREAT (EAGAIN)");
                    return fail(libc::EAGAIN);
                }
                None => {
                    let d = c.ctx.open_xrcd();
                    t.push((key, d.clone(), 1));
                    d
                }
            }
        }
    };
    Xrcd::into_raw(ibv_xrcd { context }, XrcdInner { xrcd, file })
}

/// `verbs_context.close_xrcd` (`ibv_close_xrcd`): the handle goes; the domain lives on while
/// another handle, SRQ or QP of it does.
pub(crate) unsafe extern "C" fn vctx_close_xrcd(x: *mut ibv_xrcd) -> c_int {
    if x.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: verbs' contract: `x` is a domain of ours the program has not closed; its context is written only at open.
    let (inner, context) = unsafe { (xrcd_of(x), (*x).context) };
    if let Some((dev, ino)) = inner.file {
        let key = (context as usize, dev, ino);
        let mut t = BY_FILE.lock();
        if let Some(i) = t.iter().position(|e| e.0 == key) {
            t[i].2 -= 1;
            if t[i].2 == 0 {
                t.swap_remove(i);
            }
        }
    }
    // SAFETY: the program gives the handle up with this call; nothing of ours keeps its pointer.
    unsafe { Xrcd::free(x) };
    0
}

/// `verbs_context.create_srq_ex` (`ibv_create_srq_ex` with more than a PD and the basic
/// type): a basic SRQ, or an XRC SRQ of a domain with its PD and CQ. Tag matching is not
/// offered (EOPNOTSUPP).
pub(crate) unsafe extern "C" fn vctx_create_srq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    if context.is_null() || attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: verbs' contract: `attr` is valid for reading and writing.
    let a = unsafe { &mut *attr };
    let known = IBV_SRQ_INIT_ATTR_TYPE
        | IBV_SRQ_INIT_ATTR_PD
        | IBV_SRQ_INIT_ATTR_XRCD
        | IBV_SRQ_INIT_ATTR_CQ;
    if a.comp_mask & !known != 0 {
        log::debug!(
            "ibv_create_srq_ex: comp_mask bits {:#x} (tag matching) are not offered (EOPNOTSUPP)",
            a.comp_mask & !known
        );
        return fail(libc::EOPNOTSUPP);
    }
    let srq_type = if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 {
        a.srq_type
    } else {
        0
    };
    if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
        log::debug!("ibv_create_srq_ex: an SRQ needs IBV_SRQ_INIT_ATTR_PD and a PD (EINVAL)");
        return fail(libc::EINVAL);
    }
    match srq_type {
        0 => {
            let mut base = ibv_srq_init_attr {
                srq_context: a.srq_context,
                attr: a.attr,
            };
            // SAFETY: the PD is a live PD of ours (verbs' contract); `base` is valid.
            let s = unsafe { crate::srq::ibv_create_srq(a.pd, &mut base) };
            a.attr = base.attr;
            s
        }
        1 => {
            let need = IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
            if a.comp_mask & need != need || a.xrcd.is_null() || a.cq.is_null() {
                log::debug!(
                    "ibv_create_srq_ex: an XRC SRQ needs IBV_SRQ_INIT_ATTR_XRCD and _CQ with a domain and a CQ (EINVAL)"
                );
                return fail(libc::EINVAL);
            }
            // SAFETY: verbs' contract: the PD, domain and CQ are live objects of ours.
            let (p, x, cq) = unsafe { (pd_of(a.pd), xrcd_of(a.xrcd), cq_of(a.cq)) };
            let r = x.xrcd.create_srq(
                &p.pd,
                &cq.cq,
                SrqAttr {
                    max_wr: a.attr.max_wr,
                    max_sge: a.attr.max_sge.max(1),
                    srq_limit: a.attr.srq_limit,
                },
            );
            match r {
                Ok(srq) => {
                    let num = srq.srq_num();
                    let ptr = Srq::into_raw(
                        ibv_srq {
                            context,
                            srq_context: a.srq_context,
                            pd: a.pd,
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
                    // SAFETY: `context` is live (verbs' contract).
                    unsafe { ctx_of(context) }
                        .srqs
                        .lock()
                        .insert(num, ptr as usize);
                    ptr
                }
                Err(e) => fail(errno_of(&e)),
            }
        }
        t => {
            log::debug!(
                "ibv_create_srq_ex: SRQ type {t} (tag matching) is not offered (EOPNOTSUPP)"
            );
            fail(libc::EOPNOTSUPP)
        }
    }
}

/// `verbs_context.get_srq_num` (`ibv_get_srq_num`): the number an XRC sender puts in
/// `remote_srqn`.
pub(crate) unsafe extern "C" fn vctx_get_srq_num(srq: *mut ibv_srq, num: *mut u32) -> c_int {
    if srq.is_null() || num.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: verbs' contract: `srq` is a live SRQ of ours and `num` is writable.
    unsafe { num.write(srq_of(srq).srq.srq_num()) };
    0
}

/// The XRC_RECV branch of `ibv_create_qp_ex`: a receive QP of the domain `attr.xrcd` (no PD,
/// CQs or SRQ of its own; `cap` comes back zero).
///
/// # Safety
/// `context` is a live context of ours; `a.xrcd` is NULL or a live domain of it.
pub(crate) unsafe fn create_xrc_recv_qp(
    context: *mut ibv_context,
    a: &mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    if a.comp_mask & IBV_QP_INIT_ATTR_XRCD == 0 || a.xrcd.is_null() {
        log::debug!(
            "ibv_create_qp_ex: an XRC_RECV QP needs IBV_QP_INIT_ATTR_XRCD and a domain (EINVAL)"
        );
        return fail(libc::EINVAL);
    }
    // SAFETY: a.xrcd is a live domain of ours (this function's contract).
    let x = unsafe { xrcd_of(a.xrcd) };
    let qp = match x.xrcd.create_qp() {
        Ok(q) => q,
        Err(e) => return fail(errno_of(&e)),
    };
    a.cap = ibv_qp_cap::default();
    let c = QpHandle {
        context,
        qp_context: a.qp_context,
        pd: core::ptr::null_mut(),
        cqs: (core::ptr::null_mut(), core::ptr::null_mut()),
        srq: core::ptr::null_mut(),
        qp_type: a.qp_type,
    };
    // SAFETY: `context` is live (this function's contract).
    unsafe { publish_qp(c, qp, false, false) }
}

/// `verbs_context.open_qp` (`ibv_open_qp`): another handle on an XRC_RECV QP of the domain,
/// found by its number (this process's QPs only). The QP lives while any handle does.
pub(crate) unsafe extern "C" fn vctx_open_qp(
    context: *mut ibv_context,
    attr: *mut ibv_qp_open_attr,
) -> *mut ibv_qp {
    if context.is_null() || attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: verbs' contract: `context` is live and `attr` readable.
    let (c, a) = unsafe { (ctx_of(context), &*attr) };
    if a.comp_mask & IBV_QP_OPEN_ATTR_ALL != IBV_QP_OPEN_ATTR_ALL
        || a.xrcd.is_null()
        || a.qp_type != ferroce::QpType::XrcRecv as c_int
    {
        log::debug!(
            "ibv_open_qp: needs the QP number, a domain, the context and type XRC_RECV (EINVAL)"
        );
        return fail(libc::EINVAL);
    }
    // SAFETY: a.xrcd is a live domain of ours (verbs' contract).
    let x = unsafe { xrcd_of(a.xrcd) };
    let found = c.qps.lock().get(&a.qp_num).copied();
    // SAFETY: the table holds live QPs of this context (each leaves it before it is freed), and the lock is held no longer than the lookup: the program destroys a QP it opens only after this call.
    let qp = found.map(|p| unsafe { qp_of(p as *mut ibv_qp) }.qp.clone());
    let Some(qp) = qp.filter(|q| {
        q.qp_type() == ferroce::QpType::XrcRecv && q.xrc_domain() == Some(x.xrcd.handle())
    }) else {
        log::debug!(
            "ibv_open_qp: no XRC_RECV QP {:#x} in this domain in this process (ENOENT)",
            a.qp_num
        );
        return fail(libc::ENOENT);
    };
    let h = QpHandle {
        context,
        qp_context: a.qp_context,
        pd: core::ptr::null_mut(),
        cqs: (core::ptr::null_mut(), core::ptr::null_mut()),
        srq: core::ptr::null_mut(),
        qp_type: a.qp_type,
    };
    // SAFETY: `context` is live (verbs' contract).
    unsafe { publish_qp(h, qp, false, true) }
}
