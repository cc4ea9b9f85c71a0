//! RDMA FLUSH (IBTA 1.5, `IBV_WR_FLUSH`): a FETH and a RETH, no payload, answered by a
//! zero-length READ response (as kernel rxe answers it) once the region grants the flush its
//! placement type asks for; refused with a remote access NAK when it does not, and answered
//! again when the answer is lost.

mod common;

use common::script::Script;
use common::*;
use ferroce_transport::{
    AccessFlags, FlushSpec, QpState, RemoteAddr, SendWr, WcOpcode, WcStatus, WrOpcode,
};
use ferroce_wire::{AckType, NakCode, Opcode};

const STEPS: u64 = 100_000;

/// Every right a FLUSH test's QPs and regions have: RDMA's usual ones and both flushes.
fn all_flush() -> AccessFlags {
    Opts::default().access | AccessFlags::FLUSH_GLOBAL | AccessFlags::FLUSH_PERSISTENT
}

fn flush(p: &Pair, wr_id: u64, off: u64, len: u32, ptype: u8, level: u8) -> SendWr {
    let remote = RemoteAddr {
        remote_addr: p.mrb.addr + off,
        rkey: p.mrb.rkey,
    };
    SendWr::flush(wr_id, remote, len, ptype, level)
}

#[test]
fn a_flush_after_a_write_is_answered_by_an_empty_read_response() {
    let mut p = pair(
        61,
        lossless(),
        Opts {
            access: all_flush(),
            ..Opts::default()
        },
    );
    let sc = Script::install(&mut p.net);
    p.post_send(0, p.wr(1, WrOpcode::RdmaWrite, 0, 3000, 100));
    p.post_send(
        0,
        flush(&p, 2, 100, 3000, FlushSpec::GLOBAL, FlushSpec::RANGE),
    );
    p.post_send(
        0,
        flush(&p, 3, 0, 12_345_678, FlushSpec::PERSISTENT, FlushSpec::MR),
    );
    assert!(p.run_until_send_wcs(3, STEPS));
    p.net.drive(STEPS);
    let s = p.send_wcs(0);
    assert_eq!(
        statuses(&s),
        vec![WcStatus::Success, WcStatus::Success, WcStatus::Success]
    );
    assert_eq!(s[1].opcode, WcOpcode::Flush);
    assert_eq!(s[2].opcode, WcOpcode::Flush);
    assert_eq!(
        &p.bytes(1)[100..3100],
        &p.bytes(0)[..3000],
        "the write landed"
    );
    let log = &sc.borrow().log;
    let req: Vec<_> = log
        .iter()
        .filter(|s| s.from == 0 && s.opcode == Opcode::RC_FLUSH)
        .collect();
    assert_eq!(req.len(), 2);
    assert!(req.iter().all(|r| r.ack_req && r.payload_len == 0));
    let reth = req[0].reth.expect("RETH");
    assert_eq!((reth.va, reth.dma_len), (p.mrb.addr + 100, 3000));
    let resp: Vec<_> = log
        .iter()
        .filter(|s| s.from == 1 && s.opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY)
        .collect();
    assert_eq!(resp.len(), 2);
    assert!(resp.iter().all(|r| r.payload_len == 0));
    assert_eq!(resp[0].psn, req[0].psn);
    assert!(matches!(resp[0].ack, Some(AckType::Ack(_))));
}

/// The FETH word carries the level in bits 5..4 and the type in bits 3..0, as rxe reads it.
#[test]
fn the_feth_word_is_level_and_type() {
    let spec = FlushSpec {
        len: 0,
        placement_type: FlushSpec::PERSISTENT,
        selectivity_level: FlushSpec::MR,
    };
    assert_eq!(spec.feth_bits(), 0x12);
    assert_eq!(FlushSpec::from_feth(0x12, 0), spec);
    assert_eq!(spec.access(), AccessFlags::FLUSH_PERSISTENT);
    assert!(spec.is_valid());
    assert!(
        !FlushSpec {
            placement_type: 0,
            ..spec
        }
        .is_valid()
    );
    assert!(
        !FlushSpec {
            selectivity_level: 2,
            ..spec
        }
        .is_valid()
    );
}

