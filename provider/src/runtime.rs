//! The runtime that drives the sans-IO engine over a UDP socket.
//!
//! One socket per device (bound to its address, port 4791), one progress thread per device.
//! Verbs calls lock the engine, do their work and send what the engine produced right away
//! (so a `post_send` leaves in the caller's thread); the progress thread sleeps in `poll` on
//! the socket and a wake-up eventfd with the engine's next deadline as timeout, receives in
//! batches (`recvmmsg`), feeds the engine, sends its answers in batches (`sendmmsg`), fires
//! timers, and routes completions to CQs and events to the context. `FERROCE_BUSY_POLL=1`
//! makes it spin instead of sleeping (lower latency, one core busy).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::BufWriter;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ferroce_transport::{AsyncEvent, Endpoint, EndpointConfig, Instant};
use parking_lot::{Condvar, Mutex};

use crate::cq::CqInner;
use crate::faults::Faults;
use crate::mr::MrTable;
use crate::pcap;
use crate::sys::{self, EventFd, RecvBatch, SendBatch};

/// Datagrams per `recvmmsg`/`sendmmsg`.
const BATCH: usize = 32;
/// Datagrams one pump sends before it lets received packets in (a long READ response must
/// not hold the engine while a retry request waits behind it).
const PUMP_BUDGET: usize = 4 * BATCH;
/// Room for the largest RoCEv2 packet (4 KiB payload plus headers).
const MAX_PACKET: usize = 4096 + 128;
const _: () = assert!(MAX_PACKET >= ferroce_transport::MIN_TRANSMIT_BUF);

/// Runtime counters the engine does not keep.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuntimeCounters {
    /// Datagrams handed to the kernel.
    pub udp_sent: u64,
    /// Datagrams received from the kernel.
    pub udp_rcvd: u64,
    /// Datagrams the kernel refused to send.
    pub udp_send_errors: u64,
    /// Datagrams dropped by fault injection.
    pub injected_losses: u64,
    /// Completions dropped because a CQ was full.
    pub cq_overflows: u64,
    /// Progress-thread wake-ups.
    pub wakeups: u64,
}

/// An asynchronous event with the object it concerns.
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

/// Everything the engine lock protects.
pub(crate) struct EngineState {
    pub(crate) ep: Endpoint,
    send: SendBatch,
    faults: Option<Faults>,
    pcap: Option<pcap::Writer<BufWriter<File>>>,
    pub(crate) counters: RuntimeCounters,
}

/// What a device's handles share with its progress thread.
pub(crate) struct Shared {
    pub(crate) local: SocketAddr,
    socket: socket2::Socket,
    pub(crate) engine: Mutex<EngineState>,
    pub(crate) mrs: MrTable,
    wake: EventFd,
    shutdown: AtomicBool,
    epoch: std::time::Instant,
    /// The deadline the progress thread sleeps until (ns since epoch; u64::MAX = none).
    sleep_until: AtomicU64,
    busy_poll: bool,
    pub(crate) events: Mutex<VecDeque<AsyncEventRecord>>,
    pub(crate) events_cond: Condvar,
    pub(crate) events_fd: EventFd,
    /// Every live CQ of the device by the number the engine reports completions with
    /// ([`ferroce_transport::Completion::cq`]). Locked after `engine`, never before.
    pub(crate) cqs: Mutex<HashMap<u32, Weak<CqInner>>>,
    next_cq: AtomicU32,
    /// The receive buffers; whoever holds this lock is the one receiver.
    receive_batch: Mutex<RecvBatch>,
}

/// How a runtime is started.
pub(crate) struct RuntimeConfig {
    pub(crate) local: SocketAddr,
    pub(crate) engine: EndpointConfig,
    pub(crate) faults: Option<crate::faults::FaultConfig>,
    pub(crate) pcap_path: Option<std::path::PathBuf>,
    pub(crate) busy_poll: bool,
}

