//! Provider behaviour over real UDP: RNR, access violations on both sides, a vanished peer, 64
//! QPs on one CQ, completion channels, and the same transfers under FERROCE-style loss.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ferroce::faults::FaultConfig;
use ferroce::transport::{Mtu, QpCap, QpType, RecvWr, WcStatus, WrOpcode};
use ferroce::{Device, OpenOptions, QpInitAttr};

const T: Duration = Duration::from_secs(30);

#[test]
fn rnr_until_a_receive_is_posted() {
    let (a, b) = pair(
        [127, 13, 0, 1],
        [127, 13, 0, 2],
        QpType::Rc,
        Mtu::Mtu1024,
        1 << 16,
    );
    a.qp.post_send(&wr(&a, &b, 1, WrOpcode::Send, 0, 100, 0))
        .unwrap();
    // The responder answers RNR NAK (no receive posted); the requester waits and retries.
    let deadline = std::time::Instant::now() + T;
    while a.ctx.counters().0.rcvd_rnr_err < 2 {
        assert!(std::time::Instant::now() < deadline, "no RNR NAK arrived");
        assert!(
            a.cq.poll_one().is_none(),
            "the SEND completed without a receive"
        );
        std::thread::yield_now();
    }
    assert!(a.cq.poll_one().is_none(), "the SEND waits (rnr_retry 7)");
    b.qp.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: vec![b.mr.sge(0, 100)].into(),
    })
    .unwrap();
    assert_eq!(wait(&a.cq, 1, T)[0].status, WcStatus::Success);
    assert_eq!(wait(&b.cq, 1, T)[0].byte_len, 100);
    let (e, _) = a.ctx.counters();
    assert!(e.rcvd_rnr_err > 0);
}

#[test]
fn access_and_bounds_violations_on_both_sides() {
    let (a, b) = pair(
        [127, 13, 1, 1],
        [127, 13, 1, 2],
        QpType::Rc,
        Mtu::Mtu1024,
        1 << 16,
    );
    b.qp.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: vec![b.mr.sge(0, 100)].into(),
    })
    .unwrap();
    a.qp.post_send(&wr(&a, &b, 1, WrOpcode::RdmaWrite, 0, 100, (1 << 16) - 10))
        .unwrap();
    a.qp.post_send(&wr(&a, &b, 2, WrOpcode::RdmaWrite, 0, 100, 0))
        .unwrap();
    let s = wait(&a.cq, 2, T);
    assert_eq!(
        (s[0].status, s[1].status),
        (WcStatus::RemAccessErr, WcStatus::WrFlushErr)
    );
    let r = wait(&b.cq, 1, T);
    assert_eq!(
        r[0].status,
        WcStatus::WrFlushErr,
        "the responder's QP went to ERR"
    );
    // A bad lkey on the requester: a local protection error, as on rxe.
    let (c, d) = pair(
        [127, 13, 2, 1],
        [127, 13, 2, 2],
        QpType::Rc,
        Mtu::Mtu1024,
        1 << 16,
    );
    let mut w = wr(&c, &d, 1, WrOpcode::RdmaWrite, 0, 100, 0);
    w.sg_list[0].lkey ^= 0x77;
    c.qp.post_send(&w).unwrap();
    assert_eq!(wait(&c.cq, 1, T)[0].status, WcStatus::LocProtErr);
}

#[test]
fn vanished_peer_gives_retry_exc_err_then_flush() {
    let (a, b) = pair(
        [127, 13, 3, 1],
        [127, 13, 3, 2],
        QpType::Rc,
        Mtu::Mtu1024,
        4 << 20,
    );
    // A steady stream, then B disappears mid-transfer.
    for i in 0..20 {
        a.qp.post_send(&wr(&a, &b, i, WrOpcode::RdmaWrite, 0, 1 << 20, 0))
            .unwrap();
    }
    drop(b);
    let s = wait(&a.cq, 20, T);
    assert_eq!(s.len(), 20);
    let first_err = s
        .iter()
        .position(|w| w.status != WcStatus::Success)
        .expect("some WR must fail");
    assert_eq!(s[first_err].status, WcStatus::RetryExcErr);
    assert!(
        s[first_err + 1..]
            .iter()
            .all(|w| w.status == WcStatus::WrFlushErr)
    );
    assert_eq!(a.qp.query().qp_state, ferroce::transport::QpState::Err);
}