/// A region that grants only FLUSH_GLOBAL refuses a persistent flush (NAK remote access:
/// REM_ACCESS_ERR, as pyverbs' test_qp_ex_rc_flush_type_violate expects of rxe), and a range
/// beyond a region is refused the same way; a QP without the flush right NAKs invalid request.
/// Each moves both QPs to ERR.
#[test]
fn refused_flushes_end_with_the_spec_naks() {
    // (QP rights, whether the target is a region granting only FLUSH_GLOBAL, type, length,
    // status, NAK)
    type Case = (AccessFlags, bool, u8, u32, WcStatus, NakCode);
    let cases: [Case; 3] = [
        (
            all_flush(),
            true,
            FlushSpec::PERSISTENT,
            64,
            WcStatus::RemAccessErr,
            NakCode::RemoteAccessError,
        ),
        (
            all_flush(),
            true,
            FlushSpec::GLOBAL,
            u32::MAX,
            WcStatus::RemAccessErr,
            NakCode::RemoteAccessError,
        ),
        (
            Opts::default().access,
            false,
            FlushSpec::GLOBAL,
            64,
            WcStatus::RemInvReqErr,
            NakCode::InvalidRequest,
        ),
    ];
    for (i, (access, global_only, ptype, len, status, nak)) in cases.into_iter().enumerate() {
        let mut p = pair(
            62 + i as u64,
            lossless(),
            Opts {
                access,
                ..Opts::default()
            },
        );
        let sc = Script::install(&mut p.net);
        let mut w = flush(&p, 1, 0, len, ptype, FlushSpec::RANGE);
        if global_only {
            let mr = p.net.nodes[1].mem.register(
                PD,
                vec![0; 4096],
                Opts::default().access | AccessFlags::FLUSH_GLOBAL,
            );
            w.remote = RemoteAddr {
                remote_addr: mr.addr,
                rkey: mr.rkey,
            };
        }
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
    }
}

/// The answer is lost: the requester sends the FLUSH again after its timeout and the
/// responder answers the duplicate; the FLUSH completes once.
#[test]
fn a_lost_answer_is_given_again() {
    let mut p = pair(
        66,
        lossless(),
        Opts {
            access: all_flush(),
            ..Opts::default()
        },
    );
    let sc = Script::install(&mut p.net);
    sc.borrow_mut().drop(1, |s| {
        s.from == 1 && s.opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY
    });
    p.post_send(0, flush(&p, 1, 0, 64, FlushSpec::GLOBAL, FlushSpec::RANGE));
    assert!(p.run_until_send_wcs(1, STEPS));
    p.net.drive(STEPS);
    assert_eq!(statuses(&p.send_wcs(0)), vec![WcStatus::Success]);
    let log = &sc.borrow().log;
    assert_eq!(
        log.iter().filter(|s| s.opcode == Opcode::RC_FLUSH).count(),
        2
    );
    assert_eq!(p.counters(1).duplicate_request, 1);
}

/// Post-time checks: a FLUSH names a valid type and level, and runs on RC only.
#[test]
fn a_flush_needs_its_operands_on_an_rc_qp() {
    use ferroce_transport::{PostError, QpType, VerbError};
    let mut p = pair(67, lossless(), Opts::default());
    let mut bad = flush(&p, 1, 0, 8, FlushSpec::GLOBAL, FlushSpec::RANGE);
    bad.flush = None;
    let bad_type = flush(&p, 2, 0, 8, 4, FlushSpec::RANGE);
    let (now, qa) = (p.net.now, p.qa);
    let node = &mut p.net.nodes[0];
    for w in [bad, bad_type] {
        assert!(matches!(
            node.endpoint.post_send(qa, w, &node.mem, now),
            Err(VerbError::Post(PostError::InvalidOpcode))
        ));
    }
    assert!(WrOpcode::Flush.allowed_on(QpType::Rc));
    assert!(!WrOpcode::Flush.allowed_on(QpType::Uc));
    assert!(!WrOpcode::Flush.allowed_on(QpType::Ud));
}

