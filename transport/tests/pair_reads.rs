//! Paired READs (`EndpointConfig::pair_reads`): toward another ferroce — a peer whose packets
//! come from the RoCE port itself — an RDMA READ longer than two packets is requested as READ
//! requests of two packets each, so its responses (FIRST and LAST, or an ONLY at the end) are
//! all one size and leave the responder in full trains; only where `max_rd_atomic` covers the
//! packets a READ may request ahead of its data (64 pairs for 128 packets). Toward a peer that
//! sends from another port (kernel rxe), with a shallower `max_rd_atomic`, or with the option
//! off, a long READ keeps its requests of up to 64 packets. Either way the bytes land in place,
//! on clean and lossy links.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::script::{Script, Seen};
use common::*;
use ferroce_transport::sim::run_seeds;
use ferroce_transport::{EndpointConfig, WcStatus, WrOpcode};
use ferroce_wire::{Opcode, Operation};

const STEPS: u64 = 1_000_000;

/// Deep enough for pairs: 64 READ requests of two packets cover the 128-packet READ window.
fn deep() -> Opts {
    Opts {
        max_rd_atomic: 64,
        max_dest_rd_atomic: 64,
        ..Opts::default()
    }
}

fn read_request(s: &Seen) -> bool {
    s.from == 0 && s.opcode == Opcode::RC_RDMA_READ_REQUEST
}

fn read_response(s: &Seen) -> bool {
    s.from == 1 && s.opcode.info().map(|i| i.operation) == Some(Operation::ReadResponse)
}

/// A first WRITE to make A hear B (B's ACK), then a READ of `len` bytes from B's offset 8192
/// into A's offset 8192, checked byte for byte. Returns (offset from the READ's remote
/// address, DMA length) of each READ request A sent.
fn read_after_hearing(p: &mut Pair, len: u32) -> Vec<(u64, u32)> {
    read_and_record(p, len).0
}

/// As [`read_after_hearing`], with (opcode, payload length) of each READ response B sent.
#[allow(clippy::type_complexity)]
fn read_and_record(p: &mut Pair, len: u32) -> (Vec<(u64, u32)>, Vec<(Opcode, usize)>) {
    p.post_send(0, p.wr(1, WrOpcode::RdmaWrite, 0, 100, 0));
    assert!(p.run_until_send_wcs(1, STEPS));
    let sc = Script::install(&mut p.net);
    p.post_send(0, p.wr(2, WrOpcode::RdmaRead, 8192, len, 8192));
    assert!(p.run_until_send_wcs(2, STEPS));
    assert_eq!(statuses(&p.send_wcs(0)), vec![WcStatus::Success; 2]);
    let (a, b) = (p.bytes(0), p.bytes(1));
    let end = 8192 + len as usize;
    assert!(a[8192..end] == b[8192..end], "the bytes differ");
    let base = p.mrb.addr + 8192;
    let s = sc.borrow();
    let requests = s
        .log
        .iter()
        .filter(|x| read_request(x))
        .map(|x| {
            let r = x.reth.expect("a READ request has a RETH");
            assert_eq!(r.rkey, p.mrb.rkey);
            (r.va - base, r.dma_len)
        })
        .collect();
    let responses = s
        .log
        .iter()
        .filter(|x| read_response(x))
        .map(|x| (x.opcode, x.payload_len))
        .collect();
    (requests, responses)
}

#[test]
fn a_read_from_a_ferroce_peer_is_requested_in_pairs_answered_in_one_size() {
    let mut p = pair(1, lossless(), deep());
    let (reqs, responses) = read_and_record(&mut p, 6000);
    // MTU 1024: six packets in three pairs, the last one short.
    assert_eq!(reqs, [(0, 2048), (2048, 2048), (4096, 1904)]);
    assert_eq!(
        responses,
        [
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 1024),
            (Opcode::RC_RDMA_READ_RESPONSE_LAST, 1024),
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 1024),
            (Opcode::RC_RDMA_READ_RESPONSE_LAST, 1024),
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 1024),
            (Opcode::RC_RDMA_READ_RESPONSE_LAST, 880),
        ],
        "every response packet carries an AETH: one size"
    );
}

#[test]
fn a_read_from_an_rxe_like_peer_keeps_its_one_request() {
    let opts = Opts {
        b_src_port: 0xC0DE,
        ..deep()
    };
    let mut p = pair(1, lossless(), opts);
    assert_eq!(read_after_hearing(&mut p, 6000), [(0, 6000)]);
}

