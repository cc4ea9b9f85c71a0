//! Asynchronous events: `ibv_get_async_event`, `ibv_ack_async_event`.

use core::ffi::{c_int, c_void};
use std::time::Duration;

use ferroce::AsyncEventRecord;
use ferroce::transport::AsyncEvent;

use crate::abi::*;
use crate::device::{Ctx, ctx_of};
use crate::handle::publish_u32;
use crate::objects::*;
use crate::set_errno;

/// The object an async event is about, as `ibv_async_event.element` holds it.
#[derive(Clone, Copy)]
enum Element {
    Qp(*mut ibv_qp),
    Srq(*mut ibv_srq),
    Cq(*mut ibv_cq),
}

/// `enum ibv_event_type` values ferroce reports.
const IBV_EVENT_CQ_ERR: c_int = 0;
const IBV_EVENT_COMM_EST: c_int = 4;
const IBV_EVENT_SQ_DRAINED: c_int = 5;
const IBV_EVENT_SRQ_LIMIT_REACHED: c_int = 15;
const IBV_EVENT_QP_LAST_WQE_REACHED: c_int = 16;

/// Finds the object of an event in its table and counts the event as handed out, under the
/// table's lock, so that the object's destroy (which leaves the table under the same lock
/// first) waits for its acknowledgement. None: the object was destroyed meanwhile.
fn report(c: &Ctx, rec: AsyncEventRecord) -> Option<(Element, c_int)> {
    let qp = |qpn: u32, ty: c_int| {
        let t = c.qps.lock();
        t.get(&qpn).map(|&p| {
            let p = p as *mut ibv_qp;
            // SAFETY: QPs in the table are live (destroy removes them, under this lock, before it waits and frees).
            unsafe { qp_of(p) }.events.reported();
            (Element::Qp(p), ty)
        })
    };
    match rec {
        AsyncEventRecord::Engine(AsyncEvent::CommEst { qpn }) => qp(qpn, IBV_EVENT_COMM_EST),
        AsyncEventRecord::Engine(AsyncEvent::SqDrained { qpn }) => qp(qpn, IBV_EVENT_SQ_DRAINED),
        AsyncEventRecord::Engine(AsyncEvent::QpLastWqeReached { qpn }) => {
            qp(qpn, IBV_EVENT_QP_LAST_WQE_REACHED)
        }
        AsyncEventRecord::Engine(AsyncEvent::SrqLimitReached { srqn, .. }) => {
            let t = c.srqs.lock();
            t.get(&srqn).map(|&p| {
                let p = p as *mut ibv_srq;
                // SAFETY: SRQs in the table are live, as QPs above.
                unsafe { srq_of(p) }.events.reported();
                (Element::Srq(p), IBV_EVENT_SRQ_LIMIT_REACHED)
            })
        }
        AsyncEventRecord::CqErr { cq } => {
            let t = c.cqs.lock();
            t.get(&cq).map(|&p| {
                let p = p as *mut ibv_cq;
                // SAFETY: CQs in the table are live, as QPs above.
                unsafe { cq_of(p) }.async_events.reported();
                (Element::Cq(p), IBV_EVENT_CQ_ERR)
            })
        }
    }
}

/// `ibv_get_async_event`: blocks for the next event (EAGAIN at once when `async_fd` was made
/// non-blocking). The object it names stays allocated until the event is acknowledged.
///
/// # Safety
/// `context` is live; `event` is valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    if context.is_null() || event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: `context` came from this library's ibv_open_device and is not closed; its `async_fd` is written only at open.
    let (c, fd) = unsafe { (ctx_of(context), (*context).async_fd) };
    let nb = crate::cq::nonblocking(fd);
    loop {
        let got = if nb {
            c.ctx.get_async_event(Duration::ZERO)
        } else {
            // rdma-core's wait is a read(2): a signal without SA_RESTART ends it with EINTR.
            match c.ctx.wait_async_event() {
                Ok(r) => Some(r),
                Err(e) => {
                    log::debug!("ibv_get_async_event: the wait ended: errno {e}");
                    set_errno(e);
                    return -1;
                }
            }
        };
        let Some(rec) = got else {
            set_errno(libc::EAGAIN);
            return -1;
        };
        // An event of an object destroyed meanwhile is dropped.
        let Some((element, ty)) = report(c, rec) else {
            log::debug!("ibv_get_async_event: {rec:?} of a destroyed object dropped");
            continue;
        };
        // What it means, with its facts (a LAST_WQE_REACHED with its QP's first error).
        log::info!("async event: {}", c.ctx.async_event_reason(&rec));
        let element = match element {
            Element::Qp(p) => p.cast::<c_void>(),
            Element::Srq(p) => p.cast(),
            Element::Cq(p) => p.cast(),
        };
        // SAFETY: `event` is valid for writing (this function's contract).
        unsafe {
            event.write(ibv_async_event {
                element,
                event_type: ty,
            })
        };
        return 0;
    }
}

/// `ibv_ack_async_event`: the event's object may now be destroyed (its destroy waits for this).
///
/// # Safety
/// `event` was filled by `ibv_get_async_event` and is acknowledged once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: `event` is valid for reading (this function's contract).
    let ev = unsafe { event.read() };
    // SAFETY: the element of an unacknowledged event is live (its destroy waits for this acknowledgement); its type follows from the event type ibv_get_async_event chose; the counters are aligned u32 fields that ferroce writes only atomically.
    unsafe {
        match ev.event_type {
            IBV_EVENT_COMM_EST | IBV_EVENT_SQ_DRAINED | IBV_EVENT_QP_LAST_WQE_REACHED => {
                let p = ev.element.cast::<ibv_qp>();
                let n = qp_of(p).events.acked(1);
                publish_u32(&raw mut (*p).events_completed, n);
            }
            IBV_EVENT_SRQ_LIMIT_REACHED => {
                let p = ev.element.cast::<ibv_srq>();
                let n = srq_of(p).events.acked(1);
                publish_u32(&raw mut (*p).events_completed, n);
            }
            IBV_EVENT_CQ_ERR => {
                let p = ev.element.cast::<ibv_cq>();
                let n = cq_of(p).async_events.acked(1);
                publish_u32(&raw mut (*p).async_events_completed, n);
            }
            other => log::debug!("ibv_ack_async_event: event type {other} is not ferroce's"),
        }
    }
}
