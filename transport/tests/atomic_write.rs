//! ATOMIC WRITE (IBTA 1.5, `IBV_WR_ATOMIC_WRITE`): 8 bytes stored at once, answered by a
//! zero-length READ response (as kernel rxe answers it), replayed and never stored twice when
//! that answer is lost, and refused with the spec's NAKs.

mod common;

use common::script::Script;
use common::*;
use ferroce_transport::{AccessFlags, QpState, SendWr, WcOpcode, WcStatus, WrOpcode};
use ferroce_wire::{AckType, NakCode, Opcode};

const STEPS: u64 = 100_000;

fn atomic_write(p: &Pair, wr_id: u64, a_off: u64, b_off: u64) -> SendWr {
    p.wr(wr_id, WrOpcode::AtomicWrite, a_off, 8, b_off)
}

fn word(bytes: &[u8], at: usize) -> [u8; 8] {
    bytes[at..at + 8].try_into().expect("8 bytes")
}

#[test]
fn atomic_write_stores_eight_bytes_and_is_answered_by_an_empty_read_response() {
    let mut p = pair(41, lossless(), Opts::default());
    let sc = Script::install(&mut p.net);
    let a = p.bytes(0);
    p.post_send(0, atomic_write(&p, 1, 16, 4096));
    assert!(p.run_until_send_wcs(1, STEPS));
    p.net.drive(STEPS);
    let s = p.send_wcs(0);
    assert_eq!(statuses(&s), vec![WcStatus::Success]);
    assert_eq!(s[0].opcode, WcOpcode::AtomicWrite);
    assert_eq!(word(&p.bytes(1), 4096), word(&a, 16), "the bytes as sent");
    let log = &sc.borrow().log;
    let req: Vec<_> = log.iter().filter(|s| s.from == 0).collect();
    assert_eq!(req.len(), 1);
    assert_eq!(req[0].opcode, Opcode::RC_ATOMIC_WRITE);
    assert!(req[0].ack_req);
    assert_eq!(req[0].payload_len, 8);
    let reth = req[0].reth.expect("RETH");
    assert_eq!((reth.va, reth.dma_len), (p.mrb.addr + 4096, 8));
    let resp: Vec<_> = log.iter().filter(|s| s.from == 1).collect();
    assert_eq!(resp.len(), 1);
    assert_eq!(resp[0].opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    assert_eq!(resp[0].payload_len, 0);
    assert_eq!(resp[0].psn, req[0].psn);
    assert!(matches!(resp[0].ack, Some(AckType::Ack(_))));
}

/// The answer is lost: the requester times out and sends the ATOMIC WRITE again; the
/// responder replays its answer from the resource and does not store the bytes a second time
/// (a program's write to the word in between survives).
#[test]
fn lost_answer_is_replayed_and_the_store_is_not_repeated() {
    let mut p = pair(42, lossless(), Opts::default());
    let sc = Script::install(&mut p.net);
    sc.borrow_mut().drop(1, |s| {
        s.from == 1 && s.opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY
    });
    let a = p.bytes(0);
    p.post_send(0, atomic_write(&p, 1, 24, 800));
    // Run until the first answer has been dropped, then overwrite the word on B as its
    // program would.
    assert!(
        p.net
            .drive_until(STEPS, |_| sc.borrow().log.iter().any(|s| s.dropped))
    );
    assert_eq!(word(&p.bytes(1), 800), word(&a, 24));
    let lkey = p.mrb.lkey;
    p.net.nodes[1].mem.fill(lkey, 800, &[0x5a; 8]);
    assert!(p.run_until_send_wcs(1, STEPS));
    p.net.drive(STEPS);
    assert_eq!(statuses(&p.send_wcs(0)), vec![WcStatus::Success]);
    assert_eq!(word(&p.bytes(1), 800), [0x5a; 8], "stored once only");
    let log = &sc.borrow().log;
    assert_eq!(
        log.iter()
            .filter(|s| s.opcode == Opcode::RC_ATOMIC_WRITE)
            .count(),
        2
    );
    assert_eq!(p.counters(1).duplicate_request, 1);
}

/// Responder checks: an unaligned address is NAK invalid request (REM_INV_REQ_ERR), a bad
/// rkey NAK remote access (REM_ACCESS_ERR), a QP without remote write NAK invalid request;
/// each moves both QPs to ERR and flushes what follows.
#[test]
fn refused_atomic_writes_end_with_the_spec_naks() {
    type Case = (fn(&Pair) -> SendWr, Opts, WcStatus, NakCode);
    let cases: [Case; 3] = [
        (
            |p| atomic_write(p, 1, 0, 4),
            Opts::default(),
            WcStatus::RemInvReqErr,
            NakCode::InvalidRequest,
        ),
        (
            |p| {
                let mut w = atomic_write(p, 1, 0, 8);
                w.remote.rkey ^= 0x100;
                w
            },
            Opts::default(),
            WcStatus::RemAccessErr,
            NakCode::RemoteAccessError,
        ),
        (
            |p| atomic_write(p, 1, 0, 8),
            Opts {
                access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
                ..Opts::default()
            },
            WcStatus::RemInvReqErr,
            NakCode::InvalidRequest,
        ),
    ];
    for (i, (wr, opts, status, nak)) in cases.into_iter().enumerate() {
        let mut p = pair(43 + i as u64, lossless(), opts);
        let sc = Script::install(&mut p.net);
        let before = p.bytes(1);
        let w = wr(&p);
        p.post_send(0, w);
        p.post_send(0, p.wr(2, WrOpcode::RdmaWrite, 0, 10, 0));
        assert!(p.run_until_send_wcs(2, STEPS), "case {i}");
        p.net.drive(STEPS);
        assert_eq!(
            statuses(&p.send_wcs(0)),
            vec![status, WcStatus::WrFlushErr],
            "case {i}"
        );
        assert_eq!(
            sc.borrow().count(|s| s.ack == Some(AckType::Nak(nak))),
            1,
            "case {i}"
        );
        assert_eq!((p.state(0), p.state(1)), (QpState::Err, QpState::Err));
        assert_eq!(p.bytes(1), before, "case {i}: nothing stored");
    }
}

/// Post-time checks: exactly 8 bytes, and only on RC.
#[test]
fn atomic_write_needs_eight_bytes_on_an_rc_qp() {
    use ferroce_transport::{PostError, QpType, VerbError};
    let mut p = pair(46, lossless(), Opts::default());
    let w = p.wr(1, WrOpcode::AtomicWrite, 0, 16, 0);
    let (now, qa) = (p.net.now, p.qa);
    let node = &mut p.net.nodes[0];
    assert!(matches!(
        node.endpoint.post_send(qa, w, &node.mem, now),
        Err(VerbError::Post(PostError::InvalidAtomicLength))
    ));
    assert!(WrOpcode::AtomicWrite.allowed_on(QpType::Rc));
    assert!(!WrOpcode::AtomicWrite.allowed_on(QpType::Uc));
    assert!(!WrOpcode::AtomicWrite.allowed_on(QpType::Ud));
}

/// `SendWr::atomic_write` carries its value in the request (as `ibv_wr_atomic_write` does),
/// with no SGE and no INLINE flag.
#[test]
fn the_value_may_come_with_the_request() {
    use ferroce_transport::RemoteAddr;
    let mut p = pair(47, lossless(), Opts::default());
    let remote = RemoteAddr {
        remote_addr: p.mrb.addr + 64,
        rkey: p.mrb.rkey,
    };
    p.post_send(0, SendWr::atomic_write(7, remote, *b"ferroce!"));
    assert!(p.run_until_send_wcs(1, STEPS));
    p.net.drive(STEPS);
    assert_eq!(statuses(&p.send_wcs(0)), vec![WcStatus::Success]);
    assert_eq!(&word(&p.bytes(1), 64), b"ferroce!");
}
