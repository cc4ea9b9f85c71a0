//! When a requester asks for acknowledgements (AckReq): at the end of a burst — the last
//! SEND/WRITE before its send queue drains or before a READ, atomic or local operation — every
//! 64 packets, at half its window and when the endpoint's in-flight budget is half used; not on
//! every message. The responder here is ferroce's, which (as kernel rxe) answers only packets
//! that ask: a burst must never wait for a retransmission timeout, on a clean link or a lossy one,
//! with one QP or with many sharing a small budget.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::*;
use ferroce_transport::sim::{LinkConfig, Network, run_seeds};
use ferroce_transport::{Endpoint, EndpointConfig, SendFlags, SendWr, WcQueue, WcStatus, WrOpcode};

fn ok(wcs: &[ferroce_transport::WorkCompletion], n: usize) -> Result<(), String> {
    if statuses(wcs) != vec![WcStatus::Success; n] {
        return Err(format!("{:?}", statuses(wcs)));
    }
    Ok(())
}

/// 32 WRITEs posted together: one burst, so one packet asks and one ACK answers (the link's
/// 10 MB/s bottleneck spaces the packets out, so the responder sees each on its own and could
/// not coalesce ACKs they all asked for); the bytes all land and nothing is sent twice.
#[test]
fn a_burst_asks_once_at_its_end() {
    let slow = LinkConfig {
        rate: 10_000_000,
        ..lossless()
    };
    run_seeds(0..3, |seed| {
        let mut p = pair(seed, slow, Opts::default());
        for i in 0..32u64 {
            let w = p.wr(i, WrOpcode::RdmaWrite, i * 64, 64, i * 64);
            p.post_send(0, w);
        }
        if !p.run_until_send_wcs(32, 1_000_000) {
            return Err("the burst did not complete".into());
        }
        ok(&p.send_wcs(0), 32)?;
        let (a, b) = (p.counters(0), p.counters(1));
        if b.sent_pkts > 2 {
            return Err(format!("{} ACKs for one burst of 32 WRITEs", b.sent_pkts));
        }
        if b.duplicate_request != 0 || a.sent_pkts != 32 {
            return Err(format!("retransmissions: {a:?} / {b:?}"));
        }
        if p.bytes(1)[..32 * 64] != p.bytes(0)[..32 * 64] {
            return Err("the bytes differ".into());
        }
        Ok(())
    });
}

/// Long bursts ask at least every 64 packets and at half the 128-PSN window; a READ, an
/// atomic or a local operation ends a burst (the packet before it asks). Mixed lists complete
/// without a retransmission on a clean link.
#[test]
fn mixed_work_never_waits_for_a_timeout() {
    run_seeds(10..13, |seed| {
        let opts = Opts {
            mem_len: 1 << 18,
            ..Opts::default()
        };
        let mut p = pair(seed, lossless(), opts);
        let mut n = 0u64;
        for round in 0..20u64 {
            for k in 0..10u64 {
                let off = (round * 10 + k) % 500 * 64;
                let op = match k {
                    3 => WrOpcode::RdmaRead,
                    6 => WrOpcode::AtomicFetchAndAdd,
                    _ => WrOpcode::RdmaWrite,
                };
                let mut w = p.wr(n, op, off, if op.is_atomic() { 8 } else { 64 }, off);
                if op.is_atomic() {
                    w.sg_list = vec![p.mra.sge(40_000, 8)].into();
                    w.remote.remote_addr = p.mrb.addr + 40_000;
                    w.compare_add = 1;
                }
                p.post_send(0, w);
                n += 1;
            }
        }
        // And one 200-packet WRITE: more than the 128-PSN window, asked every 64 at most.
        let w = p.wr(n, WrOpcode::RdmaWrite, 0, 200 * 1024, 0);
        p.post_send(0, w);
        n += 1;
        if !p.run_until_send_wcs(n as usize, 2_000_000) {
            return Err(format!("{} of {n} completed", p.send_wcs(0).len()));
        }
        ok(&p.send_wcs(0), n as usize)?;
        let b = p.counters(1);
        if b.duplicate_request != 0 {
            return Err(format!("{} requests sent twice", b.duplicate_request));
        }
        Ok(())
    });
}

/// Under 3 % loss in both directions every burst completes with its bytes: a lost ACK is
/// recovered by the next one or by the retransmission the timeout brings.
#[test]
fn bursts_complete_under_loss() {
    let lossy = LinkConfig {
        loss: 0.03,
        ..lossless()
    };
    run_seeds(20..24, |seed| {
        let mut p = pair(seed, lossy, Opts::default());
        for i in 0..200u64 {
            let w = p.wr(i, WrOpcode::RdmaWrite, i % 100 * 256, 256, i % 100 * 256);
            p.post_send(0, w);
        }
        if !p.run_until_send_wcs(200, 20_000_000) {
            return Err(format!("{} of 200 completed", p.send_wcs(0).len()));
        }
        ok(&p.send_wcs(0), 200)?;
        if p.bytes(1)[..100 * 256] != p.bytes(0)[..100 * 256] {
            return Err("the bytes differ".into());
        }
        Ok(())
    });
}

