//! UC, UD (with QP1), SRQ, and the QP state machine's effects: post-time errors, ERR flushes,
//! SQD drain, RESET.

mod common;

use common::script::Script;
use common::*;
use ferroce_transport::sim::{LinkConfig, Network};
use ferroce_transport::{
    AhAttr, AsyncEvent, Instant, PostError, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType,
    RecvWr, SendFlags, SendWr, SrqAttr, UdDest, VerbError, WcFlags, WcOpcode, WcQueue, WcStatus,
    WrOpcode,
};
use ferroce_wire::{Opcode, Psn};

const STEPS: u64 = 100_000;

#[test]
fn uc_write_and_send_no_acks() {
    let opts = Opts {
        qp_type: QpType::Uc,
        ..Opts::default()
    };
    let mut p = pair(1, lossless(), opts);
    let sc = Script::install(&mut p.net);
    p.post_recv(1, 5, 0, 4096);
    p.post_send(0, p.wr(1, WrOpcode::RdmaWrite, 0, 3000, 5000));
    p.post_send(0, p.wr(2, WrOpcode::Send, 100, 2500, 0));
    assert!(p.run_until_send_wcs(2, STEPS));
    p.net.drive(STEPS);
    assert_eq!(statuses(&p.send_wcs(0)), vec![WcStatus::Success; 2]);
    assert_eq!(p.recv_wcs(1)[0].byte_len, 2500);
    assert_eq!(sc.borrow().count(|s| s.from == 1), 0, "UC never answers");
    assert!(sc.borrow().log.iter().all(|s| s.opcode.0 & 0xE0 == 0x20));
    let (a, b) = (p.bytes(0), p.bytes(1));
    assert_eq!(b[5000..8000], a[..3000]);
    assert_eq!(b[..2500], a[100..2600]);
}

/// UC: a lost middle packet drops that message (no completion); the receive WQE is kept and
/// the next message lands in it.
#[test]
fn uc_gap_drops_the_message_and_reuses_the_wqe() {
    let opts = Opts {
        qp_type: QpType::Uc,
        ..Opts::default()
    };
    let mut p = pair(2, lossless(), opts);
    let sc = Script::install(&mut p.net);
    let lost = Psn::new(p.opts.psn_a) + 1;
    sc.borrow_mut().drop(1, move |s| s.psn == lost);
    p.post_recv(1, 5, 0, 8192);
    p.post_send(0, p.wr(1, WrOpcode::Send, 0, 3000, 0));
    p.post_send(0, p.wr(2, WrOpcode::Send, 4000, 500, 0));
    assert!(p.run_until_send_wcs(2, STEPS));
    p.net.drive(STEPS);
    assert_eq!(
        statuses(&p.send_wcs(0)),
        vec![WcStatus::Success; 2],
        "UC completes on send"
    );
    let r = p.recv_wcs(1);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].wr_id, r[0].byte_len), (5, 500));
    assert_eq!(p.bytes(1)[..500], p.bytes(0)[4000..4500]);
    assert_eq!(p.counters(1).out_of_seq_request, 1);
}

fn ud_net(
    seed: u64,
) -> (
    Network,
    u32,
    u32,
    ferroce_transport::memory::VecMr,
    ferroce_transport::memory::VecMr,
) {
    let opts = Opts {
        qp_type: QpType::Ud,
        ..Opts::default()
    };
    let p = pair(seed, LinkConfig::default(), opts);
    (p.net, p.qa, p.qb, p.mra, p.mrb)
}

fn ud_wr(
    wr_id: u64,
    mra: &ferroce_transport::memory::VecMr,
    len: u32,
    dest: std::net::IpAddr,
    qpn: u32,
    qkey: u32,
) -> SendWr {
    let mut w = SendWr::new(wr_id, WrOpcode::SendWithImm);
    w.send_flags = SendFlags::SIGNALED;
    w.sg_list = vec![mra.sge(0, len)].into();
    w.imm_data = 0x1234;
    w.ud = Some(UdDest {
        ah: AhAttr::new(dest),
        remote_qpn: qpn,
        remote_qkey: qkey,
    });
    w
}

