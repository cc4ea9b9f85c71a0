//! `ferroce bw` and `ferroce lat`: perftest-like measurements between two endpoints.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::tools::loopback::Side;
use ferroce::transport::{SendFlags, SendWr, WcStatus, WorkCompletion, WrOpcode};
use ferroce::{Error, Result};

/// The operation measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// SEND / RECV.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// FETCH_ADD on 8 bytes.
    Atomic,
}

impl std::str::FromStr for Op {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Op, String> {
        match s {
            "send" => Ok(Op::Send),
            "write" => Ok(Op::Write),
            "read" => Ok(Op::Read),
            "atomic" => Ok(Op::Atomic),
            _ => Err(format!("unknown operation {s} (send, write, read, atomic)")),
        }
    }
}

impl Op {
    fn opcode(self) -> WrOpcode {
        match self {
            Op::Send => WrOpcode::Send,
            Op::Write => WrOpcode::RdmaWrite,
            Op::Read => WrOpcode::RdmaRead,
            Op::Atomic => WrOpcode::AtomicFetchAndAdd,
        }
    }
}

/// When a measurement stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// After this many messages.
    Iters(u64),
    /// After this long.
    Duration(Duration),
}

/// A bandwidth result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwResult {
    /// Message size.
    pub size: u32,
    /// Messages completed.
    pub msgs: u64,
    /// Time taken.
    pub elapsed: Duration,
    /// System calls of both ends during the run (runtime counters).
    pub calls: Syscalls,
    /// CPU time of the whole process (both ends, their runtimes' threads, user and system)
    /// during the run.
    pub cpu: Duration,
}

/// `sendmmsg` and `recvmmsg` calls of both devices over a run, from their runtime counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Syscalls {
    /// `sendmmsg` calls.
    pub send: u64,
    /// `recvmmsg` calls that took datagrams.
    pub recv: u64,
    /// `recvmmsg` calls that found nothing (polls of an empty CQ).
    pub empty: u64,
    /// Times a progress thread woke from a sleep (each a context switch).
    pub wakeups: u64,
}

impl Syscalls {
    /// The calls both sides have made so far.
    pub fn now(a: &Side, b: &Side) -> Syscalls {
        let (x, y) = (a.ctx.counters().1, b.ctx.counters().1);
        let empty = x.empty_recvs + y.empty_recvs;
        Syscalls {
            send: x.send_calls + y.send_calls,
            recv: (x.recv_calls + y.recv_calls).saturating_sub(empty),
            empty,
            wakeups: x.wakeups + y.wakeups,
        }
    }

    /// The calls made since `before`.
    pub fn since(self, before: Syscalls) -> Syscalls {
        Syscalls {
            send: self.send.saturating_sub(before.send),
            recv: self.recv.saturating_sub(before.recv),
            empty: self.empty.saturating_sub(before.empty),
            wakeups: self.wakeups.saturating_sub(before.wakeups),
        }
    }

    /// `sendmmsg` and `recvmmsg` calls that moved datagrams, per `n` messages.
    pub fn per(self, n: u64) -> f64 {
        ratio(self.send + self.recv, n)
    }

    /// Empty `recvmmsg` calls per `n` messages.
    pub fn empty_per(self, n: u64) -> f64 {
        ratio(self.empty, n)
    }

    /// Progress-thread wake-ups per `n` messages.
    pub fn wakeups_per(self, n: u64) -> f64 {
        ratio(self.wakeups, n)
    }
}

/// `count` per one of `n` (none for no messages).
fn ratio(count: u64, n: u64) -> f64 {
    count as f64 / n.max(1) as f64
}

impl BwResult {
    /// MB/s (10^6 bytes).
    pub fn mb_per_s(&self) -> f64 {
        self.msgs as f64 * f64::from(self.size) / self.elapsed.as_secs_f64() / 1e6
    }

    /// Gb/s.
    pub fn gbit_per_s(&self) -> f64 {
        self.mb_per_s() * 8.0 / 1000.0
    }

