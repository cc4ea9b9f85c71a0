//! The extended send API of `ibv_qp_ex` (`ibv_wr_start`, `ibv_wr_rdma_write`,
//! `ibv_wr_set_sge`, ..., `ibv_wr_complete`): work requests are built in a batch and posted
//! together by `ibv_wr_complete`.
//!
//! As in rdma-core, an error found while building (an operation ferroce does not offer, a
//! setter with no work request to set) is reported by `ibv_wr_complete`, which then posts
//! nothing; a request the QP refuses at posting (full queue, too long) stops the batch there,
//! the requests before it posted, as `ibv_post_send` does with `bad_wr`.

use core::ffi::{c_int, c_void};

use ferroce::transport::{
    FlushSpec, InlineData, RemoteAddr, SendFlags, SendWr, SgList, Sge, UdDest, WrOpcode,
};

use crate::abi::*;
use crate::errno_of;
use crate::objects::{QpInner, ah_of, qp_of};

/// `send_ops_flags` this library implements: RDMA_WRITE, RDMA_WRITE_WITH_IMM, SEND,
/// SEND_WITH_IMM, RDMA_READ, ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD, LOCAL_INV, BIND_MW,
/// SEND_WITH_INV, FLUSH (bit 11) and ATOMIC_WRITE (bit 12); not TSO (10).
pub const SEND_OPS_SUPPORTED: u64 =
    ((1 << 10) - 1) | IBV_QP_EX_WITH_FLUSH | IBV_QP_EX_WITH_ATOMIC_WRITE;

/// `IBV_QP_EX_WITH_FLUSH` (rdma-core 45 and later).
const IBV_QP_EX_WITH_FLUSH: u64 = 1 << 11;
/// `IBV_QP_EX_WITH_ATOMIC_WRITE`.
const IBV_QP_EX_WITH_ATOMIC_WRITE: u64 = 1 << 12;

/// The work requests between `ibv_wr_start` and `ibv_wr_complete`/`ibv_wr_abort`.
#[derive(Debug, Default)]
pub struct Batch {
    wrs: Vec<SendWr>,
    /// The first error met while building (reported by `ibv_wr_complete`).
    err: c_int,
}

/// The `ibv_qp_ex` around a new QP's `ibv_qp`, every slot filled.
pub fn qp_ex(base: ibv_qp) -> ibv_qp_ex {
    ibv_qp_ex {
        qp_base: base,
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        wr_atomic_cmp_swp: Some(wr_atomic_cmp_swp),
        wr_atomic_fetch_add: Some(wr_atomic_fetch_add),
        wr_bind_mw: Some(wr_bind_mw),
        wr_local_inv: Some(wr_local_inv),
        wr_rdma_read: Some(wr_rdma_read),
        wr_rdma_write: Some(wr_rdma_write),
        wr_rdma_write_imm: Some(wr_rdma_write_imm),
        wr_send: Some(wr_send),
        wr_send_imm: Some(wr_send_imm),
        wr_send_inv: Some(wr_send_inv),
        wr_send_tso: Some(wr_unsupported),
        wr_set_ud_addr: Some(wr_set_ud_addr),
        wr_set_xrc_srqn: Some(wr_set_xrc_srqn),
        wr_set_inline_data: Some(wr_set_inline_data),
        wr_set_inline_data_list: Some(wr_set_inline_data_list),
        wr_set_sge: Some(wr_set_sge),
        wr_set_sge_list: Some(wr_set_sge_list),
        wr_start: Some(wr_start),
        wr_complete: Some(wr_complete),
        wr_abort: Some(wr_abort),
        wr_atomic_write: Some(wr_atomic_write),
        wr_flush: Some(wr_flush),
    }
}

/// Runs `f` on the QP's batch.
///
/// # Safety
/// `qp` is the `ibv_qp_ex` of a live QP of ours.
unsafe fn with_batch<R>(qp: *mut ibv_qp_ex, f: impl FnOnce(&QpInner, &mut Batch) -> R) -> R {
    // SAFETY: the caller's qp is the ibv_qp_ex of a live QP of this library, which starts with its ibv_qp.
    let q = unsafe { qp_of(qp.cast()) };
    let mut b = q.batch.lock();
    f(q, &mut b)
}

/// Starts a work request of `opcode` with the QP's current `wr_id` and `wr_flags`.
///
/// # Safety
/// As [`with_batch`].
unsafe fn begin(qp: *mut ibv_qp_ex, opcode: WrOpcode, fill: impl FnOnce(&mut SendWr)) {
    // SAFETY: `qp` is the live QP's ibv_qp_ex (this function's contract, with_batch's); `wr_id` and `wr_flags` are the program's, set by this same thread before the call.
    let (wr_id, wr_flags) = unsafe { ((*qp).wr_id, (*qp).wr_flags) };
    // SAFETY: as just said, with_batch's contract holds.
    unsafe {
        with_batch(qp, |_, b| {
            let mut w = SendWr::new(wr_id, opcode);
            w.send_flags = SendFlags(wr_flags & 0xf);
            fill(&mut w);
            b.wrs.push(w);
        })
    }
}

