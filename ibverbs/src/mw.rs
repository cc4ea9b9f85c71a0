//! Memory windows: `ibv_alloc_mw`, `ibv_bind_mw` (type 1), `ibv_dealloc_mw` (verbs.h reaches
//! them through the context's ops). Type 2 windows are bound, and invalidated, by work
//! requests (`IBV_WR_BIND_MW`, `IBV_WR_LOCAL_INV`, `IBV_WR_SEND_WITH_INV`, see `data.rs`).

use core::ffi::c_int;

use ferroce::MwType;
use ferroce::transport::AccessFlags;

use crate::abi::*;
use crate::errno_of;
use crate::objects::*;

/// Window rights a bind grants: remote READ, WRITE, ATOMIC, and ZERO_BASED (a type 2 window
/// addressed by offset); LOCAL_WRITE and MW_BIND may be passed along (as rxe takes them) and
/// mean nothing for a window.
const MW_ACCESS: u32 = 2 | 4 | 8 | IBV_ACCESS_ZERO_BASED;
const MW_ACCESS_TAKEN: u32 = 0x1f | IBV_ACCESS_ZERO_BASED;
/// `IBV_ACCESS_ZERO_BASED`.
const IBV_ACCESS_ZERO_BASED: u32 = 1 << 5;

/// `ops.alloc_mw` (behind `ibv_alloc_mw`).
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, kind: c_int) -> *mut ibv_mw {
    let kind = match kind {
        1 => MwType::Type1,
        2 => MwType::Type2,
        _ => {
            log::debug!("ibv_alloc_mw: type {kind} is no window type (1 or 2)");
            return fail(libc::EINVAL);
        }
    };
    if pd.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: verbs passes a live PD of ours.
    let p = unsafe { pd_of(pd) };
    match p.pd.alloc_mw(kind) {
        Ok(mw) => Mw::into_raw(
            ibv_mw {
                // SAFETY: a live PD's `context` is written only at creation.
                context: unsafe { (*pd).context },
                pd,
                rkey: mw.rkey(),
                handle: mw.rkey() >> 8,
                type_: kind as c_int,
            },
            MwInner { mw },
        ),
        Err(e) => fail(errno_of(&e)),
    }
}

/// `ops.dealloc_mw` (behind `ibv_dealloc_mw`): a bound window closes with it.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    crate::status((|| {
        if mw.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `mw` is a window of this library the program has not deallocated; windows are in no table of this crate and have no events, so nothing else refers to the box; the program gives it up here.
        unsafe { Mw::free(mw) };
        0
    })())
}

/// The engine's bind of the window `mw` names with `info`, under `new_rkey`.
///
/// # Safety
/// `mw` is a live window of ours; `info.mr` is NULL or a live MR of ours.
pub(crate) unsafe fn mw_bind_of(
    mw: *mut ibv_mw,
    new_rkey: u32,
    info: &ibv_mw_bind_info,
) -> Result<ferroce::transport::MwBind, c_int> {
    if mw.is_null() || info.mw_access_flags & !MW_ACCESS_TAKEN != 0 {
        log::debug!(
            "bind_mw: no window, or access bits {:#x} a window does not take",
            info.mw_access_flags
        );
        return Err(libc::EINVAL);
    }
    if info.mr.is_null() && info.length != 0 {
        log::debug!("bind_mw: a range without a region");
        return Err(libc::EINVAL);
    }
    // SAFETY: a non-NULL `info.mr` is a live MR of ours (this function's contract); `mw` is live.
    let (lkey, mw_rkey) = unsafe {
        (
            (!info.mr.is_null()).then(|| Mr::rust(info.mr).mr.lock().lkey()),
            (*mw).rkey,
        )
    };
    Ok(ferroce::transport::MwBind {
        mw_rkey,
        new_rkey,
        mr_lkey: lkey.unwrap_or(0),
        addr: info.addr,
        length: info.length,
        access: AccessFlags(info.mw_access_flags & MW_ACCESS),
    })
}

/// `ops.bind_mw` (behind `ibv_bind_mw`, which lets only type 1 windows through): posts the bind
/// on `qp` under the next key and sets `mw->rkey` to it.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    bind: *mut ibv_mw_bind,
) -> c_int {
    crate::status((|| {
        if qp.is_null() || mw.is_null() || bind.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: verbs passes a live QP and window of ours and a valid bind struct.
        let (q, m, b) = unsafe { (qp_of(qp), Mw::rust(mw), &*bind) };
        if m.mw.mw_type() != MwType::Type1 {
            log::debug!("ibv_bind_mw: a type 2 window is bound by an IBV_WR_BIND_MW work request");
            return libc::EINVAL;
        }
        if b.bind_info.mw_access_flags & IBV_ACCESS_ZERO_BASED != 0 {
            log::debug!("ibv_bind_mw: a type 1 window cannot be zero based (IBTA o10-36.2.2)");
            return libc::EINVAL;
        }
        // SAFETY: `mw` is live and ours; `bind_info.mr` is NULL or a live MR of ours (verbs' contract).
        let info = match unsafe { mw_bind_of(mw, ferroce::mw::inc_rkey((*mw).rkey), &b.bind_info) }
        {
            Ok(i) => i,
            Err(e) => return e,
        };
        let mut wr = ferroce::transport::SendWr::bind_mw(b.wr_id, info);
        wr.send_flags = ferroce::transport::SendFlags(b.send_flags & 0xf);
        match q.qp.post_send(&wr) {
            Ok(()) => {
                // SAFETY: `mw` is live; verbs has the program read `rkey`, which a bind sets.
                unsafe { (*mw).rkey = info.new_rkey };
                0
            }
            Err(e) => errno_of(&e),
        }
    })())
}
