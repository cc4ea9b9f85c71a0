//! One device, many contexts in one process (the pyverbs pattern: server and client contexts
//! of the same device): they share the device's runtime, connect to each other over the one
//! address, keep their resources and async events apart, and outlive each other.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::{CtxSide, connect_sides, ctx_side, ok};

use ferroce::{
    AccessFlags, AsyncEventRecord, Context, Device, Error, QpType, RecvWr, SendWr, WcOpcode,
    WcStatus,
};

const T: Duration = Duration::from_secs(10);
const ADDR: &str = "127.91.0.1";

/// Every operation from `x` to `y` (two contexts of the same device), data checked.
fn every_operation(x: &CtxSide, y: &CtxSide, salt: u8) {
    let data: Vec<u8> = (0..4096u32).map(|i| (i as u8) ^ salt).collect();
    x.mr.write(0, &data).unwrap();
    let remote = y.mr.remote();
    // SEND with immediate.
    y.qp.post_recv(&RecvWr::new(10, y.mr.sge(8192, 4096)))
        .unwrap();
    x.qp.post_send(&SendWr::send_with_imm(1, x.mr.sge(0, 4096), 0xabcd))
        .unwrap();
    ok(&x.cq);
    let r = ok(&y.cq);
    assert_eq!((r.wr_id, r.byte_len, r.imm_data), (10, 4096, 0xabcd));
    let mut got = vec![0u8; 4096];
    y.mr.read(8192, &mut got).unwrap();
    assert_eq!(got, data, "SEND data");
    // WRITE, then READ it back elsewhere.
    x.qp.post_send(&SendWr::write(2, x.mr.sge(0, 4096), remote.at(16384)))
        .unwrap();
    ok(&x.cq);
    y.mr.read(16384, &mut got).unwrap();
    assert_eq!(got, data, "WRITE data");
    x.qp.post_send(&SendWr::read(3, x.mr.sge(20480, 4096), remote.at(16384)))
        .unwrap();
    assert_eq!(ok(&x.cq).opcode, WcOpcode::RdmaRead);
    x.mr.read(20480, &mut got).unwrap();
    assert_eq!(got, data, "READ data");
    // WRITE with immediate, atomics.
    y.qp.post_recv(&RecvWr::new(11, y.mr.sge(0, 0))).unwrap();
    x.qp.post_send(&SendWr::write_with_imm(
        4,
        x.mr.sge(0, 64),
        remote.at(32768),
        7,
    ))
    .unwrap();
    ok(&x.cq);
    assert_eq!(ok(&y.cq).opcode, WcOpcode::RecvRdmaWithImm);
    let before = y.mr.atomic_load(40960).unwrap();
    x.qp.post_send(&SendWr::fetch_add(
        5,
        x.mr.sge(24576, 8),
        remote.at(40960),
        3,
    ))
    .unwrap();
    ok(&x.cq);
    assert_eq!(x.mr.atomic_load(24576).unwrap(), before);
    x.qp.post_send(&SendWr::compare_swap(
        6,
        x.mr.sge(24584, 8),
        remote.at(40960),
        before.wrapping_add(3),
        99,
    ))
    .unwrap();
    ok(&x.cq);
    assert_eq!(y.mr.atomic_load(40960).unwrap(), 99);
}

