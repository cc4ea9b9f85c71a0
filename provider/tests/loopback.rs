//! The verbs API over real UDP sockets on loopback: two devices in one process.

mod common;

use std::time::Duration;

use common::*;
use ferroce::transport::{Mtu, QpType, RecvWr, WcOpcode, WcStatus, WrOpcode};

const T: Duration = Duration::from_secs(10);

#[test]
fn rc_every_opcode_over_udp() {
    let (a, b) = pair(
        [127, 11, 0, 1],
        [127, 11, 0, 2],
        QpType::Rc,
        Mtu::Mtu1024,
        1 << 20,
    );
    let data = pattern(1 << 20, 7);
    a.mr.write(0, &data).unwrap();
    b.mr.write(0, &pattern(1 << 20, 9)).unwrap();
    b.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: vec![b.mr.sge(0, 100_000)].into(),
    })
    .unwrap();
    b.qp.post_recv(&RecvWr {
        wr_id: 2,
        sg_list: vec![b.mr.sge(0, 0)].into(),
    })
    .unwrap();
    a.qp.post_send(&wr(&a, &b, 10, WrOpcode::Send, 0, 100_000, 0))
        .unwrap();
    a.qp.post_send(&wr(
        &a,
        &b,
        11,
        WrOpcode::RdmaWrite,
        200_000,
        300_000,
        200_000,
    ))
    .unwrap();
    let mut wi = wr(
        &a,
        &b,
        12,
        WrOpcode::RdmaWriteWithImm,
        600_000,
        1025,
        600_000,
    );
    wi.imm_data = 0xabcd;
    a.qp.post_send(&wi).unwrap();
    a.qp.post_send(&wr(
        &a,
        &b,
        13,
        WrOpcode::RdmaRead,
        700_000,
        50_000,
        900_000,
    ))
    .unwrap();
    let mut fa = wr(
        &a,
        &b,
        14,
        WrOpcode::AtomicFetchAndAdd,
        800_000,
        8,
        1_000_000,
    );
    fa.compare_add = 3;
    a.qp.post_send(&fa).unwrap();
    let s = wait(&a.cq, 5, T);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (10, WcStatus::Success),
            (11, WcStatus::Success),
            (12, WcStatus::Success),
            (13, WcStatus::Success),
            (14, WcStatus::Success)
        ]
    );
    let r = wait(&b.cq, 2, T);
    assert_eq!(
        (r[0].wr_id, r[0].byte_len, r[0].opcode),
        (1, 100_000, WcOpcode::Recv)
    );
    assert_eq!(
        (r[1].wr_id, r[1].imm_data, r[1].opcode),
        (2, 0xabcd, WcOpcode::RecvRdmaWithImm)
    );
    let (am, bm) = (a.mr.to_vec(), b.mr.to_vec());
    assert_eq!(bm[..100_000], am[..100_000]);
    assert_eq!(bm[200_000..500_000], am[200_000..500_000]);
    assert_eq!(bm[600_000..601_025], am[600_000..601_025]);
    assert_eq!(am[700_000..750_000], bm[900_000..950_000]);
    let orig = u64::from_ne_bytes(
        pattern(1 << 20, 9)[1_000_000..1_000_008]
            .try_into()
            .unwrap(),
    );
    assert_eq!(a.mr.atomic_load(800_000).unwrap(), orig);
    assert_eq!(b.mr.atomic_load(1_000_000).unwrap(), orig.wrapping_add(3));
    let (ea, ra) = a.ctx.counters();
    assert!(ea.sent_pkts > 300 && ra.udp_sent >= ea.sent_pkts);
}

#[test]
fn bad_rkey_gives_rem_access_err_on_both_sides() {
    let (a, b) = pair(
        [127, 11, 1, 1],
        [127, 11, 1, 2],
        QpType::Rc,
        Mtu::Mtu4096,
        1 << 16,
    );
    let mut w = wr(&a, &b, 1, WrOpcode::RdmaWrite, 0, 100, 0);
    w.remote.rkey ^= 0x55;
    a.qp.post_send(&w).unwrap();
    let s = wait(&a.cq, 1, T);
    assert_eq!(s[0].status, WcStatus::RemAccessErr);
    // The responder moved to ERR when it sent the NAK, before the requester saw it.
    assert_eq!(b.qp.query().qp_state, ferroce::transport::QpState::Err);
}

#[test]
fn dereg_makes_the_rkey_dead_at_once() {
    let (a, b) = pair(
        [127, 11, 2, 1],
        [127, 11, 2, 2],
        QpType::Rc,
        Mtu::Mtu4096,
        1 << 16,
    );
    let w = wr(&a, &b, 1, WrOpcode::RdmaRead, 0, 100, 0);
    b.mr.clone().dereg();
    a.qp.post_send(&w).unwrap();
    assert_eq!(wait(&a.cq, 1, T)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn address_in_use_is_a_clear_error() {
    // Another program (here a plain socket) holds the address and port.
    let _other = std::net::UdpSocket::bind("127.11.3.1:4791").unwrap();
    let err = ferroce::Device::for_addr([127, 11, 3, 1].into())
        .unwrap()
        .open()
        .unwrap_err();
    assert!(matches!(err, ferroce::Error::AddressInUse(_)), "{err}");
    assert!(err.to_string().contains("127.11.3.1:4791"));
}

/// Every handle can move to and be shared between threads.
#[test]
fn handles_are_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<ferroce::Context>();
    both::<ferroce::ProtectionDomain>();
    both::<ferroce::MemoryRegion>();
    both::<ferroce::CompletionQueue>();
    both::<ferroce::CompletionChannel>();
    both::<ferroce::QueuePair>();
    both::<ferroce::SharedReceiveQueue>();
    both::<ferroce::AddressHandle>();
}

/// Huge-page regions work where the host has huge pages, and fail cleanly where it has none.
#[test]
fn huge_page_regions_work_or_fail_cleanly() {
    let ctx = open([127, 11, 4, 1]);
    let pd = ctx.alloc_pd();
    match pd.reg_mr_huge(3 << 20, ALL) {
        Ok(mr) => {
            assert_eq!(mr.len(), 3 << 20);
            mr.write((3 << 20) - 4, &[1, 2, 3, 4]).unwrap();
            let mut b = [0u8; 4];
            mr.read((3 << 20) - 4, &mut b).unwrap();
            assert_eq!(b, [1, 2, 3, 4]);
        }
        Err(ferroce::Error::Io(e)) => assert!(e.raw_os_error().is_some(), "{e}"),
        Err(e) => panic!("unexpected error {e}"),
    }
    // Access rules apply as to any region.
    assert!(matches!(
        pd.reg_mr_huge(4096, ferroce::transport::AccessFlags::REMOTE_WRITE),
        Err(ferroce::Error::InvalidArgument(_))
    ));
}

/// Dropping every handle closes the device: its address can be opened again at once.
#[test]
fn dropping_every_handle_releases_the_device() {
    for _ in 0..3 {
        let (a, b) = pair(
            [127, 11, 5, 1],
            [127, 11, 5, 2],
            QpType::Rc,
            Mtu::Mtu1024,
            1 << 16,
        );
        b.qp.post_recv(&RecvWr {
            wr_id: 1,
            sg_list: vec![b.mr.sge(0, 10)].into(),
        })
        .unwrap();
        a.qp.post_send(&wr(&a, &b, 1, WrOpcode::Send, 0, 10, 0))
            .unwrap();
        assert_eq!(wait(&a.cq, 1, T)[0].status, WcStatus::Success);
        drop((a, b));
    }
}
