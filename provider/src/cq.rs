//! Completion queues (`ibv_cq`) and completion channels (`ibv_comp_channel`).

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ferroce_transport::WorkCompletion;
use parking_lot::Mutex;

use crate::driver::Shared;
use crate::events::Owned;
use crate::sys::EventFd;
use crate::{Context, Error, Result};

const NOT_ARMED: u8 = 0;
const ARMED_ANY: u8 = 1;
const ARMED_SOLICITED: u8 = 2;

/// The shared part of a CQ.
#[derive(Debug)]
pub(crate) struct CqInner {
    pub(crate) handle: u32,
    queue: Mutex<VecDeque<WorkCompletion>>,
    /// Capacity; changed only under the `queue` lock (`resize`).
    cqe: std::sync::atomic::AtomicUsize,
    /// Whether completions are stamped as they arrive ([`CompletionQueue::stamp_completions`]).
    stamps: std::sync::atomic::AtomicBool,
    /// Event moderation (`ibv_modify_cq`): an armed CQ fires after this many completions...
    mod_count: AtomicU32,
    /// ... or this long (ns) after the first of them; 0 = no period.
    mod_period_ns: std::sync::atomic::AtomicU64,
    /// Completions since the CQ was armed that have not fired yet.
    pending: AtomicU32,
    channel: Option<Arc<ChannelInner>>,
    armed: AtomicU8,
    /// Events `get_event` returned for this CQ (queued but unread ones do not count).
    got_events: AtomicU32,
    acked_events: AtomicU32,
    /// The device runtime whose CQ registry lists this CQ.
    device: Weak<Shared>,
    /// The device's shards with a QP (or XRC SRQ) that reports here, bit i for shard i: an
    /// empty poll reads their sockets only.
    shards: std::sync::atomic::AtomicU64,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        if let Some(shared) = self.device.upgrade() {
            shared.remove_cq(self.handle);
            shared.forget_events(Owned::Cq(self.handle));
        }
    }
}

impl CqInner {
    /// Shard `index` of the device has a QP or SRQ reporting to this CQ.
    pub(crate) fn fed_by(&self, index: usize) {
        self.shards.fetch_or(1 << index, Ordering::Relaxed);
    }

    /// The shards that feed this CQ (bit i: shard i; 0 before any QP).
    pub(crate) fn shards(&self) -> u64 {
        self.shards.load(Ordering::Relaxed)
    }

    /// Adds a completion; false if the CQ is full (the completion is lost, as on overflow).
    pub(crate) fn push(self: &Arc<Self>, mut wc: WorkCompletion) -> bool {
        if self.stamps.load(Ordering::Relaxed) {
            wc.completion_ts = crate::sys::clock_ns(libc::CLOCK_MONOTONIC);
            wc.completion_wallclock_ns = crate::sys::clock_ns(libc::CLOCK_REALTIME);
        }
        {
            let mut q = self.queue.lock();
            if q.len() >= self.cqe.load(Ordering::Relaxed) {
                return false;
            }
            q.push_back(wc);
        }
        // Solicited-only arming also fires on every completion: ferroce does not yet carry
        // the SE bit into completions, and an extra event is harmless where a missed one hangs.
        let armed = self.armed.load(Ordering::SeqCst);
        if armed != ARMED_ANY && armed != ARMED_SOLICITED {
            return true;
        }
        // Moderation: wait for `count` completions, or the period after the first of them.
        let count = self.mod_count.load(Ordering::Relaxed);
        let n = self.pending.fetch_add(1, Ordering::SeqCst) + 1;
        if n < count {
            let period = self.mod_period_ns.load(Ordering::Relaxed);
            if n == 1 && period > 0 {
                if let Some(shared) = self.device.upgrade() {
                    shared.cq_timer(self, period);
                }
            }
            return true;
        }
        self.fire();
        true
    }

    /// Hands the channel an event, if the CQ is still armed (the arming is used up).
    pub(crate) fn fire(self: &Arc<Self>) {
        let armed = self.armed.load(Ordering::SeqCst);
        let fire = (armed == ARMED_ANY || armed == ARMED_SOLICITED)
            && self
                .armed
                .compare_exchange(armed, NOT_ARMED, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok();
        if fire {
            self.pending.store(0, Ordering::SeqCst);
            if let Some(ch) = &self.channel {
                ch.notify(self);
            }
        }
    }

    /// The moderation period ran out: fire if completions are waiting for an event.
    pub(crate) fn period_elapsed(self: &Arc<Self>) {
        if self.pending.load(Ordering::SeqCst) > 0 {
            self.fire();
        }
    }
}

/// A completion queue: `ibv_create_cq` creates it, `poll` is `ibv_poll_cq`.
#[derive(Debug, Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
    pub(crate) ctx: Context,
}

