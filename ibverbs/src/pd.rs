//! Protection domains: `ibv_alloc_pd`, `ibv_dealloc_pd`.

use core::ffi::c_int;

use crate::abi::*;
use crate::device::ctx_of;
use crate::objects::*;

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
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if pd.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `pd` is a PD of this library the program has not deallocated (verbs' rule).
        let p = unsafe { pd_of(pd) };
        if p.pd.in_use() {
            log::debug!("ibv_dealloc_pd: memory regions, QPs or AHs of the PD still live");
            return libc::EBUSY;
        }
        // SAFETY: nothing of ferroce refers to the PD any more (no child: checked above), and the program gives up `pd` with this call.
        unsafe { Pd::free(pd) };
        0
    })())
}
