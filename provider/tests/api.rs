//! The Rust API a newcomer reaches for: endpoints exchanged as bytes, `QueuePair::connect`,
//! the work-request constructors, `RemoteMemory`, `CompletionQueue::wait`, `AsFd`.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use ferroce::{AccessFlags, Device, QpEndpoint, QpType, RemoteMemory, SendWr, WcOpcode, WcStatus};

const T: Duration = Duration::from_secs(10);

#[test]
fn endpoints_over_bytes_then_every_constructor() {
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mut sides = Vec::new();
    for addr in ["127.89.0.1", "127.89.0.2"] {
        let ctx = Device::find(addr).unwrap().open().unwrap();
        let pd = ctx.alloc_pd();
        let ch = ctx.create_comp_channel().unwrap();
        let cq = ctx.create_cq(16, Some(&ch)).unwrap();
        let qp = pd.qp(QpType::Rc, &cq).max_send_wr(8).build().unwrap();
        let mr = pd.reg_mr(4096, all).unwrap();
        sides.push((ctx, ch, cq, qp, mr));
    }
    let (a, b) = (&sides[0], &sides[1]);
    // What would cross a TCP connection: bytes only.
    let ea = QpEndpoint::from_bytes(&a.3.endpoint(7).to_bytes()).unwrap();
    let eb = QpEndpoint::from_bytes(&b.3.endpoint(9).to_bytes()).unwrap();
    let rb = RemoteMemory::from_bytes(&b.4.remote().to_bytes()).unwrap();
    assert_eq!(rb.len, 4096);
    a.3.connect(7, &eb).unwrap();
    b.3.connect(9, &ea).unwrap();

    // Nothing posted yet: wait gives up after its timeout.
    assert!(a.2.wait(Duration::from_millis(20)).is_none());

    a.4.write(0, &[5u8; 16]).unwrap();
    let wrs = [
        SendWr::write(1, a.4.sge(0, 16), rb.at(64)),
        SendWr::read(2, a.4.sge(512, 16), rb.at(64)),
        SendWr::fetch_add(3, a.4.sge(1024, 8), rb.at(128), 5),
        SendWr::compare_swap(4, a.4.sge(1032, 8), rb.at(128), 5, 40),
        SendWr::write(5, a.4.sge(0, 16), rb.at(256)).unsignaled(),
    ];
    for w in &wrs[..4] {
        a.3.post_send(w).unwrap();
    }
    let ops: Vec<_> = (0..4).map(|_| a.2.wait(T).unwrap()).collect();
    assert!(ops.iter().all(|w| w.status == WcStatus::Success), "{ops:?}");
    assert_eq!(
        ops.iter().map(|w| w.opcode).collect::<Vec<_>>(),
        [
            WcOpcode::RdmaWrite,
            WcOpcode::RdmaRead,
            WcOpcode::FetchAdd,
            WcOpcode::CompSwap
        ]
    );
    let mut back = [0u8; 16];
    a.4.read(512, &mut back).unwrap();
    assert_eq!(back, [5u8; 16]);
    assert_eq!(a.4.atomic_load(1024).unwrap(), 0, "fetch_add saw 0");
    assert_eq!(a.4.atomic_load(1032).unwrap(), 5, "compare_swap saw 5");
    assert_eq!(b.4.atomic_load(128).unwrap(), 40);

    // An unsignaled request completes silently.
    a.3.post_send(&wrs[4]).unwrap();
    a.3.post_send(&SendWr::write(6, a.4.sge(0, 16), rb.at(512)))
        .unwrap();
    assert_eq!(
        a.2.wait(T).unwrap().wr_id,
        6,
        "only the signaled one reports"
    );

    // The channel's descriptor, borrowed for an event loop.
    assert_eq!(a.1.as_fd().as_raw_fd(), a.1.fd());
    assert_eq!(a.1.as_raw_fd(), a.1.fd());
    assert_eq!(a.0.async_fd_borrowed().as_raw_fd(), a.0.async_fd());
}

/// `post_send_batch` says which work request it refused; those before it were posted.
#[test]
fn post_send_batch_names_the_refused_wr() {
    let ctx = Device::find("127.89.1.1").unwrap().open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = pd.qp(QpType::Rc, &cq).max_send_wr(2).build().unwrap();
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    qp.connect_to(
        "127.89.1.2".parse().unwrap(),
        5,
        ferroce::Mtu::Mtu1024,
        1,
        1,
    )
    .unwrap();
    let remote = ferroce::RemoteAddr {
        remote_addr: 0,
        rkey: 1,
    };
    let wrs: Vec<_> = (0..3)
        .map(|i| SendWr::write(i, mr.sge(0, 8), remote))
        .collect();
    match qp.post_send_batch(&wrs) {
        Err(ferroce::Error::Refused { index, error }) => {
            assert_eq!(index, 2, "the third WR does not fit max_send_wr 2");
            assert_eq!(error.errno(), libc::ENOMEM);
        }
        other => panic!("{other:?}"),
    }
    // A single post keeps its plain error.
    assert!(matches!(
        qp.post_send(&wrs[0]),
        Err(ferroce::Error::Post(_))
    ));
}