#[test]
fn a_shallow_max_rd_atomic_keeps_chunks_of_64_packets() {
    // 16 pairs would hold 32 packets in flight where a chunk of 64 holds them all.
    let mut p = pair(1, lossless(), Opts::default());
    assert_eq!(read_after_hearing(&mut p, 6000), [(0, 6000)]);
    let opts = Opts {
        max_rd_atomic: 63,
        max_dest_rd_atomic: 63,
        ..Opts::default()
    };
    let mut p = pair(1, lossless(), opts);
    assert_eq!(read_after_hearing(&mut p, 6000), [(0, 6000)]);
}

#[test]
fn a_two_packet_read_is_one_request_either_way() {
    let mut p = pair(1, lossless(), deep());
    assert_eq!(read_after_hearing(&mut p, 2048), [(0, 2048)]);
}

#[test]
fn pair_reads_can_be_turned_off() {
    let mut p = pair(1, lossless(), deep());
    let cfg = EndpointConfig {
        pair_reads: false,
        ..*p.net.nodes[0].endpoint.config()
    };
    assert!(!cfg.pair_reads);
    // A fresh requester with pairing off.
    reconfigure_a(&mut p, cfg, 64);
    assert_eq!(read_after_hearing(&mut p, 6000), [(0, 6000)]);
}

/// More pairs than the responder holds (eight READs of 32 KiB at MTU 1024: 128 pairs against
/// `max_dest_rd_atomic` 64): the requester counts each pair as a READ request outstanding and
/// waits, so the responder never NAKs one beyond its resources, and every READ completes.
#[test]
fn pairs_never_outnumber_max_rd_atomic() {
    let opts = Opts {
        mem_len: 1 << 18,
        ..deep()
    };
    let mut p = pair(1, lossless(), opts);
    p.post_send(0, p.wr(100, WrOpcode::RdmaWrite, 0, 100, 0));
    assert!(p.run_until_send_wcs(1, STEPS));
    for i in 0..8u64 {
        p.post_send(0, p.wr(i, WrOpcode::RdmaRead, i << 15, 1 << 15, i << 15));
    }
    assert!(p.run_until_send_wcs(9, STEPS));
    assert_eq!(statuses(&p.send_wcs(0)), vec![WcStatus::Success; 9]);
    let (a, b) = (p.bytes(0), p.bytes(1));
    assert!(a[100..1 << 18] == b[100..1 << 18], "the bytes differ");
}

/// Long READs over a lossy, reordering, duplicating link, the first started before the peer
/// was heard: every byte lands in place, no READ ever has more requests outstanding than
/// `max_rd_atomic` allows the responder to hold (it NAKs one beyond), and every request
/// reissued after a loss is one the first requests covered (a pair, or a whole chunk, at the
/// same aligned offset: the responder replays only what ends before the PSN it expects).
#[test]
fn paired_reads_survive_loss_and_reordering() {
    let link = lossy_reordering(0.05);
    run_seeds(0..20, |seed| {
        let mut p = pair(seed, link, deep());
        let sc = Script::install(&mut p.net);
        // B's region holds a pattern A's READs fetch.
        let lens: Vec<u32> = (0..10u32).map(|i| 3000 + (i * 977) % 3000).collect();
        for (i, len) in lens.iter().enumerate() {
            let off = i as u64 * 6144;
            p.post_send(0, p.wr(i as u64, WrOpcode::RdmaRead, off, *len, off));
            if i == 2 && !p.run_until_send_wcs(1, STEPS) {
                return Err("the first READ did not complete".into());
            }
        }
        if !p.run_until_send_wcs(lens.len(), STEPS) {
            return Err("the READs did not complete".into());
        }
        if statuses(&p.send_wcs(0)) != vec![WcStatus::Success; lens.len()] {
            return Err(format!("{:?}", statuses(&p.send_wcs(0))));
        }
        let (a, b) = (p.bytes(0), p.bytes(1));
        for (i, len) in lens.iter().enumerate() {
            let (off, len) = (i * 6144, *len as usize);
            if a[off..off + len] != b[off..off + len] {
                return Err(format!("READ {i}'s bytes differ"));
            }
        }
        let s = sc.borrow();
        let mut asked = std::collections::HashMap::new();
        let mut pairs = 0;
        for x in s.log.iter().filter(|x| read_request(x)) {
            let r = x.reth.expect("a READ request has a RETH");
            let this = (r.va, r.dma_len);
            if r.dma_len <= 2048 && r.dma_len > 1024 {
                pairs += 1;
            }
            if let Some(before) = asked.insert(x.psn, this) {
                if before.0 != this.0 || this.1 > before.1 {
                    return Err(format!(
                        "PSN {:?} asked as {before:?}, then {this:?}",
                        x.psn
                    ));
                }
            }
        }
        if pairs == 0 {
            return Err("no READ went in pairs".into());
        }
        Ok(())
    });
}
