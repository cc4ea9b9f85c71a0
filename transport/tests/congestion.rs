//! ECN and CNPs in the simulator (DCQCN's notification and reaction points): a bottleneck
//! whose queue marks CE past a threshold and drops past its limit; a path that marks at
//! random; a peer that ignores CNPs (as kernel rxe does). Every transfer must end with the
//! right bytes, and with congestion control on the queue must overflow far less than with it
//! off.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::*;
use ferroce_transport::sim::LinkConfig;
use ferroce_transport::{CongestionConfig, Counters, Mtu, WcStatus, WrOpcode};

const WRS: u64 = 16;
const LEN: u32 = 256 << 10;

/// A 100 MB/s bottleneck with 5 us of latency, a 500 us (50 KB) drop-tail queue that marks CE
/// past 50 us (5 KB), as a shallow-buffered switch port with ECN does.
fn bottleneck() -> LinkConfig {
    LinkConfig {
        latency: Duration::from_micros(5),
        rate: 100_000_000,
        queue_limit: Some(Duration::from_micros(500)),
        ce_threshold: Some(Duration::from_micros(50)),
        ..lossless()
    }
}

struct Outcome {
    a: Counters,
    b: Counters,
    queue_drops: u64,
    ce_marked: u64,
    /// Virtual time the transfer took.
    took: Duration,
}

/// A writes 16 × 256 KiB to B over `link` (MTU 4096) with congestion control as `cc_a` (the
/// sender: its reaction point) and `cc_b` (the receiver: its notification point) say.
fn transfer(
    seed: u64,
    link: LinkConfig,
    cc_a: CongestionConfig,
    cc_b: CongestionConfig,
) -> Result<Outcome, String> {
    let opts = Opts {
        mtu: Mtu::Mtu4096,
        mem_len: (WRS * u64::from(LEN)) as usize,
        timeout: 14, // 67 ms
        ..Opts::default()
    };
    let mut p = pair(seed, link, opts);
    p.net.nodes[0].endpoint.set_congestion(cc_a);
    p.net.nodes[1].endpoint.set_congestion(cc_b);
    for i in 0..WRS {
        let off = i * u64::from(LEN);
        p.post_send(0, p.wr(i, WrOpcode::RdmaWrite, off, LEN, off));
    }
    if !p.run_until_send_wcs(WRS as usize, 5_000_000) {
        return Err(format!("not finished: {:?}", p.send_wcs(0)));
    }
    let st = statuses(&p.send_wcs(0));
    if st != vec![WcStatus::Success; WRS as usize] {
        return Err(format!("completions {st:?}"));
    }
    if p.bytes(1) != p.bytes(0) {
        return Err("B's region differs from A's".into());
    }
    Ok(Outcome {
        a: p.counters(0),
        b: p.counters(1),
        queue_drops: p.net.queue_drops,
        ce_marked: p.net.ce_marked,
        took: p.net.now - ferroce_transport::Instant::ZERO,
    })
}

#[test]
fn cnps_slow_the_sender_so_a_shallow_queue_overflows_far_less() {
    let off = transfer(
        1,
        bottleneck(),
        CongestionConfig::off(),
        CongestionConfig::off(),
    )
    .unwrap();
    let on = transfer(
        1,
        bottleneck(),
        CongestionConfig::default(),
        CongestionConfig::default(),
    )
    .unwrap();
    eprintln!(
        "off: {} queue drops, {:?}; on: {} queue drops, {} CE, {} CNPs sent, {} handled, {:?}",
        off.queue_drops,
        off.took,
        on.queue_drops,
        on.ce_marked,
        on.b.cnp_sent,
        on.a.cnp_handled,
        on.took
    );
    // Without congestion control the window (128 × 4 KiB) overruns the 50 KB queue again and
    // again; nothing answers the marks.
    assert!(
        off.queue_drops > 100,
        "{} drops without CC",
        off.queue_drops
    );
    assert_eq!((off.b.cnp_sent, off.a.cnp_handled), (0, 0));
    assert!(off.b.ecn_marked_pkts > 0, "the queue marks either way");
    // With it, B answers the marks, A cuts its rate and the queue stays mostly below its limit.
    assert!(on.b.cnp_sent > 0 && on.a.cnp_handled == on.b.cnp_sent);
    assert!(
        on.queue_drops * 4 < off.queue_drops,
        "{} drops with CC vs {} without",
        on.queue_drops,
        off.queue_drops
    );
    // Fewer losses, fewer go-back-N rounds: the same bytes in less time.
    assert!(
        on.took < off.took,
        "{:?} with CC vs {:?} without",
        on.took,
        off.took
    );
}

