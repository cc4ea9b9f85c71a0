//! The data path verbs.h inlines through `ibv_context.ops`: `ibv_post_send`, `ibv_post_recv`,
//! `ibv_post_srq_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`.

use core::ffi::c_int;

use ferroce::transport::{
    InlineData, RecvWr, RemoteAddr, SendFlags, SendWr, SgList, Sge, UdDest, WorkCompletion,
    WrOpcode,
};

use crate::abi::*;
use crate::errno_of;
use crate::objects::{ah_of, cq_of, qp_of, srq_of};
use ferroce::context::limits::MAX_INLINE;

/// The ops table every context gets.
pub fn context_ops() -> ibv_context_ops {
    ibv_context_ops {
        _compat_query_device: None,
        _compat_query_port: None,
        _compat_alloc_pd: None,
        _compat_dealloc_pd: None,
        _compat_reg_mr: None,
        _compat_rereg_mr: None,
        _compat_dereg_mr: None,
        alloc_mw: Some(crate::mw::alloc_mw),
        bind_mw: Some(crate::mw::bind_mw),
        dealloc_mw: Some(crate::mw::dealloc_mw),
        _compat_create_cq: None,
        poll_cq: Some(poll_cq),
        req_notify_cq: Some(req_notify_cq),
        _compat_cq_event: None,
        _compat_resize_cq: None,
        _compat_destroy_cq: None,
        _compat_create_srq: None,
        _compat_modify_srq: None,
        _compat_query_srq: None,
        _compat_destroy_srq: None,
        post_srq_recv: Some(post_srq_recv),
        _compat_create_qp: None,
        _compat_query_qp: None,
        _compat_modify_qp: None,
        _compat_destroy_qp: None,
        post_send: Some(post_send),
        post_recv: Some(post_recv),
        _compat_create_ah: None,
        _compat_destroy_ah: None,
        _compat_attach_mcast: None,
        _compat_detach_mcast: None,
        _compat_async_event: None,
    }
}

/// The SGE list of a C work request.
///
/// # Safety
/// `sg_list` points at `num_sge` SGEs (or `num_sge` is 0).
unsafe fn sges(sg_list: *const ibv_sge, num_sge: c_int) -> Result<SgList, c_int> {
    if num_sge < 0 || (num_sge > 0 && sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    if num_sge == 0 {
        return Ok(SgList::new());
    }
    // SAFETY: the caller's list holds num_sge readable entries (at any alignment: read_array reads each unaligned), and the iterator is used up here.
    let list = unsafe { read_array(sg_list, num_sge as usize) };
    Ok(list
        .map(|s| Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect())
}

/// Copies `n` elements of a program's C array, which need not be aligned for `T`: C on x86
/// tolerates an `ibv_sge` array at any address (libiscsi's iSER initiator keeps one inside a
/// packed structure), where a Rust slice over it would be undefined behaviour.
///
/// The elements are read as the iterator is advanced, with no copy of the array made (the
/// post path reads SGE lists through this).
///
/// # Safety
/// `p` points at `n` readable elements (it may be NULL only when `n` is 0), and stays so
/// while the iterator is used.
pub(crate) unsafe fn read_array<T: Copy>(p: *const T, n: usize) -> impl Iterator<Item = T> {
    (0..n)
        // SAFETY: element i < n is readable while the iterator is used (the caller's promise); read_unaligned needs no alignment.
        .map(move |i| unsafe { p.add(i).read_unaligned() })
}

/// One C send work request as ferroce's.
///
/// # Safety
/// `w` and what it points to are valid; a UD request's AH is a live AH of ours.
unsafe fn send_wr(w: &ibv_send_wr, ud: bool) -> Result<SendWr, c_int> {
    let opcode = WrOpcode::from_raw(w.opcode as u32).ok_or(libc::EINVAL)?;
    let mut s = SendWr::new(w.wr_id, opcode);
    s.send_flags = SendFlags(w.send_flags & 0xf);
    // SAFETY: a valid ibv_send_wr's sg_list holds num_sge entries (this function's contract).
    s.sg_list = unsafe { sges(w.sg_list, w.num_sge) }?;
    s.imm_data = u32::from_be(w.imm_data);
    // Read by XRC send QPs only (`qp_type.xrc.remote_srqn`).
    s.remote_srqn = w.remote_srqn;
    // The same union member is `invalidate_rkey`, host order.
    s.invalidate_rkey = w.imm_data;
    if opcode == WrOpcode::BindMw {
        let b = w.bind_mw;
        // SAFETY: a BIND_MW request names a live window of ours and NULL or a live MR of ours (ibv_post_send's contract).
        s.bind_mw = Some(unsafe { crate::mw::mw_bind_of(b.mw, b.rkey, &b.bind_info) }?);
    }
    if s.send_flags.contains(SendFlags::INLINE) && !opcode.is_read_or_atomic() {
        // verbs: inline data is read at post time and the SGEs' lkeys are ignored, so the
        // program may point them at any memory of its own. Longer than any QP's
        // max_inline_data, it is left to the QP to refuse.
        let total: u64 = s.sg_list.iter().map(|g| u64::from(g.length)).sum();
        if total <= u64::from(MAX_INLINE) {
            let mut data = InlineData::new();
            for g in &s.sg_list {
                if g.length == 0 {
                    continue;
                }
                // SAFETY: verbs' contract for IBV_SEND_INLINE: each SGE's addr..addr+length is readable program memory during ibv_post_send.
                let bytes = unsafe {
                    core::slice::from_raw_parts(g.addr as usize as *const u8, g.length as usize)
                };
                data.extend_from_slice(bytes);
            }
            s.inline_data = Some(data);
        }
    }
    if opcode.is_atomic() {
        // SAFETY: the atomic member is the one an atomic request fills.
        let a = unsafe { w.wr.atomic };
        s.remote = RemoteAddr {
            remote_addr: a.remote_addr,
            rkey: a.rkey,
        };
        s.compare_add = a.compare_add;
        s.swap = a.swap;
    } else if ud {
        // SAFETY: the ud member is the one a UD request fills.
        let u = unsafe { w.wr.ud };
        if u.ah.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a UD request's AH is one of this library the program has not destroyed (this function's contract).
        let ah = unsafe { ah_of(u.ah) };
        s.ud = Some(UdDest {
            ah: ah.ah.attr(),
            remote_qpn: u.remote_qpn,
            remote_qkey: u.remote_qkey,
        });
    } else {
        // SAFETY: the rdma member (unused by SEND, harmless to read: plain integers).
        let r = unsafe { w.wr.rdma };
        s.remote = RemoteAddr {
            remote_addr: r.remote_addr,
            rkey: r.rkey,
        };
    }
    Ok(s)
}

unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: verbs.h calls this through the QP's own context ops, so `qp` is a QP of this library the program has not destroyed; its `qp_type` is written only at creation.
    let (q, ud) = unsafe { (qp_of(qp), (*qp).qp_type == 4) };
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the program's list is valid up to its NULL `next`.
        let w = unsafe { &*cur };
        // SAFETY: each WR of the program's list is valid, and a UD WR names a live AH of ours (ibv_post_send's contract, which is send_wr's).
        let r = unsafe { send_wr(w, ud) }.and_then(|s| {
            q.qp.post_send(&s).map_err(|e| {
                log::debug!("ibv_post_send on QP {:#x}: {e}", q.qp.qp_num());
                errno_of(&e)
            })
        });
        if let Err(e) = r {
            if !bad_wr.is_null() {
                // SAFETY: bad_wr is valid for writing.
                unsafe { *bad_wr = cur };
            }
            return e;
        }
        cur = w.next;
    }
    0
}