#[test]
fn sixty_four_qps_on_one_cq() {
    let ca = open([127, 13, 4, 1]);
    let cb = open([127, 13, 4, 2]);
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let (cqa, cqb) = (
        ca.create_cq(4096, None).unwrap(),
        cb.create_cq(4096, None).unwrap(),
    );
    let (ma, mb) = (
        pa.reg_mr(64 * 4096, ALL).unwrap(),
        pb.reg_mr(64 * 4096, ALL).unwrap(),
    );
    ma.write(0, &pattern(64 * 4096, 3)).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qps = Vec::new();
    for _ in 0..64 {
        let qa = pa
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cqa,
                recv_cq: &cqa,
                srq: None,
                cap,
                sq_sig_all: true,
            })
            .unwrap();
        let qb = pb
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cqb,
                recv_cq: &cqb,
                srq: None,
                cap,
                sq_sig_all: true,
            })
            .unwrap();
        connect(&qa, cb.device().addr, qb.qp_num(), Mtu::Mtu1024, 1, 2);
        connect(&qb, ca.device().addr, qa.qp_num(), Mtu::Mtu1024, 2, 1);
        qps.push((qa, qb));
    }
    for (i, (qa, qb)) in qps.iter().enumerate() {
        qb.post_recv(&RecvWr {
            wr_id: i as u64,
            sg_list: vec![mb.sge(i * 4096, 4096)].into(),
        })
        .unwrap();
        let mut w = ferroce::transport::SendWr::new(i as u64, WrOpcode::Send);
        w.sg_list = vec![ma.sge(i * 4096, 4096)].into();
        qa.post_send(&w).unwrap();
    }
    let s = wait(&cqa, 64, T);
    assert_eq!(s.len(), 64);
    assert!(s.iter().all(|w| w.status == WcStatus::Success));
    let r = wait(&cqb, 64, T);
    assert_eq!(r.len(), 64);
    let qpns: std::collections::HashSet<u32> = r.iter().map(|w| w.qp_num).collect();
    assert_eq!(qpns.len(), 64, "one receive per QP");
    assert_eq!(mb.to_vec(), ma.to_vec());
}

#[test]
fn completion_channel_events() {
    let ca = open([127, 13, 5, 1]);
    let cb = open([127, 13, 5, 2]);
    let ch = ca.create_comp_channel().unwrap();
    let pa = ca.alloc_pd();
    let pb = cb.alloc_pd();
    let cqa = ca.create_cq(16, Some(&ch)).unwrap();
    let cqb = cb.create_cq(16, None).unwrap();
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qa = pa
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cqa,
            recv_cq: &cqa,
            srq: None,
            cap,
            sq_sig_all: true,
        })
        .unwrap();
    let qb = pb
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cqb,
            recv_cq: &cqb,
            srq: None,
            cap,
            sq_sig_all: true,
        })
        .unwrap();
    connect(&qa, cb.device().addr, qb.qp_num(), Mtu::Mtu1024, 1, 2);
    connect(&qb, ca.device().addr, qa.qp_num(), Mtu::Mtu1024, 2, 1);
    let ma = pa.reg_mr(4096, ALL).unwrap();
    let mb = pb.reg_mr(4096, ALL).unwrap();
    cqa.req_notify(false).unwrap();
    assert!(
        ch.get_event_timeout(Duration::from_millis(20)).is_none(),
        "no event before a completion"
    );
    let mut w = ferroce::transport::SendWr::new(5, WrOpcode::RdmaWrite);
    w.sg_list = vec![ma.sge(0, 100)].into();
    w.remote.remote_addr = mb.addr();
    w.remote.rkey = mb.rkey();
    let t = Instant::now();
    qa.post_send(&w).unwrap();
    // The channel's fd becomes readable when the event is pending (as epoll would see it).
    assert!(
        readable(ch.fd(), 10_000),
        "fd readable once the event is pending"
    );
    let ev = ch.get_event_timeout(T).expect("an event");
    assert!(t.elapsed() < T);
    assert!(
        !readable(ch.fd(), 0),
        "fd not readable once the event is taken"
    );
    ev.ack_events(1);
    assert_eq!(cqa.poll_one().unwrap().wr_id, 5);
    // Not re-armed: a second completion raises no event.
    qa.post_send(&w).unwrap();
    assert!(wait(&cqa, 1, T).len() == 1);
    assert!(ch.get_event_timeout(Duration::from_millis(20)).is_none());
    // Destroying the CQ with every event acknowledged is refused only because the QP uses it.
    assert!(matches!(
        cqa.clone().destroy(),
        Err(ferroce::Error::Busy(_))
    ));
}