impl CompletionQueue {
    /// A new CQ, registered with the device's runtime under a number unique on the device.
    pub(crate) fn new(
        ctx: &Context,
        cqe: usize,
        channel: Option<&CompletionChannel>,
    ) -> CompletionQueue {
        let handle = ctx.shared.next_cq_number();
        let cq = CompletionQueue {
            inner: Arc::new(CqInner {
                handle,
                queue: Mutex::new(VecDeque::with_capacity(cqe.min(4096))),
                cqe: std::sync::atomic::AtomicUsize::new(cqe),
                stamps: std::sync::atomic::AtomicBool::new(false),
                mod_count: AtomicU32::new(1),
                mod_period_ns: std::sync::atomic::AtomicU64::new(0),
                pending: AtomicU32::new(0),
                channel: channel.map(|c| c.inner.clone()),
                armed: AtomicU8::new(NOT_ARMED),
                got_events: AtomicU32::new(0),
                acked_events: AtomicU32::new(0),
                device: Arc::downgrade(&ctx.shared),
                shards: std::sync::atomic::AtomicU64::new(0),
            }),
            ctx: ctx.clone(),
        };
        ctx.shared.add_cq(&cq.inner);
        ctx.register_events(Owned::Cq(handle));
        cq
    }

    /// `ibv_poll_cq`: moves up to `wcs.len()` completions into `wcs`, oldest first; returns
    /// how many.
    pub fn poll(&self, wcs: &mut [WorkCompletion]) -> usize {
        // An empty CQ makes the caller drive the network itself (as a poll-mode driver does),
        // so busy-polling programs do not wait for the progress thread to be scheduled.
        let mut q = self.inner.queue.lock();
        if q.is_empty() {
            drop(q);
            self.ctx.shared.poll_inline(self.inner.shards());
            q = self.inner.queue.lock();
        }
        let n = wcs.len().min(q.len());
        for (slot, wc) in wcs.iter_mut().zip(q.drain(..n)) {
            *slot = wc;
        }
        n
    }

