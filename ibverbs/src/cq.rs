//! Completion queues: `ibv_create_cq`, `ibv_destroy_cq`, `ibv_resize_cq`, and the completion
//! events of `ibv_get_cq_event`/`ibv_ack_cq_events`.

use core::ffi::{c_int, c_uint, c_void};
use std::time::Duration;

use crate::abi::*;
use crate::device::ctx_of;
use crate::handle::{EventAcks, publish_u32};
use crate::objects::*;
use crate::{errno_of, set_errno};

/// `ibv_create_cq`.
///
/// # Safety
/// `context` is live; `channel` is NULL or a live channel of the same context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    if cqe <= 0 || comp_vector < 0 {
        return fail(libc::EINVAL);
    }
    // SAFETY: this function's contract (a live context, a NULL or live channel) is create_cq's.
    unsafe { create_cq(context, cqe as u32, cq_context, channel, comp_vector as u32) }.cast()
}

/// Creates a CQ (both `ibv_create_cq` and `ibv_create_cq_ex` come here).
///
/// # Safety
/// `context` is live; `channel` is NULL or a live channel of the same context.
pub(crate) unsafe fn create_cq(
    context: *mut ibv_context,
    cqe: u32,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: u32,
) -> *mut ibv_cq_ex {
    if context.is_null() || cqe == 0 || comp_vector != 0 {
        return fail(libc::EINVAL);
    }
    // SAFETY: `context` came from this library's ibv_open_device and is not closed (verbs forbids using a closed context), so it is the context of a live Ctx.
    let c = unsafe { ctx_of(context) };
    // SAFETY: a non-NULL channel is one of this library's, not destroyed (caller's contract).
    let ch = (!channel.is_null()).then(|| unsafe { &ch_of(channel).ch });
    match c.ctx.create_cq(cqe, ch) {
        Ok(cq) => {
            let handle = cq.handle();
            let face = crate::cq_ex::cq_ex(context, channel, cq_context, handle, cq.cqe() as c_int);
            let p = Cq::into_raw(
                face,
                CqInner {
                    cq,
                    current: parking_lot::Mutex::new(Default::default()),
                    comp_events: EventAcks::default(),
                    async_events: EventAcks::default(),
                },
            );
            c.cqs.lock().insert(handle, p as usize);
            p.cast()
        }
        Err(e) => fail(errno_of(&e)),
    }
}

/// `ibv_destroy_cq`: EBUSY while a QP uses it; otherwise it waits, as rdma-core does, until
/// every completion event `ibv_get_cq_event` returned for it and every async event
/// `ibv_get_async_event` returned for it has been acknowledged, then frees it.
///
/// # Safety
/// `cq` is live and not used again on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `cq` is a CQ of this library the program has not destroyed (verbs' rule).
        let q = unsafe { cq_of(cq) };
        if q.cq.in_use() {
            log::debug!("ibv_destroy_cq: a QP still uses the CQ (EBUSY)");
            return libc::EBUSY;
        }
        // SAFETY: a live CQ's `context` and `handle` are written only at creation; the context outlives the CQ.
        let (c, handle) = unsafe { (ctx_of((*cq).context), (*cq).handle) };
        // Out of the table first: from now on no event can be handed out for this CQ, so the
        // counts below only grow by acknowledgements.
        c.cqs.lock().remove(&handle);
        q.comp_events.wait_all_acked();
        q.async_events.wait_all_acked();
        // SAFETY: the CQ is in no table, no QP uses it, every event handed out for it has been acknowledged (so no thread holds it from an event), and the program gives it up here.
        unsafe { Cq::free(cq.cast()) };
        0
    })())
}

/// `ibv_resize_cq`: the CQ holds `cqe` completions from now on (`cq->cqe` says so); EINVAL
/// below the number of completions waiting to be polled.
///
/// # Safety
/// `cq` is live and no other thread resizes it at the same time.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if cq.is_null() || cqe <= 0 {
            log::debug!("ibv_resize_cq: cqe {cqe} (EINVAL)");
            return libc::EINVAL;
        }
        // SAFETY: `cq` is a CQ of this library the program has not destroyed (verbs' rule).
        let q = unsafe { cq_of(cq) };
        match q.cq.resize(cqe as usize) {
            Ok(n) => {
                // SAFETY: `cq` is live; verbs has programs read `cqe`, never write it, and resizes of one CQ are not concurrent (this function's contract).
                unsafe { (*cq).cqe = n as c_int };
                0
            }
            Err(e) => errno_of(&e),
        }
    })())
}