fn readable(fd: i32, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, timeout_ms) == 1 }
}

/// SEND, WRITE, a 2 MiB READ and an atomic under 5 % loss (end to end), duplication and
/// reordering: all complete, the data exact, the atomic run once.
///
/// Why 5 % and not more: every gap costs one go-back-N round, and a round fails when the
/// reissued request or its first response is lost too; `retry_cnt` 7 ends the QP after eight
/// failed rounds in a row (as rxe and the spec count). At 10 % a round fails about one time in
/// five and a 2 MiB READ meets some 300 gaps: the seeded simulator ran out of retries in 3
/// of 800 seeds, and this test failed about once in 30 runs. At 5 % that is about 1 in 10^5.
#[test]
fn transfers_survive_five_percent_loss() {
    let faults = FaultConfig {
        loss: 0.05,
        dup: 0.01,
        reorder: 0.02,
        seed: Some(42),
        ..FaultConfig::default()
    };
    let opts = OpenOptions {
        faults: Some(faults),
        ..OpenOptions::default()
    };
    let da = Device::for_addr([127, 13, 6, 1].into())
        .unwrap()
        .open_with(opts.clone())
        .unwrap();
    let db = Device::for_addr([127, 13, 6, 2].into())
        .unwrap()
        .open_with(opts)
        .unwrap();
    let mk = |ctx: ferroce::Context| {
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(256, None).unwrap();
        let cap = QpCap {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap,
                sq_sig_all: false,
            })
            .unwrap();
        let mr = pd.reg_mr(8 << 20, ALL).unwrap();
        Side {
            ctx,
            pd,
            cq,
            qp,
            mr,
        }
    };
    let (a, b) = (mk(da), mk(db));
    connect(
        &a.qp,
        b.ctx.device().addr,
        b.qp.qp_num(),
        Mtu::Mtu1024,
        5,
        6,
    );
    connect(
        &b.qp,
        a.ctx.device().addr,
        a.qp.qp_num(),
        Mtu::Mtu1024,
        6,
        5,
    );
    let data = pattern(8 << 20, 11);
    a.mr.write(0, &data).unwrap();
    b.mr.write(0, &pattern(8 << 20, 12)).unwrap();
    let b_before = b.mr.to_vec();
    b.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: vec![b.mr.sge(0, 1 << 20)].into(),
    })
    .unwrap();
    a.qp.post_send(&wr(&a, &b, 1, WrOpcode::Send, 0, 1 << 20, 0))
        .unwrap();
    a.qp.post_send(&wr(
        &a,
        &b,
        2,
        WrOpcode::RdmaWrite,
        1 << 20,
        2 << 20,
        1 << 20,
    ))
    .unwrap();
    a.qp.post_send(&wr(
        &a,
        &b,
        3,
        WrOpcode::RdmaRead,
        4 << 20,
        2 << 20,
        4 << 20,
    ))
    .unwrap();
    let mut fa = wr(&a, &b, 4, WrOpcode::AtomicFetchAndAdd, 7 << 20, 8, 7 << 20);
    fa.compare_add = 1;
    a.qp.post_send(&fa).unwrap();
    let s = wait(&a.cq, 4, Duration::from_secs(120));
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success)
        ]
    );
    let (am, bm) = (a.mr.to_vec(), b.mr.to_vec());
    assert!(
        bm[..3 << 20] == data[..3 << 20],
        "SEND and WRITE data exact"
    );
    assert!(
        am[4 << 20..6 << 20] == b_before[4 << 20..6 << 20],
        "READ data exact"
    );
    let orig = u64::from_ne_bytes(b_before[7 << 20..(7 << 20) + 8].try_into().unwrap());
    assert_eq!(
        b.mr.atomic_load(7 << 20).unwrap(),
        orig.wrapping_add(1),
        "atomic ran once"
    );
    assert_eq!(wait(&b.cq, 1, T)[0].byte_len, 1 << 20);
    let (ea, ra) = a.ctx.counters();
    assert!(
        ra.injected_losses > 0 && ea.completer_retry_err > 0,
        "the faults happened: {ra:?} {ea:?}"
    );
}