impl Shared {
    /// Binds the socket and starts the progress thread.
    pub(crate) fn start(
        cfg: RuntimeConfig,
    ) -> crate::Result<(Arc<Shared>, std::thread::JoinHandle<()>)> {
        let domain = if cfg.local.is_ipv4() {
            socket2::Domain::IPV4
        } else {
            socket2::Domain::IPV6
        };
        let socket =
            socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
        socket.set_nonblocking(true)?;
        let _ = socket.set_recv_buffer_size(8 << 20);
        let _ = socket.set_send_buffer_size(8 << 20);
        let fd = socket.as_raw_fd();
        sys::set_dont_fragment(fd, cfg.local.is_ipv6())?;
        if cfg.local.is_ipv6() {
            socket.set_only_v6(true)?;
            let _ = sys::set_no_check6_rx(fd);
        }
        socket.bind(&cfg.local.into()).map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => crate::Error::AddressInUse(cfg.local),
            std::io::ErrorKind::AddrNotAvailable => {
                crate::Error::NoDevice(cfg.local.ip().to_string())
            }
            _ => crate::Error::Io(e),
        })?;
        let pcap = match &cfg.pcap_path {
            Some(p) => Some(pcap::Writer::new(
                BufWriter::new(File::create(p)?),
                pcap::LINKTYPE_ETHERNET,
            )?),
            None => None,
        };
        let shared = Arc::new(Shared {
            local: cfg.local,
            socket,
            engine: Mutex::new(EngineState {
                ep: Endpoint::new(cfg.engine),
                send: SendBatch::new(BATCH, MAX_PACKET),
                faults: cfg.faults.map(Faults::new),
                pcap,
                counters: RuntimeCounters::default(),
            }),
            mrs: MrTable::default(),
            wake: EventFd::new()?,
            shutdown: AtomicBool::new(false),
            epoch: std::time::Instant::now(),
            sleep_until: AtomicU64::new(u64::MAX),
            busy_poll: cfg.busy_poll,
            events: Mutex::new(VecDeque::new()),
            events_cond: Condvar::new(),
            events_fd: EventFd::new_blocking()?,
            cqs: Mutex::new(HashMap::new()),
            next_cq: AtomicU32::new(1),
            receive_batch: Mutex::new(RecvBatch::new(BATCH, MAX_PACKET)),
        });
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ferroce-{}", cfg.local.ip()))
            .spawn(move || s2.progress())?;
        Ok((shared, thread))
    }

    /// Engine time now.
    pub(crate) fn now(&self) -> Instant {
        Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Runs `f` on the engine, then sends what it produced and routes completions.
    pub(crate) fn with_engine<R>(
        &self,
        f: impl FnOnce(&mut EngineState, &MrTable, Instant) -> R,
    ) -> R {
        let mut st = self.engine.lock();
        let now = self.now();
        let r = f(&mut st, &self.mrs, now);
        self.pump(&mut st, now);
        r
    }

    /// Stops the progress thread.
    pub(crate) fn stop(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        self.wake.signal();
    }

    /// Drains the engine's outputs: datagrams to the socket, completions to CQs, events to the
    /// context; wakes the progress thread if the next deadline moved earlier.
    fn pump(&self, st: &mut EngineState, now: Instant) {
        let fd = self.socket.as_raw_fd();
        let mut budget = PUMP_BUDGET;
        loop {
            if budget == 0 {
                // More to send: the progress thread carries on without sleeping.
                self.wake.signal();
                break;
            }
            budget -= 1;
            if st.send.is_full() {
                flush_batch(st, fd);
            }
            let EngineState {
                ep,
                send,
                faults,
                pcap,
                counters,
                ..
            } = &mut *st;
            let tx = match ep.poll_transmit(now, send.next_buf(), &self.mrs) {
                Ok(Some(tx)) => tx,
                Ok(None) => break,
                Err(e) => {
                    // The batch buffers are MAX_PACKET long, above MIN_TRANSMIT_BUF (a
                    // compile-time check below); this cannot happen, but is no panic.
                    log::error!("{e}");
                    break;
                }
            };
            if let Some(w) = pcap.as_mut() {
                let f = pcap::encapsulate(self.local, tx.dst, 0, &send.next_buf()[..tx.len]);
                let _ = w.write_record(wall_clock(), &f);
            }
            let (mut dup, mut release) = (false, None);
            if let Some(fl) = faults.as_mut() {
                if fl.lose() {
                    counters.injected_losses += 1;
                    continue;
                }
                if fl.reorder() && fl.held.is_none() {
                    fl.held = Some((tx.dst, send.next_buf()[..tx.len].to_vec()));
                    continue;
                }
                dup = fl.duplicate();
                release = fl.held.take();
            }
            send.commit(tx.len, tx.dst);
            if dup {
                let copy = send.last().to_vec();
                push_copy(st, fd, tx.dst, &copy);
            }
            if let Some((dst, bytes)) = release {
                push_copy(st, fd, dst, &bytes);
            }
        }
        if !st.send.is_empty() {
            flush_batch(st, fd);
        }
        // A recording is a debugging aid: keep it complete on disk after every batch.
        if let Some(w) = st.pcap.as_mut() {
            let _ = std::io::Write::flush(w.inner_mut());
        }
        // Completions to the CQs the engine names.
        while let Some(c) = st.ep.poll_completion() {
            // The registry lock is released before the CQ is used: dropping the last handle
            // of a CQ (possible right after `upgrade`) takes it to unregister.
            let cq = self.cqs.lock().get(&c.cq).and_then(Weak::upgrade);
            match cq {
                Some(cq) => {
                    if !cq.push(c.wc) {
                        st.counters.cq_overflows += 1;
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
        while let Some(e) = st.ep.poll_event() {
            self.push_event(AsyncEventRecord::Engine(e));
        }
        // A new, earlier deadline must wake the progress thread.
        if let Some(t) = st.ep.poll_timeout() {
            if t.as_nanos() < self.sleep_until.load(Ordering::SeqCst) {
                self.wake.signal();
            }
        }
    }

    /// A number for a new CQ, unique on this device.
    pub(crate) fn next_cq_number(&self) -> u32 {
        self.next_cq.fetch_add(1, Ordering::Relaxed)
    }

    fn push_event(&self, e: AsyncEventRecord) {
        self.events.lock().push_back(e);
        self.events_fd.signal();
        self.events_cond.notify_all();
    }

    /// One `recvmmsg` batch through the engine, with expired timers and the resulting sends;
    /// returns how many datagrams arrived.
    fn receive_once(&self, batch: &mut RecvBatch) -> usize {
        let fd = self.socket.as_raw_fd();
        let local_ip: IpAddr = self.local.ip();
        let n = match batch.recv(fd) {
            Ok(n) => n,
            Err(e) => {
                log::warn!("recvmmsg on {}: {e}", self.local);
                0
            }
        };
        let mut st = self.engine.lock();
        let now = self.now();
        for i in 0..n {
            let Some((from, bytes)) = batch.get(i) else {
                continue;
            };
            st.counters.udp_rcvd += 1;
            if let Some(w) = st.pcap.as_mut() {
                let f = pcap::encapsulate(from, self.local, 0, bytes);
                let _ = w.write_record(wall_clock(), &f);
            }
            let owned;
            let mut bytes = bytes;
            if let Some(fl) = st.faults.as_mut() {
                if fl.lose() {
                    st.counters.injected_losses += 1;
                    continue;
                }
                let mut copy = bytes.to_vec();
                fl.corrupt(&mut copy);
                owned = copy;
                bytes = &owned;
            }
            st.ep.handle(now, from, local_ip, bytes, &self.mrs);
        }
        if st.ep.poll_timeout().is_some_and(|t| t <= now) {
            st.ep.handle_timeout(now, &self.mrs);
        }
        // Always drain: a timer may have failed a QP (completions, no packets).
        self.pump(&mut st, now);
        n
    }

    /// Progress driven by a program polling an empty CQ (a poll-mode driver's loop): receives
    /// and processes whatever is waiting, unless another thread is doing so right now.
    pub(crate) fn poll_inline(&self) {
        if let Some(mut batch) = self.receive_batch.try_lock() {
            self.receive_once(&mut batch);
        } else {
            // The progress thread is receiving. If it was preempted holding the batch (likely
            // when busy-polling threads outnumber cores), spinning here would keep it off
            // this CPU for a whole time slice; yielding lets it finish.
            std::thread::yield_now();
        }
    }

    /// The progress thread.
    fn progress(self: Arc<Self>) {
        let fd = self.socket.as_raw_fd();
        while !self.shutdown.load(Ordering::SeqCst) {
            if !self.busy_poll {
                let deadline = self.engine.lock().ep.poll_timeout();
                let now = self.now();
                let timeout = deadline.map(|t| t.saturating_duration_since(now));
                self.sleep_until.store(
                    deadline.map_or(u64::MAX, Instant::as_nanos),
                    Ordering::SeqCst,
                );
                // Cap the sleep so a missed wake-up can never stall a timer for long.
                let timeout = Some(
                    timeout
                        .unwrap_or(Duration::from_millis(100))
                        .min(Duration::from_millis(100)),
                );
                let _ = sys::poll_fds(&[fd, self.wake.raw()], libc::POLLIN, timeout);
                self.wake.drain();
            }
            // Receive everything that is there, in batches. One receiver at a time (the
            // batch's lock): two threads each taking datagrams off the socket and then racing
            // for the engine would hand it packets out of order.
            {
                let mut batch = self.receive_batch.lock();
                while self.receive_once(&mut batch) == BATCH {}
            }
        }
    }
}

fn wall_clock() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

fn flush_batch(st: &mut EngineState, fd: std::os::fd::RawFd) {
    st.counters.udp_sent += st.send.len() as u64;
    match st.send.flush(fd) {
        Ok(failed) => st.counters.udp_send_errors += failed as u64,
        Err(e) => log::warn!("sendmmsg: {e}"),
    }
}

/// Queues a copy of a datagram (duplication and reordering by fault injection).
fn push_copy(st: &mut EngineState, fd: std::os::fd::RawFd, dst: SocketAddr, bytes: &[u8]) {
    if st.send.is_full() {
        flush_batch(st, fd);
    }
    st.send.next_buf()[..bytes.len()].copy_from_slice(bytes);
    st.send.commit(bytes.len(), dst);
}