/// UD: DETH with the Q_Key and source QP; the receive buffer starts with 40 bytes of GRH.
#[test]
fn ud_send_with_grh_and_qkey_check() {
    let (mut net, qa, qb, mra, mrb) = ud_net(3);
    let b_addr = net.nodes[1].addr;
    let now = Instant::ZERO;
    for i in 0..2 {
        let n = &mut net.nodes[1];
        n.endpoint
            .post_recv(
                qb,
                RecvWr {
                    wr_id: 10 + i,
                    sg_list: vec![mrb.sge(i * 4096, 4096)].into(),
                },
                &n.mem,
                now,
            )
            .unwrap();
    }
    // Right Q_Key, then a wrong one (dropped).
    for (id, qkey) in [(1, 0x1111_1111), (2, 0x2222_2222)] {
        let n = &mut net.nodes[0];
        n.endpoint
            .post_send(qa, ud_wr(id, &mra, 2000, b_addr, qb, qkey), &n.mem, now)
            .unwrap();
    }
    net.drive(STEPS);
    let s = net.nodes[0].completions_of(qa, WcQueue::Send);
    assert_eq!(statuses(&s), vec![WcStatus::Success; 2]);
    let r = net.nodes[1].completions_of(qb, WcQueue::Recv);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].byte_len, 40 + 2000);
    assert_eq!(r[0].src_qp, qa);
    assert_eq!(r[0].imm_data, 0x1234);
    assert!(r[0].wc_flags.contains(WcFlags::GRH) && r[0].wc_flags.contains(WcFlags::WITH_IMM));
    // The packet type in `sl`, as mlx5 reports it and UCX reads it: RoCEv2 over IPv4.
    assert_eq!(r[0].sl, ferroce_transport::ROCE_PKT_TYPE_V2_IPV4);
    let b = net.nodes[1].mem.bytes(mrb.lkey).unwrap();
    let a = net.nodes[0].mem.bytes(mra.lkey).unwrap();
    assert_eq!(b[40..2040], a[..2000]);
    assert_eq!(
        b[20], 0x45,
        "an IPv4 header in the last 20 bytes of the GRH"
    );
    assert_eq!(b[32..36], [10, 0, 0, 1]);
    assert_eq!(net.nodes[1].endpoint.counters().qkey_violations, 1);
    // UD messages are limited to the port MTU (4096 here).
    let n = &mut net.nodes[0];
    let err = n
        .endpoint
        .post_send(
            qa,
            ud_wr(3, &mra, 4097, b_addr, qb, 0x1111_1111),
            &n.mem,
            now,
        )
        .unwrap_err();
    assert_eq!(err, VerbError::Post(PostError::MessageTooLong));
}

/// QP1, the GSI QP, is a UD QP with its own transition rules and Q_Key 0x80010000: a CM MAD
/// (256 bytes) goes from one node's QP1 to the other's, as in the ucmatose capture.
#[test]
fn gsi_qp1_carries_mads() {
    let mut net = Network::new(4, 2, LinkConfig::default());
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let init = QpInitAttr {
        qp_type: QpType::Ud,
        pd: PD,
        cap,
        srq: None,
        sq_sig_all: true,
        send_cq: 0,
        recv_cq: 0,
    };
    let now = Instant::ZERO;
    let mut mrs = Vec::new();
    for i in 0..2 {
        let n = &mut net.nodes[i];
        assert_eq!(n.endpoint.create_gsi_qp(init), Ok(1));
        assert_eq!(n.endpoint.create_gsi_qp(init), Err(VerbError::QpExists(1)));
        let mr = n.mem.register(
            PD,
            pattern(4096, i as u8),
            ferroce_transport::AccessFlags::LOCAL_WRITE,
        );
        let a = QpAttr {
            qp_state: QpState::Init,
            qkey: ferroce_wire::GSI_QKEY,
            ..QpAttr::default()
        };
        // GSI: PKEY_INDEX and QKEY, no PORT.
        n.endpoint
            .modify_qp(
                1,
                &a,
                QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::QKEY,
                &n.mem,
                now,
            )
            .unwrap();
        let a = QpAttr {
            qp_state: QpState::Rtr,
            ..a
        };
        n.endpoint
            .modify_qp(1, &a, QpAttrMask::STATE, &n.mem, now)
            .unwrap();
        let a = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: 3,
            ..a
        };
        n.endpoint
            .modify_qp(1, &a, QpAttrMask::STATE | QpAttrMask::SQ_PSN, &n.mem, now)
            .unwrap();
        n.endpoint
            .post_recv(
                1,
                RecvWr {
                    wr_id: 1,
                    sg_list: vec![mr.sge(0, 4096)].into(),
                },
                &n.mem,
                now,
            )
            .unwrap();
        mrs.push(mr);
    }
    let sc = Script::install(&mut net);
    let dest = net.nodes[1].addr;
    let mut w = SendWr::new(7, WrOpcode::Send);
    w.sg_list = vec![mrs[0].sge(0, 256)].into();
    w.ud = Some(UdDest {
        ah: AhAttr::new(dest),
        remote_qpn: 1,
        remote_qkey: ferroce_wire::GSI_QKEY,
    });
    let n = &mut net.nodes[0];
    n.endpoint.post_send(1, w, &n.mem, now).unwrap();
    net.drive(STEPS);
    let r = net.nodes[1].completions_of(1, WcQueue::Recv);
    assert_eq!(
        (r[0].status, r[0].byte_len, r[0].src_qp),
        (WcStatus::Success, 296, 1)
    );
    let log = &sc.borrow().log;
    assert_eq!(log[0].opcode, Opcode::UD_SEND_ONLY);
    assert_eq!(log[0].psn, Psn::new(3));
}

