//! `struct rdma_event_channel`: where a CM ID's events queue, with a file descriptor that is
//! readable while one is pending (so a program can poll it).

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::CmEvent;
use crate::Result;
use crate::sys::EventFd;

pub(crate) struct ChannelInner {
    queue: Mutex<VecDeque<CmEvent>>,
    cond: Condvar,
    fd: EventFd,
    waiter: crate::sys::ReadWaiter,
}

/// `rdma_create_event_channel`: a queue of [`CmEvent`]s for the IDs created on it.
#[derive(Clone)]
pub struct EventChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.inner.fd.raw())
            .field("pending", &self.inner.queue.lock().len())
            .finish()
    }
}

impl EventChannel {
    /// A new channel.
    ///
    /// # Errors
    /// [`crate::Error::Io`] if no eventfd can be made.
    pub fn new() -> Result<EventChannel> {
        Ok(EventChannel {
            inner: Arc::new(ChannelInner {
                queue: Mutex::new(VecDeque::new()),
                cond: Condvar::new(),
                fd: EventFd::new_blocking()?,
                waiter: crate::sys::ReadWaiter::new()?,
            }),
        })
    }

    pub(crate) fn push(&self, e: CmEvent) {
        let mut q = self.inner.queue.lock();
        q.push_back(e);
        self.inner.fd.signal();
        self.inner.cond.notify_all();
        drop(q);
        self.inner.waiter.wake();
    }

    /// An event leaves the queue for the program: a request no longer counts against its
    /// listener's backlog.
    fn handed_out(e: &CmEvent) {
        if e.event == super::CmEventType::ConnectRequest {
            if let Some(l) = &e.listen_id {
                let _ = l.inner.queued_requests.fetch_update(
                    std::sync::atomic::Ordering::AcqRel,
                    std::sync::atomic::Ordering::Acquire,
                    |q| q.checked_sub(1),
                );
            }
        }
    }

    /// Takes the queued events of `id` (its own, and the requests that came through it as a
    /// listener), keeping the others in order.
    pub(crate) fn take_for(&self, id: &super::CmId) -> Vec<CmEvent> {
        let mut q = self.inner.queue.lock();
        let (mine, rest): (VecDeque<CmEvent>, VecDeque<CmEvent>) = q
            .drain(..)
            .partition(|e| e.id == *id || e.listen_id.as_ref() == Some(id));
        *q = rest;
        if q.is_empty() {
            self.inner.fd.drain();
        }
        mine.into()
    }

    /// `rdma_get_cm_event`: the next event, waiting for one.
    pub fn get_event(&self) -> CmEvent {
        loop {
            if let Some(e) = self.get_event_timeout(Duration::from_secs(3600)) {
                return e;
            }
        }
    }

    /// The next event if one comes within `timeout`.
    pub fn get_event_timeout(&self, timeout: Duration) -> Option<CmEvent> {
        let deadline = std::time::Instant::now() + timeout;
        let mut q = self.inner.queue.lock();
        loop {
            if let Some(e) = q.pop_front() {
                if q.is_empty() {
                    self.inner.fd.drain();
                }
                Self::handed_out(&e);
                return Some(e);
            }
            if self.inner.cond.wait_until(&mut q, deadline).timed_out() && q.is_empty() {
                return None;
            }
        }
    }

    /// The next event if one is pending (a non-blocking `rdma_get_cm_event`).
    pub fn try_get_event(&self) -> Option<CmEvent> {
        let mut q = self.inner.queue.lock();
        let e = q.pop_front();
        if q.is_empty() {
            self.inner.fd.drain();
        }
        if let Some(e) = &e {
            Self::handed_out(e);
        }
        e
    }

    /// `rdma_get_cm_event` as librdmacm blocks in it: in a `read(2)`, so a signal whose
    /// handler lacks SA_RESTART ends the wait (the errno, EINTR), as the C ABI must.
    ///
    /// # Errors
    /// The read's errno.
    pub fn wait_event(&self) -> std::result::Result<CmEvent, i32> {
        self.inner.waiter.wait(|| self.try_get_event())
    }

    /// How many events are pending.
    pub fn pending(&self) -> usize {
        self.inner.queue.lock().len()
    }

    /// The channel's file descriptor (`channel->fd`).
    pub fn fd(&self) -> RawFd {
        self.inner.fd.raw()
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd()
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the eventfd lives as long as `self.inner`, which this borrow cannot outlive.
        unsafe { BorrowedFd::borrow_raw(self.fd()) }
    }
}