/// `connect_to` sets 16 READs/atomics each way; `connect_to_rd_atomic` the depth asked for, up
/// to the device's `max_qp_rd_atom` (128), and refuses more.
#[test]
fn connect_to_rd_atomic_sets_the_read_depth() {
    let ctx = Device::find("127.89.1.3").unwrap().open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, None).unwrap();
    let peer = "127.89.1.4".parse().unwrap();
    let depth = |rd: Option<u8>| {
        let qp = pd.qp(QpType::Rc, &cq).build().unwrap();
        match rd {
            None => qp.connect_to(peer, 5, ferroce::Mtu::Mtu1024, 1, 1),
            Some(rd) => qp.connect_to_rd_atomic(peer, 5, ferroce::Mtu::Mtu1024, (1, 1), rd),
        }
        .map(|()| {
            let a = qp.query();
            (a.max_rd_atomic, a.max_dest_rd_atomic)
        })
    };
    assert_eq!(depth(None).unwrap(), (16, 16));
    assert_eq!(depth(Some(128)).unwrap(), (128, 128));
    assert_eq!(depth(Some(1)).unwrap(), (1, 1));
    assert!(matches!(depth(Some(129)), Err(ferroce::Error::Modify(_))));
}

/// A poll buffer's unfilled entries cannot pass for successes.
#[test]
fn an_unfilled_completion_is_not_a_success() {
    let wc = ferroce::WorkCompletion::default();
    assert_eq!(wc.status, WcStatus::GeneralErr);
}