    /// Messages per second.
    pub fn msgs_per_s(&self) -> f64 {
        self.msgs as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU seconds (both ends, user and system) per GB moved.
    pub fn cpu_s_per_gb(&self) -> f64 {
        cpu_per_gb(self.cpu, self.msgs as f64 * f64::from(self.size))
    }
}

/// CPU seconds per GB for `cpu` spent moving `bytes` (infinite for no bytes).
pub fn cpu_per_gb(cpu: Duration, bytes: f64) -> f64 {
    cpu.as_secs_f64() / (bytes / 1e9)
}

fn fail(wc: &WorkCompletion) -> ferroce::Error {
    ferroce::Error::Io(std::io::Error::other(format!(
        "wr_id {} completed with {} ({})",
        wc.wr_id, wc.status, wc.status as u32
    )))
}

fn wr_for(a: &Side, b: &Side, qp: usize, op: Op, size: u32, slot: u64) -> SendWr {
    let size = if op == Op::Atomic { 8 } else { size };
    let off =
        ((slot * u64::from(size)) as usize % a.mr.len().saturating_sub(size as usize).max(1)) & !7;
    let mut w = SendWr::new(slot, op.opcode());
    w.send_flags = SendFlags::SIGNALED;
    w.sg_list = [a.mr.sge(off, size)].into();
    w.remote.remote_addr = b.mr.addr() + off as u64;
    w.remote.rkey = b.mr.rkey();
    w.compare_add = 1;
    let _ = qp;
    w
}

/// Streams `op` from `a` to `b` with `depth` messages in flight per QP.
///
/// # Errors
/// A failed completion or verbs error.
pub fn bandwidth(
    a: &Side,
    b: &Side,
    op: Op,
    size: u32,
    limit: Limit,
    depth: u32,
) -> Result<BwResult> {
    let recv_len = if op == Op::Send { size } else { 0 };
    if op == Op::Send {
        for qb in &b.qps {
            for i in 0..u64::from(depth) {
                qb.post_recv(&b.recv_wr(i, recv_len))?;
            }
        }
    }
    let calls = Syscalls::now(a, b);
    let cpu = ferroce::udp::process_cpu_time();
    let start = Instant::now();
    // SEND's receiving side runs in a thread of its own, as perftest's server does in a
    // process of its own: it polls B's CQ and posts each receive again, while this thread
    // posts A's SENDs and polls A's CQ.
    // `stop` ends the receiver after the last completion; `failed` ends the sender when the
    // receiver fails (its SENDs would otherwise wait on RNR NAKs for ever).
    let (stop, failed) = (AtomicBool::new(false), AtomicBool::new(false));
    let done = std::thread::scope(|sc| -> Result<u64> {
        let receiver = (op == Op::Send).then(|| {
            sc.spawn(|| {
                let r = receive_loop(b, recv_len, &stop);
                failed.store(r.is_err(), Ordering::Release);
                r
            })
        });
        let sent = send_loop(a, b, (op, size), limit, depth, start, &failed);
        stop.store(true, Ordering::Release);
        if let Some(r) = receiver {
            // The receiver's error first: the sender's, if any, follows from it.
            r.join().map_err(|_| {
                Error::Io(std::io::Error::other("bw's receiving thread panicked"))
            })??;
        }
        sent
    })?;
    let elapsed = start.elapsed();
    let cpu = ferroce::udp::process_cpu_time().saturating_sub(cpu);
    // Drain the receiver's completions so the next run starts clean.
    let mut wcs = vec![WorkCompletion::default(); 64];
    while b.cq.poll(&mut wcs) > 0 {}
    Ok(BwResult {
        size: if op == Op::Atomic { 8 } else { size },
        msgs: done,
        elapsed,
        calls: Syscalls::now(a, b).since(calls),
        cpu,
    })
}

/// The posting side of [`bandwidth`]: posts `op` on A's QPs, `depth` in flight each, and polls
/// A's CQ until `limit`; returns the messages completed.
fn send_loop(
    a: &Side,
    b: &Side,
    (op, size): (Op, u32),
    limit: Limit,
    depth: u32,
    start: Instant,
    failed: &AtomicBool,
) -> Result<u64> {
    let nqp = a.qps.len();
    let mut posted = vec![0u64; nqp];
    let mut inflight = vec![0u32; nqp];
    let mut done = 0u64;
    let mut wcs = vec![WorkCompletion::default(); 64];
    // The clock is read once per round, not per post (a thousand QPs post per round).
    let mut out_of_time = false;
    let stop_posting = |out_of_time: bool, posted: u64| match limit {
        Limit::Iters(n) => posted >= n,
        Limit::Duration(_) => out_of_time,
    };
    // Kept as a running sum: summing 1,000 QPs' counts per post cost more than the posts.
    let mut total_posted = 0u64;
    loop {
        if let Limit::Duration(d) = limit {
            out_of_time = start.elapsed() >= d;
        }
        for q in 0..nqp {
            while inflight[q] < depth && !stop_posting(out_of_time, total_posted) {
                a.qps[q].post_send(&wr_for(
                    a,
                    b,
                    q,
                    op,
                    size,
                    posted[q] * nqp as u64 + q as u64,
                ))?;
                posted[q] += 1;
                total_posted += 1;
                inflight[q] += 1;
            }
        }
        let n = a.cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(fail(wc));
            }
            let q = (wc.wr_id % nqp as u64) as usize;
            inflight[q] -= 1;
            done += 1;
        }
        if done == total_posted && stop_posting(out_of_time, total_posted) {
            break;
        }
        if failed.load(Ordering::Acquire) {
            return Err(Error::Io(std::io::Error::other(
                "bw's receiving side failed",
            )));
        }
        if n == 0 {
            std::hint::spin_loop();
        }
    }
    Ok(done)
}

