//! Memory regions: `ibv_reg_mr` and its variants, `ibv_dereg_mr`.

use core::ffi::{c_int, c_uint, c_void};

use ferroce::transport::AccessFlags;

use crate::abi::*;
use crate::errno_of;
use crate::objects::*;

/// Access bits ferroce implements (MW_BIND lets memory windows open onto the region);
/// ON_DEMAND is what every ferroce region is anyway (never pinned, pages faulted in on access;
/// it must stay mapped while registered), and with a NULL address and SIZE_MAX length makes
/// the implicit region over the whole address space; HUGETLB is a hint, and the optional
/// range (relaxed ordering, ...) may be ignored by definition. ZERO_BASED is for memory
/// windows (and device memory), not regions: refused, as rxe does. FLUSH_GLOBAL lets peers
/// FLUSH the region; FLUSH_PERSISTENT is known but refused by the library (EINVAL: ferroce's
/// regions are not persistent memory, and rxe refuses it for pages that are not pmem).
const ACCESS_KNOWN: c_uint = 0x1f | IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB | ACCESS_FLUSH;
/// The bits of a region's access the library keeps: the remote rights, MW_BIND and the flushes.
const ACCESS_KEPT: c_uint = 0x1f | ACCESS_FLUSH;
/// `IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT`.
const ACCESS_FLUSH: c_uint = (1 << 8) | (1 << 9);
const IBV_ACCESS_ON_DEMAND: c_uint = 1 << 6;
const IBV_ACCESS_HUGETLB: c_uint = 1 << 7;
const ACCESS_OPTIONAL_RANGE: c_uint = 0x3ff << 20;

/// What `ibv_reg_mr`, `ibv_reg_mr_iova` and `ibv_reg_mr_iova2` share: checks the access bits
/// and the range (`NULL, SIZE_MAX` with `IBV_ACCESS_ON_DEMAND` is implicit on-demand paging)
/// and registers the region, or returns NULL with `errno` set.
///
/// # Safety
/// `pd` is NULL or a PD of this library the program has not deallocated; `addr..addr+length`
/// keeps verbs' `ibv_reg_mr` contract (readable and writable until `ibv_dereg_mr` returns).
unsafe fn reg(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    if pd.is_null() {
        return fail(libc::EINVAL);
    }
    let access = access & !ACCESS_OPTIONAL_RANGE;
    if access & !ACCESS_KNOWN != 0 {
        log::debug!(
            "ibv_reg_mr: access bits {:#x} not offered (ZERO_BASED is for memory windows; \
             EOPNOTSUPP)",
            access & !ACCESS_KNOWN
        );
        return fail(libc::EOPNOTSUPP);
    }
    let implicit = addr.is_null() && length == usize::MAX;
    if implicit && access & IBV_ACCESS_ON_DEMAND == 0 {
        log::debug!(
            "ibv_reg_mr: NULL, SIZE_MAX is implicit ODP and needs IBV_ACCESS_ON_DEMAND (EINVAL)"
        );
        return fail(libc::EINVAL);
    }
    if addr.is_null() && length != 0 && !implicit {
        log::debug!("ibv_reg_mr: a NULL address with length {length} (EINVAL)");
        return fail(libc::EINVAL);
    }
    // SAFETY: `pd` is a PD of this library the program has not deallocated (verbs' rule).
    let p = unsafe { pd_of(pd) };
    let flags = AccessFlags(access & ACCESS_KEPT);
    let r = if implicit {
        // SAFETY: a program registering the whole address space hands the network every address it names through the region, as a NIC's implicit ODP does; C memory is outside Rust's references, and an access to a range unmapped meanwhile is refused before it is touched.
        unsafe { p.pd.reg_mr_implicit(flags) }
    } else {
        // SAFETY: verbs' ibv_reg_mr contract keeps addr..addr+length readable and writable until ibv_dereg_mr returns (when the region's dereg returns), C memory is outside Rust's references, and the aligned words around it lie in the same pages.
        unsafe { p.pd.reg_mr_iova_raw(addr.cast(), length, iova, flags) }
    };
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
            MrInner {
                mr: parking_lot::Mutex::new(mr),
            },
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
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if mr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `mr` is an MR of this library the program has not deregistered (verbs' rule).
        let m = unsafe { Mr::rust(mr) };
        let windows = m.mr.lock().windows_bound();
        if windows > 0 {
            log::debug!("ibv_dereg_mr: {windows} memory windows are bound onto the region (EBUSY)");
            return libc::EBUSY;
        }
        // When dereg returns, no copy into or out of the program's memory runs or can start.
        m.mr.lock().clone().dereg();
        // SAFETY: nothing of ferroce refers to the Mr box (MRs are in no table of this crate), and the program gives up `mr` with this call.
        unsafe { Mr::free(mr) };
        0
    })())
}

