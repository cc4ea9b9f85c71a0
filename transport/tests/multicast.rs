//! Multicast on RoCEv2: a UD send to QPN 0xFFFFFF and an IP multicast address reaches every
//! UD QP attached to that group on every host that joined it, each taking a receive WQE of its
//! own; QPs not attached, hosts not joined and a wrong Q_Key get nothing.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::IpAddr;

use common::statuses;
use ferroce_transport::memory::VecMr;
use ferroce_transport::sim::{LinkConfig, Network};
use ferroce_transport::{
    AccessFlags, AhAttr, Instant, MULTICAST_QPN, McastError, QpCap, QpInitAttr, QpModify, QpState,
    QpType, RecvWr, SendFlags, SendWr, UdDest, VerbError, WcFlags, WcQueue, WcStatus, WrOpcode,
};

const QKEY: u32 = 0x0123_4567;
const PD: u32 = 1;

fn group() -> IpAddr {
    "239.1.2.3".parse().unwrap()
}

/// A UD QP in RTS with Q_Key `qkey` on node `n`, and a 16 KiB region for it.
fn ud_qp(net: &mut Network, n: usize, qkey: u32) -> (u32, VecMr) {
    let node = &mut net.nodes[n];
    let init = QpInitAttr {
        qp_type: QpType::Ud,
        pd: PD,
        cap: QpCap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        srq: None,
        sq_sig_all: true,
        send_cq: 0,
        recv_cq: 0,
    };
    let qpn = node.endpoint.create_qp(init).unwrap();
    let now = Instant::ZERO;
    for m in [
        QpModify::new(QpState::Init)
            .pkey_index(0)
            .port_num(1)
            .qkey(qkey),
        QpModify::new(QpState::Rtr),
        QpModify::new(QpState::Rts).sq_psn(0),
    ] {
        node.endpoint
            .modify_qp(qpn, m.attr(), m.mask(), &node.mem, now)
            .unwrap();
    }
    let data: Vec<u8> = (0..16384u32).map(|i| (i * 7 + n as u32) as u8).collect();
    let mr = node.mem.register(PD, data, AccessFlags::LOCAL_WRITE);
    (qpn, mr)
}

fn post_recvs(net: &mut Network, n: usize, qpn: u32, mr: &VecMr, count: u64) {
    let node = &mut net.nodes[n];
    for i in 0..count {
        node.endpoint
            .post_recv(
                qpn,
                RecvWr {
                    wr_id: 100 + i,
                    sg_list: vec![mr.sge(i * 2048, 2048)].into(),
                },
                &node.mem,
                Instant::ZERO,
            )
            .unwrap();
    }
}

fn send_to_group(net: &mut Network, qpn: u32, mr: &VecMr, wr_id: u64, len: u32, qkey: u32) {
    let mut w = SendWr::new(wr_id, WrOpcode::SendWithImm);
    w.send_flags = SendFlags::SIGNALED;
    w.sg_list = vec![mr.sge(wr_id * 100, len)].into();
    w.imm_data = wr_id as u32;
    w.ud = Some(UdDest {
        ah: AhAttr::new(group()),
        remote_qpn: MULTICAST_QPN,
        remote_qkey: qkey,
    });
    let node = &mut net.nodes[0];
    node.endpoint
        .post_send(qpn, w, &node.mem, Instant::ZERO)
        .unwrap();
}