    /// Waits up to `timeout` for one completion, polling (each poll of an empty CQ also drives
    /// the network, as a poll-mode driver does) and yielding the CPU between polls. For a
    /// thread that should sleep instead, arm the CQ with a [`CompletionChannel`].
    pub fn wait(&self, timeout: Duration) -> Option<WorkCompletion> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(wc) = self.poll_one() {
                return Some(wc);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::yield_now();
        }
    }

    /// One completion, if any (a convenience over [`CompletionQueue::poll`]).
    pub fn poll_one(&self) -> Option<WorkCompletion> {
        let mut one = [WorkCompletion::default()];
        (self.poll(&mut one) == 1).then_some(one[0])
    }

    /// `ibv_req_notify_cq`: the next completion (or the next solicited one) raises an event on
    /// the completion channel. Completions already queued do not.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the CQ has no completion channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.inner.channel.is_none() {
            return Err(Error::InvalidArgument(
                "CQ created without a completion channel",
            ));
        }
        // Completions before the arming do not count towards moderation.
        self.inner.pending.store(0, Ordering::SeqCst);
        self.inner.armed.store(
            if solicited_only {
                ARMED_SOLICITED
            } else {
                ARMED_ANY
            },
            Ordering::SeqCst,
        );
        Ok(())
    }

    /// `ibv_ack_cq_events`: acknowledges `n` events got from the channel for this CQ.
    pub fn ack_events(&self, n: u32) {
        self.inner.acked_events.fetch_add(n, Ordering::SeqCst);
    }

    /// The CQ's handle number (`ibv_cq.handle`; unique within its context).
    pub fn handle(&self) -> u32 {
        self.inner.handle
    }

    /// The number of completions the CQ holds (`cqe`).
    pub fn cqe(&self) -> usize {
        self.inner.cqe.load(Ordering::Relaxed)
    }

    /// Stamps every completion from now on with the moment it reaches this CQ
    /// (`WorkCompletion::completion_ts` on `CLOCK_MONOTONIC`, `completion_wallclock_ns` on
    /// the real-time clock): `ibv_create_cq_ex` with `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`
    /// or `_WALLCLOCK`.
    pub fn stamp_completions(&self) {
        self.inner.stamps.store(true, Ordering::Relaxed);
    }

    /// `ibv_modify_cq` with `IBV_CQ_ATTR_MODERATE`: once armed, the CQ raises its event after
    /// `cq_count` completions, or `cq_period_us` µs after the first of them, whichever comes
    /// first (`cq_count` 0 or 1 and period 0: every completion, the default).
    pub fn moderate(&self, cq_count: u16, cq_period_us: u16) {
        self.inner
            .mod_count
            .store(u32::from(cq_count.max(1)), Ordering::Relaxed);
        self.inner
            .mod_period_ns
            .store(u64::from(cq_period_us) * 1000, Ordering::Relaxed);
    }

    /// How many completions wait to be polled.
    pub fn len(&self) -> usize {
        self.inner.queue.lock().len()
    }

    /// Whether no completion waits to be polled.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the completions of QP `qpn` still waiting to be polled (the QP went to RESET).
    pub(crate) fn remove_qp(&self, qpn: u32) {
        let mut q = self.inner.queue.lock();
        let before = q.len();
        q.retain(|wc| wc.qp_num != qpn);
        if q.len() != before {
            log::debug!(
                "qp {qpn:#x} reset: {} of its completions removed from CQ {}",
                before - q.len(),
                self.inner.handle
            );
        }
    }

    /// `ibv_resize_cq`: the CQ holds `cqe` completions from now on; returns the new size.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0, a size above `max_cqe`, or one below the number of
    /// completions waiting to be polled (EINVAL, as verbs says).
    pub fn resize(&self, cqe: usize) -> Result<usize> {
        if cqe == 0 || cqe > crate::context::limits::MAX_CQE as usize {
            log::debug!(
                "resize_cq to {cqe}: 1..={} (EINVAL)",
                crate::context::limits::MAX_CQE
            );
            return Err(Error::InvalidArgument("CQ size out of range"));
        }
        let q = self.inner.queue.lock();
        if q.len() > cqe {
            log::debug!(
                "resize_cq to {cqe}: {} completions wait to be polled (EINVAL)",
                q.len()
            );
            return Err(Error::InvalidArgument(
                "fewer entries than completions waiting",
            ));
        }
        self.inner.cqe.store(cqe, Ordering::Relaxed);
        Ok(cqe)
    }

    /// `ibv_destroy_cq`: checks nothing still needs the CQ, then drops this handle.
    ///
    /// # Errors
    /// [`Error::Busy`] while a QP uses it, or while events that
    /// [`CompletionChannel::get_event`] returned for it are not acknowledged (EBUSY; an event
    /// still queued on the channel does not count).
    pub fn destroy(self) -> Result<()> {
        let events = self.inner.got_events.load(Ordering::SeqCst);
        if self.inner.acked_events.load(Ordering::SeqCst) < events {
            return Err(Error::Busy("CQ events not acknowledged"));
        }
        if self.in_use() {
            return Err(Error::Busy("CQ still used by a QP"));
        }
        Ok(())
    }

    /// Whether a QP reports to this CQ (what makes `ibv_destroy_cq` refuse with EBUSY).
    pub fn in_use(&self) -> bool {
        self.ctx.shared.cq_in_use(self.inner.handle)
    }
}

/// The shared part of a completion channel.
#[derive(Debug)]
pub(crate) struct ChannelInner {
    /// CQs with an event not yet got. Weak: a queued event does not keep its CQ (nor so the
    /// channel) alive; destroying the CQ discards it, as the kernel does.
    pending: Mutex<VecDeque<Weak<CqInner>>>,
    fd: EventFd,
}

impl ChannelInner {
    fn notify(&self, cq: &Arc<CqInner>) {
        self.pending.lock().push_back(Arc::downgrade(cq));
        self.fd.signal();
    }
}

/// A completion channel (`ibv_comp_channel`): where armed CQs report that they have new
/// completions. Its file descriptor is readable while an event is pending, so it fits
/// epoll/mio/tokio.
#[derive(Debug, Clone)]
pub struct CompletionChannel {
    pub(crate) inner: Arc<ChannelInner>,
    pub(crate) ctx: Context,
}

impl CompletionChannel {
    pub(crate) fn new(ctx: &Context) -> Result<CompletionChannel> {
        Ok(CompletionChannel {
            inner: Arc::new(ChannelInner {
                pending: Mutex::new(VecDeque::new()),
                fd: EventFd::new_blocking()?,
            }),
            ctx: ctx.clone(),
        })
    }