/// 16 QPs with deep queues of small WRITEs share an in-flight budget of 64 PSNs: a QP that may
/// not start its next message has asked for the ACK of its last one (the budget is half used),
/// so none waits for a timeout.
#[test]
fn qps_held_by_the_budget_have_asked_for_their_acks() {
    run_seeds(30..33, |seed| {
        let mut net = Network::new(seed, 2, lossless());
        for n in &mut net.nodes {
            n.endpoint = Endpoint::new(EndpointConfig {
                solve_unknown_ident: false,
                inflight_budget: 64,
                ..EndpointConfig::new(n.addr)
            });
        }
        let opts = Opts::default();
        let init = rc_init(256);
        let (aa, ab) = (net.nodes[0].addr, net.nodes[1].addr);
        let mra = net.nodes[0]
            .mem
            .register(PD, pattern(1 << 16, 3), opts.access);
        let mrb = net.nodes[1].mem.register(PD, vec![0; 1 << 16], opts.access);
        let mut qps = Vec::new();
        for i in 0..16u32 {
            let qa = net.nodes[0].endpoint.create_qp(init).unwrap();
            let qb = net.nodes[1].endpoint.create_qp(init).unwrap();
            connect(&mut net, 0, qa, ab, qb, 0x100 + i, 0x900 + i, &opts);
            connect(&mut net, 1, qb, aa, qa, 0x900 + i, 0x100 + i, &opts);
            qps.push(qa);
        }
        for (q, &qa) in qps.iter().enumerate() {
            for w in 0..64u64 {
                let off = (q as u64 * 64 + w) * 64;
                let mut wr = SendWr::new(w, WrOpcode::RdmaWrite);
                wr.send_flags = SendFlags::SIGNALED;
                wr.sg_list = vec![mra.sge(off, 64)].into();
                wr.remote.remote_addr = mrb.addr + off;
                wr.remote.rkey = mrb.rkey;
                let now = net.now;
                let n = &mut net.nodes[0];
                n.endpoint.post_send(qa, wr, &n.mem, now).unwrap();
            }
        }
        // 1,024 WRITEs; a QP stalled until its 4.2 ms timeout would show as a resent request.
        let done = net.drive_until(5_000_000, |net| {
            qps.iter()
                .all(|&qa| net.nodes[0].completions_of(qa, WcQueue::Send).len() == 64)
        });
        if !done {
            return Err("the WRITEs did not finish".into());
        }
        let b = *net.nodes[1].endpoint.counters();
        if b.duplicate_request != 0 {
            return Err(format!(
                "{} requests resent: a QP waited for its timeout",
                b.duplicate_request
            ));
        }
        if net.nodes[1].mem.bytes(mrb.lkey).unwrap() != net.nodes[0].mem.bytes(mra.lkey).unwrap() {
            return Err("the bytes differ".into());
        }
        Ok(())
    });
}

/// A NAK acknowledges every request before the one it names (IBTA 9.7.5.1.2): the messages
/// of a burst before a WRITE with a bad R_Key, which asked for no ACK of their own, complete
/// successfully before the bad one fails the QP; likewise before an RNR NAK with `rnr_retry` 0.
#[test]
fn a_nak_completes_the_burst_before_it() {
    run_seeds(40..43, |seed| {
        let mut p = pair(seed, lossless(), Opts::default());
        for i in 0..3u64 {
            let w = p.wr(i, WrOpcode::RdmaWrite, i * 64, 64, i * 64);
            p.post_send(0, w);
        }
        let mut bad = p.wr(3, WrOpcode::RdmaWrite, 0, 64, 0);
        bad.remote.rkey ^= 0x55;
        p.post_send(0, bad);
        if !p.run_until_send_wcs(4, 1_000_000) {
            return Err(format!("{} of 4 completed", p.send_wcs(0).len()));
        }
        let want = [
            WcStatus::Success,
            WcStatus::Success,
            WcStatus::Success,
            WcStatus::RemAccessErr,
        ];
        if statuses(&p.send_wcs(0)) != want {
            return Err(format!("after a bad R_Key: {:?}", statuses(&p.send_wcs(0))));
        }

        let opts = Opts {
            rnr_retry: 0,
            ..Opts::default()
        };
        let mut p = pair(seed, lossless(), opts);
        p.post_recv(1, 0, 0, 64);
        p.post_recv(1, 1, 64, 64);
        for i in 0..3u64 {
            let mut w = SendWr::new(i, WrOpcode::Send);
            w.send_flags = SendFlags::SIGNALED;
            w.sg_list = vec![p.mra.sge(i * 64, 64)].into();
            p.post_send(0, w);
        }
        if !p.run_until_send_wcs(3, 1_000_000) {
            return Err(format!("{} of 3 SENDs completed", p.send_wcs(0).len()));
        }
        let want = [
            WcStatus::Success,
            WcStatus::Success,
            WcStatus::RnrRetryExcErr,
        ];
        if statuses(&p.send_wcs(0)) != want {
            return Err(format!("after an RNR NAK: {:?}", statuses(&p.send_wcs(0))));
        }
        Ok(())
    });
}
