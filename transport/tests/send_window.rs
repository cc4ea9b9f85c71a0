//! The RC send window (`Qp::send_window`): toward kernel rxe, a NIC, or a peer not heard yet, a
//! requester has at most `MAX_UNACKED_PSNS` (128, rxe's) request PSNs unacknowledged; toward
//! another ferroce — a peer whose packets come from the RoCE port itself — it has
//! `FERROCE_PEER_UNACKED_PSNS` (256), whether or not its WRITEs are split. A window is measured
//! as the distinct PSNs a requester sends while none of its ACKs come back (its retransmissions
//! repeat the oldest PSNs, never a new one).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::collections::HashSet;

use common::script::Script;
use common::*;
use ferroce_transport::sim::run_seeds;
use ferroce_transport::{
    EndpointConfig, FERROCE_PEER_UNACKED_PSNS, MAX_UNACKED_PSNS, WcStatus, WrOpcode,
};

const STEPS: u64 = 1_000_000;
/// One-packet WRITEs posted while B's answers are dropped: more than either window.
const POSTED: u64 = 400;

/// A pair whose A has heard B (if `hear`: one WRITE done), then the distinct request PSNs A
/// sends of [`POSTED`] one-packet WRITEs while every packet of B is lost.
fn window(opts: Opts, hear: bool, split_writes: bool) -> usize {
    let mut p = pair(1, lossless(), opts);
    if !split_writes {
        let cfg = EndpointConfig {
            split_writes: false,
            ..*p.net.nodes[0].endpoint.config()
        };
        reconfigure_a(&mut p, cfg, 4096);
    }
    let mut done = 0;
    if hear {
        p.post_send(0, p.wr(0, WrOpcode::RdmaWrite, 0, 64, 0));
        assert!(p.run_until_send_wcs(1, STEPS));
        done = 1;
    }
    let sc = Script::install(&mut p.net);
    sc.borrow_mut().drop(u32::MAX, |s| s.from == 1);
    for i in 1..=POSTED {
        p.post_send(0, p.wr(i, WrOpcode::RdmaWrite, i * 64, 64, i * 64));
    }
    // Until the retries run out and every WRITE is flushed in error.
    assert!(p.run_until_send_wcs(done + POSTED as usize, STEPS));
    let wcs = p.send_wcs(0);
    assert_eq!(wcs[done].status, WcStatus::RetryExcErr);
    let s = sc.borrow();
    let psns: HashSet<_> = s
        .log
        .iter()
        .filter(|x| x.from == 0 && x.opcode.is_request())
        .map(|x| x.psn)
        .collect();
    assert!(
        s.count(|x| x.from == 0 && x.opcode.is_request()) > psns.len(),
        "A retransmitted"
    );
    psns.len()
}

#[test]
fn toward_a_ferroce_peer_the_window_is_256_psns() {
    assert_eq!(
        window(Opts::default(), true, true),
        FERROCE_PEER_UNACKED_PSNS as usize
    );
    assert_eq!(FERROCE_PEER_UNACKED_PSNS, 256);
}

#[test]
fn toward_a_ferroce_peer_with_split_writes_off_the_window_is_still_256() {
    assert_eq!(
        window(Opts::default(), true, false),
        FERROCE_PEER_UNACKED_PSNS as usize
    );
}

#[test]
fn toward_an_rxe_like_peer_the_window_is_rxes_128() {
    let opts = Opts {
        b_src_port: 0xC0DE,
        ..Opts::default()
    };
    assert_eq!(window(opts, true, true), MAX_UNACKED_PSNS as usize);
    assert_eq!(MAX_UNACKED_PSNS, 128);
}

#[test]
fn before_the_peer_is_heard_the_window_is_rxes() {
    assert_eq!(
        window(Opts::default(), false, true),
        MAX_UNACKED_PSNS as usize
    );
}

/// A full 256-PSN window over a lossy, reordering, duplicating link: every WRITE completes
/// and its bytes land in place.
#[test]
fn a_full_ferroce_window_survives_loss_and_reordering() {
    let link = lossy_reordering(0.02);
    run_seeds(0..10, |seed| {
        let mut p = pair(seed, link, Opts::default());
        p.post_send(0, p.wr(0, WrOpcode::RdmaWrite, 0, 64, 0));
        if !p.run_until_send_wcs(1, STEPS) {
            return Err("the first WRITE did not complete".into());
        }
        let n = 600u64;
        for i in 1..=n {
            p.post_send(0, p.wr(i, WrOpcode::RdmaWrite, i * 64, 64, i * 64));
        }
        if !p.run_until_send_wcs(n as usize + 1, STEPS) {
            return Err("the WRITEs did not complete".into());
        }
        let st = statuses(&p.send_wcs(0));
        if st != vec![WcStatus::Success; n as usize + 1] {
            return Err(format!("{st:?}"));
        }
        let end = (n as usize + 1) * 64;
        if p.bytes(1)[..end] != p.bytes(0)[..end] {
            return Err("the bytes differ".into());
        }
        Ok(())
    });
}