/// `IBV_REREG_MR_CHANGE_TRANSLATION`, `_CHANGE_PD`, `_CHANGE_ACCESS`.
const REREG_TRANSLATION: c_int = 1;
const REREG_PD: c_int = 2;
const REREG_ACCESS: c_int = 4;
/// `IBV_REREG_MR_ERR_INPUT`: the call changed nothing (errno says why).
const REREG_ERR_INPUT: c_int = -1;

/// `ibv_rereg_mr`: a new translation (`addr`, `length`), PD or access for `mr`, under the same
/// lkey and rkey (as rxe); `mr`'s fields follow. On failure nothing changed:
/// `IBV_REREG_MR_ERR_INPUT` with errno set (EINVAL, EOPNOTSUPP for unknown access bits).
///
/// # Safety
/// `mr` is live; with `IBV_REREG_MR_CHANGE_PD`, `pd` is a live PD of the same context; with
/// `IBV_REREG_MR_CHANGE_TRANSLATION`, `addr..addr+length` carries `ibv_reg_mr`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let refuse = |e: c_int, why: &str| {
        log::debug!("ibv_rereg_mr: {why}");
        crate::set_errno(e);
        REREG_ERR_INPUT
    };
    if mr.is_null() || flags == 0 || flags & !(REREG_TRANSLATION | REREG_PD | REREG_ACCESS) != 0 {
        return refuse(
            libc::EINVAL,
            "no MR, or flags not a set of CHANGE_TRANSLATION, CHANGE_PD, CHANGE_ACCESS",
        );
    }
    if flags & REREG_PD != 0 && pd.is_null() {
        return refuse(libc::EINVAL, "CHANGE_PD without a PD");
    }
    if flags & REREG_TRANSLATION != 0 && (addr.is_null() || length == 0) {
        return refuse(libc::EINVAL, "CHANGE_TRANSLATION without memory");
    }
    let access = access as c_uint & !ACCESS_OPTIONAL_RANGE;
    if flags & REREG_ACCESS != 0 && access & !ACCESS_KNOWN != 0 {
        return refuse(libc::EOPNOTSUPP, "access bits ferroce does not offer");
    }
    // SAFETY: `mr` is an MR of this library the program has not deregistered (this function's contract).
    let (m, old_pd) = unsafe { (Mr::rust(mr), (*mr).pd) };
    let new_pd = if flags & REREG_PD != 0 { pd } else { old_pd };
    // SAFETY: `new_pd` is the MR's own live PD or a live PD the program passed (this function's contract).
    let p = unsafe { pd_of(new_pd) };
    let mut cur = m.mr.lock();
    let acc = if flags & REREG_ACCESS != 0 {
        AccessFlags(access & ACCESS_KEPT)
    } else {
        cur.access()
    };
    let translation = (flags & REREG_TRANSLATION != 0).then_some((addr.cast::<u8>(), length));
    // SAFETY: a new translation carries ibv_reg_mr's contract (this function's), which is rereg_mr_raw's.
    match unsafe { p.pd.rereg_mr_raw(&cur, translation, acc) } {
        Ok(next) => {
            // SAFETY: `mr` is live and its fields are the program's to read only; this call owns the update (verbs forbids concurrent use of an MR being re-registered).
            unsafe {
                (*mr).pd = new_pd;
                if let Some((a, l)) = translation {
                    (*mr).addr = a.cast();
                    (*mr).length = l;
                }
            }
            *cur = next;
            0
        }
        Err(e) => refuse(errno_of(&e), &e.to_string()),
    }
}

/// `verbs_context.advise_mr` (behind verbs.h's `ibv_advise_mr`): prefetch of on-demand pages.
pub(crate) unsafe extern "C" fn vctx_advise_mr(
    pd: *mut ibv_pd,
    advice: c_uint,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    use ferroce::MrAdvice;
    // IBV_ADVISE_MR_FLAG_FLUSH: wait until done, which a prefetch here always does.
    const FLAG_FLUSH: u32 = 1;
    let advice = match advice {
        0 => MrAdvice::Prefetch,
        1 => MrAdvice::PrefetchWrite,
        2 => MrAdvice::PrefetchNoFault,
        _ => {
            log::debug!("ibv_advise_mr: advice {advice} (EOPNOTSUPP)");
            return libc::EOPNOTSUPP;
        }
    };
    if pd.is_null() || flags & !FLAG_FLUSH != 0 || num_sge == 0 || sg_list.is_null() {
        log::debug!("ibv_advise_mr: no PD, SGEs, or flags {flags:#x} (EINVAL)");
        return libc::EINVAL;
    }
    // SAFETY: verbs' contract: `pd` is a live PD of ours and `sg_list` holds `num_sge` SGEs (read unaligned, the iterator used up below).
    let (p, sges) = unsafe {
        (
            pd_of(pd),
            crate::data::read_array(sg_list, num_sge as usize),
        )
    };
    let sges: Vec<ferroce::Sge> = sges
        .map(|s| ferroce::Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect();
    match p.pd.advise_mr(advice, &sges) {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}
