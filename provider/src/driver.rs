//! The driver: it owns a device's engines, the locks around them and their timers, and moves
//! datagrams between the engines and a [`backend`](crate::backend) it knows only by its traits.
//!
//! A device is one or more shards ([`ShardRt`]: a [`Shard`] — an engine and its send batch —
//! with its own socket in the address's group, QPN slot and progress thread); RC and UC QPs
//! without an SRQ are spread over them, everything else is on the first. The handles reach
//! the engines only through the verbs methods of [`Shared`] (`post_send`, `modify_qp`,
//! `copy_barrier`…), which find the QP's shard by the slot in its number, and those only
//! through the shard's methods; each locks the shard, does its work and hands what the engine
//! produced to the backend right away (so a `post_send` leaves in the caller's thread). A
//! pump publishes completions before it sends; bare ACKs built by the poll of a program that
//! answers what it receives wait for its answer and leave with it in one system call
//! ([`Flush::Join`]). Each progress thread sleeps in `poll` on its shard's descriptor and a
//! wake-up eventfd with the engine's next deadline as timeout, receives a batch, feeds the
//! engine, sends its answers, fires timers, and delivers completions to the CQs the engine
//! names (device-wide) and events to the context. `FERROCE_BUSY_POLL=1` makes them spin
//! instead of sleeping (lower latency, a core busy each).

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ferroce_transport::{
    EndpointConfig, Instant, QpAttr, QpAttrMask, RecvWr, SendWr, SrqAttr, VerbError, WcStatus,
};
use parking_lot::Mutex;

use crate::backend::{self, DatapathStats, Receiver};
use crate::cq::CqInner;
use crate::events::{AsyncEventRecord, EventRouter, Owned};
use crate::idle::{BUSY_POLLS_PER_YIELD, EMPTY_POLLS_PER_YIELD, IdleStreak, yield_when_idle};
use crate::mr::MrTable;
use crate::shard::{ACK_HOLD, Settled, Shard};
use crate::sys::{self, EventFd};

/// Datagrams one pump sends before it lets received packets in (a long READ response must
/// not hold the engine while a retry request waits behind it).
const PUMP_BUDGET: usize = 128;

/// How long after a program's last inline poll the progress thread leaves the socket to it.
/// It sleeps until the window ends and looks again: a program that polls its CQ once and then
/// spins on memory (perftest's ib_write_lat before its ACKs come with the answers) has its
/// datagrams taken by this thread at most twice this late, and one that keeps polling costs it
/// a wake-up per window. Each such wake-up on a core where a poller spins preempts the poller:
/// at 100 µs a busy 8-byte ping-pong saw 0.22 wake-ups a round trip and a one-way median of
/// 4.6-6.4 µs, at 500 µs 0.04 and 4.2-4.4 µs (docs/benchmarks.md).
pub(crate) const INLINE_WINDOW: Duration = Duration::from_micros(500);
/// The shortest sleep of the progress thread beside a polling program.
const INLINE_MIN_SLEEP: Duration = Duration::from_micros(20);
/// The progress thread's longest sleep while a program sleeping on a completion channel
/// receives for itself ([`Shared::sleep_on`]) and has been awake within [`SLEEPER_IDLE`]: after
/// the program leaves its sleep, datagrams wait at most this long if it does not come back.
const SLEEPER_SLICE: Duration = Duration::from_millis(1);
/// How long a sleeping program must have slept before the progress thread sleeps its usual
/// long sleeps beside it (and the program's next wake-up signals it instead).
const SLEEPER_IDLE: Duration = Duration::from_millis(10);
/// The progress thread's scheduler slice ([`sys::short_slice`]): the shortest Linux takes.
const PROGRESS_SLICE: Duration = Duration::from_micros(100);

/// Unacknowledged request PSNs of the device below which the progress thread leaves the socket
/// to a polling program (above, a stream: both receive).
const INLINE_MAX_INFLIGHT: u32 = 16;

/// Unacknowledged PSNs of a QP from which a post waits for the next acknowledgement's pump
/// rather than sending alone: a deep queue, not a ping-pong (whose next message may be posted
/// before the last one's ACK is in, and must not wait for it).
const DEFER_MIN_PSNS: u32 = 8;

/// How a pump hands what the engine built to the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flush {
    /// Build and send everything now.
    Now,
    /// Build nothing: a deep queue's posts wait for the next acknowledgement's pump, which
    /// sends them with everything queued by then (trains). ACKs held earlier leave now.
    Hold,
    /// A program's own receive (its poll of a CQ) or receive post: if all that was built are
    /// bare ACKs and the program has been answering what it receives ([`HOLD_AFTER`]), they
    /// wait in the send batch for its answer (one system call for the ACK and the reply of a
    /// ping-pong), and leave at its next post, its next poll that finds nothing, or when
    /// [`ACK_HOLD`] has passed (the progress thread's timer), whichever comes first; anything
    /// else is sent now.
    Join,
}

/// How much later than a hold's end the progress thread may wake before a hold signals it.
const HOLD_SLACK: Duration = Duration::from_micros(100);

