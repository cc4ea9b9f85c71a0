//! Address handles: `ibv_create_ah`, `ibv_destroy_ah`, and the AH that answers a UD receive
//! (`ibv_init_ah_from_wc`, `ibv_create_ah_from_wc`).

use core::ffi::c_int;

use crate::abi::*;
use crate::convert::*;
use crate::objects::*;
use crate::{errno_of, set_errno};

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
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if ah.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `ah` is an AH of this library the program has not destroyed; AHs are in no table and have no events, so nothing else refers to it; the program gives it up here.
        unsafe { Ah::free(ah) };
        0
    })())
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
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        let _ = (context, port_num);
        if wc.is_null() || grh.is_null() || ah_attr.is_null() {
            return -1;
        }
        // SAFETY: wc is valid.
        if unsafe { (*wc).wc_flags } & 1 == 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: grh points at the 40 readable bytes at the start of the receive buffer (this function's contract); they are copied out, no reference is kept.
        let bytes = unsafe { grh.cast::<[u8; 40]>().read_unaligned() };
        match ah_attr_from_grh(&bytes) {
            Ok(a) => {
                // SAFETY: ah_attr is valid for writing (this function's contract).
                unsafe { ah_attr.write(a) };
                0
            }
            Err(e) => {
                set_errno(e);
                e
            }
        }
    })())
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