/// The receiving side of a SEND [`bandwidth`] run: polls B's CQ and posts every consumed
/// receive again, until `stop`.
fn receive_loop(b: &Side, recv_len: u32, stop: &AtomicBool) -> Result<()> {
    let mut wcs = vec![WorkCompletion::default(); 64];
    let index: HashMap<u32, usize> = b
        .qps
        .iter()
        .enumerate()
        .map(|(i, qp)| (qp.qp_num(), i))
        .collect();
    while !stop.load(Ordering::Acquire) {
        let m = b.cq.poll(&mut wcs);
        for wc in &wcs[..m] {
            if wc.status != WcStatus::Success {
                return Err(fail(wc));
            }
            let q = index.get(&wc.qp_num).copied().unwrap_or(0);
            b.qps[q].post_recv(&b.recv_wr(wc.wr_id, recv_len))?;
        }
        if m == 0 {
            std::hint::spin_loop();
        }
    }
    Ok(())
}

/// Latency samples, sorted.
#[derive(Debug, Clone, PartialEq)]
pub struct LatResult {
    /// Message size.
    pub size: u32,
    /// One sample per iteration, ascending.
    pub samples: Vec<Duration>,
    /// System calls of both ends during the run (runtime counters).
    pub calls: Syscalls,
}

impl LatResult {
    /// The `p`-th percentile (0 ≤ p ≤ 100).
    pub fn percentile(&self, p: f64) -> Duration {
        if self.samples.is_empty() {
            return Duration::ZERO;
        }
        let i = ((p / 100.0) * (self.samples.len() - 1) as f64).round() as usize;
        self.samples[i.min(self.samples.len() - 1)]
    }
}

fn spin_one(side: &Side, deadline: Instant) -> Result<WorkCompletion> {
    loop {
        if let Some(wc) = side.cq.poll_one() {
            if wc.status != WcStatus::Success {
                return Err(fail(&wc));
            }
            return Ok(wc);
        }
        if Instant::now() > deadline {
            return Err(ferroce::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no completion within 10 s",
            )));
        }
        std::hint::spin_loop();
    }
}