/// Two RC QPs share one SRQ; the limit event fires once when the queue drops below the limit.
/// Each QP reports to its own CQs, SRQ receives included (the CQ of the QP a WQE was consumed
/// on, as verbs says).
#[test]
fn srq_shared_by_two_qps_with_limit_event() {
    let mut net = Network::new(5, 2, LinkConfig::default());
    let now = Instant::ZERO;
    let srqn = net.nodes[1].endpoint.create_srq(SrqAttr {
        max_wr: 8,
        max_sge: 1,
        srq_limit: 0,
    });
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let a_init = QpInitAttr {
        qp_type: QpType::Rc,
        pd: PD,
        cap,
        srq: None,
        sq_sig_all: true,
        send_cq: 0,
        recv_cq: 0,
    };
    let b_init = QpInitAttr {
        srq: Some(srqn),
        ..a_init
    };
    let o = Opts::default();
    let mra = net.nodes[0].mem.register(PD, pattern(4096, 1), o.access);
    let mrb = net.nodes[1].mem.register(PD, vec![0; 8192], o.access);
    let (aa, ab) = (net.nodes[0].addr, net.nodes[1].addr);
    let mut pairs = Vec::new();
    for k in 0..2u32 {
        let a = QpInitAttr {
            send_cq: 10 + k,
            recv_cq: 20 + k,
            ..a_init
        };
        let b = QpInitAttr {
            send_cq: 30 + k,
            recv_cq: 40 + k,
            ..b_init
        };
        let qa = net.nodes[0].endpoint.create_qp(a).unwrap();
        let qb = net.nodes[1].endpoint.create_qp(b).unwrap();
        connect(&mut net, 0, qa, ab, qb, 100, 200, &o);
        connect(&mut net, 1, qb, aa, qa, 200, 100, &o);
        pairs.push((qa, qb));
    }
    for i in 0..6u64 {
        net.nodes[1]
            .endpoint
            .post_srq_recv(
                srqn,
                RecvWr {
                    wr_id: i,
                    sg_list: vec![mrb.sge(i * 1024, 1024)].into(),
                },
            )
            .unwrap();
    }
    // Receives on an SRQ QP go to the SRQ.
    let n = &mut net.nodes[1];
    let e = n
        .endpoint
        .post_recv(pairs[0].1, RecvWr::default(), &n.mem, now)
        .unwrap_err();
    assert_eq!(e, VerbError::Post(PostError::UsesSrq));
    net.nodes[1].endpoint.arm_srq(srqn, 3).unwrap();
    for (k, (qa, _)) in [pairs[0], pairs[1], pairs[0], pairs[1]].iter().enumerate() {
        let mut w = SendWr::new(k as u64, WrOpcode::Send);
        w.sg_list = vec![mra.sge(k as u64 * 10, 10)].into();
        let n = &mut net.nodes[0];
        n.endpoint.post_send(*qa, w, &n.mem, now).unwrap();
    }
    net.drive(STEPS);
    let recvs: Vec<_> = net.nodes[1]
        .completions
        .iter()
        .filter(|c| c.queue == WcQueue::Recv)
        .collect();
    assert_eq!(recvs.len(), 4);
    // WQEs were taken in SRQ order, whichever QP the SEND came in on.
    let mut ids: Vec<u64> = recvs.iter().map(|c| c.wc.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![0, 1, 2, 3]);
    assert!(recvs.iter().any(|c| c.qpn == pairs[0].1) && recvs.iter().any(|c| c.qpn == pairs[1].1));
    for c in &recvs {
        let k = u32::from(c.qpn == pairs[1].1);
        assert_eq!(
            c.cq,
            40 + k,
            "receive completion on {:#x} went to CQ {}",
            c.qpn,
            c.cq
        );
    }
    let sends: Vec<_> = net.nodes[0].completions.iter().collect();
    assert_eq!(sends.len(), 4);
    for c in sends {
        assert_eq!(c.queue, WcQueue::Send);
        let k = u32::from(c.qpn == pairs[1].0);
        assert_eq!(
            c.cq,
            10 + k,
            "send completion on {:#x} went to CQ {}",
            c.qpn,
            c.cq
        );
    }
    assert!(net.nodes[1].endpoint.cq_in_use(41) && !net.nodes[1].endpoint.cq_in_use(20));
    net.nodes[1].endpoint.destroy_qp(pairs[1].1).unwrap();
    assert!(!net.nodes[1].endpoint.cq_in_use(41) && net.nodes[1].endpoint.cq_in_use(40));
    let limit_events: Vec<_> = net.nodes[1]
        .events
        .iter()
        .filter(|e| matches!(e, AsyncEvent::SrqLimitReached { .. }))
        .collect();
    // Six receives, armed at 3, four taken: it fires as the queue falls to 2.
    assert_eq!(
        limit_events,
        vec![&AsyncEvent::SrqLimitReached {
            srqn,
            limit: 3,
            left: 2
        }]
    );
    let why = limit_events[0].explain(None);
    assert!(
        why.contains(&format!(
            "SRQ {srqn}: 2 receive WQEs left, below the limit 3"
        )),
        "{why}"
    );
    assert_eq!(
        net.nodes[1].endpoint.destroy_srq(srqn),
        Err(VerbError::Busy)
    );
}