#[test]
fn two_contexts_of_one_device_talk_both_ways_and_outlive_each_other() {
    let dev = Device::find(ADDR).unwrap();
    let (ca, cb) = (dev.open().unwrap(), dev.open().unwrap());
    assert!(ca.same_device(&cb));
    assert_eq!(ca.local_addr(), cb.local_addr());
    let (a, b) = (ctx_side(&ca), ctx_side(&cb));
    connect_sides(&a, &b);
    every_operation(&a, &b, 0x11);
    every_operation(&b, &a, 0x22);

    // Async events reach the context that owns the QP: COMM_EST of a QP that gets a packet
    // in RTR, here a fresh pair in ctx B receiving from ctx A.
    let (a2, b2) = (ctx_side(&ca), ctx_side(&cb));
    a2.qp.connect(5, &b2.qp.endpoint(6)).unwrap();
    // B's QP only to RTR: the first packet raises COMM_EST there.
    {
        use ferroce::{QpModify, QpState};
        let peer = a2.qp.endpoint(5);
        b2.qp
            .modify_with(
                &QpModify::new(QpState::Init)
                    .pkey_index(0)
                    .port_num(1)
                    .qp_access_flags(
                        AccessFlags::LOCAL_WRITE
                            | AccessFlags::REMOTE_WRITE
                            | AccessFlags::REMOTE_READ
                            | AccessFlags::REMOTE_ATOMIC,
                    ),
            )
            .unwrap();
        b2.qp
            .modify_with(
                &QpModify::new(QpState::Rtr)
                    .ah_attr(ferroce::AhAttr {
                        dest: ca.device().addr,
                        hop_limit: 64,
                        traffic_class: 0,
                        flow_label: 0,
                        sgid_index: 1,
                    })
                    .path_mtu(peer.mtu)
                    .dest_qp_num(peer.qp_num)
                    .rq_psn(peer.psn)
                    .max_dest_rd_atomic(4)
                    .min_rnr_timer(12),
            )
            .unwrap();
    }
    b2.qp.post_recv(&RecvWr::new(1, b2.mr.sge(0, 64))).unwrap();
    a2.qp.post_send(&SendWr::send(1, a2.mr.sge(0, 64))).unwrap();
    ok(&a2.cq);
    ok(&b2.cq);
    match cb.get_async_event(T) {
        Some(AsyncEventRecord::Engine(ferroce::transport::AsyncEvent::CommEst { qpn })) => {
            assert_eq!(qpn, b2.qp.qp_num());
        }
        other => panic!("context B: {other:?}"),
    }
    assert!(
        ca.get_async_event(Duration::from_millis(50)).is_none(),
        "context A got an event of B's QP"
    );

    // Resources stay per context.
    let pd_b = cb.alloc_pd();
    let e = pd_b.qp(QpType::Rc, &a.cq).build().unwrap_err();
    assert!(matches!(e, Error::WrongParent(_)), "{e}");
    let ch_a = ca.create_comp_channel().unwrap();
    assert!(matches!(
        cb.create_cq(4, Some(&ch_a)),
        Err(Error::WrongParent(_))
    ));
    // A region of B's PD is not reachable through A's QP (another PD): LocProtErr.
    let mr_b = pd_b.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    a.qp.post_send(&SendWr::write(9, mr_b.sge(0, 8), b.mr.remote().at(0)))
        .unwrap();
    assert_eq!(a.cq.wait(T).map(|w| w.status), Some(WcStatus::LocProtErr));

    // Closing context A (every handle of it) leaves B working with a third context.
    drop((a, a2, ch_a, ca, mr_b));
    let cc = dev.open().unwrap();
    let c = ctx_side(&cc);
    let b3 = ctx_side(&cb);
    connect_sides(&b3, &c);
    every_operation(&b3, &c, 0x33);
    every_operation(&c, &b3, 0x44);
}

#[test]
fn the_device_is_released_when_its_last_context_goes() {
    let dev = Device::find("127.91.1.1").unwrap();
    let c1 = dev.open().unwrap();
    let c2 = dev.open().unwrap();
    drop(c1);
    // c2 still holds the device: its socket is bound.
    assert!(std::net::UdpSocket::bind("127.91.1.1:4791").is_err());
    drop(c2);
    // All gone: the port is free again (the socket closes when the runtime stops).
    let free = (0..1000).any(|_| {
        let ok = std::net::UdpSocket::bind("127.91.1.1:4791").is_ok();
        if !ok {
            std::thread::yield_now();
        }
        ok
    });
    assert!(free, "the device's socket outlived its last context");
    // And it opens again.
    let c3 = dev.open().unwrap();
    let s = ctx_side(&c3);
    let t = ctx_side(&c3);
    connect_sides(&s, &t);
    every_operation(&s, &t, 0x55);
}

/// A process using a device reads its own live counters through the registry it holds (a
/// second descriptor of the file, closed, would drop its slot's record lock), and they move.
#[test]
fn a_member_reads_its_own_live_counters() {
    let a = Device::find("127.91.3.1").unwrap().open().unwrap();
    let b = Device::find("127.91.3.1").unwrap().open().unwrap();
    let (x, y) = (ctx_side(&a), ctx_side(&b));
    connect_sides(&x, &y);
    let me = std::process::id();
    let sent = |ctx: &Context| {
        let deadline = std::time::Instant::now() + T;
        loop {
            let procs = ctx.device().live_counters(ctx.port()).unwrap();
            let mine: Vec<_> = procs.iter().filter(|p| p.pid == me).collect();
            assert!(mine.len() <= 1, "{procs:?}");
            if let Some(p) = mine.first() {
                if let Some(&(_, n)) = p.counters.iter().find(|(k, _)| *k == "sent_pkts") {
                    return n;
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "own page never shown: {procs:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let before = sent(&a);
    every_operation(&x, &y, 3);
    let deadline = std::time::Instant::now() + T;
    while sent(&b) <= before {
        assert!(
            std::time::Instant::now() < deadline,
            "counters did not move"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    every_operation(&y, &x, 4);
}
