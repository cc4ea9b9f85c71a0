//! Asynchronous events per context (`ibv_get_async_event`): each context has its own queue
//! and descriptor, and the device's runtime hands every event to the context that owns the
//! object it concerns (contexts of one device share the runtime, as on a NIC).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ferroce_transport::AsyncEvent;
use parking_lot::{Condvar, Mutex};

use crate::sys::EventFd;

/// An asynchronous event with the object it concerns (`struct ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEventRecord {
    /// An event of a QP or SRQ from the engine.
    Engine(AsyncEvent),
    /// `IBV_EVENT_CQ_ERR`: a CQ overflowed.
    CqErr {
        /// The CQ's handle number.
        cq: u32,
    },
}

/// One context's pending events; its descriptor is readable while any is queued.
#[derive(Debug)]
pub(crate) struct EventQueue {
    queue: Mutex<VecDeque<AsyncEventRecord>>,
    cond: Condvar,
    fd: EventFd,
    waiter: crate::sys::ReadWaiter,
}

impl EventQueue {
    pub(crate) fn new() -> std::io::Result<EventQueue> {
        Ok(EventQueue {
            queue: Mutex::new(VecDeque::new()),
            cond: Condvar::new(),
            fd: EventFd::new_blocking()?,
            waiter: crate::sys::ReadWaiter::new()?,
        })
    }

    fn push(&self, e: AsyncEventRecord) {
        self.queue.lock().push_back(e);
        self.fd.signal();
        self.cond.notify_all();
        self.waiter.wake();
    }

    /// The oldest event, waiting at most `timeout`.
    pub(crate) fn get(&self, timeout: Duration) -> Option<AsyncEventRecord> {
        let mut q = self.queue.lock();
        let deadline = std::time::Instant::now() + timeout;
        while q.is_empty() {
            if self.cond.wait_until(&mut q, deadline).timed_out() && q.is_empty() {
                return None;
            }
        }
        let e = q.pop_front();
        if q.is_empty() {
            self.fd.drain();
        }
        e
    }

    /// The next event, waiting in a `read(2)` (see [`crate::sys::ReadWaiter`]).
    pub(crate) fn wait(&self) -> Result<AsyncEventRecord, i32> {
        self.waiter.wait(|| self.get(Duration::ZERO))
    }

    /// The descriptor (readable while an event is pending).
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.raw()
    }
}

/// An object events can concern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Owned {
    /// A QP by number.
    Qp(u32),
    /// An SRQ by number.
    Srq(u32),
    /// A CQ by its device-wide number.
    Cq(u32),
}

/// Which context owns each QP, SRQ and CQ of a device.
#[derive(Debug, Default)]
pub(crate) struct EventRouter {
    owners: Mutex<HashMap<Owned, Weak<EventQueue>>>,
}

impl EventRouter {
    /// `what` now belongs to the context whose queue is `to`.
    pub(crate) fn register(&self, what: Owned, to: &Arc<EventQueue>) {
        self.owners.lock().insert(what, Arc::downgrade(to));
    }

    /// `what` is gone.
    pub(crate) fn unregister(&self, what: Owned) {
        self.owners.lock().remove(&what);
    }

    /// Hands `e` to the context owning its object; an event of an object no context owns
    /// (destroyed meanwhile) is dropped, with a debug line.
    pub(crate) fn route(&self, e: AsyncEventRecord) {
        let what = match e {
            AsyncEventRecord::Engine(
                AsyncEvent::CommEst { qpn }
                | AsyncEvent::SqDrained { qpn }
                | AsyncEvent::QpLastWqeReached { qpn },
            ) => Owned::Qp(qpn),
            AsyncEventRecord::Engine(AsyncEvent::SrqLimitReached { srqn, .. }) => Owned::Srq(srqn),
            AsyncEventRecord::CqErr { cq } => Owned::Cq(cq),
        };
        let to = self.owners.lock().get(&what).and_then(Weak::upgrade);
        match to {
            Some(q) => q.push(e),
            None => log::debug!("async event {e:?} dropped: its object has no live context"),
        }
    }
}