thread_local! {
    /// The devices on which this thread's polls left bare ACKs held ([`Flush::Join`]): its
    /// next poll that finds nothing sends them (one thread may drive several devices: `ferroce
    /// lat` runs both ends in one).
    static HELD_HERE: std::cell::RefCell<Vec<SocketAddr>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runtime counters the engine does not keep.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuntimeCounters {
    /// Datagrams handed to the kernel.
    pub udp_sent: u64,
    /// Datagrams received from the kernel.
    pub udp_rcvd: u64,
    /// Datagrams the kernel refused to send.
    pub udp_send_errors: u64,
    /// Of those, datagrams longer than the interface's MTU allows (EMSGSIZE): a `path_mtu`
    /// above what the interface carries.
    pub udp_send_too_long: u64,
    /// Datagrams dropped by fault injection.
    pub injected_losses: u64,
    /// Completions dropped because a CQ was full.
    pub cq_overflows: u64,
    /// Times the progress thread woke from a sleep.
    pub wakeups: u64,
    /// `sendmmsg` calls made.
    pub send_calls: u64,
    /// `UDP_SEGMENT` trains sent.
    pub trains: u64,
    /// Received datagrams fault injection marked CE (`FERROCE_FAULTS=ce=P`).
    pub injected_ce: u64,
    /// `recvmmsg` calls made, those that found nothing included.
    pub recv_calls: u64,
    /// `recvmmsg` calls that found nothing (a poll of an empty CQ reads the socket).
    pub empty_recvs: u64,
    /// `recvmmsg` calls with datagrams made by programs asleep on a completion channel (a
    /// thread in `get_event_timeout` or `ibv_get_cq_event` receives for itself).
    pub sleeper_recvs: u64,
    /// Datagrams the address's group steered here that belonged to another member (a
    /// process, or another shard of this device), sent on to it: MADs through the QP1
    /// routing point, and data only while the group's steering table changes.
    pub forwarded: u64,
}

/// What a device's handles share with its progress threads: the device-wide state (regions,
/// CQs, numbers, events, multicast) and its shards.
pub(crate) struct Shared {
    local: SocketAddr,
    /// The device's shards, the one with the process's lowest slot first (it has QP1, SRQs,
    /// UD and XRC QPs, the multicast groups and the CQ moderation timers).
    shards: Vec<ShardRt>,
    /// Which shard owns the QPs of each slot (QPN bits 23:16); `NO_SHARD` for none.
    by_slot: [u8; 256],
    mrs: MrTable,
    shutdown: AtomicBool,
    epoch: std::time::Instant,
    busy_poll: bool,
    /// Which context each event goes to.
    router: EventRouter,
    /// Numbers of PDs, unique on the device (so a PD of one context never matches another's).
    next_pd: AtomicU32,
    /// Every live CQ of the device by the number the engine reports completions with
    /// ([`ferroce_transport::Completion::cq`]). Locked after `engine`, never before.
    cqs: Mutex<HashMap<u32, Weak<CqInner>>>,
    next_cq: AtomicU32,
    /// Moderated CQs waiting for their period to run out: (deadline in engine ns, CQ).
    cq_timers: Mutex<Vec<(u64, Weak<CqInner>)>>,
    /// Programs asleep in [`Shared::sleep_on`], receiving for themselves.
    sleepers: AtomicUsize,
    /// The multicast groups this process joined on the device (locked before `engine`,
    /// never after); `None` on the in-memory backend, which has no IP groups.
    mcast: Option<Mutex<crate::mcast::McastSockets>>,
    /// The groups' epoll descriptor for the progress thread to poll (−1 before any join).
    mcast_fd: AtomicI32,
}

/// `Shared::by_slot` for a slot no shard of this device owns.
const NO_SHARD: u8 = u8::MAX;

/// The most shards a device runs (each takes a slot of the address's 255; a sleeper polls
/// two descriptors of each, beside its channel, in a 32-bit ready mask).
pub(crate) const MAX_SHARDS: usize = 8;

/// The highest first slot with which a device takes its default shards (one per core): slots
/// are taken lowest first, so a process whose first slot is above this finds the address
/// crowded and runs one shard, leaving the rest of the 255 to one process each (a 64-rank MPI
/// job on one address fits however many cores each rank sees).
pub(crate) const AUTO_SHARD_SLOTS: u8 = 64;

/// One shard's runtime: its engine (behind the shard lock), its socket's receiving half, its
/// progress thread's sleep and its place in the address's group.
pub(crate) struct ShardRt {
    /// Its index in [`Shared::shards`].
    index: usize,
    /// The engine and its send batch: the engine lock.
    shard: Mutex<Shard>,
    wake: EventFd,
    /// The deadline the progress thread sleeps until (ns since epoch; u64::MAX = none).
    sleep_until: AtomicU64,
    /// When the progress thread wakes at the latest (its sleep's timeout, engine ns; 0 while
    /// it is awake).
    wakes_at: AtomicU64,
    /// The backend's receiving half; whoever holds this lock is the one receiver.
    rx: Mutex<Box<dyn Receiver>>,
    /// `rx`'s descriptor, readable while datagrams wait (valid while `rx` lives).
    rx_fd: RawFd,
    /// The receiver's second descriptor, polled beside `rx_fd`.
    rx_side_fd: Option<RawFd>,
    /// The backend's counters.
    stats: Arc<DatapathStats>,
    /// This shard's place in the address's group (none on the in-memory backend).
    membership: Option<crate::host::group::Membership>,
    /// When a program last polled an empty CQ fed by this shard and drove its socket itself
    /// (engine ns).
    last_inline: AtomicU64,
    /// QPs the shard holds (where a new QP goes: the shard with the fewest).
    qps: AtomicUsize,
}

/// A device's running runtime: the [`Shared`] state and its progress thread, stopped and
/// joined when the last context of the device goes.
pub(crate) struct Runtime {
    pub(crate) shared: Arc<Shared>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The process that started it ([`crate::fork`]).
    owner: u32,
}

impl std::ops::AddAssign for RuntimeCounters {
    /// Adds `other`'s counts to these (a device's shards summed).
    fn add_assign(&mut self, other: RuntimeCounters) {
        self.udp_sent += other.udp_sent;
        self.udp_rcvd += other.udp_rcvd;
        self.udp_send_errors += other.udp_send_errors;
        self.udp_send_too_long += other.udp_send_too_long;
        self.injected_losses += other.injected_losses;
        self.cq_overflows += other.cq_overflows;
        self.wakeups += other.wakeups;
        self.send_calls += other.send_calls;
        self.trains += other.trains;
        self.injected_ce += other.injected_ce;
        self.recv_calls += other.recv_calls;
        self.empty_recvs += other.empty_recvs;
        self.sleeper_recvs += other.sleeper_recvs;
    }
}

impl RuntimeCounters {
    /// Every counter with its name, in a fixed order.
    pub fn named(&self) -> [(&'static str, u64); 14] {
        [
            ("udp_sent", self.udp_sent),
            ("udp_rcvd", self.udp_rcvd),
            ("udp_send_errors", self.udp_send_errors),
            ("udp_send_too_long", self.udp_send_too_long),
            ("injected_losses", self.injected_losses),
            ("cq_overflows", self.cq_overflows),
            ("wakeups", self.wakeups),
            ("send_calls", self.send_calls),
            ("trains", self.trains),
            ("injected_ce", self.injected_ce),
            ("recv_calls", self.recv_calls),
            ("empty_recvs", self.empty_recvs),
            ("sleeper_recvs", self.sleeper_recvs),
            ("forwarded", self.forwarded),
        ]
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if !crate::fork::owned(self.owner) {
            // A forked child's copy: its threads are the parent's, not the child's to join.
            std::mem::forget(std::mem::take(self.threads.get_mut()));
            return;
        }
        self.shared.stop();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        if log::log_enabled!(log::Level::Info) {
            // The device's last context is closing: what it did, as `ibv_devinfo` and the
            // port's hw_counters would show it (the counters that are not zero).
            let (e, r) = self.shared.all_counters();
            let nonzero: Vec<String> = e
                .named()
                .into_iter()
                .chain(r.named())
                .filter(|&(_, v)| v != 0)
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            log::info!(
                "{}: closed; counters: {}",
                self.shared.local,
                nonzero.join(" ")
            );
        }
    }
}

/// A runtime of this process: its bound address, the runtime, and its shared state (which
/// outlives the runtime until the last handle goes, holding the socket).
type Registered = (SocketAddr, Weak<Runtime>, Weak<Shared>);

/// The runtimes of this process by bound address: every open of a device shares one.
static RUNTIMES: Mutex<Vec<Registered>> = Mutex::new(Vec::new());

impl Runtime {
    /// The runtime of the device at `cfg.local`: the running one if this process has it open,
    /// else a new one (its options are the first opener's).
    ///
    /// # Errors
    /// As [`Shared::start`].
    pub(crate) fn get_or_start(cfg: RuntimeConfig) -> crate::Result<Arc<Runtime>> {
        crate::fork::install();
        let mut table = RUNTIMES.lock();
        table.retain(|(_, rt, sh)| rt.strong_count() > 0 || sh.strong_count() > 0);
        if let Some(rt) = table
            .iter()
            .find(|(a, _, _)| *a == cfg.local)
            .and_then(|(_, rt, _)| rt.upgrade())
        {
            log::debug!("{}: a new context shares the running device", cfg.local);
            return Ok(rt);
        }
        // A runtime of this address that is shutting down still holds its socket until its
        // last handle goes: wait for that (bounded) rather than fail with EADDRINUSE.
        let closing: Vec<Weak<Shared>> = table
            .iter()
            .filter(|(a, _, _)| *a == cfg.local)
            .map(|(_, _, sh)| sh.clone())
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while closing.iter().any(|w| w.strong_count() > 0) && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        let local = cfg.local;
        let (shared, threads) = Shared::start(cfg)?;
        let rt = Arc::new(Runtime {
            shared: shared.clone(),
            threads: Mutex::new(threads),
            owner: crate::fork::pid(),
        });
        table.retain(|(a, _, _)| *a != local);
        table.push((local, Arc::downgrade(&rt), Arc::downgrade(&shared)));
        Ok(rt)
    }
}

/// In a forked child ([`crate::fork`]): forgets the parent's runtimes, never dropping them, so
/// the child's next open starts its own.
pub(crate) fn forget_all() {
    if RUNTIMES.is_locked() {
        // In a forked child only the forking thread runs, and fork is the program's call,
        // never made inside this module's critical sections.
        // SAFETY: a held lock belongs to a parent thread the child does not have.
        unsafe { RUNTIMES.force_unlock() };
    }
    let runtimes = std::mem::take(&mut *RUNTIMES.lock());
    // The parent's slot locks live while any descriptor of the registry does: the child's
    // copies go, so a parent that dies is seen dead although this child lives on.
    for sh in runtimes.iter().filter_map(|(_, _, sh)| sh.upgrade()) {
        for m in sh.shards.iter().filter_map(|r| r.membership.as_ref()) {
            m.registry.close_inherited();
        }
    }
    std::mem::forget(runtimes);
}

/// The registry of `local` if this process is a member of its group (and its slot).
pub(crate) fn member_registry(
    local: SocketAddr,
) -> Option<(Arc<crate::host::group::Registry>, u8)> {
    RUNTIMES
        .lock()
        .iter()
        .filter(|(a, _, _)| *a == local)
        .find_map(|(_, _, sh)| sh.upgrade())
        .and_then(|sh| {
            sh.shards[0]
                .membership
                .as_ref()
                .map(|m| (m.registry.clone(), m.slot))
        })
}

/// Sends the ACKs this thread's polls held ([`Flush::Join`]) on every device.
fn flush_held_all() {
    // At exit (a destructor of the C library, after this thread's locals are gone) there is
    // nothing held here to find.
    let addrs = HELD_HERE
        .try_with(|h| std::mem::take(&mut *h.borrow_mut()))
        .unwrap_or_default();
    let held: Vec<Arc<Shared>> = RUNTIMES
        .lock()
        .iter()
        .filter(|(a, _, _)| addrs.contains(a))
        .filter_map(|(_, _, sh)| sh.upgrade())
        .collect();
    for sh in held {
        sh.flush_held();
    }
}

/// How a runtime is started.
pub(crate) struct RuntimeConfig {
    pub(crate) local: SocketAddr,
    pub(crate) engine: EndpointConfig,
    pub(crate) faults: Option<crate::faults::FaultConfig>,
    pub(crate) pcap_path: Option<std::path::PathBuf>,
    pub(crate) busy_poll: bool,
    /// `UDP_SEGMENT` trains out and `UDP_GRO` in.
    pub(crate) trains: bool,
    /// The in-memory backend instead of a UDP socket.
    pub(crate) memory: bool,
    /// Packets leave ECN-capable and CE marks are read (the engine's congestion control).
    pub(crate) ecn: bool,
    /// Shards (engines, sockets, progress threads) to run; 1 on the in-memory backend and
    /// with a capture.
    pub(crate) shards: usize,
    /// `FERROCE_FAULTS`' `droprx` flag: one packet dropped per device, whichever shard
    /// receives it (every shard's receiver shares it).
    pub(crate) dropped_rx: Arc<std::sync::atomic::AtomicBool>,
    /// `shards` is the default (one per core), not asked for: one only on a crowded address
    /// ([`AUTO_SHARD_SLOTS`]).
    pub(crate) shards_auto: bool,
}

impl ShardRt {
    /// Opens shard `index`'s backend (a socket joining the address's group, with a slot of
    /// its own) and its engine.
    fn open(cfg: &RuntimeConfig, index: usize) -> crate::Result<ShardRt> {
        let stats = Arc::new(DatapathStats::default());
        let (tx, rx, membership) = backend::open(cfg, index, &stats)?;
        let mut engine = cfg.engine;
        // This shard's QPNs carry its slot: the group steers them to its socket.
        if let Some(m) = &membership {
            engine.qpn_slot = Some(m.slot);
            engine.first_qpn = (u32::from(m.slot) << 16) | 0x11;
        }
        // Unacknowledged request PSNs of all its QPs together: what the receive buffer holds
        // at ~8 KiB of buffer per 4 KiB packet (a peer's buffer is taken to be like ours).
        engine.inflight_budget = (rx.capacity() / 8192).clamp(256, 4096) as u32;
        log::debug!(
            "{} shard {index}: receive buffer {} bytes: at most {} request PSNs in flight over \
             its QPs",
            cfg.local,
            rx.capacity(),
            engine.inflight_budget
        );
        let rx_fd = rx.ready_fd();
        let rx_side_fd = rx.side_fd();
        Ok(ShardRt {
            index,
            shard: Mutex::new(Shard::new(engine, tx)),
            wake: EventFd::new()?,
            sleep_until: AtomicU64::new(u64::MAX),
            wakes_at: AtomicU64::new(0),
            rx: Mutex::new(rx),
            rx_fd,
            rx_side_fd,
            stats,
            membership,
            last_inline: AtomicU64::new(0),
            qps: AtomicUsize::new(0),
        })
    }

    /// The counters of the shard's runtime and backend.
    fn counters(&self, sh: &Shard) -> RuntimeCounters {
        RuntimeCounters {
            udp_sent: DatapathStats::get(&self.stats.sent),
            udp_rcvd: DatapathStats::get(&self.stats.rcvd),
            udp_send_errors: DatapathStats::get(&self.stats.send_errors),
            udp_send_too_long: DatapathStats::get(&self.stats.send_too_long),
            injected_losses: DatapathStats::get(&self.stats.injected_losses),
            send_calls: DatapathStats::get(&self.stats.send_calls),
            trains: DatapathStats::get(&self.stats.trains),
            injected_ce: DatapathStats::get(&self.stats.injected_ce),
            recv_calls: DatapathStats::get(&self.stats.recv_calls),
            empty_recvs: DatapathStats::get(&self.stats.empty_recvs),
            wakeups: DatapathStats::get(&self.stats.wakeups),
            sleeper_recvs: DatapathStats::get(&self.stats.sleeper_recvs),
            forwarded: DatapathStats::get(&self.stats.forwarded),
            ..sh.runtime_counters()
        }
    }
}

impl Shared {
    /// Opens the backend of each shard (a UDP socket in the address's group, wrapped in fault
    /// injection and pcap recording if asked) and starts the progress threads and the keeper.
    pub(crate) fn start(
        cfg: RuntimeConfig,
    ) -> crate::Result<(Arc<Shared>, Vec<std::thread::JoinHandle<()>>)> {
        let n = if cfg.memory || cfg.pcap_path.is_some() {
            if cfg.shards > 1 {
                log::debug!(
                    "{}: one shard (a capture or the in-memory backend takes one socket)",
                    cfg.local
                );
            }
            1
        } else {
            cfg.shards.clamp(1, MAX_SHARDS)
        };
        let mut shards = Vec::with_capacity(n);
        shards.push(ShardRt::open(&cfg, 0)?);
        let first_slot = shards[0].membership.as_ref().map_or(0, |m| m.slot);
        let n = if cfg.shards_auto && n > 1 && first_slot > AUTO_SHARD_SLOTS {
            log::debug!(
                "{}: one shard, not {n}: this process's slot {first_slot} is above \
                 {AUTO_SHARD_SLOTS} (a crowded address; FERROCE_SHARDS=N asks for N)",
                cfg.local
            );
            1
        } else {
            n
        };
        for index in 1..n {
            // A shard beyond the first that cannot open (the address's slots are all taken,
            // say) leaves the device with fewer shards, not without the device.
            match ShardRt::open(&cfg, index) {
                Ok(r) => shards.push(r),
                Err(e) => {
                    log::info!(
                        "{}: {index} of {n} shards: shard {index} did not open: {e}",
                        cfg.local
                    );
                    break;
                }
            }
        }
        // The shard with the lowest slot first: the slot steered the host-wide QP1 role.
        shards.sort_by_key(|r| r.membership.as_ref().map_or(0, |m| m.slot));
        let mut by_slot = [NO_SHARD; 256];
        for (i, r) in shards.iter_mut().enumerate() {
            r.index = i;
            if let Some(m) = &r.membership {
                by_slot[usize::from(m.slot)] = i as u8;
            }
        }
        let shared = Arc::new(Shared {
            local: cfg.local,
            shards,
            by_slot,
            mrs: MrTable::default(),
            shutdown: AtomicBool::new(false),
            epoch: std::time::Instant::now(),
            busy_poll: cfg.busy_poll,
            router: EventRouter::default(),
            next_pd: AtomicU32::new(1),
            cqs: Mutex::new(HashMap::new()),
            next_cq: AtomicU32::new(1),
            cq_timers: Mutex::new(Vec::new()),
            sleepers: AtomicUsize::new(0),
            mcast: (!cfg.memory).then(|| Mutex::new(crate::mcast::McastSockets::new(cfg.local))),
            mcast_fd: AtomicI32::new(-1),
        });
        let opened = shared.shards.len();
        let mut threads = Vec::with_capacity(opened + 1);
        for i in 0..opened {
            let s2 = shared.clone();
            let name = if i == 0 {
                format!("ferroce-{}", cfg.local.ip())
            } else {
                format!("ferroce{i}-{}", cfg.local.ip())
            };
            threads.push(crate::sys::spawn_quiet(name, move || s2.progress(i))?);
        }
        // The keeper finds each shard's socket number now (its probe is answered by the
        // shard's progress thread) and rebalances whenever the group's members change.
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let s3 = shared.clone();
        threads.push(crate::sys::spawn_quiet(
            format!("ferroce-keeper-{}", cfg.local.ip()),
            move || s3.keep(&ready_tx),
        )?);
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(()) => {}
            Err(_) => log::warn!(
                "{}: the group's steering table is not up yet; this process's QPs may miss \
                 packets until it is",
                cfg.local
            ),
        }
        Ok((shared, threads))
    }

    /// The keeper thread: rebalances the address's group when this device's shards join and
    /// whenever its live members change (a member closed, or died: its record lock fell). A
    /// change is noticed within `KEEPER_PERIOD`.
    fn keep(self: Arc<Self>, ready: &std::sync::mpsc::Sender<()>) {
        const KEEPER_PERIOD: Duration = Duration::from_millis(20);
        let members: Vec<&crate::host::group::Membership> = self
            .shards
            .iter()
            .filter_map(|r| r.membership.as_ref())
            .collect();
        if members.is_empty() {
            // Nobody shares an in-memory device.
            let _ = ready.send(());
            return;
        }
        // The QP table is rewritten every tenth period (200 ms): it walks every QP.
        const QP_TABLE_PERIODS: u32 = 10;
        // Shards whose joining rebalance is still to be done.
        let mut joining = vec![true; members.len()];
        let mut told = false;
        let mut period = 0u32;
        while !self.shutdown.load(Ordering::SeqCst) {
            for (m, first) in members.iter().zip(joining.iter_mut()) {
                if *first || m.changed() {
                    // Joining, a shard waits its turn; a change others may be handling
                    // already is left to whoever holds the registry.
                    if m.rebalance(Duration::from_secs(5), *first, &self.shutdown) && *first {
                        *first = false;
                    } else if *first && !m.changed() {
                        // Another member rebalanced for this one meanwhile.
                        *first = false;
                    }
                }
            }
            if !told && joining.iter().all(|f| !f) {
                told = true;
                let _ = ready.send(());
            }
            for r in &self.shards {
                if let Some(m) = &r.membership {
                    self.publish_counters(r, m);
                    if period % QP_TABLE_PERIODS == 0 {
                        Self::publish_qps(r, m);
                    }
                }
            }
            period = period.wrapping_add(1);
            std::thread::sleep(KEEPER_PERIOD);
        }
    }

    /// Copies a shard's counters to its slot's page of the registry, where `ferroce devinfo
    /// --counters` reads them (at most one keeper period old).
    fn publish_counters(&self, r: &ShardRt, membership: &crate::host::group::Membership) {
        let (e, rc) = {
            let sh = r.shard.lock();
            (sh.engine_counters(), r.counters(&sh))
        };
        let values = e.named().into_iter().chain(rc.named()).map(|(_, v)| v);
        membership.registry.publish(membership.slot, values);
    }

    /// Copies a shard's QPs (its failed ones first, then by QPN; QP1 left out) to its slot's
    /// table in the registry, where `ferroce devinfo --qps` reads them.
    fn publish_qps(r: &ShardRt, membership: &crate::host::group::Membership) {
        let (total, records) = r.shard.lock().qp_records(crate::host::qptable::RECORDS);
        membership.registry.publish_qps(
            membership.slot,
            u32::try_from(total).unwrap_or(u32::MAX),
            &records,
        );
    }

    /// The device's address and UDP port.
    pub(crate) fn local(&self) -> SocketAddr {
        self.local
    }

    /// The device's memory regions and windows (`ibv_reg_mr`, `ibv_alloc_mw`…).
    pub(crate) fn mrs(&self) -> &MrTable {
        &self.mrs
    }

    /// Sends the asynchronous events of `what` to `events` (its context's queue) from now on.
    pub(crate) fn register_events(&self, what: Owned, events: &Arc<crate::events::EventQueue>) {
        self.router.register(what, events);
    }

    /// Stops routing `what`'s events (it is being destroyed).
    pub(crate) fn forget_events(&self, what: Owned) {
        self.router.unregister(what);
    }

    /// Engine time now.
    pub(crate) fn now(&self) -> Instant {
        Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// The shard that owns QP `qpn` (by the slot in its bits 23:16; the first shard for QPNs
    /// of no shard here, QP1's among them).
    fn shard_of(&self, qpn: u32) -> &ShardRt {
        let i = self.by_slot[((qpn >> 16) & 0xFF) as usize];
        self.shards.get(usize::from(i)).unwrap_or(&self.shards[0])
    }

    /// The first shard: the process's lowest slot, QP1, SRQs, UD and XRC QPs, multicast and
    /// the CQ timers.
    fn first(&self) -> &ShardRt {
        // `start` always opens at least one shard.
        &self.shards[0]
    }

    /// Runs `f` on shard `r`, then sends what it produced and routes completions.
    fn on_shard<R>(&self, r: &ShardRt, f: impl FnOnce(&mut Shard, &MrTable, Instant) -> R) -> R {
        self.on_shard_flush(r, Flush::Now, f)
    }

    /// As [`Shared::on_shard`], pumping as `flush` says.
    fn on_shard_flush<R>(
        &self,
        r: &ShardRt,
        flush: Flush,
        f: impl FnOnce(&mut Shard, &MrTable, Instant) -> R,
    ) -> R {
        let mut sh = r.shard.lock();
        let now = self.now();
        let out = f(&mut sh, &self.mrs, now);
        self.pump(r, &mut sh, now, flush);
        out
    }

    /// `ibv_post_send`'s way in: runs `f` (the posts) on QP `qpn`'s engine. If RC QP `qpn`
    /// already had [`DEFER_MIN_PSNS`] requests unacknowledged, what the posts produce waits
    /// for the acknowledgement (or the retransmit timer), whose processing sends it with
    /// everything else queued by then: a deep queue of small messages leaves in trains, one
    /// system call for many. A post to a QP with nothing in flight (a lone message) leaves at
    /// once, in the caller's thread.
    fn on_shard_post<R>(&self, qpn: u32, f: impl FnOnce(&mut Shard, &MrTable, Instant) -> R) -> R {
        let r = self.shard_of(qpn);
        let mut sh = r.shard.lock();
        let now = self.now();
        let in_flight = sh.unacked_psns(qpn) >= DEFER_MIN_PSNS;
        let out = f(&mut sh, &self.mrs, now);
        self.pump(
            r,
            &mut sh,
            now,
            if in_flight { Flush::Hold } else { Flush::Now },
        );
        out
    }

    /// Where a new QP goes: an RC or UC QP with no SRQ to the shard with the fewest QPs, every
    /// other (QP1, UD, XRC, a QP on an SRQ) to the first shard, where SRQs, multicast and the
    /// connection manager are.
    fn place(&self, init: &ferroce_transport::QpInitAttr, gsi: bool) -> &ShardRt {
        let spread = !gsi
            && init.srq.is_none()
            && matches!(
                init.qp_type,
                ferroce_transport::QpType::Rc | ferroce_transport::QpType::Uc
            );
        if !spread {
            return self.first();
        }
        self.shards
            .iter()
            .min_by_key(|r| r.qps.load(Ordering::Relaxed))
            .unwrap_or(self.first())
    }

    // ---- The verbs the handles call: they reach the engine only through these. ----

    /// `ibv_create_qp` (QP1 if `gsi`): `registered` runs with the new QPN under the engine
    /// lock, so nothing of the QP (an event) can come before the caller knows it.
    pub(crate) fn create_qp(
        &self,
        init: ferroce_transport::QpInitAttr,
        gsi: bool,
        registered: impl FnOnce(u32),
    ) -> Result<u32, VerbError> {
        let shard = self.place(&init, gsi);
        let (send_cq, recv_cq) = (init.send_cq, init.recv_cq);
        let r = self.on_shard(shard, |sh, _, _| {
            let r = sh.create_qp(init, gsi);
            if let Ok(qpn) = r {
                registered(qpn);
            }
            r
        });
        if r.is_ok() {
            shard.qps.fetch_add(1, Ordering::Relaxed);
            // Its CQs' polls drive this shard's socket.
            let cqs = self.cqs.lock();
            for cq in [send_cq, recv_cq] {
                if let Some(cq) = cqs.get(&cq).and_then(Weak::upgrade) {
                    cq.fed_by(shard.index);
                }
            }
        }
        r
    }

    /// `ibv_destroy_qp`: its unfinished work is dropped (a destroyed QP completes nothing).
    pub(crate) fn destroy_qp(&self, qpn: u32) {
        let r = self.shard_of(qpn);
        // Only the first shard's QPs join groups.
        let mut mc = self
            .mcast
            .as_ref()
            .filter(|_| r.index == 0)
            .map(|m| m.lock());
        let _ = r
            .qps
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        self.on_shard(r, |sh, _, _| {
            sh.destroy_qp(qpn);
            // Groups its destruction left without a QP here are left on the network.
            if let Some(mc) = mc.as_mut() {
                for g in mc.groups() {
                    if !sh.mcast_attached(g) {
                        mc.leave(g);
                    }
                }
            }
        });
    }

    /// The QP's first error since RESET and why ([`ferroce_transport::QpError`]).
    pub(crate) fn qp_error(&self, qpn: u32) -> Option<ferroce_transport::QpError> {
        self.on_shard(self.shard_of(qpn), |sh, _, _| sh.qp_error(qpn))
    }

    /// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB` for QP `qpn`.
    pub(crate) fn block_self_mcast_lb(&self, qpn: u32) -> Result<(), VerbError> {
        self.on_shard(self.shard_of(qpn), |sh, _, _| sh.block_self_mcast_lb(qpn))
    }

    /// `ibv_attach_mcast`: the engine attaches the QP (UD, so on the first shard, whose
    /// thread reads the groups' sockets), and the group's socket joins the group on the
    /// network if no QP of this process had.
    pub(crate) fn attach_mcast(&self, qpn: u32, group: IpAddr) -> crate::Result<()> {
        let Some(mc) = &self.mcast else {
            log::debug!("ibv_attach_mcast: the in-memory backend has no IP multicast");
            return Err(crate::Error::NotSupported(
                "multicast on the in-memory backend",
            ));
        };
        let mut mc = mc.lock();
        let new = self
            .on_shard(self.shard_of(qpn), |sh, _, _| sh.attach_mcast(qpn, group))
            .map_err(|e| {
                log::debug!("ibv_attach_mcast QP {qpn:#x} to {group}: {e}");
                crate::Error::from(e)
            })?;
        if !mc.has(group) {
            if let Err(e) = mc.join(group) {
                log::debug!(
                    "ibv_attach_mcast QP {qpn:#x}: joining {group} on {}'s interface: {e}",
                    self.local
                );
                if new {
                    let _ =
                        self.on_shard(self.shard_of(qpn), |sh, _, _| sh.detach_mcast(qpn, group));
                }
                return Err(e.into());
            }
            self.mcast_fd
                .store(mc.ready_fd().unwrap_or(-1), Ordering::SeqCst);
            // The first shard's thread polls the groups' descriptor from its next pass.
            self.first().wake.signal();
        }
        Ok(())
    }

    /// `ibv_detach_mcast`: the engine detaches the QP; the last QP of this process leaving
    /// a group leaves it on the network.
    pub(crate) fn detach_mcast(&self, qpn: u32, group: IpAddr) -> crate::Result<()> {
        let Some(mc) = &self.mcast else {
            return Err(crate::Error::NotSupported(
                "multicast on the in-memory backend",
            ));
        };
        let mut mc = mc.lock();
        let empty = self
            .on_shard(self.shard_of(qpn), |sh, _, _| sh.detach_mcast(qpn, group))
            .map_err(|e| {
                log::debug!("ibv_detach_mcast QP {qpn:#x} from {group}: {e}");
                crate::Error::from(e)
            })?;
        if empty {
            mc.leave(group);
        }
        Ok(())
    }

    /// Takes what waits on the groups' sockets through the engine (the progress thread, when
    /// a group is joined). A join or leave under way makes it wait for the next pass.
    fn receive_mcast(&self) {
        let Some(mut mc) = self.mcast.as_ref().and_then(|m| m.try_lock()) else {
            return;
        };
        let r = self.first();
        let mut sh = r.shard.lock();
        let now = self.now();
        let n = mc
            .drain(&mut |from, group, bytes| sh.receive_group(now, from, group, bytes, &self.mrs));
        drop(mc);
        if n > 0 {
            DatapathStats::add(&r.stats.rcvd, n as u64);
            self.pump(r, &mut sh, now, Flush::Now);
        }
    }

    /// `ibv_modify_qp`.
    pub(crate) fn modify_qp(
        &self,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), VerbError> {
        self.on_shard(self.shard_of(qpn), |sh, mrs, now| {
            sh.modify_qp(qpn, attr, mask, mrs, now)
        })
    }

    /// `ibv_query_qp`.
    pub(crate) fn query_qp(&self, qpn: u32) -> Option<QpAttr> {
        self.shard_of(qpn).shard.lock().query_qp(qpn)
    }

    /// `ibv_post_send` for a list: posts in order and stops at the first refused WR, which
    /// is returned with its index; the WRs before it were posted. See
    /// [`Shared::on_shard_post`] for when the packets leave.
    pub(crate) fn post_send(&self, qpn: u32, wrs: &[SendWr]) -> Result<(), (usize, VerbError)> {
        self.on_shard_post(qpn, |sh, mrs, now| sh.post_send(qpn, wrs, mrs, now))
    }

    /// `ibv_post_recv`.
    /// ACKs held for the program's answer stay held: a program reposts its receive before
    /// it answers.
    pub(crate) fn post_recv(&self, qpn: u32, wr: &RecvWr) -> Result<(), VerbError> {
        self.on_shard_flush(self.shard_of(qpn), Flush::Join, |sh, mrs, now| {
            sh.post_recv(qpn, wr, mrs, now)
        })
    }

    /// `ibv_create_srq` (on the first shard, with the QPs that will use it): `registered`
    /// runs with its number under the engine lock.
    pub(crate) fn create_srq(&self, attr: SrqAttr, registered: impl FnOnce(u32)) -> u32 {
        self.on_shard(self.first(), |sh, _, _| {
            let n = sh.create_srq(attr);
            registered(n);
            n
        })
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: `registered` runs with its number under the
    /// engine lock.
    pub(crate) fn create_xrc_srq(
        &self,
        attr: SrqAttr,
        xrc: ferroce_transport::XrcSrq,
        registered: impl FnOnce(u32),
    ) -> u32 {
        let cq = xrc.cq;
        let n = self.on_shard(self.first(), |sh, _, _| {
            let n = sh.create_xrc_srq(attr, xrc);
            registered(n);
            n
        });
        if let Some(cq) = self.cqs.lock().get(&cq).and_then(Weak::upgrade) {
            cq.fed_by(0);
        }
        n
    }

    /// `ibv_destroy_srq`.
    pub(crate) fn destroy_srq(&self, srqn: u32) {
        self.on_shard(self.first(), |sh, _, _| sh.destroy_srq(srqn));
    }

    /// Whether a QP receives through SRQ `srqn`.
    pub(crate) fn srq_in_use(&self, srqn: u32) -> bool {
        self.first().shard.lock().srq_in_use(srqn)
    }

    /// Whether a QP reports to CQ `cq`.
    pub(crate) fn cq_in_use(&self, cq: u32) -> bool {
        self.shards.iter().any(|r| r.shard.lock().cq_in_use(cq))
    }

    /// `ibv_post_srq_recv` (held ACKs stay held, as [`Shared::post_recv`]).
    pub(crate) fn post_srq_recv(&self, srqn: u32, wr: &RecvWr) -> Result<(), VerbError> {
        self.on_shard_flush(self.first(), Flush::Join, |sh, _, _| {
            sh.post_srq_recv(srqn, wr)
        })
    }

    /// `ibv_modify_srq` with `IBV_SRQ_LIMIT`; `None` if the limit is above `max_wr`.
    pub(crate) fn arm_srq(&self, srqn: u32, limit: u32) -> Option<Result<(), VerbError>> {
        self.on_shard(self.first(), |sh, _, _| sh.arm_srq(srqn, limit))
    }

    /// `ibv_query_srq`.
    pub(crate) fn query_srq(&self, srqn: u32) -> Option<SrqAttr> {
        self.first().shard.lock().query_srq(srqn)
    }

    /// The engine's counters (named as rxe's hw_counters) and the runtime's.
    /// Summed over the device's shards.
    pub(crate) fn all_counters(&self) -> (ferroce_transport::Counters, RuntimeCounters) {
        let mut sum = (
            ferroce_transport::Counters::default(),
            RuntimeCounters::default(),
        );
        for r in &self.shards {
            let sh = r.shard.lock();
            sum.0 += sh.engine_counters();
            sum.1 += r.counters(&sh);
        }
        sum
    }

    /// Each shard's slot and counters, in shard order.
    pub(crate) fn shard_counters(
        &self,
    ) -> Vec<(Option<u8>, ferroce_transport::Counters, RuntimeCounters)> {
        self.shards
            .iter()
            .map(|r| {
                let sh = r.shard.lock();
                (
                    r.membership.as_ref().map(|m| m.slot),
                    sh.engine_counters(),
                    r.counters(&sh),
                )
            })
            .collect()
    }

    /// Returns once no copy into or out of a region that started before the call is still
    /// running and no shard holds a region removed before it: every copy runs under its
    /// shard's engine lock after a key lookup in the shard's snapshot of the regions, so
    /// taking each shard's lock once and renewing its snapshot there leaves a key removed
    /// before the call to none (`ibv_dereg_mr`, `ibv_rereg_mr`).
    pub(crate) fn copy_barrier(&self) {
        for r in &self.shards {
            r.shard.lock().renew_regions(&self.mrs);
        }
    }

    /// Stops the progress threads.
    pub(crate) fn stop(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        for r in &self.shards {
            r.wake.signal();
        }
    }

    /// Drains the engine's outputs: completions to CQs and events to the context first, then
    /// datagrams to the socket as `flush` says (so a program sees its completion before the
    /// system call that carries the ACK, which leaves right after: a peer's send completes
    /// when the packet is received, as with a NIC, not when the program next calls a verb);
    /// wakes shard `r`'s progress thread if the next deadline moved earlier.
    fn pump(&self, r: &ShardRt, sh: &mut Shard, now: Instant, flush: Flush) {
        let budget = if flush == Flush::Hold { 0 } else { PUMP_BUDGET };
        let built = sh.build(now, &self.mrs, budget);
        if built.more {
            // More to send: the progress thread carries on without sleeping.
            r.wake.signal();
        }
        self.route_completions(sh);
        while let Some(e) = sh.next_event() {
            self.push_event(AsyncEventRecord::Engine(e));
        }
        if sh.settle(now, flush == Flush::Join, built) == Settled::NewHold {
            // Bare ACKs wait for this thread's program to answer, at most ACK_HOLD.
            let noted = HELD_HERE.try_with(|h| {
                let mut h = h.borrow_mut();
                if !h.contains(&self.local) {
                    h.push(self.local);
                }
            });
            if noted.is_err() {
                // This thread's locals are gone (the process is exiting): nobody would
                // send them on its next poll.
                sh.flush();
            }
            let due = now.as_nanos() + ACK_HOLD.as_nanos() as u64;
            if r.wakes_at.load(Ordering::SeqCst) > due + HOLD_SLACK.as_nanos() as u64 {
                // The progress thread sleeps past the hold (it is not in its short sleeps
                // beside a polling program): it must send them in time.
                r.wake.signal();
            }
        }
        // A new, earlier deadline must wake the progress thread.
        if let Some(t) = sh.deadline() {
            if t.as_nanos() < r.sleep_until.load(Ordering::SeqCst) {
                r.wake.signal();
            }
        }
    }

    /// Sends the bare ACKs held for the program's answer ([`Flush::Join`]), if any.
    fn flush_held(&self) {
        for r in &self.shards {
            r.shard.lock().flush_held();
        }
    }

    /// Completions to the CQs the engine names: the registry is read once per run of
    /// completions of one CQ, not once per completion.
    fn route_completions(&self, sh: &mut Shard) {
        let mut last: Option<Arc<CqInner>> = None;
        while let Some(c) = sh.next_completion() {
            // Every error completion says why at info, so an unmodified program's user sees
            // it: the QP's first error once with its reason (for a flush, why the QP is in
            // ERR, which the flushed work request's own status cannot say); other error
            // completions with their status.
            if c.wc.status != WcStatus::Success && log::log_enabled!(log::Level::Info) {
                match sh.error_to_report(c.qpn) {
                    Some(e) if e.wr_id == c.wc.wr_id && e.status == c.wc.status => {
                        log::info!("QP {:#x} wr_id {}: {}: {e}", c.qpn, c.wc.wr_id, c.wc.status)
                    }
                    Some(e) => log::info!(
                        "QP {:#x} wr_id {}: {}: the QP is in ERR since {} (wr_id {}): {e}",
                        c.qpn,
                        c.wc.wr_id,
                        c.wc.status,
                        e.status,
                        e.wr_id
                    ),
                    None if c.wc.status != WcStatus::WrFlushErr => {
                        log::info!("QP {:#x} wr_id {}: {}", c.qpn, c.wc.wr_id, c.wc.status)
                    }
                    None => {}
                }
            }
            if last.as_ref().is_none_or(|cq| cq.handle != c.cq) {
                // The registry lock is released before the CQ is used: dropping the last
                // handle of a CQ (possible right after `upgrade`) takes it to unregister.
                last = self.cqs.lock().get(&c.cq).and_then(Weak::upgrade);
            }
            match &last {
                Some(cq) => {
                    if !cq.push(c.wc) {
                        sh.count_cq_overflow();
                        self.push_event(AsyncEventRecord::CqErr { cq: cq.handle });
                    }
                }
                None => log::debug!(
                    "completion of QP {:#x} for CQ {} dropped: the CQ is gone",
                    c.qpn,
                    c.cq
                ),
            }
        }
    }

    /// The address's registry and this process's slot in it (the GSI routing point's tables).
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] on the in-memory backend, which has no group.
    pub(crate) fn gsi(&self) -> crate::Result<(&crate::host::group::Registry, u8)> {
        self.first()
            .membership
            .as_ref()
            .map(|m| (&*m.registry, m.slot))
            .ok_or(crate::Error::InvalidArgument(
                "an in-memory device has no host-wide GSI routing",
            ))
    }

    /// Fires `cq`'s moderation period `period_ns` from now (the progress thread's timer).
    pub(crate) fn cq_timer(&self, cq: &Arc<CqInner>, period_ns: u64) {
        let at = self.now().as_nanos().saturating_add(period_ns);
        self.cq_timers.lock().push((at, Arc::downgrade(cq)));
        self.first().wake.signal();
    }

    /// Runs the moderation periods that have ended; returns the next deadline (engine ns).
    fn run_cq_timers(&self) -> Option<u64> {
        let now = self.now().as_nanos();
        let due: Vec<Weak<CqInner>> = {
            let mut t = self.cq_timers.lock();
            if t.is_empty() {
                return None;
            }
            let (due, rest): (Vec<_>, Vec<_>) = t.drain(..).partition(|(at, _)| *at <= now);
            *t = rest;
            due.into_iter().map(|(_, cq)| cq).collect()
        };
        for cq in due.iter().filter_map(Weak::upgrade) {
            cq.period_elapsed();
        }
        self.cq_timers.lock().iter().map(|(at, _)| *at).min()
    }

    /// A number for a new CQ, unique on this device.
    pub(crate) fn next_cq_number(&self) -> u32 {
        self.next_cq.fetch_add(1, Ordering::Relaxed)
    }

    /// Lists a new CQ under its handle number: the engine's completions for that number go
    /// to it from now on.
    pub(crate) fn add_cq(&self, cq: &Arc<CqInner>) {
        self.cqs.lock().insert(cq.handle, Arc::downgrade(cq));
    }

    /// Unlists CQ `handle` (its last handle is going): its completions are dropped.
    pub(crate) fn remove_cq(&self, handle: u32) {
        self.cqs.lock().remove(&handle);
    }

    fn push_event(&self, e: AsyncEventRecord) {
        self.router.route(e);
    }

    /// A number for a new PD, unique on this device.
    pub(crate) fn next_pd_number(&self) -> u32 {
        self.next_pd.fetch_add(1, Ordering::Relaxed)
    }

    /// One receive batch of shard `r` through its engine, with expired timers and the
    /// resulting sends; returns how many datagrams arrived.
    fn receive_once(&self, r: &ShardRt, rx: &mut dyn Receiver) -> usize {
        let local_ip: IpAddr = self.local.ip();
        // The system call runs before the engine lock is taken: verbs calls need not wait.
        let n = rx.receive(self.now());
        self.process(r, rx, n, local_ip, Flush::Now)
    }

    /// Takes what waits on the sockets through the engines now, in the caller's thread (at
    /// most 64 batches a shard; nothing from a shard whose receive path another receiver
    /// holds for 100 ms). At exit, MADs this process just sent to its own address — which it
    /// receives first when it is the address's QP1 role holder — are forwarded to their
    /// processes before it goes.
    pub(crate) fn receive_now(&self) {
        for r in &self.shards {
            let Some(mut rx) = r.rx.try_lock_for(Duration::from_millis(100)) else {
                continue;
            };
            let batch = rx.batch();
            for _ in 0..64 {
                if self.receive_once(r, &mut **rx) < batch {
                    break;
                }
            }
        }
    }

    /// As [`Shared::receive_once`] for a program's poll of an empty CQ: a poll that finds
    /// nothing takes no lock (timers are the progress thread's, which sleeps until the next).
    fn receive_inline(&self, r: &ShardRt, rx: &mut dyn Receiver, now: Instant) -> usize {
        let n = rx.receive_polled(now);
        if n == 0 {
            return 0;
        }
        self.process(r, rx, n, self.local.ip(), Flush::Join)
    }

    /// Feeds the `n` datagrams shard `r` just received to its engine, fires expired timers
    /// and pumps as `flush` says.
    fn process(
        &self,
        r: &ShardRt,
        rx: &mut dyn Receiver,
        n: usize,
        local_ip: IpAddr,
        flush: Flush,
    ) -> usize {
        let mut sh = r.shard.lock();
        let now = self.now();
        rx.deliver(&mut |from, bytes, ident, ecn| {
            sh.receive(now, from, local_ip, bytes, ident, ecn, &self.mrs)
        });
        sh.fire_timers(now, &self.mrs);
        // Always drain: a timer may have failed a QP (completions, no packets).
        self.pump(r, &mut sh, now, flush);
        n
    }

    /// The shards of `mask` (bit i: shard i; none: the first).
    fn shards_in(&self, mask: u64) -> impl Iterator<Item = &ShardRt> {
        let mask = if mask == 0 { 1 } else { mask };
        self.shards
            .iter()
            .filter(move |r| mask & (1 << r.index) != 0)
    }

    /// Progress driven by a program polling an empty CQ (a poll-mode driver's loop): receives
    /// and processes whatever waits on the sockets of the shards that feed the CQ (`shards`,
    /// a mask as [`CqInner::shards`]), except one another thread is receiving on right now.
    pub(crate) fn poll_inline(&self, shards: u64) {
        thread_local! {
            static EMPTY: RefCell<IdleStreak> =
                const { RefCell::new(IdleStreak::new(EMPTY_POLLS_PER_YIELD)) };
            static BUSY: RefCell<IdleStreak> =
                const { RefCell::new(IdleStreak::new(BUSY_POLLS_PER_YIELD)) };
        }
        let now = self.now();
        let (mut got, mut polled) = (0, false);
        for r in self.shards_in(shards) {
            // Whether or not it gets the receive path now, a poller is here: the progress
            // thread leaves the socket to it.
            r.last_inline.store(now.as_nanos(), Ordering::Relaxed);
            if let Some(mut rx) = r.rx.try_lock() {
                polled = true;
                got += self.receive_inline(r, &mut **rx, now);
            }
        }
        if polled {
            let _ = BUSY.try_with(|b| b.borrow_mut().worked());
            if got > 0 {
                if yield_when_idle() {
                    let _ = EMPTY.try_with(|e| e.borrow_mut().worked());
                }
                return;
            }
            if HELD_HERE
                .try_with(|h| !h.borrow().is_empty())
                .unwrap_or(false)
            {
                // Nothing new, and the program did not answer what it got: the ACKs its
                // polls held leave now (on every device this thread polled).
                flush_held_all();
            }
            // Nothing arrived: what the program waits for may need another thread of this
            // process first (idle.rs); after a run of empty polls, let it have the CPU.
            if yield_when_idle() && EMPTY.try_with(|e| e.borrow_mut().idle()).unwrap_or(false) {
                std::thread::yield_now();
            }
        } else {
            // The progress threads are receiving: usually for a few microseconds, on another
            // core, so the poller spins. If they stay busy, one may have been preempted
            // holding its batch (likely when busy-polling threads outnumber cores), and
            // spinning would keep it off this CPU for a whole time slice: after a run of busy
            // polls, yield and let it finish.
            if BUSY.try_with(|b| b.borrow_mut().idle()).unwrap_or(false) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// A program waits up to `left` for `fd` (its completion channel) to become readable, and
    /// receives the device's datagrams itself meanwhile, as a poller does: a packet wakes the
    /// program that waits for it, not the progress thread, which would then have to wake the
    /// program (one wake-up per packet instead of two). Returns after each batch it took, when
    /// `fd` is readable, or at the timeout; the caller checks its channel and calls again. The
    /// progress threads leave their sockets to the sleeper (they keep the timers and the
    /// multicast groups) and look again at least every [`SLEEPER_SLICE`] while the program is
    /// busy, so a program that stops waiting leaves no datagram unread for longer.
    ///
    /// With `mask`, the program's signals are held outside the wait (`sys::SignalsHeld`) and
    /// the wait runs with `mask`: a signal handler that ran ends it with `Interrupted`, as it
    /// would end rdma-core's `read(2)`.
    ///
    /// # Errors
    /// `Interrupted` when a signal handler ran; what `ppoll` returns otherwise.
    pub(crate) fn sleep_on(
        &self,
        fd: RawFd,
        left: Duration,
        mask: Option<&libc::sigset_t>,
    ) -> std::io::Result<()> {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        // The channel, then each shard's two descriptors (at most 1 + 2 × MAX_SHARDS bits).
        let mut fds = Vec::with_capacity(1 + 2 * self.shards.len());
        fds.push(fd);
        for r in &self.shards {
            fds.push(r.rx_fd);
            fds.push(r.rx_side_fd.unwrap_or(-1));
        }
        let ready = sys::poll_masked(&fds, libc::POLLIN, Some(left), mask);
        if let Ok(bits) = &ready {
            for r in &self.shards {
                if bits & (0b11 << (1 + 2 * r.index)) == 0 {
                    continue;
                }
                // The progress thread may be taking the same datagrams (it had not seen this
                // sleeper yet): wait for its batch, then take what is left.
                let mut rx = r.rx.lock();
                let batch = rx.batch();
                for _ in 0..64 {
                    let n = rx.receive(self.now());
                    if n == 0 {
                        break;
                    }
                    DatapathStats::add(&r.stats.sleeper_recvs, 1);
                    // A join: this program answers what it receives, as a poller does.
                    self.process(r, &mut **rx, n, self.local.ip(), Flush::Join);
                    if n < batch {
                        break;
                    }
                }
            }
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        // The program is awake and in the provider: the progress threads' window, as after a
        // poll. A thread that sleeps long beside a program that slept long must look now.
        let now = self.now().as_nanos();
        for r in &self.shards {
            r.last_inline.store(now, Ordering::SeqCst);
            let wakes = r.wakes_at.load(Ordering::SeqCst);
            if wakes > now + 2 * SLEEPER_SLICE.as_nanos() as u64 {
                r.wake.signal();
            }
        }
        ready.map(drop)
    }

    /// The progress thread of shard `index` (the first shard's also runs the CQ moderation
    /// timers and reads the multicast groups).
    fn progress(self: Arc<Self>, index: usize) {
        let r = &self.shards[index];
        let first = index == 0;
        let fd = r.rx_fd;
        // This thread must run when a datagram comes even while the program spins on every
        // core (perftest's ib_write_lat spins on memory): a short slice lets it preempt.
        if let Err(e) = sys::short_slice(PROGRESS_SLICE) {
            log::debug!(
                "{}: no short scheduler slice for the progress thread: {e}",
                self.local
            );
        }
        while !self.shutdown.load(Ordering::SeqCst) {
            let cq_deadline = if first { self.run_cq_timers() } else { None };
            // While a program polls a CQ of this shard and little is in flight (a ping-pong,
            // not a stream), its polls take the datagrams off the socket: this thread then
            // sleeps on its wake-up and timers only, for at most the window, instead of waking
            // (or spinning) for every datagram and racing the poller for the receive path. A
            // stream keeps this thread receiving beside the poller (two cores at work).
            // Until this pass knows its timeout, a new hold signals the thread (the eventfd
            // keeps the signal, so a hold made after the read below is not missed).
            r.wakes_at.store(u64::MAX, Ordering::SeqCst);
            let (deadline, inflight, held) = {
                let mut sh = r.shard.lock();
                (sh.deadline(), sh.inflight(), sh.acks_held_since())
            };
            let since_poll = self
                .now()
                .as_nanos()
                .saturating_sub(r.last_inline.load(Ordering::Relaxed));
            let polled = since_poll < INLINE_WINDOW.as_nanos() as u64;
            // A program asleep in `sleep_on` receives for itself, as a poller does.
            let sleeper = self.sleepers.load(Ordering::SeqCst) > 0;
            let inline = inflight < INLINE_MAX_INFLIGHT && (polled || sleeper);
            if inline || !self.busy_poll {
                let now = self.now();
                let timeout = deadline.map(|t| t.saturating_duration_since(now));
                let cq_wait =
                    cq_deadline.map(|at| Duration::from_nanos(at.saturating_sub(now.as_nanos())));
                // ACKs held for a program's answer leave by the end of their hold.
                let hold_wait = held.map(|t| {
                    Duration::from_nanos(
                        (t + ACK_HOLD.as_nanos() as u64).saturating_sub(now.as_nanos()),
                    )
                });
                let timeout = [timeout, cq_wait, hold_wait].into_iter().flatten().min();
                // A pump that makes the next deadline earlier than this one wakes the thread.
                r.sleep_until.store(
                    deadline.map_or(u64::MAX, Instant::as_nanos),
                    Ordering::SeqCst,
                );
                // Cap the sleep so a missed wake-up can never stall a timer for long.
                let cap = if inline && polled {
                    // Until the window ends, then look again.
                    (INLINE_WINDOW - Duration::from_nanos(since_poll)).max(INLINE_MIN_SLEEP)
                } else if inline && since_poll < SLEEPER_IDLE.as_nanos() as u64 {
                    // Beside a sleeper that was awake lately: look again soon, in case it
                    // stopped waiting.
                    SLEEPER_SLICE
                } else {
                    Duration::from_millis(100)
                };
                let timeout = timeout.unwrap_or(cap).min(cap);
                r.wakes_at.store(
                    now.as_nanos().saturating_add(timeout.as_nanos() as u64),
                    Ordering::SeqCst,
                );
                let timeout = Some(timeout);
                // Groups' datagrams are the first shard's thread's (a poller or sleeper reads
                // the shards' sockets only); −1 is skipped by poll.
                let mc = if first {
                    self.mcast_fd.load(Ordering::Relaxed)
                } else {
                    -1
                };
                if inline {
                    let _ = sys::poll_fds(&[r.wake.raw(), mc], libc::POLLIN, timeout);
                } else {
                    let side = r.rx_side_fd.unwrap_or(-1);
                    let _ = sys::poll_fds(&[fd, side, r.wake.raw(), mc], libc::POLLIN, timeout);
                }
                r.wake.drain();
                DatapathStats::add(&r.stats.wakeups, 1);
            }
            r.wakes_at.store(0, Ordering::SeqCst);
            // Receive everything that is there, in batches. One receiver at a time (the
            // batch's lock): two threads each taking datagrams off the socket and then racing
            // for the engine would hand it packets out of order.
            {
                let mut rx = r.rx.lock();
                let batch = rx.batch();
                while self.receive_once(r, &mut **rx) == batch {}
            }
            if first && self.mcast_fd.load(Ordering::Relaxed) >= 0 {
                self.receive_mcast();
            }
        }
    }
}
