//! Errors that explain themselves: each failed work request keeps the facts that decide it
//! (`Endpoint::qp_error`), for the verbs pitfalls people hit — a wrong dest QPN, a peer gone
//! after answering, receives posted late with `rnr_retry` 0, a wrong rkey, a SEND larger than
//! the receive, a path MTU larger than the peer's.
#![allow(clippy::unwrap_used)]

mod common;

use common::script::inject;
use common::*;
use ferroce_transport::{
    AccessFlags, ErrorCause, MemError, Mtu, QpState, QpType, RecvWr, SendWr, SgeFault, WcStatus,
    WrOpcode,
};
use ferroce_wire::{AethRepr, BthRepr, ExtHeaders, NakCode, Opcode, PacketRepr, Psn};

const STEPS: u64 = 200_000;

fn opts() -> Opts {
    Opts {
        retry_cnt: 3,
        timeout: 10,
        ..Opts::default()
    }
}

#[test]
fn a_wrong_dest_qpn_is_retransmissions_unanswered_and_nothing_heard() {
    let mut p = pair(51, lossless(), opts());
    // A's QP points at a QPN B does not have (its own + 1): B drops every packet.
    let (qa, qb) = (p.qa, p.qb);
    let peer = p.net.nodes[1].addr;
    reconnect_a(&mut p, qb + 1, 0, 0);
    p.post_send(0, p.wr(7, WrOpcode::RdmaWrite, 0, 100, 0));
    p.net.drive(STEPS);
    let wcs = p.send_wcs(0);
    assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
    let e = p.net.nodes[0].endpoint.qp_error(qa).unwrap();
    assert_eq!(
        (e.status, e.wr_id, e.dest_qp_num),
        (WcStatus::RetryExcErr, 7, qb + 1)
    );
    assert_eq!(e.peer, Some(peer));
    match e.cause {
        ErrorCause::NoAnswer {
            retries,
            timeout,
            heard_since_rts,
            ..
        } => assert_eq!((retries, timeout, heard_since_rts), (3, 10, false)),
        other => panic!("{other:?}"),
    }
    let text = e.to_string();
    assert!(
        text.contains("3 retransmissions") && text.contains("nothing has come from that peer"),
        "{text}"
    );
    assert!(p.counters(1).no_qp > 0);
}

#[test]
fn a_peer_gone_after_answering_is_told_apart() {
    let mut p = pair(52, lossless(), opts());
    p.post_send(0, p.wr(1, WrOpcode::RdmaWrite, 0, 100, 0));
    assert!(p.run_until_send_wcs(1, STEPS));
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::Success);
    p.net.nodes[1].down = true;
    p.post_send(0, p.wr(2, WrOpcode::RdmaWrite, 0, 100, 0));
    p.net.drive(STEPS);
    let e = p.net.nodes[0].endpoint.qp_error(p.qa).unwrap();
    assert_eq!(e.wr_id, 2);
    assert!(matches!(
        e.cause,
        ErrorCause::NoAnswer {
            heard_since_rts: true,
            ..
        }
    ));
    assert!(e.to_string().contains("answered earlier"), "{e}");
}

#[test]
fn rnr_retry_0_gives_up_at_the_first_rnr_nak_and_says_so() {
    let o = Opts {
        rnr_retry: 0,
        ..opts()
    };
    let mut p = pair(53, lossless(), o);
    // B has posted no receive.
    p.post_send(0, p.wr(9, WrOpcode::Send, 0, 64, 0));
    p.net.drive(STEPS);
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::RnrRetryExcErr);
    let e = p.net.nodes[0].endpoint.qp_error(p.qa).unwrap();
    match e.cause {
        ErrorCause::RnrExhausted {
            rnr_naks,
            rnr_retry,
            ..
        } => assert_eq!((rnr_naks, rnr_retry), (1, 0)),
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("rnr_retry 0 gives up"), "{e}");
    // Handed to the runtime to report once; still there to ask for.
    let ep = &mut p.net.nodes[0].endpoint;
    assert_eq!(ep.qp_error_to_report(p.qa), Some(e));
    assert_eq!(ep.qp_error_to_report(p.qa), None);
    assert_eq!(ep.qp_error(p.qa), Some(e));
}

