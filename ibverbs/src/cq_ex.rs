//! The extended CQ (`ibv_create_cq_ex`) and its polling API: `ibv_start_poll` /
//! `ibv_next_poll` make one completion current (its `status` and `wr_id` in the `ibv_cq_ex`),
//! `ibv_wc_read_*` read its other fields, `ibv_end_poll` ends the pass.
//!
//! The fields of `IBV_WC_STANDARD_FLAGS` are offered; completion timestamps, CVLAN, flow tags
//! and tag matching are not (EOPNOTSUPP at creation), nor parent domains.

use core::ffi::{c_int, c_uint, c_void};

use ferroce::transport::WorkCompletion;

use crate::abi::*;
use crate::objects::cq_of;

/// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP` (the free-running clock, `CLOCK_MONOTONIC` in ns).
const WITH_COMPLETION_TIMESTAMP: u64 = 1 << 7;
/// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK` (ns since the Unix epoch).
const WITH_COMPLETION_TIMESTAMP_WALLCLOCK: u64 = 1 << 11;
/// `IBV_WC_STANDARD_FLAGS` (byte_len, imm, qp_num, src_qp, slid, sl, dlid_path_bits) and the
/// two completion timestamps.
pub const WC_FLAGS_SUPPORTED: u64 =
    0x7f | WITH_COMPLETION_TIMESTAMP | WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
/// `IBV_CQ_INIT_ATTR_MASK_FLAGS` (single-threaded, ignore-overrun hints: accepted).
const CQ_INIT_ATTR_MASK_FLAGS: u32 = 1 << 0;

/// A new CQ's C face with every polling slot filled.
pub fn cq_ex(
    context: *mut ibv_context,
    channel: *mut ibv_comp_channel,
    cq_context: *mut c_void,
    handle: u32,
    cqe: c_int,
) -> ibv_cq_ex {
    ibv_cq_ex {
        context,
        channel,
        cq_context,
        handle,
        cqe,
        mutex: mutex_init(),
        cond: cond_init(),
        comp_events_completed: 0,
        async_events_completed: 0,
        comp_mask: 0,
        status: 0,
        wr_id: 0,
        start_poll: Some(start_poll),
        next_poll: Some(next_poll),
        end_poll: Some(end_poll),
        read_opcode: Some(read_opcode),
        read_vendor_err: Some(read_vendor_err),
        read_byte_len: Some(read_byte_len),
        read_imm_data: Some(read_imm_data),
        read_qp_num: Some(read_qp_num),
        read_src_qp: Some(read_src_qp),
        read_wc_flags: Some(read_wc_flags),
        read_slid: Some(read_zero_u32),
        read_sl: Some(read_sl),
        read_dlid_path_bits: Some(read_zero_u8),
        read_completion_ts: Some(read_completion_ts),
        read_cvlan: Some(read_zero_u16),
        read_flow_tag: Some(read_zero_u32),
        read_tm_info: Some(read_tm_info),
        read_completion_wallclock_ns: Some(read_completion_wallclock_ns),
    }
}

/// The `verbs_context.create_cq_ex` behind verbs.h's `ibv_create_cq_ex`.
pub(crate) unsafe extern "C" fn vctx_create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    if attr.is_null() {
        crate::set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    // SAFETY: ibv_create_cq_ex passes a valid, non-NULL (checked) init attribute struct.
    let a = unsafe { &*attr };
    if a.wc_flags & !WC_FLAGS_SUPPORTED != 0 || a.comp_mask & !CQ_INIT_ATTR_MASK_FLAGS != 0 {
        log::debug!(
            "ibv_create_cq_ex: wc_flags {:#x} / comp_mask {:#x} not offered (CVLAN, flow tag, tag matching; EOPNOTSUPP)",
            a.wc_flags & !WC_FLAGS_SUPPORTED,
            a.comp_mask & !CQ_INIT_ATTR_MASK_FLAGS
        );
        crate::set_errno(libc::EOPNOTSUPP);
        return core::ptr::null_mut();
    }
    let (cqe, ctx_of_cq, ch, vector) = (a.cqe, a.cq_context, a.channel, a.comp_vector);
    // SAFETY: verbs passes an open context of ours, and `ch` is NULL or a live channel of it, which is create_cq's contract.
    let cq = unsafe { crate::cq::create_cq(context, cqe, ctx_of_cq, ch, vector) };
    if !cq.is_null()
        && a.wc_flags & (WITH_COMPLETION_TIMESTAMP | WITH_COMPLETION_TIMESTAMP_WALLCLOCK) != 0
    {
        // SAFETY: `cq` was just created by this library and is live.
        unsafe { cq_of(cq.cast()) }.cq.stamp_completions();
    }
    cq
}