#[test]
fn post_time_errors() {
    let mut p = pair(
        6,
        lossless(),
        Opts {
            max_wr: 2,
            ..Opts::default()
        },
    );
    let now = p.net.now;
    let n = &mut p.net.nodes[0];
    let qa = p.qa;
    let mk = |op, len| {
        let mut w = SendWr::new(1, op);
        w.sg_list = vec![p.mra.sge(0, len)].into();
        w
    };
    let err = |r: Result<(), VerbError>| match r {
        Err(VerbError::Post(e)) => e,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        err(n
            .endpoint
            .post_send(qa, mk(WrOpcode::AtomicFetchAndAdd, 4), &n.mem, now)),
        PostError::InvalidAtomicLength
    );
    let mut w = mk(WrOpcode::Send, 300);
    w.send_flags = SendFlags::INLINE;
    assert_eq!(
        err(n.endpoint.post_send(qa, w, &n.mem, now)),
        PostError::InlineTooLong
    );
    let mut w = mk(WrOpcode::Send, 10);
    w.sg_list = vec![p.mra.sge(0, 1); 5].into();
    assert_eq!(
        err(n.endpoint.post_send(qa, w, &n.mem, now)),
        PostError::TooManySge
    );
    let mut w = mk(WrOpcode::Send, 10);
    w.ud = Some(UdDest {
        ah: AhAttr::new(n.addr),
        remote_qpn: 1,
        remote_qkey: 0,
    });
    assert_eq!(
        err(n.endpoint.post_send(qa, w, &n.mem, now)),
        PostError::InvalidDestination
    );
    let mut w = mk(WrOpcode::Send, 0);
    w.sg_list = vec![
        p.mra.sge(0, 4 << 20),
        p.mra.sge(0, 4 << 20),
        p.mra.sge(0, 1),
    ]
    .into();
    assert_eq!(
        err(n.endpoint.post_send(qa, w, &n.mem, now)),
        PostError::MessageTooLong
    );
    n.endpoint
        .post_send(qa, mk(WrOpcode::RdmaWrite, 1), &n.mem, now)
        .unwrap();
    n.endpoint
        .post_send(qa, mk(WrOpcode::RdmaWrite, 1), &n.mem, now)
        .unwrap();
    assert_eq!(
        err(n
            .endpoint
            .post_send(qa, mk(WrOpcode::RdmaWrite, 1), &n.mem, now)),
        PostError::QueueFull
    );
    // A fresh QP in RESET takes neither sends nor receives; INIT takes receives only.
    let init = QpInitAttr {
        qp_type: QpType::Uc,
        pd: PD,
        cap: QpCap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        srq: None,
        sq_sig_all: false,
        send_cq: 0,
        recv_cq: 0,
    };
    let q = n.endpoint.create_qp(init).unwrap();
    assert_eq!(
        err(n.endpoint.post_send(q, mk(WrOpcode::Send, 1), &n.mem, now)),
        PostError::InvalidState(QpState::Reset)
    );
    assert_eq!(
        err(n.endpoint.post_recv(q, RecvWr::default(), &n.mem, now)),
        PostError::InvalidState(QpState::Reset)
    );
    assert_eq!(
        err(n
            .endpoint
            .post_send(q, mk(WrOpcode::RdmaRead, 1), &n.mem, now)),
        PostError::InvalidState(QpState::Reset)
    );
    let a = QpAttr {
        qp_state: QpState::Init,
        ..QpAttr::default()
    };
    n.endpoint
        .modify_qp(
            q,
            &a,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
            &n.mem,
            now,
        )
        .unwrap();
    n.endpoint
        .post_recv(q, RecvWr::default(), &n.mem, now)
        .unwrap();
    assert_eq!(
        err(n.endpoint.post_send(q, mk(WrOpcode::Send, 1), &n.mem, now)),
        PostError::InvalidState(QpState::Init)
    );
    assert!(matches!(
        n.endpoint
            .post_send(0x999, mk(WrOpcode::Send, 1), &n.mem, now),
        Err(VerbError::NoSuchQp(0x999))
    ));
}