/// `verbs_context.modify_cq` (behind verbs.h's `ibv_modify_cq`): event moderation, the CQ's
/// event once `cq_count` completions arrived or `cq_period` µs after the first of them.
pub(crate) unsafe extern "C" fn vctx_modify_cq(
    cq: *mut ibv_cq,
    attr: *mut ibv_modify_cq_attr,
) -> c_int {
    crate::status((|| {
        if cq.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: verbs passes a live CQ of ours and a readable attribute struct.
        let (q, a) = unsafe { (cq_of(cq), &*attr) };
        if a.attr_mask & !IBV_CQ_ATTR_MODERATE != 0 {
            log::debug!(
                "ibv_modify_cq: attr_mask {:#x} not known (EINVAL)",
                a.attr_mask
            );
            return libc::EINVAL;
        }
        if a.attr_mask & IBV_CQ_ATTR_MODERATE != 0 {
            q.cq.moderate(a.cq_count, a.cq_period);
        }
        0
    })())
}

pub(crate) fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL on any fd is harmless; a bad fd gives -1.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// `ibv_get_cq_event`: blocks for the next event (or fails with EAGAIN at once when the
/// channel's fd was made non-blocking).
///
/// # Safety
/// `channel` is live; `cq` and `cq_context` are valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    if channel.is_null() || cq.is_null() || cq_context.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: `channel` is a channel of this library the program has not destroyed.
    let ch = unsafe { ch_of(channel) };
    // A handle of its own (an Arc): the program may destroy the channel while this thread
    // waits (rdma-core's blocked read(2) keeps the file); the wait never touches the freed
    // object.
    let waiter = ch.ch.clone();
    // SAFETY: a live channel's `fd` and `context` are written only at creation; the context outlives the channel.
    let (fd, c) = unsafe { ((*channel).fd, ctx_of((*channel).context)) };
    let nb = nonblocking(fd);
    loop {
        let got = if nb {
            waiter.get_event_timeout(Duration::ZERO)
        } else {
            // rdma-core's wait is a read(2): a signal without SA_RESTART ends it with EINTR
            // (qperf ends its ping-pong loops with an alarm that way).
            match waiter.wait_event() {
                Ok(e) => Some(e),
                Err(e) => {
                    log::debug!("ibv_get_cq_event: the wait ended: errno {e}");
                    set_errno(e);
                    return -1;
                }
            }
        };
        let Some(event_cq) = got else {
            set_errno(libc::EAGAIN);
            return -1;
        };
        let found = {
            let table = c.cqs.lock();
            table.get(&event_cq.handle()).map(|&p| {
                let p = p as *mut ibv_cq;
                // SAFETY: CQs in the table are live (destroy removes them before freeing, under this lock); counting here, under the lock, makes destroy wait for it.
                unsafe { cq_of(p) }.comp_events.reported();
                p
            })
        };
        let Some(p) = found else {
            // The CQ was destroyed after its event was queued: not the program's any more.
            log::debug!("ibv_get_cq_event: event of a destroyed CQ dropped");
            continue;
        };
        // SAFETY: `p` stays live until this event is acknowledged (destroy waits for it); its `cq_context` is written only at creation; the out-pointers are valid for writing (this function's contract).
        unsafe {
            *cq = p;
            *cq_context = (*p).cq_context;
        }
        return 0;
    }
}

/// `ibv_ack_cq_events`.
///
/// # Safety
/// `cq` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    if cq.is_null() {
        return;
    }
    // SAFETY: `cq` is a live CQ of this library (the program acknowledges before destroying).
    let q = unsafe { cq_of(cq) };
    q.cq.ack_events(nevents);
    let total = q.comp_events.acked(nevents);
    // SAFETY: `comp_events_completed` is an aligned u32 of the live CQ that ferroce writes only atomically (acknowledgements may come from several threads).
    unsafe { publish_u32(&raw mut (*cq).comp_events_completed, total) };
}
