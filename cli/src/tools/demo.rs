//! `ferroce demo`: two RDMA endpoints on loopback in one process — ping-pong, RDMA WRITE,
//! RDMA READ and atomics, every byte verified — with what happened and the figures.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::tools::loopback::connected_pair;
use crate::tools::perf::{self, Limit, Op};
use ferroce::transport::{Mtu, QpType, SendFlags, SendWr, WcStatus, WrOpcode};
use ferroce::{Error, OpenOptions, Result};

const MIB: usize = 1 << 20;

fn wait_one(side: &crate::tools::loopback::Side) -> Result<ferroce::transport::WorkCompletion> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(wc) = side.cq.poll_one() {
            return Ok(wc);
        }
        if Instant::now() > deadline {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no completion within 20 s",
            )));
        }
        std::thread::yield_now();
    }
}

fn check(ok: bool, what: &str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::Io(std::io::Error::other(format!(
            "verification failed: {what}"
        ))))
    }
}

/// Runs the demo, printing to `out`.
///
/// # Errors
/// Any verbs failure, a failed completion, or data that does not verify.
pub fn run(out: &mut dyn Write) -> Result<()> {
    let mem = 16 * MIB;
    let (a, b) = connected_pair(
        &OpenOptions::default(),
        QpType::Rc,
        1,
        mem,
        Mtu::Mtu4096,
        128,
    )?;
    let w = |out: &mut dyn Write, s: String| {
        let _ = writeln!(out, "{s}");
    };
    w(
        out,
        "ferroce demo: two RoCEv2 endpoints over UDP on loopback, in one process".into(),
    );
    for (name, s) in [("A", &a), ("B", &b)] {
        w(
            out,
            format!(
                "  {name}: {} GID {} QPN {:#08x}, {} MiB registered (rkey {:#x})",
                s.ctx.local_addr(),
                s.ctx.query_gid(1)?,
                s.qps[0].qp_num(),
                s.mr.len() / MIB,
                s.mr.rkey()
            ),
        );
    }
    w(
        out,
        format!(
            "  RC QPs connected, path MTU {} (the loopback port's active MTU)",
            a.ctx.query_port().active_mtu.bytes()
        ),
    );

    // 1. Ping-pong.
    let lat = perf::latency(&a, &b, Op::Send, 64, 1000)?;
    w(
        out,
        format!(
            "1. SEND ping-pong, 64 B x 1000: median {:.1} us one way (min {:.1}, p99 {:.1})",
            lat.percentile(50.0).as_secs_f64() * 1e6,
            lat.percentile(0.0).as_secs_f64() * 1e6,
            lat.percentile(99.0).as_secs_f64() * 1e6
        ),
    );

    // 2. RDMA WRITE of 8 MiB, verified.
    let data: Vec<u8> = (0..8 * MIB)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[1])
        .collect();
    a.mr.write(0, &data)?;
    let mut wr = SendWr::new(1, WrOpcode::RdmaWrite);
    wr.send_flags = SendFlags::SIGNALED;
    wr.sg_list = vec![a.mr.sge(0, data.len() as u32)].into();
    wr.remote.remote_addr = b.mr.addr() + (4 * MIB) as u64;
    wr.remote.rkey = b.mr.rkey();
    let t = Instant::now();
    a.qps[0].post_send(&wr)?;
    let wc = wait_one(&a)?;
    let dt = t.elapsed();
    check(wc.status == WcStatus::Success, "WRITE completion")?;
    let mut got = vec![0u8; data.len()];
    b.mr.read(4 * MIB, &mut got)?;
    check(got == data, "8 MiB written to B")?;
    w(
        out,
        format!(
            "2. RDMA WRITE 8 MiB A -> B: verified, {:.1} MB/s",
            data.len() as f64 / dt.as_secs_f64() / 1e6
        ),
    );

    // 3. RDMA READ it back into another part of A, verified.
    let mut rd = SendWr::new(2, WrOpcode::RdmaRead);
    rd.send_flags = SendFlags::SIGNALED;
    rd.sg_list = vec![a.mr.sge(8 * MIB, data.len() as u32)].into();
    rd.remote.remote_addr = b.mr.addr() + (4 * MIB) as u64;
    rd.remote.rkey = b.mr.rkey();
    let t = Instant::now();
    a.qps[0].post_send(&rd)?;
    let wc = wait_one(&a)?;
    let dt = t.elapsed();
    check(
        wc.status == WcStatus::Success,
        &format!("READ completion ({})", wc.status),
    )?;
    a.mr.read(8 * MIB, &mut got)?;
    check(got == data, "8 MiB read back into A")?;
    w(
        out,
        format!(
            "3. RDMA READ 8 MiB B -> A: verified, {:.1} MB/s",
            data.len() as f64 / dt.as_secs_f64() / 1e6
        ),
    );

    // 4. Atomics: 1000 FETCH_ADDs then a CMP_SWAP on one counter in B.
    let counter = 12 * MIB;
    b.mr.write(counter, &0u64.to_ne_bytes())?;
    let t = Instant::now();
    for i in 0..1000u64 {
        let mut fa = SendWr::new(100 + i, WrOpcode::AtomicFetchAndAdd);
        fa.send_flags = SendFlags::SIGNALED;
        fa.sg_list = vec![a.mr.sge(counter, 8)].into();
        fa.remote.remote_addr = b.mr.addr() + counter as u64;
        fa.remote.rkey = b.mr.rkey();
        fa.compare_add = 1;
        a.qps[0].post_send(&fa)?;
        let wc = wait_one(&a)?;
        check(wc.status == WcStatus::Success, "FETCH_ADD completion")?;
        check(
            a.mr.atomic_load(counter)? == i,
            "FETCH_ADD returned the previous value",
        )?;
    }
    let dt = t.elapsed();
    let mut cs = SendWr::new(2000, WrOpcode::AtomicCmpAndSwp);
    cs.send_flags = SendFlags::SIGNALED;
    cs.sg_list = vec![a.mr.sge(counter, 8)].into();
    cs.remote.remote_addr = b.mr.addr() + counter as u64;
    cs.remote.rkey = b.mr.rkey();
    cs.compare_add = 1000;
    cs.swap = 42;
    a.qps[0].post_send(&cs)?;
    check(
        wait_one(&a)?.status == WcStatus::Success,
        "CMP_SWAP completion",
    )?;
    check(
        b.mr.atomic_load(counter)? == 42 && a.mr.atomic_load(counter)? == 1000,
        "CMP_SWAP swapped 1000 for 42",
    )?;
    w(
        out,
        format!(
            "4. 1000 FETCH_ADD + 1 CMP_SWAP on B's counter: verified, {:.1} us per atomic",
            dt.as_secs_f64() * 1e6 / 1000.0
        ),
    );

    // 5. Streaming WRITE bandwidth.
    let bw = perf::bandwidth(
        &a,
        &b,
        Op::Write,
        65536,
        Limit::Duration(Duration::from_secs(1)),
        64,
    )?;
    w(
        out,
        format!(
            "5. RDMA WRITE 64 KiB streamed for 1 s: {:.0} MB/s ({:.2} Gb/s)",
            bw.mb_per_s(),
            bw.gbit_per_s()
        ),
    );

    let (ea, ra) = a.ctx.counters();
    let (eb, _) = b.ctx.counters();
    w(
        out,
        format!(
            "counters A: sent_pkts {} rcvd_pkts {} retries {} icrc_errors {} | B: sent_pkts {} rcvd_pkts {} duplicate_request {}",
            ea.sent_pkts,
            ea.rcvd_pkts,
            ea.completer_retry_err,
            ea.icrc_errors,
            eb.sent_pkts,
            eb.rcvd_pkts,
            eb.duplicate_request
        ),
    );
    let _ = ra;
    w(out, "demo OK: every byte verified".into());
    Ok(())
}