/// Polls one completion into `current` and the C-visible `status`/`wr_id`; ENOENT if none.
///
/// # Safety
/// `cq` is a live CQ of ours, polled by one thread at a time (verbs' rule for this API).
unsafe fn poll_one(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: `cq` is a live CQ of this library (this function's contract).
    let q = unsafe { cq_of(cq.cast()) };
    let Some(wc) = q.cq.poll_one() else {
        return libc::ENOENT;
    };
    *q.current.lock() = wc;
    // SAFETY: the poller owns these two fields between start_poll and end_poll.
    unsafe {
        (&raw mut (*cq).status).write(wc.status as c_int);
        (&raw mut (*cq).wr_id).write(wc.wr_id);
    }
    0
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: attr is NULL or valid.
    if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: verbs calls the CQ's own ops with the live CQ, one poller at a time.
    unsafe { poll_one(cq) }
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: verbs calls the CQ's own ops with the live CQ, one poller at a time.
    unsafe { poll_one(cq) }
}

unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    let _ = cq;
}

/// The current completion.
///
/// # Safety
/// `cq` is a live CQ of ours.
unsafe fn cur(cq: *mut ibv_cq_ex) -> WorkCompletion {
    // SAFETY: `cq` is a live CQ of this library (this function's contract).
    *unsafe { cq_of(cq.cast()) }.current.lock()
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: verbs calls the CQ's own ops with the live CQ they belong to.
    unsafe { cur(cq) }.opcode as c_int
}

unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: verbs calls the CQ's own ops with the live CQ they belong to.
    unsafe { cur(cq) }.vendor_err
}

unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: verbs calls the CQ's own ops with the live CQ they belong to.
    unsafe { cur(cq) }.byte_len
}

/// `ibv_wc_read_imm_data` and `ibv_wc_read_invalidated_rkey` (verbs.h routes both here).
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: verbs calls this slot of the CQ's ops only with the live CQ it belongs to.
    let wc = unsafe { cur(cq) };
    if wc.wc_flags.contains(ferroce::transport::WcFlags::WITH_INV) {
        wc.invalidated_rkey
    } else {
        wc.imm_data.to_be()
    }
}

unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: verbs calls the CQ's own ops with the live CQ they belong to.
    unsafe { cur(cq) }.qp_num
}

unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: verbs calls the CQ's own ops with the live CQ they belong to.
    unsafe { cur(cq) }.src_qp
}

/// When the completion reached the CQ, on the free-running clock (ns; `hca_core_clock` is
/// 1 GHz): 0 unless the CQ was created with a timestamp flag.
unsafe extern "C" fn read_completion_ts(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: verbs calls the CQ's own ops with the live CQ they belong to.
    unsafe { cur(cq) }.completion_ts
}

/// The same moment in ns since the Unix epoch.
unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: verbs calls the CQ's own ops with the live CQ they belong to.
    unsafe { cur(cq) }.completion_wallclock_ns
}

/// The packet type of a UD receive (see `WorkCompletion::sl`), 0 otherwise.
unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    // SAFETY: verbs calls the CQ's own ops with the live CQ they belong to.
    unsafe { cur(cq) }.sl
}

unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    // SAFETY: verbs calls the CQ's own ops with the live CQ they belong to.
    unsafe { cur(cq) }.wc_flags.0
}

/// SLID and the rest are 0 on RoCE (no LIDs on UDP).
unsafe extern "C" fn read_zero_u32(cq: *mut ibv_cq_ex) -> u32 {
    let _ = cq;
    0
}

unsafe extern "C" fn read_zero_u16(cq: *mut ibv_cq_ex) -> u16 {
    let _ = cq;
    0
}

unsafe extern "C" fn read_zero_u8(cq: *mut ibv_cq_ex) -> u8 {
    let _ = cq;
    0
}

unsafe extern "C" fn read_tm_info(cq: *mut ibv_cq_ex, info: *mut c_void) {
    let _ = cq;
    if !info.is_null() {
        // SAFETY: info points at a struct ibv_wc_tm_info (16 bytes: u64 tag, u32 priv, pad).
        unsafe { core::ptr::write_bytes(info.cast::<u8>(), 0, 16) };
    }
}