#[test]
fn a_send_to_a_group_reaches_every_attached_qp_of_every_joined_host() {
    let mut net = Network::new(41, 4, LinkConfig::default());
    let (sender, smr) = ud_qp(&mut net, 0, QKEY);
    // Node 1: two QPs attached. Node 2: one attached, one not. Node 3: attached, wrong Q_Key.
    let (a1, mra1) = ud_qp(&mut net, 1, QKEY);
    let (b1, mrb1) = ud_qp(&mut net, 1, QKEY);
    let (a2, mra2) = ud_qp(&mut net, 2, QKEY);
    let (b2, mrb2) = ud_qp(&mut net, 2, QKEY);
    let (a3, mra3) = ud_qp(&mut net, 3, 0x1111);
    for (n, qpn) in [(1, a1), (1, b1), (2, a2), (3, a3)] {
        let first = n == 1 && qpn == a1 || n == 2 || n == 3;
        // The mapped form of the MGID names the same group.
        let g: IpAddr = "::ffff:239.1.2.3".parse().unwrap();
        assert_eq!(net.nodes[n].endpoint.attach_mcast(qpn, g), Ok(first));
        net.join(n, group());
    }
    for (n, q, mr) in [
        (1, a1, &mra1),
        (1, b1, &mrb1),
        (2, a2, &mra2),
        (2, b2, &mrb2),
        (3, a3, &mra3),
    ] {
        post_recvs(&mut net, n, q, mr, 4);
    }
    for i in 1..=3 {
        send_to_group(&mut net, sender, &smr, i, 300 + i as u32, QKEY);
    }
    net.drive(100_000);
    assert_eq!(
        statuses(&net.nodes[0].completions_of(sender, WcQueue::Send)),
        vec![WcStatus::Success; 3]
    );
    for (n, q, mr) in [(1, a1, &mra1), (1, b1, &mrb1), (2, a2, &mra2)] {
        let r = net.nodes[n].completions_of(q, WcQueue::Recv);
        assert_eq!(r.len(), 3, "node {n} QP {q:#x}");
        let mem = net.nodes[n].mem.bytes(mr.lkey).unwrap();
        let sent = net.nodes[0].mem.bytes(smr.lkey).unwrap();
        for (i, wc) in r.iter().enumerate() {
            let k = i as u64 + 1;
            assert_eq!(wc.status, WcStatus::Success);
            assert_eq!(wc.byte_len, 40 + 300 + k as u32);
            assert_eq!(wc.src_qp, sender);
            assert_eq!(wc.imm_data, k as u32);
            assert!(wc.wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
            let at = i * 2048;
            // The GRH's IPv4 destination is the group.
            assert_eq!(mem[at + 36..at + 40], [239, 1, 2, 3]);
            let body = &mem[at + 40..at + 40 + 300 + k as usize];
            assert_eq!(
                body,
                &sent[(k * 100) as usize..(k * 100) as usize + 300 + k as usize]
            );
        }
    }
    assert!(net.nodes[2].completions_of(b2, WcQueue::Recv).is_empty());
    assert!(net.nodes[3].completions_of(a3, WcQueue::Recv).is_empty());
    assert_eq!(net.nodes[3].endpoint.counters().qkey_violations, 3);
    // The sender's host did not join: nothing of its own came back.
    assert_eq!(net.nodes[0].endpoint.counters().no_qp, 0);

    // Detached, a QP gets no more; the other QP of the host still does.
    assert_eq!(net.nodes[1].endpoint.detach_mcast(a1, group()), Ok(false));
    send_to_group(&mut net, sender, &smr, 4, 100, QKEY);
    net.drive(100_000);
    assert_eq!(net.nodes[1].completions_of(a1, WcQueue::Recv).len(), 3);
    assert_eq!(net.nodes[1].completions_of(b1, WcQueue::Recv).len(), 4);
    // A destroyed QP leaves its groups: the host that still gets the datagrams counts them
    // as for no QP.
    net.nodes[2].endpoint.destroy_qp(a2).unwrap();
    let before = net.nodes[2].endpoint.counters().no_qp;
    send_to_group(&mut net, sender, &smr, 5, 100, QKEY);
    net.drive(100_000);
    assert_eq!(net.nodes[2].endpoint.counters().no_qp, before + 1);
}

#[test]
fn attach_and_detach_refuse_what_the_kernel_refuses() {
    let mut net = Network::new(42, 1, LinkConfig::default());
    let (ud, _) = ud_qp(&mut net, 0, QKEY);
    let ep = &mut net.nodes[0].endpoint;
    let rc = ep.create_qp(common::rc_init(4)).unwrap();
    assert_eq!(
        ep.attach_mcast(rc, group()),
        Err(VerbError::Mcast(McastError::NotUd))
    );
    let unicast: IpAddr = "10.0.0.9".parse().unwrap();
    assert_eq!(
        ep.attach_mcast(ud, unicast),
        Err(VerbError::Mcast(McastError::NotMulticast(unicast)))
    );
    assert_eq!(
        ep.detach_mcast(ud, group()),
        Err(VerbError::Mcast(McastError::NotAttached(group())))
    );
    assert_eq!(
        ep.attach_mcast(0x77, group()),
        Err(VerbError::NoSuchQp(0x77))
    );
    assert_eq!(ep.attach_mcast(ud, group()), Ok(true));
    assert_eq!(
        ep.attach_mcast(ud, group()),
        Ok(false),
        "twice is not an error"
    );
    assert_eq!(ep.detach_mcast(ud, group()), Ok(true));
}

/// A packet for the multicast QPN sent to a unicast address, or an RC opcode sent to a
/// group, is dropped and counted.
#[test]
fn the_multicast_qpn_is_taken_only_for_ud_sends_to_a_group() {
    let mut net = Network::new(43, 2, LinkConfig::default());
    let (sender, smr) = ud_qp(&mut net, 0, QKEY);
    let (r, rmr) = ud_qp(&mut net, 1, QKEY);
    net.nodes[1].endpoint.attach_mcast(r, group()).unwrap();
    post_recvs(&mut net, 1, r, &rmr, 2);
    let mut w = SendWr::new(1, WrOpcode::Send);
    w.sg_list = vec![smr.sge(0, 64)].into();
    w.ud = Some(UdDest {
        ah: AhAttr::new(net.nodes[1].addr),
        remote_qpn: MULTICAST_QPN,
        remote_qkey: QKEY,
    });
    let node = &mut net.nodes[0];
    node.endpoint
        .post_send(sender, w, &node.mem, Instant::ZERO)
        .unwrap();
    net.drive(100_000);
    assert!(net.nodes[1].completions_of(r, WcQueue::Recv).is_empty());
    assert_eq!(net.nodes[1].endpoint.counters().no_qp, 1);
}

/// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`: a QP attached to the group it sends to does not get
/// its own datagrams back; another attached QP of its host does, and so does the QP without
/// the flag (mckey's default: loopback on).
#[test]
fn a_qp_that_blocks_self_loopback_does_not_receive_its_own_group_sends() {
    let mut net = Network::new(43, 2, LinkConfig::default());
    let (sender, smr) = ud_qp(&mut net, 0, QKEY);
    let (other, omr) = ud_qp(&mut net, 0, QKEY);
    let (remote, rmr) = ud_qp(&mut net, 1, QKEY);
    for (n, q) in [(0, sender), (0, other), (1, remote)] {
        net.nodes[n].endpoint.attach_mcast(q, group()).unwrap();
        net.join(n, group());
    }
    for (n, q, mr) in [(0, sender, &smr), (0, other, &omr), (1, remote, &rmr)] {
        post_recvs(&mut net, n, q, mr, 4);
    }
    // Without the flag its own datagram comes back to the sender.
    send_to_group(&mut net, sender, &smr, 1, 64, QKEY);
    net.drive(100_000);
    assert_eq!(net.nodes[0].completions_of(sender, WcQueue::Recv).len(), 1);
    net.nodes[0].endpoint.block_self_mcast_lb(sender).unwrap();
    send_to_group(&mut net, sender, &smr, 2, 64, QKEY);
    net.drive(100_000);
    assert_eq!(net.nodes[0].completions_of(sender, WcQueue::Recv).len(), 1);
    assert_eq!(net.nodes[0].completions_of(other, WcQueue::Recv).len(), 2);
    assert_eq!(net.nodes[1].completions_of(remote, WcQueue::Recv).len(), 2);
    assert_eq!(
        net.nodes[0].endpoint.block_self_mcast_lb(0xdead),
        Err(VerbError::NoSuchQp(0xdead))
    );
}