/// A FLUSH leaves with kernel rxe's ICRC form by default (the one rxe takes), and a FLUSH
/// carrying the IBTA form is taken too: a hand-built one, injected, is answered.
#[test]
fn flush_icrc_is_rxes_form_on_the_wire_and_either_form_is_taken() {
    use ferroce_wire::{BthRepr, ExtHeaders, FethRepr, IcrcContext, PacketRepr, Psn, RethRepr};
    use std::net::Ipv4Addr;
    let mut p = pair(
        68,
        lossless(),
        Opts {
            access: all_flush(),
            ..Opts::default()
        },
    );
    p.post_send(0, flush(&p, 1, 0, 64, FlushSpec::GLOBAL, FlushSpec::RANGE));
    let now = p.net.now;
    let node = &mut p.net.nodes[0];
    let mut buf = vec![0u8; 9000];
    let t = node
        .endpoint
        .poll_transmit(now, &mut buf, &node.mem)
        .unwrap()
        .expect("the FLUSH");
    let dgram = &buf[..t.len];
    assert_eq!(dgram[0], Opcode::RC_FLUSH.0);
    let ctx = IcrcContext::v4(
        Ipv4Addr::new(10, 0, 0, 1),
        Ipv4Addr::new(10, 0, 0, 2),
        0,
        4791,
        4791,
    );
    assert!(ctx.verify_rxe_flush(dgram) && !ctx.verify(dgram));

    // The same FLUSH in the IBTA form (the one taken off node 0 never left), injected as node
    // 0's: node 1 answers it with a zero-length READ response and node 0's FLUSH completes.
    let sc = Script::install(&mut p.net);
    let repr = PacketRepr {
        bth: BthRepr::new(Opcode::RC_FLUSH, p.qb, Psn::new(Opts::default().psn_a))
            .with_ack_req(true),
        ext: ExtHeaders {
            feth: Some(FethRepr { bits: 0x01 }),
            reth: Some(RethRepr {
                va: p.mrb.addr,
                rkey: p.mrb.rkey,
                dma_len: 64,
            }),
            ..Default::default()
        },
        payload: &[],
    };
    common::script::inject(&mut p.net, 0, 1, repr);
    p.net.drive(STEPS);
    assert_eq!(
        sc.borrow()
            .count(|s| s.from == 1 && s.opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY),
        1
    );
    assert_eq!(statuses(&p.send_wcs(0)), vec![WcStatus::Success]);
}

/// A FLUSH of the whole region uses its key and rights only: its address may be anything
/// (rxe resends one with address 0), where a range flush at that address is refused.
#[test]
fn a_whole_region_flush_ignores_the_address() {
    let mut p = pair(
        69,
        lossless(),
        Opts {
            access: all_flush(),
            ..Opts::default()
        },
    );
    let nowhere = RemoteAddr {
        remote_addr: 0,
        rkey: p.mrb.rkey,
    };
    p.post_send(
        0,
        SendWr::flush(1, nowhere, 0, FlushSpec::GLOBAL, FlushSpec::MR),
    );
    p.post_send(
        0,
        SendWr::flush(2, nowhere, 8, FlushSpec::GLOBAL, FlushSpec::RANGE),
    );
    assert!(p.run_until_send_wcs(2, STEPS));
    assert_eq!(
        statuses(&p.send_wcs(0)),
        vec![WcStatus::Success, WcStatus::RemAccessErr]
    );
}