/// The QP builder: defaults, and the attributes it sets reach the QP.
#[test]
fn qp_builder_sets_what_it_says() {
    let ctx = Device::find("127.89.2.1").unwrap().open().unwrap();
    let pd = ctx.alloc_pd();
    let (scq, rcq) = (
        ctx.create_cq(16, None).unwrap(),
        ctx.create_cq(16, None).unwrap(),
    );
    let qp = pd.qp(QpType::Rc, &scq).build().unwrap();
    let cap = qp.query().cap;
    assert_eq!(
        (cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge),
        (64, 64, 1)
    );
    let srq = pd
        .create_srq(ferroce::transport::SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let qp = pd
        .qp(QpType::Ud, &scq)
        .recv_cq(&rcq)
        .srq(&srq)
        .max_send_wr(3)
        .max_inline_data(32)
        .sq_sig_all(true)
        .build()
        .unwrap();
    let a = qp.query();
    assert_eq!((a.cap.max_send_wr, a.cap.max_recv_wr), (3, 0));
    assert!(a.cap.max_inline_data >= 32);
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let r = qp.post_recv(&ferroce::RecvWr {
        wr_id: 1,
        sg_list: vec![mr.sge(0, 8)].into(),
    });
    assert!(r.is_err(), "a QP on an SRQ has no receive queue of its own");
}

/// `modify_with`: a hand-made RESET → INIT → RTR → RTS bring-up whose masks come from the
/// setters; a WRITE then completes, and a missing attribute is refused by name.
#[test]
fn modify_with_sets_mask_and_fields_together() {
    use ferroce::{AhAttr, Mtu, QpModify, QpState};
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mut sides = Vec::new();
    for addr in ["127.89.3.1", "127.89.3.2"] {
        let ctx = Device::find(addr).unwrap().open().unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(16, None).unwrap();
        let qp = pd.qp(QpType::Rc, &cq).build().unwrap();
        let mr = pd.reg_mr(4096, all).unwrap();
        sides.push((ctx, cq, qp, mr));
    }
    let bring_up = |me: usize, peer: usize, sq_psn: u32, rq_psn: u32| {
        let (qp, peer_ctx, peer_qp) = (&sides[me].2, &sides[peer].0, &sides[peer].2);
        qp.modify_with(
            &QpModify::new(QpState::Init)
                .pkey_index(0)
                .port_num(1)
                .qp_access_flags(all),
        )
        .unwrap();
        // RTR without the path: refused, naming what is missing.
        let e = qp
            .modify_with(&QpModify::new(QpState::Rtr).path_mtu(Mtu::Mtu1024))
            .unwrap_err();
        assert!(format!("{e}").contains("missing IBV_QP_AV"), "{e}");
        let path = AhAttr {
            dest: peer_ctx.device().addr,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            sgid_index: 1,
        };
        qp.modify_with(
            &QpModify::new(QpState::Rtr)
                .ah_attr(path)
                .path_mtu(Mtu::Mtu1024)
                .dest_qp_num(peer_qp.qp_num())
                .rq_psn(rq_psn)
                .max_dest_rd_atomic(4)
                .min_rnr_timer(12),
        )
        .unwrap();
        qp.modify_with(
            &QpModify::new(QpState::Rts)
                .sq_psn(sq_psn)
                .timeout(14)
                .retry_cnt(7)
                .rnr_retry(7)
                .max_rd_atomic(4),
        )
        .unwrap();
        let q = qp.query();
        assert_eq!(
            (q.qp_state, q.sq_psn, q.rq_psn),
            (QpState::Rts, sq_psn, rq_psn)
        );
    };
    bring_up(0, 1, 10, 20);
    bring_up(1, 0, 20, 10);
    let (a, b) = (&sides[0], &sides[1]);
    a.3.write(0, b"through modify_with").unwrap();
    a.2.post_send(&SendWr::write(1, a.3.sge(0, 19), b.3.remote().at(0)))
        .unwrap();
    assert_eq!(a.1.wait(T).map(|w| w.status), Some(WcStatus::Success));
    let mut got = [0u8; 19];
    b.3.read(0, &mut got).unwrap();
    assert_eq!(&got, b"through modify_with");
}

/// `advise_mr` prefetches the pages of SGEs inside a region of the PD, and refuses SGEs with a
/// wrong key, outside the region, or of another PD.
#[test]
fn advise_mr_prefetches_and_checks_its_sges() {
    use ferroce::MrAdvice;
    let ctx = Device::find("127.89.4.1").unwrap().open().unwrap();
    let (pd, other) = (ctx.alloc_pd(), ctx.alloc_pd());
    let mr = pd.reg_mr(1 << 20, AccessFlags::LOCAL_WRITE).unwrap();
    for advice in [
        MrAdvice::Prefetch,
        MrAdvice::PrefetchWrite,
        MrAdvice::PrefetchNoFault,
    ] {
        pd.advise_mr(advice, &[mr.sge(0, 4096), mr.sge(512 << 10, 512 << 10)])
            .unwrap();
    }
    let mut bad = mr.sge(0, 64);
    bad.lkey ^= 1;
    assert!(pd.advise_mr(MrAdvice::Prefetch, &[bad]).is_err());
    let mut past = mr.sge(0, 64);
    past.addr += 1 << 20;
    assert!(pd.advise_mr(MrAdvice::Prefetch, &[past]).is_err());
    assert!(
        other
            .advise_mr(MrAdvice::Prefetch, &[mr.sge(0, 64)])
            .is_err()
    );
    assert_eq!(mr.to_vec(), vec![0u8; 1 << 20], "prefetch changes no byte");
}

/// An async event says what it means with its facts (`Context::async_event_reason`): an SRQ's
/// limit and the receives left; for a QP of the SRQ that failed (a SEND larger than the
/// receive it took), LAST_WQE_REACHED with the QP's first error.
#[test]
fn async_events_explain_themselves() {
    use ferroce::AsyncEventRecord;
    use ferroce::transport::AsyncEvent;
    let mut sides = Vec::new();
    for addr in ["127.89.3.1", "127.89.3.2"] {
        let ctx = Device::find(addr).unwrap().open().unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(16, None).unwrap();
        let srq = pd
            .create_srq(ferroce::transport::SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let qp = pd.qp(QpType::Rc, &cq).srq(&srq).build().unwrap();
        let mr = pd.reg_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();
        sides.push((ctx, cq, srq, qp, mr));
    }
    let (a, b) = (&sides[0], &sides[1]);
    a.3.connect(7, &b.3.endpoint(9)).unwrap();
    b.3.connect(9, &a.3.endpoint(7)).unwrap();
    for i in 0..3usize {
        b.2.post_recv(&ferroce::RecvWr {
            wr_id: i as u64,
            sg_list: vec![b.4.sge(i * 100, 100)].into(),
        })
        .unwrap();
    }
    b.2.arm_limit(3).unwrap();
    // A SEND of 100 bytes takes one receive: 2 left, below 3.
    a.3.post_send(&SendWr::send(1, a.4.sge(0, 100))).unwrap();
    assert_eq!(a.1.wait(T).unwrap().status, WcStatus::Success);
    let e = b.0.get_async_event(T).expect("the SRQ limit event");
    assert!(matches!(
        e,
        AsyncEventRecord::Engine(AsyncEvent::SrqLimitReached {
            limit: 3,
            left: 2,
            ..
        })
    ));
    let why = b.0.async_event_reason(&e);
    assert!(
        why.contains("2 receive WQEs left, below the limit 3"),
        "{why}"
    );
    // A SEND of 1000 bytes into a 100-byte receive: B's QP fails and leaves the SRQ.
    a.3.post_send(&SendWr::send(2, a.4.sge(0, 1000))).unwrap();
    assert_eq!(a.1.wait(T).unwrap().status, WcStatus::RemInvReqErr);
    let e = b.0.get_async_event(T).expect("LAST_WQE_REACHED");
    assert_eq!(
        e,
        AsyncEventRecord::Engine(AsyncEvent::QpLastWqeReached { qpn: b.3.qp_num() })
    );
    let why = b.0.async_event_reason(&e);
    assert!(
        why.contains("takes no more receive WQEs from it")
            && why.contains("its first error:")
            && why.contains("does not fit the 100 bytes"),
        "{why}"
    );
}
