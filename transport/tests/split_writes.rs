//! Split WRITEs (`EndpointConfig::split_writes`): toward another ferroce — a peer whose packets
//! come from the RoCE port itself — an RDMA WRITE longer than the path MTU goes as one WRITE
//! ONLY packet per MTU, each with the RETH of its own piece, so a stream's packets are one size
//! and leave in full trains. Toward a peer that sends from another port (kernel rxe: 0xC000
//! and up) and before the peer has been heard, the message keeps its FIRST/MIDDLE/LAST shape.
//! Either way the bytes land once, in place, on clean and lossy links.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::script::{Script, Seen};
use common::*;
use ferroce_transport::sim::run_seeds;
use ferroce_transport::{EndpointConfig, WcStatus, WrOpcode};
use ferroce_wire::Opcode;

const STEPS: u64 = 1_000_000;

fn data(s: &Seen) -> bool {
    s.from == 0 && s.opcode.is_request()
}

/// The opcodes of the requests A sent, in order.
fn opcodes(sc: &Script) -> Vec<Opcode> {
    sc.log
        .iter()
        .filter(|s| data(s))
        .map(|s| s.opcode)
        .collect()
}

/// A first WRITE to make A hear B (B's ACK), then what a second one of `len` bytes sent.
fn second_write(opts: Opts, len: u32) -> (Pair, Vec<Seen>) {
    let mut p = pair(1, lossless(), opts);
    let sc = Script::install(&mut p.net);
    p.post_send(0, p.wr(1, WrOpcode::RdmaWrite, 0, 3000, 0));
    assert!(p.run_until_send_wcs(1, STEPS));
    let first = opcodes(&sc.borrow());
    assert_eq!(
        first,
        [
            Opcode::RC_RDMA_WRITE_FIRST,
            Opcode::RC_RDMA_WRITE_MIDDLE,
            Opcode::RC_RDMA_WRITE_LAST
        ],
        "before the peer is heard, a WRITE keeps its shape"
    );
    sc.borrow_mut().log.clear();
    p.post_send(0, p.wr(2, WrOpcode::RdmaWrite, 4096, len, 4096));
    assert!(p.run_until_send_wcs(2, STEPS));
    assert_eq!(statuses(&p.send_wcs(0)), vec![WcStatus::Success; 2]);
    let log = sc
        .borrow()
        .log
        .iter()
        .filter(|s| data(s))
        .copied()
        .collect();
    let (a, b) = (p.bytes(0), p.bytes(1));
    let end = 4096 + len as usize;
    assert!(
        b[..3000] == a[..3000] && b[4096..end] == a[4096..end],
        "the bytes differ"
    );
    (p, log)
}

#[test]
fn a_write_to_a_ferroce_peer_goes_as_write_only_packets_each_with_its_piece() {
    let (p, log) = second_write(Opts::default(), 4000);
    let base = p.mrb.addr + 4096;
    let pieces: Vec<(Opcode, u64, u32, usize)> = log
        .iter()
        .map(|s| {
            let r = s.reth.expect("every split packet has a RETH");
            assert_eq!(r.rkey, p.mrb.rkey);
            (s.opcode, r.va - base, r.dma_len, s.payload_len)
        })
        .collect();
    assert_eq!(
        pieces,
        [
            (Opcode::RC_RDMA_WRITE_ONLY, 0, 1024, 1024),
            (Opcode::RC_RDMA_WRITE_ONLY, 1024, 1024, 1024),
            (Opcode::RC_RDMA_WRITE_ONLY, 2048, 1024, 1024),
            (Opcode::RC_RDMA_WRITE_ONLY, 3072, 928, 928),
        ]
    );
    // One message, one burst: only its last packet asks for the ACK.
    let asks: Vec<bool> = log.iter().map(|s| s.ack_req).collect();
    assert_eq!(asks, [false, false, false, true]);
}

#[test]
fn a_write_to_an_rxe_like_peer_keeps_its_shape() {
    let opts = Opts {
        b_src_port: 0xC0DE,
        ..Opts::default()
    };
    let (_, log) = second_write(opts, 4000);
    let ops: Vec<Opcode> = log.iter().map(|s| s.opcode).collect();
    assert_eq!(
        ops,
        [
            Opcode::RC_RDMA_WRITE_FIRST,
            Opcode::RC_RDMA_WRITE_MIDDLE,
            Opcode::RC_RDMA_WRITE_MIDDLE,
            Opcode::RC_RDMA_WRITE_LAST
        ]
    );
}