/// Moving to ERR flushes every outstanding WR, in order, send and receive.
#[test]
fn err_flushes_in_order() {
    let mut p = pair(7, lossless(), Opts::default());
    p.net.nodes[1].down = true;
    for i in 0..3 {
        p.post_recv(0, 100 + i, 0, 10);
        p.post_send(0, p.wr(i, WrOpcode::RdmaWrite, 0, 10, 0));
    }
    p.net.step();
    let n = &mut p.net.nodes[0];
    let a = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    n.endpoint
        .modify_qp(p.qa, &a, QpAttrMask::STATE, &n.mem, p.net.now)
        .unwrap();
    p.net.drive(10);
    let s = p.send_wcs(0);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (0, WcStatus::WrFlushErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    let r = p.recv_wcs(0);
    assert_eq!(
        r.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![100, 101, 102]
    );
    assert!(
        r.iter()
            .all(|w| w.status == WcStatus::WrFlushErr && w.opcode == WcOpcode::Recv)
    );
    // ERR → RESET clears everything; RESET → INIT works again.
    let n = &mut p.net.nodes[0];
    let a = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    n.endpoint
        .modify_qp(p.qa, &a, QpAttrMask::STATE, &n.mem, p.net.now)
        .unwrap();
    let q = n.endpoint.query_qp(p.qa).unwrap();
    assert_eq!(q.qp_state, QpState::Reset);
}

/// RTS → SQD stops new WRs, lets those in flight finish, raises SqDrained; SQD → RTS resumes.
#[test]
fn sqd_drains_then_resumes() {
    let mut p = pair(8, lossless(), Opts::default());
    p.post_send(0, p.wr(1, WrOpcode::RdmaWrite, 0, 5000, 0));
    p.net.step(); // first packets on the wire
    let now = p.net.now;
    let n = &mut p.net.nodes[0];
    let a = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    n.endpoint
        .modify_qp(
            p.qa,
            &a,
            QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY,
            &n.mem,
            now,
        )
        .unwrap();
    assert!(n.endpoint.query_qp(p.qa).unwrap().sq_draining);
    p.post_send(0, p.wr(2, WrOpcode::RdmaWrite, 0, 10, 0));
    // Draining: SQD → RTS is refused until drained.
    let n = &mut p.net.nodes[0];
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    assert!(
        n.endpoint
            .modify_qp(p.qa, &rts, QpAttrMask::STATE, &n.mem, now)
            .is_err()
    );
    p.net.drive(STEPS);
    assert_eq!(p.send_wcs(0).len(), 1, "only the WR in flight completed");
    assert!(
        p.net.nodes[0]
            .events
            .contains(&AsyncEvent::SqDrained { qpn: p.qa })
    );
    let n = &mut p.net.nodes[0];
    n.endpoint
        .modify_qp(p.qa, &rts, QpAttrMask::STATE, &n.mem, p.net.now)
        .unwrap();
    p.net.drive(STEPS);
    assert_eq!(statuses(&p.send_wcs(0)), vec![WcStatus::Success; 2]);
}

/// The first packet to a QP in RTR raises COMM_EST.
#[test]
fn comm_est_event() {
    let mut p = pair(9, lossless(), Opts::default());
    let now = p.net.now;
    // Take B back to a fresh RTR: RESET, INIT, RTR.
    let n = &mut p.net.nodes[1];
    n.endpoint
        .modify_qp(p.qb, &QpAttr::default(), QpAttrMask::STATE, &n.mem, now)
        .unwrap();
    let o = p.opts;
    let aa = p.net.nodes[0].addr;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: o.access,
        ..QpAttr::default()
    };
    let n = &mut p.net.nodes[1];
    n.endpoint
        .modify_qp(
            p.qb,
            &a,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
            &n.mem,
            now,
        )
        .unwrap();
    a.qp_state = QpState::Rtr;
    a.ah_attr = Some(AhAttr::new(aa));
    a.dest_qp_num = p.qa;
    a.rq_psn = o.psn_a;
    a.path_mtu = o.mtu;
    a.max_dest_rd_atomic = 1;
    let m = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    n.endpoint.modify_qp(p.qb, &a, m, &n.mem, now).unwrap();
    p.post_send(0, p.wr(1, WrOpcode::RdmaWrite, 0, 10, 0));
    p.net.drive(STEPS);
    assert_eq!(statuses(&p.send_wcs(0)), vec![WcStatus::Success]);
    assert_eq!(
        p.net.nodes[1]
            .events
            .iter()
            .filter(|e| **e == AsyncEvent::CommEst { qpn: p.qb })
            .count(),
        1
    );
}