/// The next completion of `side` that `want`s, sleeping on its completion channel between
/// polls (`ibv_req_notify_cq`, poll again, `ibv_get_cq_event`) as an event-driven program
/// does; `want` sees every successful completion met on the way. A side without a channel
/// spins.
fn wait_for(
    side: &Side,
    deadline: Instant,
    mut want: impl FnMut(&WorkCompletion) -> bool,
) -> Result<WorkCompletion> {
    let timed_out = || {
        ferroce::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no completion within 10 s",
        ))
    };
    loop {
        while let Some(wc) = side.cq.poll_one() {
            if wc.status != WcStatus::Success {
                return Err(fail(&wc));
            }
            if want(&wc) {
                return Ok(wc);
            }
        }
        let Some(ch) = &side.channel else {
            if Instant::now() > deadline {
                return Err(timed_out());
            }
            std::hint::spin_loop();
            continue;
        };
        side.cq.req_notify(false)?;
        // A completion that came between the last poll and the arming raised no event.
        if let Some(wc) = side.cq.poll_one() {
            if wc.status != WcStatus::Success {
                return Err(fail(&wc));
            }
            if want(&wc) {
                return Ok(wc);
            }
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let cq = ch.get_event_timeout(left).ok_or_else(timed_out)?;
        cq.ack_events(1);
    }
}

/// One end of a ping-pong: the receive it waits for, and whether its last SEND (`wr_id`
/// `iters - 1`) has completed, which may come before or after the last receive.
struct End<'a> {
    side: &'a Side,
    iters: u64,
    last_done: bool,
}

impl End<'_> {
    fn is_last(&self, wc: &WorkCompletion) -> bool {
        wc.opcode == ferroce::transport::WcOpcode::Send && wc.wr_id + 1 == self.iters
    }

    /// The next receive completion; send completions met on the way are noted.
    fn recv(&mut self, deadline: Instant) -> Result<WorkCompletion> {
        let (side, iters) = (self.side, self.iters);
        let mut done = self.last_done;
        let wc = wait_for(side, deadline, |wc| {
            if wc.opcode == ferroce::transport::WcOpcode::Send && wc.wr_id + 1 == iters {
                done = true;
            }
            wc.opcode == ferroce::transport::WcOpcode::Recv
        });
        self.last_done = done;
        wc
    }

    /// Waits for the last SEND's completion unless it came already: then the CQ is empty.
    fn finish(&mut self) -> Result<()> {
        if self.last_done {
            return Ok(());
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        wait_for(self.side, deadline, |wc| self.is_last(wc))?;
        self.last_done = true;
        Ok(())
    }
}

/// A SEND ping-pong between two threads, one per end, as `ib_send_lat`'s two processes: each
/// sleeps on its completion channel if its side has one (`--blocking`, as perftest's `-e`) and
/// spins on its CQ otherwise, so the figure holds against a UDP ping-pong of the same shape.
/// Each sample is half the round trip; every 8th SEND and the last are signalled. It leaves
/// both CQs empty and no receive posted, so the QPs serve the next measurement as they came.
///
/// # Errors
/// A failed completion or verbs error.
pub fn ping_pong(a: &Side, b: &Side, size: u32, iters: u64) -> Result<LatResult> {
    let (qa, qb) = (&a.qps[0], &b.qps[0]);
    if iters == 0 {
        return Ok(LatResult {
            size,
            samples: Vec::new(),
            calls: Syscalls::default(),
        });
    }
    let recv = |side: &Side| side.recv_wr(0, size);
    // Every 8th SEND is signalled, so the send queue's slots come back, and the last, whose
    // completion says every send is done; the rest complete silently.
    let send = |side: &Side, i: u64| {
        let mut w = SendWr::new(i, WrOpcode::Send);
        if i % 8 == 7 || i + 1 == iters {
            w.send_flags = SendFlags::SIGNALED;
        }
        w.sg_list = [side.mr.sge(0, size)].into();
        w
    };
    qa.post_recv(&recv(a))?;
    qb.post_recv(&recv(b))?;
    let calls = Syscalls::now(a, b);
    let mut samples = Vec::with_capacity(iters as usize);
    std::thread::scope(|sc| -> Result<()> {
        let answerer = sc.spawn(|| -> Result<()> {
            let mut end = End {
                side: b,
                iters,
                last_done: false,
            };
            for i in 0..iters {
                end.recv(Instant::now() + Duration::from_secs(10))?;
                if i + 1 < iters {
                    qb.post_recv(&recv(b))?;
                }
                qb.post_send(&send(b, i))?;
            }
            end.finish()
        });
        let mut run = || -> Result<()> {
            let mut end = End {
                side: a,
                iters,
                last_done: false,
            };
            for i in 0..iters {
                let t0 = Instant::now();
                qa.post_send(&send(a, i))?;
                end.recv(t0 + Duration::from_secs(10))?;
                samples.push(t0.elapsed() / 2);
                if i + 1 < iters {
                    qa.post_recv(&recv(a))?;
                }
            }
            end.finish()
        };
        let r = run();
        let joined = answerer.join().unwrap_or_else(|_| {
            Err(ferroce::Error::Io(std::io::Error::other(
                "answerer panicked",
            )))
        });
        r.and(joined)
    })?;
    samples.sort_unstable();
    Ok(LatResult {
        size,
        samples,
        calls: Syscalls::now(a, b).since(calls),
    })
}

