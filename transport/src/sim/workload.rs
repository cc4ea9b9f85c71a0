//! Random RC workloads over faulty links, checked against a model of what memory must hold:
//! every WR completes exactly once, in posting order, with the right status, and every byte
//! lands exactly as sent. Shared by the property tests, the soak and the `rc_engine` fuzz target.

use core::time::Duration;

use super::pair::{Opts, Pair, pair, pattern};
use super::{Fate, FateFilter, LinkConfig, Rng};
use crate::{AtomicOp, Mtu, WcFlags, WcOpcode, WcStatus, WrOpcode};

/// One work request of a workload and where its bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    /// The operation.
    pub opcode: WrOpcode,
    /// Message length (8 for atomics and ATOMIC WRITE).
    pub len: u32,
    /// Offset in A's region: source of SEND/WRITE, destination of READ data and atomic results.
    pub a_off: u64,
    /// Offset in B's region: destination of SEND/WRITE, source of READ, atomic target.
    pub b_off: u64,
    /// Immediate data (…_WITH_IMM).
    pub imm: u32,
    /// Compare (CMP_SWAP) or addend (FETCH_ADD).
    pub compare_add: u64,
    /// Swap value (CMP_SWAP).
    pub swap: u64,
}

/// The shape of a random workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// At most this many WRs.
    pub max_ops: u64,
    /// The longest message.
    pub max_len: u32,
    /// The highest loss probability drawn.
    pub max_loss: f64,
    /// Whether links get faults at all.
    pub faults: bool,
    /// Sizes near `max_len` (max_len / 1 … / 8) instead of the usual mix.
    pub large: bool,
}

/// A complete workload: the pair's set-up, the link and the WRs.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// How the pair is set up (MTU, PSNs, limits, region size).
    pub opts: Opts,
    /// Both directions' link.
    pub link: LinkConfig,
    /// The WRs, posted in order on A.
    pub ops: Vec<Op>,
}

/// What one run went through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// WRs posted.
    pub ops: u64,
    /// Packets put on the wire.
    pub packets: u64,
    /// Go-back-N restarts on A.
    pub retries: u64,
    /// Sequence NAKs (and READ gaps) A saw.
    pub seq_naks: u64,
    /// Duplicate requests B saw.
    pub duplicates: u64,
    /// Packets dropped for a bad ICRC on either side.
    pub icrc_errors: u64,
    /// Runs that ended in RetryExcErr.
    pub retry_exceeded: u64,
    /// RNR NAKs A received.
    pub rnr: u64,
}

impl Stats {
    /// Adds another run's figures.
    pub fn add(&mut self, o: Stats) {
        self.ops += o.ops;
        self.packets += o.packets;
        self.retries += o.retries;
        self.seq_naks += o.seq_naks;
        self.duplicates += o.duplicates;
        self.icrc_errors += o.icrc_errors;
        self.retry_exceeded += o.retry_exceeded;
        self.rnr += o.rnr;
    }
}

/// A message length: empty, tiny, around the MTU, or anything up to `max_len`.
pub fn random_len(rng: &mut Rng, mtu: u32, max_len: u32) -> u32 {
    let l = match rng.below(8) {
        0 => 0,
        1 => 1 + rng.below(8) as u32,
        2 => mtu - 1,
        3 => mtu,
        4 => mtu + 1,
        5 => rng.below(u64::from(max_len) + 1) as u32,
        _ => rng.below(3 * u64::from(mtu)) as u32,
    };
    l.min(max_len)
}

/// A link with random latency, jitter and faults within `shape`.
pub fn random_link(rng: &mut Rng, shape: &Shape) -> LinkConfig {
    if !shape.faults {
        return LinkConfig::default();
    }
    let pct = |rng: &mut Rng, max: f64| (rng.below(1001) as f64 / 1000.0) * max;
    LinkConfig {
        latency: Duration::from_micros(5 + rng.below(50)),
        jitter: Duration::from_micros(rng.below(20)),
        loss: pct(rng, shape.max_loss),
        dup: pct(rng, 0.05),
        reorder: pct(rng, 0.05),
        corrupt: pct(rng, 0.02),
        ..LinkConfig::default()
    }
}