#[test]
fn a_wrong_rkey_is_the_peers_remote_access_nak_on_both_sides() {
    let mut p = pair(54, lossless(), opts());
    let mut w = p.wr(4, WrOpcode::RdmaWrite, 0, 100, 0);
    w.remote.rkey ^= 0x55;
    p.post_send(0, w);
    p.net.drive(STEPS);
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::RemAccessErr);
    let e = p.net.nodes[0].endpoint.qp_error(p.qa).unwrap();
    assert!(matches!(
        e.cause,
        ErrorCause::Nak {
            code: NakCode::RemoteAccessError,
            ..
        }
    ));
    assert!(e.to_string().contains("the rkey is unknown"), "{e}");
    // The responder keeps what it refused, and is in ERR.
    let r = p.net.nodes[1].endpoint.qp_error(p.qb).unwrap();
    assert!(matches!(
        r.cause,
        ErrorCause::RemoteRequest {
            code: NakCode::RemoteAccessError,
            ..
        }
    ));
    assert_eq!(p.state(1), QpState::Err);
}

/// The classic: an rkey whose region the peer deregistered.
#[test]
fn an_rkey_after_dereg_is_the_peers_remote_access_nak() {
    let mut p = pair(61, lossless(), opts());
    p.post_send(0, p.wr(1, WrOpcode::RdmaWrite, 0, 100, 0));
    assert!(p.run_until_send_wcs(1, STEPS));
    assert!(p.net.nodes[1].mem.deregister(p.mrb.lkey));
    p.post_send(0, p.wr(2, WrOpcode::RdmaRead, 0, 100, 0));
    p.net.drive(STEPS);
    assert_eq!(
        statuses(&p.send_wcs(0)),
        vec![WcStatus::Success, WcStatus::RemAccessErr]
    );
    let e = p.net.nodes[0].endpoint.qp_error(p.qa).unwrap();
    assert_eq!(e.wr_id, 2);
    assert!(matches!(
        e.cause,
        ErrorCause::Nak {
            code: NakCode::RemoteAccessError,
            ..
        }
    ));
    assert!(e.to_string().contains("(deregistered"), "{e}");
}

#[test]
fn a_send_larger_than_the_receive_names_both_sizes() {
    let mut p = pair(55, lossless(), opts());
    p.post_recv(1, 30, 0, 1000);
    p.post_send(0, p.wr(5, WrOpcode::Send, 0, 3000, 0));
    p.net.drive(STEPS);
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::RemInvReqErr);
    let r = p.net.nodes[1].endpoint.qp_error(p.qb).unwrap();
    assert_eq!((r.status, r.wr_id), (WcStatus::LocLenErr, 30));
    match r.cause {
        ErrorCause::LocalLength { message, buffer } => {
            assert_eq!(buffer, 1000);
            assert!(message > 1000, "{message}");
        }
        other => panic!("{other:?}"),
    }
    let e = p.net.nodes[0].endpoint.qp_error(p.qa).unwrap();
    assert!(matches!(
        e.cause,
        ErrorCause::Nak {
            code: NakCode::InvalidRequest,
            ..
        }
    ));
}

/// A requester whose path_mtu (4096) is larger than its peer's (1024): the peer refuses the
/// first packet longer than its MTU with NAK invalid request, and the reason names the packet's
/// size and this QP's path_mtu.
#[test]
fn a_path_mtu_larger_than_the_peers_is_named() {
    let mut p = pair(59, lossless(), opts());
    let (qb, psn_a, psn_b) = (p.qb, p.opts.psn_a, p.opts.psn_b);
    p.opts.mtu = Mtu::Mtu4096;
    reconnect_a(&mut p, qb, psn_a, psn_b);
    p.post_send(0, p.wr(6, WrOpcode::RdmaWrite, 0, 3000, 0));
    p.net.drive(STEPS);
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::RemInvReqErr);
    let e = p.net.nodes[0].endpoint.qp_error(p.qa).unwrap();
    match e.cause {
        ErrorCause::Nak {
            code: NakCode::InvalidRequest,
            packet_bytes,
            path_mtu,
            ..
        } => assert_eq!((packet_bytes, path_mtu), (3000, 4096)),
        other => panic!("{other:?}"),
    }
    let text = e.to_string();
    assert!(
        text.contains("carried 3000 bytes (this QP's path_mtu is 4096)")
            && text.contains("both sides must use the same path_mtu"),
        "{text}"
    );
    // A refusal with nothing to do with the MTU does not mention it.
    let mut p = pair(60, lossless(), opts());
    p.post_recv(1, 30, 0, 10);
    p.post_send(0, p.wr(5, WrOpcode::Send, 0, 200, 0));
    p.net.drive(STEPS);
    let e = p.net.nodes[0].endpoint.qp_error(p.qa).unwrap();
    assert!(!e.to_string().contains("path_mtu"), "{e}");
}