    /// `ibv_get_cq_event`: waits for an event and returns the CQ it came from.
    pub fn get_event(&self) -> CompletionQueue {
        loop {
            if let Some(cq) = self.get_event_timeout(Duration::from_secs(3600)) {
                return cq;
            }
        }
    }

    /// Like [`CompletionChannel::get_event`], giving up after `timeout`. While it waits, the
    /// calling thread receives the device's datagrams itself (`Shared::sleep_on`), so the
    /// packet that completes its work wakes it directly.
    pub fn get_event_timeout(&self, timeout: Duration) -> Option<CompletionQueue> {
        self.wait_timeout(timeout, true)
    }

    /// As [`CompletionChannel::get_event_timeout`] for the provider's own threads (the CM
    /// agent): the thread waits on the channel only and never takes the device's datagrams,
    /// which stay the program's and the progress thread's.
    pub(crate) fn get_event_quietly(&self, timeout: Duration) -> Option<CompletionQueue> {
        self.wait_timeout(timeout, false)
    }

    /// The next event within `timeout`; while it waits, the thread receives for itself if
    /// `receive`.
    fn wait_timeout(&self, timeout: Duration, receive: bool) -> Option<CompletionQueue> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(cq) = self.take_event() {
                return Some(cq);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            let fd = self.inner.fd.raw();
            if !receive {
                let _ = crate::sys::poll_fds(&[fd], libc::POLLIN, Some(left));
                continue;
            }
            if let Err(e) = self.ctx.shared.sleep_on(fd, left, None) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    log::debug!("a wait on a completion channel failed: {e}");
                    // Never a busy loop on a failing poll: the channel, checked again soon.
                    let _ = crate::sys::poll_fds(
                        &[fd],
                        libc::POLLIN,
                        Some(left.min(Duration::from_millis(1))),
                    );
                }
            }
        }
    }

    /// The next pending event, if any; with none left, the descriptor is drained under the
    /// queue's lock, so an event queued after this signals it again and a wait on it sees it.
    fn take_event(&self) -> Option<CompletionQueue> {
        let mut p = self.inner.pending.lock();
        // Events of CQs destroyed since are dropped.
        while let Some(w) = p.pop_front() {
            if let Some(cq) = w.upgrade() {
                if p.is_empty() {
                    self.inner.fd.drain();
                }
                cq.got_events.fetch_add(1, Ordering::SeqCst);
                return Some(CompletionQueue {
                    inner: cq,
                    ctx: self.ctx.clone(),
                });
            }
        }
        self.inner.fd.drain();
        None
    }

    /// `ibv_get_cq_event` as rdma-core blocks in it, in a `read(2)` of the channel: a signal
    /// whose handler has SA_RESTART lets the wait go on, one without ends it (the errno,
    /// EINTR), as the C ABI must. Meanwhile the thread receives for itself, as
    /// [`CompletionChannel::get_event_timeout`] does; the program's signals are held while it
    /// works and delivered in its waits (`sys::SignalsHeld`), so one that comes while it
    /// processes a datagram still ends the wait. Which handler ran is not known: the wait goes
    /// on only when every handler the process installed has SA_RESTART
    /// (`sys::restarts_after_signal`).
    ///
    /// # Errors
    /// EINTR as above; the errno of a failed wait.
    pub fn wait_event(&self) -> std::result::Result<CompletionQueue, i32> {
        let held = crate::sys::SignalsHeld::new();
        loop {
            if let Some(cq) = self.take_event() {
                return Ok(cq);
            }
            let fd = self.inner.fd.raw();
            let wait = Duration::from_secs(3600);
            match self.ctx.shared.sleep_on(fd, wait, Some(held.waiting())) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                    if !crate::sys::restarts_after_signal() {
                        return Err(libc::EINTR);
                    }
                }
                Err(e) => return Err(e.raw_os_error().unwrap_or(libc::EIO)),
            }
        }
    }

    /// Whether CQs still use the channel (what makes `ibv_destroy_comp_channel` refuse with
    /// EBUSY).
    pub fn in_use(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }

    /// The channel's file descriptor (readable while an event is pending).
    pub fn fd(&self) -> RawFd {
        self.inner.fd.raw()
    }
}

impl std::os::fd::AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd()
    }
}

/// For `tokio::io::unix::AsyncFd`, mio or epoll: readable while an event is pending.
impl std::os::fd::AsFd for CompletionChannel {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the descriptor belongs to the channel's eventfd, which lives in the Arc<ChannelInner> this handle holds, so it stays open for the borrow's lifetime.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.fd()) }
    }
}