/// RESET cleans a QP's completions out of its CQs (as mlx5 does): the flushes an error left
/// behind are not mistaken for new work once the QP is brought up again; another QP's
/// completions on the same CQ stay.
#[test]
fn reset_removes_the_qps_completions_from_its_cq() {
    use ferroce::transport::QpState;
    let (x, _y) = pair(
        [127, 93, 7, 1],
        [127, 93, 7, 2],
        QpType::Rc,
        Mtu::Mtu1024,
        4096,
    );
    let other = x.pd.qp(QpType::Rc, &x.cq).build().unwrap();
    other
        .modify_with(
            &ferroce::QpModify::new(QpState::Init)
                .pkey_index(0)
                .port_num(1)
                .qp_access_flags(ALL),
        )
        .unwrap();
    for i in 0..3 {
        x.qp.post_recv(&ferroce::RecvWr::new(i, x.mr.sge(0, 64)))
            .unwrap();
    }
    other
        .post_recv(&ferroce::RecvWr::new(9, x.mr.sge(0, 64)))
        .unwrap();
    let to = |qp: &ferroce::QueuePair, s: QpState| {
        qp.modify_with(&ferroce::QpModify::new(s)).unwrap();
    };
    to(&x.qp, QpState::Err);
    to(&other, QpState::Err);
    // Both QPs' receives are flushed into the one CQ.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while x.cq.len() < 4 && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert_eq!(x.cq.len(), 4);
    to(&x.qp, QpState::Reset);
    let left: Vec<_> = std::iter::from_fn(|| x.cq.poll_one()).collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!((left[0].qp_num, left[0].wr_id), (other.qp_num(), 9));
}