/// Changes the work request being built, or records EINVAL when there is none.
///
/// # Safety
/// As [`with_batch`].
unsafe fn set(qp: *mut ibv_qp_ex, f: impl FnOnce(&mut SendWr)) {
    // SAFETY: `qp` is the live QP's ibv_qp_ex (this function's contract, with_batch's).
    unsafe {
        with_batch(qp, |_, b| match b.wrs.last_mut() {
            Some(w) => f(w),
            None => {
                if b.err == 0 {
                    b.err = libc::EINVAL;
                }
            }
        })
    }
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe { with_batch(qp, |_, b| *b = Batch::default()) }
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe { with_batch(qp, |_, b| *b = Batch::default()) }
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe {
        with_batch(qp, |q, b| {
            let batch = std::mem::take(b);
            if batch.err != 0 {
                return batch.err;
            }
            match q.qp.post_send_batch(&batch.wrs) {
                Ok(()) => 0,
                Err(e) => {
                    log::debug!("ibv_wr_complete on QP {:#x}: {e}", q.qp.qp_num());
                    errno_of(&e)
                }
            }
        })
    }
}

/// TSO: the batch fails with EOPNOTSUPP.
unsafe extern "C" fn wr_unsupported(qp: *mut ibv_qp_ex) {
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp); other arguments are not read.
    unsafe {
        with_batch(qp, |_, b| {
            if b.err == 0 {
                b.err = libc::EOPNOTSUPP;
            }
        })
    }
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe {
        begin(qp, WrOpcode::RdmaWrite, |w| {
            w.remote = RemoteAddr { remote_addr, rkey }
        })
    }
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe {
        begin(qp, WrOpcode::RdmaWriteWithImm, |w| {
            w.remote = RemoteAddr { remote_addr, rkey };
            w.imm_data = u32::from_be(imm);
        })
    }
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe {
        begin(qp, WrOpcode::RdmaRead, |w| {
            w.remote = RemoteAddr { remote_addr, rkey }
        })
    }
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe { begin(qp, WrOpcode::Send, |_| {}) }
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe {
        begin(qp, WrOpcode::SendWithInv, |w| {
            w.invalidate_rkey = invalidate_rkey
        })
    }
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe {
        begin(qp, WrOpcode::LocalInv, |w| {
            w.invalidate_rkey = invalidate_rkey
        })
    }
}

unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    let bind = if info.is_null() {
        Err(libc::EINVAL)
    } else {
        // SAFETY: verbs' ibv_wr_bind_mw contract: `mw` is a live window of ours, `info` a valid bind info whose `mr` is NULL or a live MR of ours.
        unsafe { crate::mw::mw_bind_of(mw, rkey, &*info) }
    };
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe {
        begin(qp, WrOpcode::BindMw, |w| w.bind_mw = bind.ok());
    }
    if bind.is_err() {
        // SAFETY: as above.
        unsafe {
            with_batch(qp, |_, b| {
                b.wrs.pop();
                if b.err == 0 {
                    b.err = libc::EINVAL;
                }
            })
        }
    }
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: u32) {
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe {
        begin(qp, WrOpcode::SendWithImm, |w| {
            w.imm_data = u32::from_be(imm)
        })
    }
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe {
        begin(qp, WrOpcode::AtomicCmpAndSwp, |w| {
            w.remote = RemoteAddr { remote_addr, rkey };
            w.compare_add = compare;
            w.swap = swap;
        })
    }
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe {
        begin(qp, WrOpcode::AtomicFetchAndAdd, |w| {
            w.remote = RemoteAddr { remote_addr, rkey };
            w.compare_add = add;
        })
    }
}

/// `ibv_wr_atomic_write`: the 8 bytes at `atomic_wr` are copied now (verbs: the buffer is
/// free once the call returns); the request needs no SGE.
unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) {
    if atomic_wr.is_null() {
        log::debug!("ibv_wr_atomic_write: NULL value pointer (EINVAL)");
        // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
        unsafe {
            with_batch(qp, |_, b| {
                b.err = if b.err == 0 { libc::EINVAL } else { b.err }
            })
        };
        return;
    }
    let mut value = [0u8; 8];
    // SAFETY: ibv_wr_atomic_write's contract: a non-NULL atomic_wr points to 8 readable bytes (no alignment promised, so an unaligned copy).
    unsafe { core::ptr::copy_nonoverlapping(atomic_wr.cast::<u8>(), value.as_mut_ptr(), 8) };
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe {
        begin(qp, WrOpcode::AtomicWrite, |w| {
            w.remote = RemoteAddr { remote_addr, rkey };
            w.inline_data = Some(InlineData::from_slice(&value));
        })
    }
}