/// Posts a C receive list through `post` (a QP's or an SRQ's).
///
/// # Safety
/// The list is valid up to its NULL `next`; `bad_wr` is NULL or valid for writing.
unsafe fn post_recv_list(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    post: impl Fn(&RecvWr) -> ferroce::Result<()>,
) -> c_int {
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the program's list is valid up to its NULL `next` (this function's contract).
        let w = unsafe { &*cur };
        // SAFETY: a valid ibv_recv_wr's sg_list holds num_sge entries.
        let r = unsafe { sges(w.sg_list, w.num_sge) }.and_then(|sg_list| {
            post(&RecvWr {
                wr_id: w.wr_id,
                sg_list,
            })
            .map_err(|e| errno_of(&e))
        });
        if let Err(e) = r {
            if !bad_wr.is_null() {
                // SAFETY: bad_wr is valid for writing.
                unsafe { *bad_wr = cur };
            }
            return e;
        }
        cur = w.next;
    }
    0
}

unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: verbs.h calls this through the QP's own ops: a live QP of this library.
    let q = unsafe { qp_of(qp) };
    // SAFETY: ibv_post_recv's contract: the list is valid up to its NULL `next`, `bad_wr` NULL or writable.
    unsafe { post_recv_list(wr, bad_wr, |r| q.qp.post_recv(r)) }
}

unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: verbs.h calls this through the SRQ's own context ops: a live SRQ of ours.
    let s = unsafe { srq_of(srq) };
    // SAFETY: ibv_post_srq_recv's contract: the list is valid up to its NULL `next`, `bad_wr` NULL or writable.
    unsafe { post_recv_list(wr, bad_wr, |r| s.srq.post_recv(r)) }
}

/// A ferroce completion as `struct ibv_wc`.
pub fn wc_to_c(wc: &WorkCompletion) -> ibv_wc {
    ibv_wc {
        wr_id: wc.wr_id,
        status: wc.status as c_int,
        opcode: wc.opcode as c_int,
        vendor_err: wc.vendor_err,
        byte_len: wc.byte_len,
        // One union: `imm_data` (network order) or, with IBV_WC_WITH_INV, `invalidated_rkey`.
        imm_data: if wc.wc_flags.contains(ferroce::transport::WcFlags::WITH_INV) {
            wc.invalidated_rkey
        } else {
            wc.imm_data.to_be()
        },
        qp_num: wc.qp_num,
        src_qp: wc.src_qp,
        wc_flags: wc.wc_flags.0,
        pkey_index: 0,
        slid: 0,
        sl: wc.sl,
        dlid_path_bits: 0,
    }
}

unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    if num_entries <= 0 {
        return 0;
    }
    // SAFETY: verbs.h calls this through the CQ's own context ops: a live CQ of ours.
    let q = unsafe { cq_of(cq) };
    let mut buf = [WorkCompletion::default(); 32];
    let mut done = 0usize;
    let want = num_entries as usize;
    while done < want {
        let chunk = (want - done).min(buf.len());
        let n = q.cq.poll(&mut buf[..chunk]);
        for (i, w) in buf[..n].iter().enumerate() {
            // SAFETY: the program's array holds num_entries entries; done + i < num_entries.
            unsafe { wc.add(done + i).write(wc_to_c(w)) };
        }
        done += n;
        if n < chunk {
            break;
        }
    }
    done as c_int
}

unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: verbs.h calls this through the CQ's own context ops: a live CQ of ours.
    let q = unsafe { cq_of(cq) };
    match q.cq.req_notify(solicited_only != 0) {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}