/// Measures `iters` operations one at a time on the first QP. SEND is a [`ping_pong`] and each
/// sample is half the round trip (as perftest's send_lat); WRITE, READ and atomics are timed
/// from post to completion (a full round trip), the program spinning on its CQ.
///
/// # Errors
/// A failed completion or verbs error.
pub fn latency(a: &Side, b: &Side, op: Op, size: u32, iters: u64) -> Result<LatResult> {
    if op == Op::Send {
        return ping_pong(a, b, size, iters);
    }
    let qa = &a.qps[0];
    let size = if op == Op::Atomic { 8 } else { size };
    let mut samples = Vec::with_capacity(iters as usize);
    let calls = Syscalls::now(a, b);
    for i in 0..iters {
        let deadline = Instant::now() + Duration::from_secs(10);
        let t0 = Instant::now();
        qa.post_send(&wr_for(a, b, 0, op, size, i))?;
        spin_one(a, deadline)?;
        samples.push(t0.elapsed());
    }
    samples.sort_unstable();
    Ok(LatResult {
        size,
        samples,
        calls: Syscalls::now(a, b).since(calls),
    })
}

/// The sizes `--all` sweeps: 2 B … 8 MiB in powers of two.
pub fn all_sizes() -> Vec<u32> {
    (1..=23).map(|p| 1u32 << p).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

    use super::*;
    use crate::tools::loopback::connected_pair_with;
    use ferroce::OpenOptions;
    use ferroce::transport::{Mtu, QpType};

    /// Two connected sides on loopback, with completion channels if `channels`.
    fn pair(channels: bool) -> (Side, Side) {
        connected_pair_with(
            &OpenOptions::default(),
            QpType::Rc,
            1,
            1 << 16,
            Mtu::Mtu1024,
            16,
            channels,
        )
        .unwrap()
    }

    /// A ping-pong takes every completion it caused and leaves no receive posted: the next
    /// one, with larger messages (`lat -a`), runs on the same QPs, and what follows a
    /// ping-pong (the demo's WRITE) sees only its own completions.
    #[test]
    fn a_ping_pong_leaves_the_qps_as_it_found_them() {
        let (a, b) = pair(false);
        for (size, iters) in [(8, 21), (4096, 13), (1, 1)] {
            let r = ping_pong(&a, &b, size, iters).unwrap();
            assert_eq!(r.samples.len(), iters as usize);
            assert!(a.cq.poll_one().is_none() && b.cq.poll_one().is_none());
        }
        assert_eq!(ping_pong(&a, &b, 8, 0).unwrap().samples.len(), 0);
    }

    /// Two threads sleeping on completion channels answer every message: each iteration is a
    /// sample, both ends moved datagrams, and nothing failed or timed out.
    #[test]
    fn a_blocking_ping_pong_gets_every_answer() {
        let (a, b) = pair(true);
        let r = ping_pong(&a, &b, 8, 300).unwrap();
        assert_eq!(r.samples.len(), 300);
        assert!(r.samples.windows(2).all(|w| w[0] <= w[1]), "sorted");
        assert!(r.calls.send > 0 && r.calls.recv > 0, "{:?}", r.calls);
    }

    /// A bandwidth run measures the process's CPU time over the run: moving 200 messages
    /// costs some, and no more than every core the process may use for the whole run (no
    /// guess at how the scheduler shares them on a loaded host), so the CPU cost per GB is
    /// positive and finite, and it is what `cpu_per_gb` makes of those figures.
    #[test]
    fn a_bandwidth_run_counts_its_cpu_time() {
        let (a, b) = connected_pair_with(
            &OpenOptions::default(),
            QpType::Rc,
            1,
            1 << 20,
            Mtu::Mtu4096,
            16,
            false,
        )
        .unwrap();
        let r = bandwidth(&a, &b, Op::Write, 65536, Limit::Iters(200), 16).unwrap();
        assert_eq!(r.msgs, 200);
        // The process clock counts in nanoseconds; its two reads bracket the run, and the
        // 10 ms cover a tick of accounting that lands just inside them.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        assert!(
            r.cpu > Duration::ZERO && r.cpu <= r.elapsed * cores + Duration::from_millis(10),
            "cpu {:?} over {:?} on {cores} cores",
            r.cpu,
            r.elapsed
        );
        let per_gb = r.cpu_s_per_gb();
        assert!(per_gb.is_finite() && per_gb > 0.0, "{per_gb}");
        assert_eq!(
            per_gb,
            cpu_per_gb(r.cpu, 200.0 * 65536.0),
            "the bytes of 200 messages of 64 KiB"
        );
    }

    /// Runs `bandwidth` in a thread and waits at most a minute for it: a receiver that stops
    /// posting would leave the SENDs waiting on RNR NAKs for ever.
    fn bounded_bw(nqp: usize, mem: usize, size: u32, iters: u64) -> Result<BwResult> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (a, b) = connected_pair_with(
                &OpenOptions::default(),
                QpType::Rc,
                nqp,
                mem,
                Mtu::Mtu1024,
                8,
                false,
            )
            .unwrap();
            let _ = tx.send(bandwidth(&a, &b, Op::Send, size, Limit::Iters(iters), 8));
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("bw --op send did not end within a minute")
    }

    /// SEND's receiving thread posts every consumed receive again: 500 SENDs over two QPs
    /// of 8 receives each all complete.
    #[test]
    fn a_send_bandwidth_run_reposts_its_receives() {
        let r = bounded_bw(2, 1 << 16, 4096, 500).unwrap();
        assert_eq!(r.msgs, 500);
    }

    /// A receive that fails (its buffer runs past the region) ends the run with an error,
    /// not a hang.
    #[test]
    fn a_failed_receive_ends_a_send_bandwidth_run() {
        let r = bounded_bw(1, 1 << 12, 8192, 50);
        assert!(r.is_err(), "{r:?}");
    }

    /// The counters' differences over a run, per message: wake-ups beside the calls.
    #[test]
    fn syscalls_since_and_per_message() {
        let before = Syscalls {
            send: 1,
            recv: 2,
            empty: 3,
            wakeups: 4,
        };
        let after = Syscalls {
            send: 11,
            recv: 12,
            empty: 43,
            wakeups: 24,
        };
        let d = after.since(before);
        assert_eq!((d.send, d.recv, d.empty, d.wakeups), (10, 10, 40, 20));
        assert_eq!(d.per(40), 0.5);
        assert_eq!(d.empty_per(40), 1.0);
        assert_eq!(d.wakeups_per(40), 0.5);
        assert_eq!(d.wakeups_per(0), 20.0, "no messages: per one");
    }
}
