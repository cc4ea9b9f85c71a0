//! First light: each operation over a perfect link, data and completions checked.

mod common;

use common::*;
use ferroce_transport::{WcFlags, WcOpcode, WcStatus, WrOpcode};

#[test]
fn send_only_and_multi_packet_send() {
    let mut p = pair(1, lossless(), Opts::default());
    p.post_recv(1, 100, 0, 8192);
    p.post_recv(1, 101, 8192, 8192);
    p.post_send(0, p.wr(1, WrOpcode::Send, 0, 100, 0));
    p.post_send(0, p.wr(2, WrOpcode::Send, 1000, 5000, 0));
    assert!(p.run_until_send_wcs(2, 10_000));
    p.net.drive(10_000);
    let s = p.send_wcs(0);
    assert_eq!(statuses(&s), vec![WcStatus::Success; 2]);
    assert_eq!((s[0].wr_id, s[1].wr_id), (1, 2));
    assert_eq!(s[1].opcode, WcOpcode::Send);
    let r = p.recv_wcs(1);
    assert_eq!(r.len(), 2);
    assert_eq!(
        (r[0].wr_id, r[0].byte_len, r[0].status),
        (100, 100, WcStatus::Success)
    );
    assert_eq!((r[1].wr_id, r[1].byte_len), (101, 5000));
    assert_eq!(r[0].src_qp, p.qa);
    let a = p.bytes(0);
    let b = p.bytes(1);
    assert_eq!(b[..100], a[..100]);
    assert_eq!(b[8192..8192 + 5000], a[1000..6000]);
}

#[test]
fn write_read_and_atomics() {
    let mut p = pair(2, lossless(), Opts::default());
    p.post_send(0, p.wr(1, WrOpcode::RdmaWrite, 0, 3000, 100));
    let mut w = p.wr(2, WrOpcode::RdmaWriteWithImm, 3000, 10, 5000);
    w.imm_data = 0xfeed;
    p.post_recv(1, 50, 0, 0);
    p.post_send(0, w);
    // READ back what B now holds into A at offset 20000.
    let mut r = p.wr(3, WrOpcode::RdmaRead, 20000, 3000, 100);
    r.sg_list = vec![p.mra.sge(20000, 3000)].into();
    p.post_send(0, r);
    let mut fa = p.wr(4, WrOpcode::AtomicFetchAndAdd, 40000, 8, 8000);
    fa.compare_add = 5;
    p.post_send(0, fa);
    let mut cs = p.wr(5, WrOpcode::AtomicCmpAndSwp, 40008, 8, 8000);
    cs.compare_add = 5;
    cs.swap = 77;
    p.post_send(0, cs);
    assert!(p.run_until_send_wcs(5, 10_000));
    let s = p.send_wcs(0);
    assert_eq!(statuses(&s), vec![WcStatus::Success; 5], "{s:?}");
    assert_eq!(
        s.iter().map(|w| w.opcode).collect::<Vec<_>>(),
        vec![
            WcOpcode::RdmaWrite,
            WcOpcode::RdmaWrite,
            WcOpcode::RdmaRead,
            WcOpcode::FetchAdd,
            WcOpcode::CompSwap
        ]
    );
    p.net.drive(10_000);
    let a = p.bytes(0);
    let b = p.bytes(1);
    assert_eq!(b[100..3100], a[..3000]);
    assert_eq!(b[5000..5010], a[3000..3010]);
    assert_eq!(a[20000..23000], b[100..3100]);
    assert_eq!(u64::from_ne_bytes(a[40000..40008].try_into().unwrap()), 0);
    assert_eq!(u64::from_ne_bytes(a[40008..40016].try_into().unwrap()), 5);
    assert_eq!(u64::from_ne_bytes(b[8000..8008].try_into().unwrap()), 77);
    let rw = p.recv_wcs(1);
    assert_eq!(rw.len(), 1);
    assert_eq!(rw[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(rw[0].imm_data, 0xfeed);
    assert_eq!(rw[0].byte_len, 10);
    assert!(rw[0].wc_flags.contains(WcFlags::WITH_IMM));
}

/// With a QPN slot, every QPN has the slot in bits 23:16 (what the kernel steers by when
/// processes share an address); the range wraps within the slot and runs out cleanly.
#[test]
fn qpn_slot_confines_every_qpn() {
    use ferroce_transport::{Endpoint, EndpointConfig, QpCap, QpInitAttr, QpType, VerbError};
    let mut cfg = EndpointConfig::new("10.0.0.1".parse().unwrap());
    cfg.qpn_slot = Some(7);
    cfg.first_qpn = 0xFFF0;
    let mut ep = Endpoint::new(cfg);
    let init = QpInitAttr {
        qp_type: QpType::Rc,
        pd: 1,
        cap: QpCap::default(),
        srq: None,
        sq_sig_all: false,
        send_cq: 0,
        recv_cq: 0,
    };
    let mut seen = std::collections::HashSet::new();
    for _ in 0..0x1_0000 {
        let q = ep.create_qp(init).unwrap();
        assert_eq!(q >> 16, 7, "{q:#x}");
        assert!(seen.insert(q), "{q:#x} twice");
    }
    assert_eq!(ep.create_qp(init), Err(VerbError::NoQpnLeft));
    let first = *seen.iter().min().unwrap();
    ep.destroy_qp(first).unwrap();
    assert_eq!(ep.create_qp(init), Ok(first));
    assert_eq!(ep.create_gsi_qp(init), Ok(1), "QP1 is outside every slot");
}