#[test]
fn a_write_with_immediate_keeps_its_shape() {
    let (mut p, _) = second_write(Opts::default(), 1024);
    let sc = Script::install(&mut p.net);
    p.post_recv(1, 7, 0, 0);
    let mut w = p.wr(3, WrOpcode::RdmaWriteWithImm, 0, 3000, 0);
    w.imm_data = 0x1234;
    p.post_send(0, w);
    assert!(p.run_until_send_wcs(3, STEPS));
    let ops = opcodes(&sc.borrow());
    assert_eq!(
        ops,
        [
            Opcode::RC_RDMA_WRITE_FIRST,
            Opcode::RC_RDMA_WRITE_MIDDLE,
            Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE
        ],
        "the receive completion's byte_len is the whole message's"
    );
    let r = p.recv_wcs(1);
    assert_eq!((r.len(), r[0].byte_len, r[0].imm_data), (1, 3000, 0x1234));
}

#[test]
fn split_writes_can_be_turned_off() {
    let mut p = pair(1, lossless(), Opts::default());
    let cfg = EndpointConfig {
        split_writes: false,
        ..*p.net.nodes[0].endpoint.config()
    };
    assert!(!cfg.split_writes);
    // A fresh pair whose requester has splitting off.
    reconfigure_a(&mut p, cfg, 64);
    let sc = Script::install(&mut p.net);
    for i in 0..2 {
        p.post_send(0, p.wr(i, WrOpcode::RdmaWrite, 0, 3000, 0));
        assert!(p.run_until_send_wcs(i as usize + 1, STEPS));
    }
    assert_eq!(
        sc.borrow()
            .count(|s| data(s) && s.opcode == Opcode::RC_RDMA_WRITE_ONLY),
        0
    );
    assert_eq!(sc.borrow().count(data), 6);
}

/// WRITEs over a lossy, reordering link, some started before the peer was heard: every byte
/// lands in place, and every retransmitted packet has the shape its first transmission had (a
/// WRITE ONLY of the same piece, or the MIDDLE it was), so the responder never sees a WRITE
/// ONLY inside a message it is assembling.
#[test]
fn split_writes_survive_loss_and_reordering() {
    let link = lossy_reordering(0.05);
    run_seeds(0..20, |seed| {
        let mut p = pair(seed, link, Opts::default());
        let sc = Script::install(&mut p.net);
        // The first six start before B is heard, unsplit; the last six are posted once the
        // first is acknowledged, while the others may still be going again, and go split.
        for i in 0..12u64 {
            let len = 1000 + (i as u32 * 733) % 4500;
            p.post_send(0, p.wr(i, WrOpcode::RdmaWrite, i * 5000, len, i * 5000));
            if i == 5 && !p.run_until_send_wcs(1, STEPS) {
                return Err("the first WRITE did not complete".into());
            }
        }
        if !p.run_until_send_wcs(12, STEPS) {
            return Err("the WRITEs did not complete".into());
        }
        if statuses(&p.send_wcs(0)) != vec![WcStatus::Success; 12] {
            return Err(format!("{:?}", statuses(&p.send_wcs(0))));
        }
        let (a, b) = (p.bytes(0), p.bytes(1));
        for i in 0..12usize {
            let (off, len) = (i * 5000, 1000 + (i * 733) % 4500);
            if b[off..off + len] != a[off..off + len] {
                return Err(format!("WRITE {i}'s bytes differ"));
            }
        }
        let s = sc.borrow();
        let mut shape = std::collections::HashMap::new();
        for x in s.log.iter().filter(|x| data(x)) {
            let key = x.psn;
            let this = (x.opcode, x.reth.map(|r| (r.va, r.dma_len)));
            if let Some(before) = shape.insert(key, this) {
                if before != this {
                    return Err(format!("PSN {key:?} sent as {before:?}, then {this:?}"));
                }
            }
        }
        if s.count(|x| data(x) && x.opcode == Opcode::RC_RDMA_WRITE_ONLY && x.payload_len == 1024)
            == 0
        {
            return Err("no WRITE went split".into());
        }
        Ok(())
    });
}