/// A READ on a QP whose max_rd_atomic is 0 fails locally, and says which attribute.
#[test]
fn a_read_with_max_rd_atomic_0_names_the_attribute() {
    let o = Opts {
        max_rd_atomic: 0,
        ..opts()
    };
    let mut p = pair(62, lossless(), o);
    p.post_send(0, p.wr(8, WrOpcode::RdmaRead, 0, 64, 0));
    p.net.drive(STEPS);
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::LocQpOpErr);
    let e = p.net.nodes[0].endpoint.qp_error(p.qa).unwrap();
    assert_eq!((e.cause, e.wr_id), (ErrorCause::NoRdAtomic, 8));
    assert!(e.to_string().contains("max_rd_atomic is 0"), "{e}");
}

#[test]
fn reset_forgets_the_error() {
    let o = Opts {
        rnr_retry: 0,
        ..opts()
    };
    let mut p = pair(56, lossless(), o);
    p.post_send(0, p.wr(9, WrOpcode::Send, 0, 64, 0));
    p.net.drive(STEPS);
    assert!(p.net.nodes[0].endpoint.qp_error(p.qa).is_some());
    let (qa, qb) = (p.qa, p.qb);
    reset_a(&mut p);
    assert!(p.net.nodes[0].endpoint.qp_error(qa).is_none());
    reconnect_a(&mut p, qb, 0, 0);
    assert!(p.net.nodes[0].endpoint.qp_error(qa).is_none());
}

/// A's QP back to RESET.
fn reset_a(p: &mut Pair) {
    let n = &mut p.net.nodes[0];
    let reset = ferroce_transport::QpModify::new(QpState::Reset);
    n.endpoint
        .modify_qp(p.qa, reset.attr(), reset.mask(), &n.mem, p.net.now)
        .unwrap();
}

/// A's QP through RESET and up again towards B's address and QPN `dest_qp_num`, with
/// `sq_psn` and `rq_psn`.
fn reconnect_a(p: &mut Pair, dest_qp_num: u32, sq_psn: u32, rq_psn: u32) {
    reset_a(p);
    let (qa, peer, o) = (p.qa, p.net.nodes[1].addr, p.opts);
    ferroce_transport::sim::pair::connect(&mut p.net, 0, qa, peer, dest_qp_num, sq_psn, rq_psn, &o);
}

/// The two sides' PSNs disagree, either way round: the peer answers (duplicate ACKs for a
/// requester behind its rq_psn, sequence NAKs for one ahead), never for what was sent, and
/// the reason says the PSNs disagree rather than that nobody answered.
#[test]
fn psns_that_disagree_are_named_as_such() {
    for (seed, ahead) in [(57u64, false), (58, true)] {
        let mut p = pair(seed, lossless(), opts());
        let rq = p.opts.psn_a; // B's rq_psn
        let sq = if ahead {
            rq + 5000
        } else {
            rq.wrapping_sub(5000) & 0xFF_FFFF
        };
        let (qb, rq_b) = (p.qb, p.opts.psn_b);
        reconnect_a(&mut p, qb, sq, rq_b);
        p.post_send(0, p.wr(3, WrOpcode::RdmaWrite, 0, 100, 0));
        p.net.drive(STEPS);
        assert_eq!(
            p.send_wcs(0)[0].status,
            WcStatus::RetryExcErr,
            "ahead {ahead}"
        );
        let e = p.net.nodes[0].endpoint.qp_error(p.qa).unwrap();
        match e.cause {
            ErrorCause::PsnMismatch { psn, strays, .. } => {
                assert_eq!(psn.value(), sq, "ahead {ahead}");
                assert!(strays > 0);
            }
            other => panic!("ahead {ahead}: {other:?}"),
        }
        assert!(e.to_string().contains("PSNs disagree"), "{e}");
    }
}

