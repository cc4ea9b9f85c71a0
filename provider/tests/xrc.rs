//! XRC through the Rust API over loopback sockets: two XRC send QPs on one device reach one
//! XRC receive QP on another, each work request naming one of two XRC SRQs of the receive
//! side's domain; receives complete on the SRQ's CQ, RDMA goes through the SRQ's PD; an SRQ
//! of another domain is refused by the peer (REM_INV_REQ_ERR).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::*;
use ferroce::transport::{
    Mtu, QpCap, QpType, RecvWr, SendWr, SrqAttr, WcOpcode, WcStatus, WrOpcode,
};
use ferroce::{QpInitAttr, SendFlags};

const A: [u8; 4] = [127, 0, 211, 1];
const B: [u8; 4] = [127, 0, 211, 2];
const T: Duration = Duration::from_secs(20);

#[test]
fn two_senders_one_receive_qp_two_srqs() {
    let (ca, cb) = (open(A), open(B));
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let scq = ca.create_cq(64, None).unwrap();
    let (rcq1, rcq2) = (
        cb.create_cq(64, None).unwrap(),
        cb.create_cq(64, None).unwrap(),
    );
    let ma = pa.reg_mr(1 << 16, ALL).unwrap();
    ma.write(0, &pattern(1 << 16, 9)).unwrap();
    let mb = pb.reg_mr(1 << 16, ALL).unwrap();
    let xrcd = cb.open_xrcd();
    let attr = SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    };
    let srq1 = xrcd.create_srq(&pb, &rcq1, attr).unwrap();
    let srq2 = xrcd.create_srq(&pb, &rcq2, attr).unwrap();
    assert!(srq1.is_xrc() && srq1.srq_num() != srq2.srq_num());
    let other = cb.open_xrcd().create_srq(&pb, &rcq1, attr).unwrap();
    let tgt = xrcd.create_qp().unwrap();
    assert_eq!(tgt.qp_type(), QpType::XrcRecv);
    for (i, s) in [&srq1, &srq2].into_iter().enumerate() {
        for k in 0..4 {
            let off = (i * 4 + k) * 4096;
            s.post_recv(&RecvWr {
                wr_id: (i * 10 + k) as u64,
                sg_list: vec![mb.sge(off, 4096)].into(),
            })
            .unwrap();
        }
    }
    let ini: Vec<_> = (0..2)
        .map(|_| {
            pa.create_qp(&QpInitAttr {
                qp_type: QpType::XrcSend,
                send_cq: &scq,
                recv_cq: &scq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 16,
                    max_send_sge: 1,
                    ..QpCap::default()
                },
                sq_sig_all: true,
            })
            .unwrap()
        })
        .collect();
    // One receive QP serves one sender (its peer); the second sender gets a receive QP of its
    // own in the same domain, sharing the SRQs.
    let tgt2 = xrcd.create_qp().unwrap();
    for (s, t) in ini.iter().zip([&tgt, &tgt2]) {
        s.connect_to(IpAddr::from(B), t.qp_num(), Mtu::Mtu1024, 7, 9)
            .unwrap();
        t.connect_to(IpAddr::from(A), s.qp_num(), Mtu::Mtu1024, 9, 7)
            .unwrap();
    }
    let wr = |id: u64, op: WrOpcode, srq: u32, off: usize, len: u32, roff: u64| {
        let mut w = SendWr::new(id, op);
        w.send_flags = SendFlags::SIGNALED;
        w.sg_list = vec![ma.sge(off, len)].into();
        w.remote.remote_addr = mb.addr() + roff;
        w.remote.rkey = mb.rkey();
        w.remote_srqn = srq;
        w
    };
    let (n1, n2) = (srq1.srq_num(), srq2.srq_num());
    ini[0]
        .post_send(&wr(1, WrOpcode::Send, n1, 0, 3000, 0))
        .unwrap();
    ini[1]
        .post_send(&wr(2, WrOpcode::Send, n2, 4096, 100, 0))
        .unwrap();
    ini[1]
        .post_send(&wr(3, WrOpcode::SendWithImm, n1, 8192, 10, 0))
        .unwrap();
    ini[0]
        .post_send(&wr(4, WrOpcode::RdmaWrite, n2, 12_288, 2000, 40_000))
        .unwrap();
    ini[0]
        .post_send(&wr(5, WrOpcode::RdmaRead, n2, 20_000, 2000, 40_000))
        .unwrap();
    let wcs = wait(&scq, 5, T);
    assert_eq!(wcs.len(), 5, "{wcs:?}");
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let r1 = wait(&rcq1, 2, T);
    let r2 = wait(&rcq2, 1, T);
    let mut got1: Vec<_> = r1.iter().map(|w| (w.wr_id, w.byte_len, w.qp_num)).collect();
    got1.sort_unstable();
    assert_eq!(got1, vec![(0, 3000, tgt.qp_num()), (1, 10, tgt2.qp_num())]);
    assert_eq!(
        r1.iter().find(|w| w.wr_id == 1).unwrap().opcode,
        WcOpcode::Recv
    );
    assert_eq!(
        r2.iter().map(|w| (w.wr_id, w.byte_len)).collect::<Vec<_>>(),
        vec![(10, 100)]
    );
    let (a, b) = (ma.to_vec(), mb.to_vec());
    assert_eq!(b[..3000], a[..3000]);
    assert_eq!(b[4 * 4096..4 * 4096 + 100], a[4096..4196]);
    assert_eq!(b[40_000..42_000], a[12_288..14_288]);
    assert_eq!(
        a[20_000..22_000],
        a[12_288..14_288],
        "the READ brought the WRITE back"
    );

    // An SRQ of another domain: the peer refuses the request.
    ini[1]
        .post_send(&wr(6, WrOpcode::Send, other.srq_num(), 0, 8, 0))
        .unwrap();
    let w = wait(&scq, 1, T);
    assert_eq!(w[0].status, WcStatus::RemInvReqErr, "{w:?}");
    assert!(wait(&rcq1, 1, Duration::from_millis(200)).is_empty());
}
