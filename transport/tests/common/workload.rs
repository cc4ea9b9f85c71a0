//! Random RC workloads over lossy links, checked against a model of what memory must hold.

use std::time::Duration;

use ferroce_transport::sim::{LinkConfig, Rng};
use ferroce_transport::{AtomicOp, Mtu, WcFlags, WcOpcode, WcStatus, WrOpcode};

use super::{Opts, pair, pattern};

/// One generated work request and where its bytes live.
#[derive(Debug, Clone, Copy)]
pub struct Op {
    pub opcode: WrOpcode,
    pub len: u32,
    /// Offset in A's region (source of SEND/WRITE, destination of READ/atomic results).
    pub a_off: u64,
    /// Offset in B's region (destination of SEND/WRITE, source of READ, atomic target).
    pub b_off: u64,
    pub imm: u32,
    pub compare_add: u64,
    pub swap: u64,
}

/// The shape of a workload.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub max_ops: u64,
    pub max_len: u32,
    pub max_loss: f64,
    pub faults: bool,
    /// Sizes near `max_len` (max_len / 1 … / 8) instead of the usual mix.
    pub large: bool,
}

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
    }
}

/// What one run went through, summed over both nodes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    pub ops: u64,
    pub packets: u64,
    pub retries: u64,
    pub seq_naks: u64,
    pub duplicates: u64,
    pub icrc_errors: u64,
    pub retry_exceeded: u64,
    pub rnr: u64,
}

impl Stats {
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

/// Runs one seeded workload; `Err` describes the first broken invariant.
pub fn run(seed: u64, shape: Shape) -> Result<Stats, String> {
    let mut rng = Rng::new(seed);
    let mtu = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ][rng.below(5) as usize];
    let link = random_link(&mut rng, &shape);
    let nops = 1 + rng.below(shape.max_ops);
    let mut ops = Vec::new();
    let (mut a_end, mut b_end) = (0u64, 0u64);
    for _ in 0..nops {
        let opcode = [
            WrOpcode::Send,
            WrOpcode::SendWithImm,
            WrOpcode::RdmaWrite,
            WrOpcode::RdmaWriteWithImm,
            WrOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp,
            WrOpcode::AtomicFetchAndAdd,
        ][rng.below(7) as usize];
        let len = match (opcode.is_atomic(), shape.large) {
            (true, _) => 8,
            (false, true) => shape.max_len >> rng.below(4),
            (false, false) => random_len(&mut rng, mtu.bytes(), shape.max_len),
        };
        let align = |x: u64| (x + 7) & !7;
        let op = Op {
            opcode,
            len,
            a_off: align(a_end),
            b_off: align(b_end),
            imm: rng.next_u64() as u32,
            compare_add: if rng.below(2) == 0 { 0 } else { rng.next_u64() },
            swap: rng.next_u64(),
        };
        a_end = op.a_off + u64::from(len.max(1));
        b_end = op.b_off + u64::from(len.max(1));
        ops.push(op);
    }
    let mem_len = a_end.max(b_end) as usize + 64;
    let opts = Opts {
        mtu,
        psn_a: rng.below(1 << 24) as u32,
        psn_b: rng.below(1 << 24) as u32,
        mem_len,
        max_rd_atomic: 1 + rng.below(16) as u8,
        ..Opts::default()
    };
    let opts = Opts {
        max_dest_rd_atomic: opts.max_rd_atomic,
        ..opts
    };
    let mut p = pair(seed, link, opts);
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
    let max_steps = 200_000 + 50 * (a_end + b_end) / u64::from(mtu.bytes());
    if !p.run_until_send_wcs(ops.len(), max_steps) {
        return Err(format!(
            "only {} of {} send completions after {} steps",
            p.send_wcs(0).len(),
            ops.len(),
            p.net.steps
        ));
    }
    p.net.drive(max_steps);
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
    // Memory: build the model of what A and B must hold after the successful WRs.
    let mut a_model = a_init.clone();
    let mut b_model = b_init.clone();
    for op in &ops[..done] {
        let (a, b, l) = (op.a_off as usize, op.b_off as usize, op.len as usize);
        match op.opcode {
            WrOpcode::Send
            | WrOpcode::SendWithImm
            | WrOpcode::RdmaWrite
            | WrOpcode::RdmaWriteWithImm => {
                b_model[b..b + l].copy_from_slice(&a_init[a..a + l]);
            }
            WrOpcode::RdmaRead => a_model[a..a + l].copy_from_slice(&b_init[b..b + l]),
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => {
                let orig = u64::from_ne_bytes(b_init[b..b + 8].try_into().unwrap_or_default());
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
    // Receive side: every SEND / WRITE-with-imm that completed delivered exactly once, in order.
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