/// Memory windows over the runtime: a type 2 window bound by a work request on B's QP takes
/// A's WRITE in its range only, a SEND with invalidate from A closes it, and a type 1 window
/// bound with `bind_mw` serves the PD; a region with a bound window tells so, and
/// deregistering it closes the window.
#[test]
fn memory_windows_over_the_runtime() {
    use ferroce::MwType;
    use ferroce::transport::{AccessFlags, RemoteAddr, SendWr, WcFlags, WcOpcode};
    let (x, y) = pair(
        [127, 93, 8, 1],
        [127, 93, 8, 2],
        QpType::Rc,
        Mtu::Mtu1024,
        65536,
    );
    let win_mr =
        y.pd.reg_mr(
            16384,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::MW_BIND,
        )
        .unwrap();
    let mw = y.pd.alloc_mw(MwType::Type2).unwrap();
    let before = mw.rkey();
    y.qp.post_send(&mw.bind_wr(
        1,
        &win_mr,
        win_mr.addr() + 4096,
        4096,
        AccessFlags::REMOTE_WRITE,
    ))
    .unwrap();
    let wc = wait(&y.cq, 1, Duration::from_secs(5));
    assert_eq!(
        (wc[0].status, wc[0].opcode),
        (WcStatus::Success, WcOpcode::Bind)
    );
    let key = mw.rkey();
    assert_ne!(key, before);
    assert_eq!(win_mr.windows_bound(), 1);
    x.mr.write(0, b"through the window").unwrap();
    let write = |id, addr, rkey| {
        SendWr::write(
            id,
            x.mr.sge(0, 18),
            RemoteAddr {
                remote_addr: addr,
                rkey,
            },
        )
    };
    x.qp.post_send(&write(2, win_mr.addr() + 5000, key))
        .unwrap();
    assert_eq!(
        wait(&x.cq, 1, Duration::from_secs(5))[0].status,
        WcStatus::Success
    );
    let mut got = [0u8; 18];
    win_mr.read(5000, &mut got).unwrap();
    assert_eq!(&got, b"through the window");
    // SEND with invalidate closes the window; B's receive says which key.
    y.qp.post_recv(&RecvWr::new(7, y.mr.sge(0, 64))).unwrap();
    x.qp.post_send(&SendWr::send_with_inv(3, x.mr.sge(0, 8), key))
        .unwrap();
    assert_eq!(
        wait(&x.cq, 1, Duration::from_secs(5))[0].status,
        WcStatus::Success
    );
    let r = wait(&y.cq, 1, Duration::from_secs(5));
    assert!(r[0].wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(r[0].invalidated_rkey, key);
    assert_eq!(win_mr.windows_bound(), 0);
    // Bound again, zero based: A addresses it by offset (offset 10 is region byte 8202).
    y.qp.post_send(&mw.bind_wr(
        8,
        &win_mr,
        win_mr.addr() + 8192,
        1024,
        AccessFlags::REMOTE_WRITE | AccessFlags::ZERO_BASED,
    ))
    .unwrap();
    assert_eq!(
        wait(&y.cq, 1, Duration::from_secs(5))[0].status,
        WcStatus::Success
    );
    x.qp.post_send(&write(9, 10, mw.rkey())).unwrap();
    assert_eq!(
        wait(&x.cq, 1, Duration::from_secs(5))[0].status,
        WcStatus::Success
    );
    win_mr.read(8202, &mut got).unwrap();
    assert_eq!(&got, b"through the window");
    y.qp.post_send(&SendWr::local_inv(10, mw.rkey())).unwrap();
    assert_eq!(
        wait(&y.cq, 1, Duration::from_secs(5))[0].opcode,
        WcOpcode::LocalInv
    );
    // A type 1 window, bound with bind_mw, closes with its region's deregistration.
    let mw1 = y.pd.alloc_mw(MwType::Type1).unwrap();
    let k1 =
        y.qp.bind_mw(
            &mw1,
            &win_mr,
            win_mr.addr(),
            16384,
            AccessFlags::REMOTE_WRITE,
            8,
        )
        .unwrap();
    assert_eq!(
        wait(&y.cq, 1, Duration::from_secs(5))[0].opcode,
        WcOpcode::Bind
    );
    assert_eq!((mw1.rkey(), win_mr.windows_bound()), (k1, 1));
    win_mr.dereg();
    assert!(x.qp.post_send(&write(4, 0, k1)).is_ok());
    assert_eq!(
        wait(&x.cq, 1, Duration::from_secs(5))[0].status,
        WcStatus::RemAccessErr,
        "the window closed with its region"
    );
}

/// CQ event moderation (`ibv_modify_cq`): an armed CQ moderated to 4 completions raises no
/// event for 2, one once the 4th arrives; re-armed with a period, a lone completion's event
/// comes when the period has run out.
#[test]
fn cq_moderation_waits_for_the_count_or_the_period() {
    let x = side([127, 93, 9, 1], QpType::Rc, 65536);
    let ch = x.ctx.create_comp_channel().unwrap();
    let cq = x.ctx.create_cq(64, Some(&ch)).unwrap();
    let y = side([127, 93, 9, 2], QpType::Rc, 65536);
    let qp = x.pd.qp(QpType::Rc, &cq).build().unwrap();
    connect(
        &qp,
        std::net::IpAddr::from([127, 93, 9, 2]),
        y.qp.qp_num(),
        Mtu::Mtu1024,
        1,
        2,
    );
    connect(
        &y.qp,
        std::net::IpAddr::from([127, 93, 9, 1]),
        qp.qp_num(),
        Mtu::Mtu1024,
        2,
        1,
    );
    let write = |id| {
        let mut w = ferroce::SendWr::write(
            id,
            x.mr.sge(0, 64),
            ferroce::RemoteAddr {
                remote_addr: y.mr.addr(),
                rkey: y.mr.rkey(),
            },
        );
        w.send_flags = ferroce::SendFlags::SIGNALED;
        qp.post_send(&w).unwrap();
    };
    cq.moderate(4, 0);
    cq.req_notify(false).unwrap();
    write(1);
    write(2);
    assert_eq!(wait(&cq, 2, Duration::from_secs(5)).len(), 2);
    assert!(
        ch.get_event_timeout(Duration::ZERO).is_none(),
        "2 of 4: no event yet"
    );
    write(3);
    write(4);
    assert!(
        ch.get_event_timeout(Duration::from_secs(5)).is_some(),
        "the 4th fires"
    );
    cq.ack_events(1);
    assert_eq!(wait(&cq, 2, Duration::from_secs(5)).len(), 2);
    // With a period (the most: 65,535 µs), a lone completion of the 4 still gets its event,
    // when the period has run out (without the period it never would).
    cq.moderate(4, u16::MAX);
    cq.req_notify(false).unwrap();
    write(5);
    assert_eq!(wait(&cq, 1, Duration::from_secs(5)).len(), 1);
    assert!(
        ch.get_event_timeout(Duration::from_secs(10)).is_some(),
        "at the period's end"
    );
    cq.ack_events(1);
}