/// IBV_SEND_INLINE with the bytes given by the caller (`inline_data`, as the C ABI gathers
/// them at post time): the SGE's lkey is not used (verbs ignores inline lkeys), and the
/// receiver gets exactly those bytes; without `inline_data` the same bad lkey fails the post.
#[test]
fn inline_data_given_by_the_caller_ignores_the_lkey() {
    let mut p = pair(41, lossless(), Opts::default());
    p.post_recv(1, 9, 0, 256);
    let mut w = p.wr(1, WrOpcode::Send, 0, 100, 0);
    w.send_flags = SendFlags::INLINE | SendFlags::SIGNALED;
    w.sg_list[0].lkey ^= 0x00ab_cd00;
    let bad_lkey = w.clone();
    w.inline_data = Some((0..100u8).map(|i| i ^ 0x5a).collect());
    p.post_send(0, w);
    assert!(p.run_until_send_wcs(1, STEPS));
    assert_eq!(statuses(&p.send_wcs(0)), vec![WcStatus::Success]);
    let r = p.recv_wcs(1);
    assert_eq!((r[0].wr_id, r[0].byte_len), (9, 100));
    let want: Vec<u8> = (0..100u8).map(|i| i ^ 0x5a).collect();
    assert_eq!(p.bytes(1)[..100], want[..]);
    let now = p.net.now;
    let n = &mut p.net.nodes[0];
    assert_eq!(
        n.endpoint.post_send(p.qa, bad_lkey, &n.mem, now),
        Err(VerbError::Post(PostError::InlineGatherFailed))
    );
}