/// Every operation the workloads use.
pub const OPCODES: [WrOpcode; 8] = [
    WrOpcode::Send,
    WrOpcode::SendWithImm,
    WrOpcode::RdmaWrite,
    WrOpcode::RdmaWriteWithImm,
    WrOpcode::RdmaRead,
    WrOpcode::AtomicCmpAndSwp,
    WrOpcode::AtomicFetchAndAdd,
    WrOpcode::AtomicWrite,
];

/// Lays out WRs given as `(opcode, len, imm, compare_add, swap)` in disjoint regions.
pub fn lay_out(ops: impl IntoIterator<Item = (WrOpcode, u32, u32, u64, u64)>) -> (Vec<Op>, usize) {
    let (mut a_end, mut b_end) = (0u64, 0u64);
    let align = |x: u64| (x + 7) & !7;
    let ops: Vec<Op> = ops
        .into_iter()
        .map(|(opcode, len, imm, compare_add, swap)| {
            let len = if opcode.is_atomic() || opcode == WrOpcode::AtomicWrite {
                8
            } else {
                len
            };
            let op = Op {
                opcode,
                len,
                a_off: align(a_end),
                b_off: align(b_end),
                imm,
                compare_add,
                swap,
            };
            a_end = op.a_off + u64::from(len.max(1));
            b_end = op.b_off + u64::from(len.max(1));
            op
        })
        .collect();
    let mem_len = a_end.max(b_end) as usize + 64;
    (ops, mem_len)
}

/// The workload of `seed`.
pub fn generate(seed: u64, shape: Shape) -> Workload {
    let mut rng = Rng::new(seed);
    let mtu = Mtu::ALL[rng.below(5) as usize];
    let link = random_link(&mut rng, &shape);
    let nops = 1 + rng.below(shape.max_ops);
    let raw: Vec<_> = (0..nops)
        .map(|_| {
            let opcode = OPCODES[rng.below(OPCODES.len() as u64) as usize];
            let len = if shape.large {
                shape.max_len >> rng.below(4)
            } else {
                random_len(&mut rng, mtu.bytes(), shape.max_len)
            };
            let compare_add = if rng.below(2) == 0 { 0 } else { rng.next_u64() };
            (
                opcode,
                len,
                rng.next_u64() as u32,
                compare_add,
                rng.next_u64(),
            )
        })
        .collect();
    let (ops, mem_len) = lay_out(raw);
    let max_rd_atomic = 1 + rng.below(16) as u8;
    let opts = Opts {
        mtu,
        psn_a: rng.below(1 << 24) as u32,
        psn_b: rng.below(1 << 24) as u32,
        mem_len,
        max_rd_atomic,
        max_dest_rd_atomic: max_rd_atomic,
        ..Opts::default()
    };
    Workload { opts, link, ops }
}

/// Runs the workload of `seed`; `Err` describes the first broken invariant.
///
/// # Errors
/// A description of the broken invariant.
pub fn run(seed: u64, shape: Shape) -> Result<Stats, String> {
    execute(seed, &generate(seed, shape), None, 0)
}