/// A send whose SGE names an lkey that is no longer registered: LOC_PROT_ERR at the requester,
/// naming the SGE (lkey, range) and that the key is unknown, and that it was read for a send.
#[test]
fn a_send_from_a_deregistered_lkey_names_the_sge() {
    let mut p = pair(63, lossless(), opts());
    let mr = p.net.nodes[0]
        .mem
        .register(PD, vec![0; 256], AccessFlags::LOCAL_WRITE);
    assert!(p.net.nodes[0].mem.deregister(mr.lkey));
    let mut w = p.wr(11, WrOpcode::RdmaWrite, 0, 100, 0);
    w.sg_list = vec![mr.sge(16, 100)].into();
    p.post_send(0, w);
    p.net.drive(STEPS);
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::LocProtErr);
    let e = p.net.nodes[0].endpoint.qp_error(p.qa).unwrap();
    let sge = SgeFault {
        lkey: mr.lkey,
        addr: mr.addr + 16,
        length: 100,
        error: MemError::InvalidKey,
    };
    assert_eq!(
        (e.wr_id, e.cause),
        (11, ErrorCause::LocalProtection { sge, write: false })
    );
    let text = e.to_string();
    assert!(
        text.contains(&format!("lkey {:#x}", mr.lkey))
            && text.contains("100 bytes, read for a send")
            && text.contains("no region of this QP's PD has that lkey"),
        "{text}"
    );
}

/// A receive buffer registered without LOCAL_WRITE: the responder's receive completes with
/// LOC_PROT_ERR naming the missing flag, and the requester hears remote operational error.
#[test]
fn a_receive_buffer_without_local_write_names_the_flag() {
    let mut p = pair(64, lossless(), opts());
    let ro = p.net.nodes[1]
        .mem
        .register(PD, vec![0; 4096], AccessFlags::REMOTE_READ);
    let qb = p.qb;
    let n = &mut p.net.nodes[1];
    n.endpoint
        .post_recv(
            qb,
            RecvWr {
                wr_id: 40,
                sg_list: vec![ro.sge(0, 4096)].into(),
            },
            &n.mem,
            p.net.now,
        )
        .unwrap();
    p.post_send(0, p.wr(12, WrOpcode::Send, 0, 300, 0));
    p.net.drive(STEPS);
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::RemOpErr);
    assert_eq!(p.recv_wcs(1)[0].status, WcStatus::LocProtErr);
    let r = p.net.nodes[1].endpoint.qp_error(p.qb).unwrap();
    assert_eq!((r.status, r.wr_id), (WcStatus::LocProtErr, 40));
    match r.cause {
        ErrorCause::LocalProtection { sge, write: true } => {
            assert_eq!((sge.lkey, sge.error), (ro.lkey, MemError::AccessDenied));
        }
        other => panic!("{other:?}"),
    }
    assert!(
        r.to_string().contains("without IBV_ACCESS_LOCAL_WRITE"),
        "{r}"
    );
    let e = p.net.nodes[0].endpoint.qp_error(p.qa).unwrap();
    assert!(matches!(
        e.cause,
        ErrorCause::Nak {
            code: NakCode::RemoteOperationalError,
            ..
        }
    ));
}

/// A READ whose local buffer lacks LOCAL_WRITE fails at the requester when the data arrives.
#[test]
fn a_read_into_a_buffer_without_local_write_is_local_protection() {
    let mut p = pair(65, lossless(), opts());
    let ro = p.net.nodes[0]
        .mem
        .register(PD, vec![0; 4096], AccessFlags::EMPTY);
    let mut w = p.wr(13, WrOpcode::RdmaRead, 0, 64, 0);
    w.sg_list = vec![ro.sge(8, 64)].into();
    p.post_send(0, w);
    p.net.drive(STEPS);
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::LocProtErr);
    let e = p.net.nodes[0].endpoint.qp_error(p.qa).unwrap();
    match e.cause {
        ErrorCause::LocalProtection { sge, write: true } => assert_eq!(
            sge,
            SgeFault {
                lkey: ro.lkey,
                addr: ro.addr + 8,
                length: 64,
                error: MemError::AccessDenied
            }
        ),
        other => panic!("{other:?}"),
    }
}