/// `ibv_wr_flush` (rdma-core 45 and later): a FLUSH of `len` bytes at `remote_addr` (level
/// `IBV_FLUSH_RANGE`) or of the whole region (`IBV_FLUSH_MR`), to global visibility or
/// persistence as `type` says; it needs no SGE. A range longer than a RETH can carry (4 GiB)
/// fails the batch with EINVAL.
unsafe extern "C" fn wr_flush(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    len: usize,
    placement_type: u8,
    selectivity_level: u8,
) {
    let len32 = match u32::try_from(len) {
        Ok(l) => l,
        Err(_) if selectivity_level == FlushSpec::MR => u32::MAX,
        Err(_) => {
            log::debug!("ibv_wr_flush: a range of {len} bytes, more than a RETH carries (EINVAL)");
            // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
            unsafe {
                with_batch(qp, |_, b| {
                    b.err = if b.err == 0 { libc::EINVAL } else { b.err }
                })
            };
            return;
        }
    };
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe {
        begin(qp, WrOpcode::Flush, |w| {
            w.remote = RemoteAddr { remote_addr, rkey };
            w.flush = Some(FlushSpec {
                len: len32,
                placement_type,
                selectivity_level,
            });
        })
    }
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe { set(qp, |w| w.sg_list = vec![Sge { addr, length, lkey }].into()) }
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    let list: SgList = if num_sge == 0 || sg_list.is_null() {
        SgList::new()
    } else {
        // SAFETY: ibv_wr_set_sge_list's contract: a non-NULL sg_list holds num_sge entries (read unaligned), and the iterator is used up here.
        unsafe { crate::data::read_array(sg_list, num_sge) }
            .map(|s| Sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            })
            .collect()
    };
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe { set(qp, |w| w.sg_list = list) }
}

/// Copies the program's inline bytes now (verbs: the buffers are free once the setter
/// returns), marks the request INLINE; the SGE list stays empty.
///
/// # Safety
/// Each `(addr, len)` is readable program memory.
unsafe fn set_inline(qp: *mut ibv_qp_ex, bufs: &[(*const u8, usize)]) {
    let mut data = InlineData::new();
    for &(p, n) in bufs {
        if n > 0 && !p.is_null() {
            // SAFETY: the caller's buffer holds n bytes.
            data.extend_from_slice(unsafe { core::slice::from_raw_parts(p, n) });
        }
    }
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe {
        set(qp, |w| {
            w.send_flags |= SendFlags::INLINE;
            w.sg_list = SgList::new();
            w.inline_data = Some(data);
        })
    }
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    // SAFETY: ibv_wr_set_inline_data's contract: addr holds length readable bytes, and `qp` is the live ibv_qp_ex the slot belongs to.
    unsafe { set_inline(qp, &[(addr.cast_const().cast(), length)]) }
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) {
    let bufs: Vec<(*const u8, usize)> = if num_buf == 0 || buf_list.is_null() {
        Vec::new()
    } else {
        // SAFETY: ibv_wr_set_inline_data_list's contract: a non-NULL buf_list holds num_buf entries (read unaligned), and the iterator is used up here.
        unsafe { crate::data::read_array(buf_list, num_buf) }
            .map(|b| (b.addr.cast_const().cast::<u8>(), b.length))
            .collect()
    };
    // SAFETY: ibv_wr_set_inline_data_list's contract: each buffer holds its length in readable bytes, and `qp` is the live ibv_qp_ex the slot belongs to.
    unsafe { set_inline(qp, &bufs) }
}

/// `ibv_wr_set_xrc_srqn`: the XRC SRQ at the target the current request is for.
unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, remote_srqn: u32) {
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe { set(qp, |w| w.remote_srqn = remote_srqn) };
}

unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    if ah.is_null() {
        // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
        unsafe {
            with_batch(qp, |_, b| {
                if b.err == 0 {
                    b.err = libc::EINVAL;
                }
            })
        };
        return;
    }
    // SAFETY: ibv_wr_set_ud_addr's contract: `ah` (non-NULL, checked) is an AH of this library the program has not destroyed.
    let attr = unsafe { ah_of(ah) }.ah.attr();
    // SAFETY: the ibv_wr_* slots are this library's and are called with the live ibv_qp_ex they belong to (verbs forbids calls after ibv_destroy_qp).
    unsafe {
        set(qp, |w| {
            w.ud = Some(UdDest {
                ah: attr,
                remote_qpn,
                remote_qkey,
            })
        })
    }
}