/// Runs a workload. `fate`, if given, decides each packet's fate before the link's random
/// faults; after `fault_steps` steps it is removed and the link made perfect, so every run
/// must finish. `Err` describes the first broken invariant.
///
/// # Errors
/// A description of the broken invariant.
pub fn execute(
    seed: u64,
    w: &Workload,
    fate: Option<FateFilter>,
    fault_steps: u64,
) -> Result<Stats, String> {
    let ops = &w.ops;
    let mtu = w.opts.mtu.bytes();
    let mut p = pair(seed, w.link, w.opts);
    p.net.fate = fate;
    let mem_len = w.opts.mem_len;
    // B's region starts with its own pattern so READs and atomics have something to fetch.
    let b_init = pattern(mem_len, 0xC3);
    p.net.nodes[1].mem.fill(p.mrb.lkey, 0, &b_init);
    let a_init = p.bytes(0);
    let mut recv_expect = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        if matches!(
            op.opcode,
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm
        ) {
            let len = if op.opcode == WrOpcode::RdmaWriteWithImm {
                0
            } else {
                op.len
            };
            p.post_recv(1, 1000 + i as u64, op.b_off, len);
            recv_expect.push((1000 + i as u64, *op));
        }
        let mut wr = p.wr(i as u64, op.opcode, op.a_off, op.len, op.b_off);
        wr.imm_data = op.imm;
        wr.compare_add = op.compare_add;
        wr.swap = op.swap;
        p.post_send(0, wr);
    }
    let bytes: u64 = ops.iter().map(|o| u64::from(o.len)).sum();
    let max_steps = 200_000 + 50 * bytes / u64::from(mtu);
    if fault_steps > 0 {
        p.run_until_send_wcs(ops.len(), fault_steps);
        p.net.fate = None;
        p.net.set_all_links(LinkConfig::default());
    }
    if !p.run_until_send_wcs(ops.len(), max_steps) {
        let got = p.send_wcs(0).len();
        return Err(format!(
            "only {got} of {} send completions after {} steps",
            ops.len(),
            p.net.steps
        ));
    }
    p.net.drive(max_steps);
    check(&p, ops, &a_init, &b_init, &recv_expect)
}