/// A READ answered with a response of the wrong size: BAD_RESP_ERR naming the request, the
/// response and both sizes. An AETH syndrome the IBTA reserves is told apart.
#[test]
fn a_response_that_does_not_match_names_both_sides() {
    let mut p = pair(66, lossless(), opts());
    p.post_send(0, p.wr(14, WrOpcode::RdmaRead, 0, 100, 0));
    // Put the READ on the wire, deliver nothing, and answer it with 52 bytes.
    let mut buf = vec![0u8; 8192];
    let n = &mut p.net.nodes[0];
    assert!(
        n.endpoint
            .poll_transmit(p.net.now, &mut buf, &n.mem)
            .unwrap()
            .is_some()
    );
    let psn = Psn::new(p.opts.psn_a);
    let aeth = Some(AethRepr {
        syndrome: 0x1F,
        msn: 1,
    });
    let short = PacketRepr {
        bth: BthRepr::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, p.qa, psn),
        ext: ExtHeaders {
            aeth,
            ..Default::default()
        },
        payload: &[7; 52],
    };
    inject(&mut p.net, 1, 0, short);
    assert_eq!(first_completion(&mut p), WcStatus::BadRespErr);
    let e = p.net.nodes[0].endpoint.qp_error(p.qa).unwrap();
    assert_eq!(
        e.cause,
        ErrorCause::BadResponse {
            psn,
            request: WrOpcode::RdmaRead,
            response: Opcode::RC_RDMA_READ_RESPONSE_ONLY,
            bytes: 52,
            expected: 100,
        }
    );
    assert!(e.to_string().contains("52 bytes where 100 were due"), "{e}");

    let mut p = pair(67, lossless(), opts());
    p.post_send(0, p.wr(15, WrOpcode::RdmaWrite, 0, 100, 0));
    let n = &mut p.net.nodes[0];
    assert!(
        n.endpoint
            .poll_transmit(p.net.now, &mut buf, &n.mem)
            .unwrap()
            .is_some()
    );
    let psn = Psn::new(p.opts.psn_a);
    let reserved = PacketRepr {
        bth: BthRepr::new(Opcode::RC_ACKNOWLEDGE, p.qa, psn),
        ext: ExtHeaders {
            aeth: Some(AethRepr {
                syndrome: 0x70,
                msn: 0,
            }),
            ..Default::default()
        },
        payload: &[],
    };
    inject(&mut p.net, 1, 0, reserved);
    assert_eq!(first_completion(&mut p), WcStatus::BadRespErr);
    let e = p.net.nodes[0].endpoint.qp_error(p.qa).unwrap();
    assert_eq!(
        e.cause,
        ErrorCause::ReservedSyndrome {
            psn,
            syndrome: 0x70
        }
    );
    assert!(e.to_string().contains("syndrome 0x70"), "{e}");
}

/// The status of A's next completion, taken from its engine directly (no simulator step).
fn first_completion(p: &mut Pair) -> WcStatus {
    let c = p.net.nodes[0].endpoint.poll_completion().unwrap();
    assert_eq!(c.qpn, p.qa);
    c.wc.status
}

/// A SEND with invalidate of a key the responder has no window for: the responder's receive
/// fails with REM_INV_REQ_ERR naming the key, the requester's with the NAK.
#[test]
fn a_send_with_invalidate_of_an_unknown_key_names_the_key() {
    let mut p = pair(68, lossless(), opts());
    p.post_recv(1, 41, 0, 4096);
    p.post_send(0, SendWr::send_with_inv(16, p.mra.sge(0, 100), 0x1234_5678));
    p.net.drive(STEPS);
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::RemInvReqErr);
    let r = p.net.nodes[1].endpoint.qp_error(p.qb).unwrap();
    assert_eq!((r.status, r.wr_id), (WcStatus::RemInvReqErr, 41));
    match r.cause {
        ErrorCause::RemoteInvalidate { rkey, error, psn } => {
            assert_eq!((rkey, error), (0x1234_5678, MemError::InvalidKey));
            assert_eq!(psn, Psn::new(p.opts.psn_a));
        }
        other => panic!("{other:?}"),
    }
    assert!(r.to_string().contains("rkey 0x12345678"), "{r}");
}

/// A UD datagram longer than the receive (GRH included): the receive completes with
/// LOC_LEN_ERR, the QP keeps both sizes and stays in RTS.
#[test]
fn a_ud_receive_too_short_names_both_sizes() {
    let o = Opts {
        qp_type: QpType::Ud,
        ..opts()
    };
    let mut p = pair(69, lossless(), o);
    p.post_recv(1, 42, 0, 100);
    let mut w = SendWr::send(17, p.mra.sge(0, 200));
    w.send_flags = ferroce_transport::SendFlags::SIGNALED;
    w.ud = Some(ferroce_transport::UdDest {
        ah: ferroce_transport::AhAttr::new(p.net.nodes[1].addr),
        remote_qpn: p.qb,
        remote_qkey: 0x1111_1111,
    });
    p.post_send(0, w);
    p.net.drive(STEPS);
    assert_eq!(p.recv_wcs(1)[0].status, WcStatus::LocLenErr);
    let r = p.net.nodes[1].endpoint.qp_error(p.qb).unwrap();
    assert_eq!(
        (r.wr_id, r.cause),
        (
            42,
            ErrorCause::LocalLength {
                message: 240,
                buffer: 100
            }
        )
    );
    assert_eq!(p.state(1), QpState::Rts);
}