#[test]
fn cnps_are_rate_limited_per_qp() {
    // Every packet marked: B may send at most one CNP per 50 us of virtual time.
    let link = LinkConfig {
        ce: 1.0,
        ..lossless()
    };
    let o = transfer(
        2,
        link,
        CongestionConfig::default(),
        CongestionConfig::default(),
    )
    .unwrap();
    let max = o.took.as_micros() as u64 / 50 + 1;
    assert!(o.b.ecn_marked_pkts >= WRS * u64::from(LEN) / 4096);
    assert!(o.b.cnp_sent >= 2, "{}", o.b.cnp_sent);
    assert!(o.b.cnp_sent <= max, "{} CNPs in {:?}", o.b.cnp_sent, o.took);
}

#[test]
fn a_peer_that_ignores_cnps_is_unaffected() {
    // As kernel rxe: A's reaction point off. B still answers the marks; A counts the CNPs as
    // ignored and runs unpaced.
    let link = LinkConfig {
        ce: 0.05,
        ..lossless()
    };
    let rxe_like = CongestionConfig {
        rp: false,
        ..CongestionConfig::default()
    };
    let o = transfer(3, link, rxe_like, CongestionConfig::default()).unwrap();
    assert!(o.b.cnp_sent > 0);
    assert_eq!(o.a.cnp_handled, 0);
    assert_eq!(o.a.cnp_ignored, o.b.cnp_sent);
    // And a notification point that is off sends none.
    let quiet = CongestionConfig {
        np: false,
        ..CongestionConfig::default()
    };
    let o = transfer(4, link, CongestionConfig::default(), quiet).unwrap();
    assert!(o.b.ecn_marked_pkts > 0);
    assert_eq!((o.b.cnp_sent, o.a.cnp_handled), (0, 0));
}

#[test]
fn congestion_control_under_loss_reordering_and_marks_keeps_every_byte() {
    ferroce_transport::sim::run_seeds(100..110, |seed| {
        let link = LinkConfig {
            loss: 0.01,
            reorder: 0.02,
            dup: 0.01,
            ce: 0.02,
            ..bottleneck()
        };
        let o = transfer(
            seed,
            link,
            CongestionConfig::default(),
            CongestionConfig::default(),
        )?;
        if o.a.cnp_handled == 0 {
            return Err("no CNP reached the sender".into());
        }
        Ok(())
    });
}

#[test]
fn a_cnp_is_opcode_0x81_with_becn_for_the_senders_qp() {
    use std::cell::RefCell;
    use std::rc::Rc;

    use ferroce_transport::sim::Fate;
    use ferroce_wire::{Opcode, Psn};

    let link = LinkConfig {
        ce: 1.0,
        ..lossless()
    };
    let mut p = pair(9, link, Opts::default());
    let seen = Rc::new(RefCell::new(Vec::new()));
    let log = seen.clone();
    p.net.fate = Some(Box::new(move |from, to, pkt| {
        if pkt.bth.opcode == Opcode::CNP {
            log.borrow_mut()
                .push((from, to, pkt.bth, pkt.ext.cnp, pkt.payload.len()));
        }
        Fate::Deliver
    }));
    p.post_send(0, p.wr(1, WrOpcode::RdmaWrite, 0, 8192, 0));
    assert!(p.run_until_send_wcs(1, 100_000));
    // Until the last CNP has landed too.
    assert!(p.net.drive(100_000));
    let seen = seen.borrow();
    assert!(!seen.is_empty());
    // B answers A's marked WRITEs; A answers B's marked ACKs the same way.
    assert!(seen.iter().any(|s| (s.0, s.1) == (1, 0)));
    for (from, to, bth, cnp, payload) in seen.iter() {
        assert_ne!(from, to);
        assert_eq!(bth.dest_qp, if *to == 0 { p.qa } else { p.qb });
        assert!(bth.becn && !bth.fecn && !bth.ack_req && !bth.se);
        assert_eq!((bth.psn, bth.pkey, bth.pad_count), (Psn::new(0), 0xFFFF, 0));
        assert_eq!(cnp.unwrap().reserved, [0; 16]);
        assert_eq!(*payload, 0);
    }
    // Each one passed its receiver's ICRC check and reached its QP.
    let to_a = seen.iter().filter(|s| s.1 == 0).count() as u64;
    assert_eq!(p.counters(0).cnp_handled, to_a);
    assert_eq!(p.counters(1).cnp_handled, seen.len() as u64 - to_a);
}