fn check(
    p: &Pair,
    ops: &[Op],
    a_init: &[u8],
    b_init: &[u8],
    recv_expect: &[(u64, Op)],
) -> Result<Stats, String> {
    let mem_len = a_init.len();
    // Send side: exactly one completion per WR, in posting order.
    let wcs = p.send_wcs(0);
    if wcs.len() != ops.len() {
        return Err(format!(
            "{} send completions for {} WRs",
            wcs.len(),
            ops.len()
        ));
    }
    let mut failed_at = None;
    for (i, wc) in wcs.iter().enumerate() {
        if wc.wr_id != i as u64 {
            return Err(format!("completion {i} is wr_id {}", wc.wr_id));
        }
        match (failed_at, wc.status) {
            (None, WcStatus::Success) => {
                if wc.opcode != WcOpcode::from(ops[i].opcode) {
                    return Err(format!("wr {i}: opcode {:?}", wc.opcode));
                }
            }
            // Under heavy loss the retry budget may run out: then that WR fails with
            // RetryExcErr, every later one is flushed, and the counter says so.
            (None, WcStatus::RetryExcErr) if p.counters(0).retry_exceeded_err == 1 => {
                failed_at = Some(i)
            }
            (Some(_), WcStatus::WrFlushErr) => {}
            (_, s) => {
                return Err(format!(
                    "wr {i} ({:?}, {} B): status {s:?}",
                    ops[i].opcode, ops[i].len
                ));
            }
        }
    }
    let done = failed_at.unwrap_or(ops.len());
    // Memory: the model of what A and B must hold after the successful WRs.
    let mut a_model = a_init.to_vec();
    let mut b_model = b_init.to_vec();
    for op in &ops[..done] {
        let (a, b, l) = (op.a_off as usize, op.b_off as usize, op.len as usize);
        match op.opcode {
            WrOpcode::Send
            | WrOpcode::SendWithImm
            | WrOpcode::RdmaWrite
            | WrOpcode::RdmaWriteWithImm
            | WrOpcode::AtomicWrite => {
                b_model[b..b + l].copy_from_slice(&a_init[a..a + l]);
            }
            WrOpcode::RdmaRead => a_model[a..a + l].copy_from_slice(&b_init[b..b + l]),
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => {
                let mut w = [0u8; 8];
                w.copy_from_slice(&b_init[b..b + 8]);
                let orig = u64::from_ne_bytes(w);
                let aop = if op.opcode == WrOpcode::AtomicCmpAndSwp {
                    AtomicOp::CompareSwap {
                        compare: op.compare_add,
                        swap: op.swap,
                    }
                } else {
                    AtomicOp::FetchAdd {
                        add: op.compare_add,
                    }
                };
                a_model[a..a + 8].copy_from_slice(&orig.to_ne_bytes());
                b_model[b..b + 8].copy_from_slice(&aop.apply(orig).to_ne_bytes());
            }
            // Workloads draw no window operations or flushes: they change no bytes.
            WrOpcode::LocalInv | WrOpcode::BindMw | WrOpcode::SendWithInv | WrOpcode::Flush => {}
        }
    }
    let (a_now, b_now) = (p.bytes(0), p.bytes(1));
    // After a failure, the bytes of the failed and flushed WRs are unspecified; all others
    // must be exact.
    let mut a_free = vec![false; mem_len];
    let mut b_free = vec![false; mem_len];
    for op in &ops[done..] {
        let (a, b, l) = (op.a_off as usize, op.b_off as usize, op.len as usize);
        a_free[a..a + l].fill(true);
        b_free[b..b + l].fill(true);
    }
    if let Some(i) = (0..mem_len).find(|&i| !a_free[i] && a_now[i] != a_model[i]) {
        return Err(format!("A differs at byte {i}"));
    }
    if let Some(i) = (0..mem_len).find(|&i| !b_free[i] && b_now[i] != b_model[i]) {
        return Err(format!("B differs at byte {i}"));
    }
    // Receive side: every SEND / WRITE-with-imm that completed was delivered once, in order.
    let rwcs = p.recv_wcs(1);
    let expect: Vec<_> = recv_expect
        .iter()
        .filter(|(id, _)| (*id - 1000) < done as u64)
        .collect();
    if failed_at.is_none() && rwcs.len() != expect.len() {
        return Err(format!(
            "{} receive completions, expected {}",
            rwcs.len(),
            expect.len()
        ));
    }
    for (wc, (id, op)) in rwcs.iter().zip(expect.iter()) {
        if wc.wr_id != *id || wc.status != WcStatus::Success || wc.byte_len != op.len {
            return Err(format!("receive completion {wc:?} for {op:?}"));
        }
        let with_imm = matches!(
            op.opcode,
            WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm
        );
        if with_imm != wc.wc_flags.contains(WcFlags::WITH_IMM)
            || (with_imm && wc.imm_data != op.imm)
        {
            return Err(format!("immediate data of {wc:?} for {op:?}"));
        }
    }
    let (ca, cb) = (p.counters(0), p.counters(1));
    Ok(Stats {
        ops: ops.len() as u64,
        packets: p.net.packets,
        retries: ca.completer_retry_err,
        seq_naks: ca.rcvd_seq_err,
        duplicates: cb.duplicate_request,
        icrc_errors: ca.icrc_errors + cb.icrc_errors,
        retry_exceeded: ca.retry_exceeded_err,
        rnr: ca.rcvd_rnr_err,
    })
}

/// A fate for each packet from a byte stream (for fuzzing): mostly deliver, sometimes drop,
/// duplicate, corrupt or delay.
pub fn fate_from_bytes(bytes: Vec<u8>) -> FateFilter {
    let mut i = 0usize;
    Box::new(move |_, _, _| {
        let b = bytes.get(i).copied().unwrap_or(0);
        let c = bytes.get(i + 1).copied().unwrap_or(0);
        i += 2;
        match b % 16 {
            0 => Fate::Drop,
            1 => Fate::Duplicate,
            2 => Fate::Corrupt(u32::from(c) * 7 + u32::from(b)),
            3 => Fate::Delay(Duration::from_micros(u64::from(c))),
            _ => Fate::Deliver,
        }
    })
}
