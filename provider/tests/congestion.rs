//! ECN and CNPs over real sockets on loopback. Loopback has no queue that marks, so the
//! receiver's fault injection marks CE as a switch would (`FERROCE_FAULTS=ce=P`), on packets
//! that arrived ECN-capable: the receiver answers with CNPs, the sender's QP is slowed and
//! recovers, and every byte arrives. With ECN off, packets leave not ECN-capable: nothing is
//! marked and no CNP is sent.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::*;
use ferroce::faults::FaultConfig;
use ferroce::transport::{Mtu, QpType, WcStatus, WrOpcode};
use ferroce::{Context, Device, OpenOptions};

const T: Duration = Duration::from_secs(30);

fn open(a: [u8; 4], ecn: bool, ce: f64) -> Context {
    Device::for_addr(IpAddr::from(a))
        .unwrap()
        .open_with(OpenOptions {
            ecn: Some(ecn),
            faults: Some(FaultConfig {
                ce,
                seed: Some(11),
                ..FaultConfig::default()
            }),
            ..OpenOptions::default()
        })
        .unwrap()
}

/// 32 × 64 KiB WRITEs from x to y; returns (x's, y's) engine counters and y's runtime ones.
fn run(
    a: [u8; 4],
    b: [u8; 4],
) -> (
    ferroce::transport::Counters,
    ferroce::transport::Counters,
    ferroce::RuntimeCounters,
) {
    let (x, y) = pair(a, b, QpType::Rc, Mtu::Mtu4096, 2 << 20);
    let data = pattern(2 << 20, 5);
    x.mr.write(0, &data).unwrap();
    for i in 0..32u64 {
        let off = (i as usize) << 16;
        x.qp.post_send(&wr(&x, &y, i, WrOpcode::RdmaWrite, off, 1 << 16, off))
            .unwrap();
    }
    let wcs = wait(&x.cq, 32, T);
    assert_eq!(wcs.len(), 32);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let mut got = vec![0u8; 2 << 20];
    y.mr.read(0, &mut got).unwrap();
    assert_eq!(got, data, "every byte, in spite of the pacing");
    // The last CNPs may still be on their way: wait until every CNP y sent has been handled
    // by x and every mark injected at y has reached y's engine (the deadline only bounds a
    // failure; the assertions then show which count fell short).
    let deadline = std::time::Instant::now() + T;
    loop {
        let (ey, ry) = y.ctx.counters();
        let (ex, _) = x.ctx.counters();
        let settled = ex.cnp_handled == ey.cnp_sent && ey.ecn_marked_pkts == ry.injected_ce;
        // y's counters are read first: a CNP sent after that read cannot be counted at x
        // without being counted at y, so equal counts mean both reads saw the same CNPs.
        if settled || std::time::Instant::now() > deadline {
            return (ex, ey, ry);
        }
        std::thread::yield_now();
    }
}

#[test]
fn ce_marks_are_answered_with_cnps_that_slow_the_sender() {
    // x sends, y receives; y's fault injection marks 5 % of what arrives CE.
    let cx = open([127, 0, 86, 1], true, 0.0);
    let cy = open([127, 0, 86, 2], true, 0.05);
    let (ex, ey, ry) = run([127, 0, 86, 1], [127, 0, 86, 2]);
    assert!(ry.injected_ce > 0, "{ry:?}");
    assert_eq!(
        ey.ecn_marked_pkts, ry.injected_ce,
        "every mark seen by the engine"
    );
    assert!(
        ey.cnp_sent > 0 && ey.cnp_sent <= ey.ecn_marked_pkts,
        "{ey:?}"
    );
    assert_eq!(
        ex.cnp_handled, ey.cnp_sent,
        "each CNP reached x's QP: {ex:?}"
    );
    assert_eq!(ex.icrc_errors + ey.icrc_errors, 0);
    drop((cx, cy));
}

#[test]
fn with_ecn_off_nothing_is_ecn_capable_so_nothing_is_marked() {
    let cx = open([127, 0, 87, 1], false, 0.0);
    let cy = open([127, 0, 87, 2], false, 0.5);
    let (ex, ey, ry) = run([127, 0, 87, 1], [127, 0, 87, 2]);
    assert_eq!(ry.injected_ce, 0, "a queue marks only ECN-capable packets");
    assert_eq!((ey.ecn_marked_pkts, ey.cnp_sent, ex.cnp_handled), (0, 0, 0));
    drop((cx, cy));
}
