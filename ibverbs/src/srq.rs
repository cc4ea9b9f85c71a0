//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq`, `ibv_query_srq`,
//! `ibv_destroy_srq`.

use core::ffi::c_int;

use ferroce::transport::SrqAttr;

use crate::abi::*;
use crate::device::ctx_of;
use crate::errno_of;
use crate::handle::EventAcks;
use crate::objects::*;

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
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if srq.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        if mask & 1 != 0 {
            log::debug!("ibv_modify_srq: IBV_SRQ_MAX_WR (resizing an SRQ) is not offered");
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
    })())
}

/// `ibv_query_srq`.
///
/// # Safety
/// `srq` is live; `attr` is valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
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
    })())
}

/// `ibv_destroy_srq`: EBUSY while a QP receives through it (as rxe).
///
/// # Safety
/// `srq` is live and not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if srq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `srq` is an SRQ of this library the program has not destroyed; its `context` and `handle` are written only at creation, and the context outlives it.
        let (s, c, handle) = unsafe { (srq_of(srq), ctx_of((*srq).context), (*srq).handle) };
        if s.srq.in_use() {
            log::debug!("ibv_destroy_srq: a QP still receives through the SRQ (EBUSY)");
            return libc::EBUSY;
        }
        // Out of the table first: no async event can be handed out for it after this.
        c.srqs.lock().remove(&handle);
        s.events.wait_all_acked();
        // SAFETY: the SRQ is in no table and every event handed out for it has been acknowledged; the program gives it up with this call.
        unsafe { Srq::free(srq) };
        0
    })())
}
