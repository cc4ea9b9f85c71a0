//! Multicast over the UDP backend (`ibv_attach_mcast`): a UD send to an IP multicast group and
//! QPN 0xFFFFFF reaches every attached UD QP of every device that joined the group (the kernel
//! delivers the datagram to each group socket; loopback carries IP multicast locally), QPs
//! detached or not attached get nothing, and the kernel's refusals are kept.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::{ALL, open, pattern, wait};
use ferroce::transport::{
    AhAttr, QpCap, QpModify, QpState, QpType, RecvWr, SendFlags, SendWr, UdDest, WcFlags, WcStatus,
    WrOpcode,
};
use ferroce::{CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpInitAttr, QueuePair};

const QKEY: u32 = 0x0123_4567;
const MCAST_QPN: u32 = 0xFF_FFFF;

struct Ud {
    _ctx: Context,
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qps: Vec<QueuePair>,
    mr: MemoryRegion,
}

/// `n` UD QPs in RTS on a device at `addr`, one CQ, a 64 KiB region.
fn ud(addr: [u8; 4], n: usize) -> Ud {
    let ctx = open(addr);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None).unwrap();
    let qps = (0..n)
        .map(|_| {
            let qp = pd
                .create_qp(&QpInitAttr {
                    qp_type: QpType::Ud,
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: None,
                    cap: QpCap {
                        max_send_wr: 16,
                        max_recv_wr: 16,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_all: true,
                })
                .unwrap();
            qp.modify_with(
                &QpModify::new(QpState::Init)
                    .pkey_index(0)
                    .port_num(1)
                    .qkey(QKEY),
            )
            .unwrap();
            qp.modify_with(&QpModify::new(QpState::Rtr)).unwrap();
            qp.modify_with(&QpModify::new(QpState::Rts).sq_psn(0))
                .unwrap();
            qp
        })
        .collect();
    let mr = pd.reg_mr(64 << 10, ALL).unwrap();
    Ud {
        _ctx: ctx,
        _pd: pd,
        cq,
        qps,
        mr,
    }
}

fn post_recvs(u: &Ud, q: usize, count: u64) {
    for i in 0..count {
        let slot = (q as u64 * 16 + i) * 1024;
        u.qps[q]
            .post_recv(&RecvWr {
                wr_id: (q as u64) << 32 | i,
                sg_list: vec![u.mr.sge(slot as usize, 1024)].into(),
            })
            .unwrap();
    }
}

fn send(u: &Ud, group: IpAddr, id: u64, len: u32) {
    let mut w = SendWr::new(id, WrOpcode::SendWithImm);
    w.send_flags = SendFlags::SIGNALED;
    w.sg_list = vec![u.mr.sge(id as usize * 64, len)].into();
    w.imm_data = id as u32;
    w.ud = Some(UdDest {
        ah: AhAttr::new(group),
        remote_qpn: MCAST_QPN,
        remote_qkey: QKEY,
    });
    u.qps[0].post_send(&w).unwrap();
    let wc = wait(&u.cq, 1, Duration::from_secs(10));
    assert_eq!(wc.len(), 1, "the send completes");
    assert_eq!(wc[0].status, WcStatus::Success);
}

/// Receives on `u`'s CQ for up to `within`, by QP index.
fn received(u: &Ud, want: usize, within: Duration) -> Vec<(usize, u64, u32, u32)> {
    wait(&u.cq, want, within)
        .into_iter()
        .map(|wc| {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            assert!(wc.wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
            let q = u.qps.iter().position(|q| q.qp_num() == wc.qp_num).unwrap();
            (q, wc.wr_id & 0xFFFF_FFFF, wc.byte_len, wc.imm_data)
        })
        .collect()
}

#[test]
fn a_group_send_reaches_every_attached_qp_of_every_joined_device() {
    // QPs attach by MGID (the IPv4-mapped form rdma_cm gives); the AH is the group's address.
    let group: IpAddr = "::ffff:239.97.0.1".parse().unwrap();
    let to: IpAddr = "239.97.0.1".parse().unwrap();
    let sender = ud([127, 0, 97, 1], 1);
    let b = ud([127, 0, 97, 2], 3);
    let c = ud([127, 0, 97, 3], 1);
    sender.mr.write(0, &pattern(64 << 10, 9)).unwrap();
    b.qps[0].attach_mcast(group).unwrap();
    b.qps[1].attach_mcast(group).unwrap();
    b.qps[1].attach_mcast(group).unwrap(); // twice: not an error
    c.qps[0].attach_mcast(group).unwrap();
    for q in 0..3 {
        post_recvs(&b, q, 4);
    }
    post_recvs(&c, 0, 4);

    send(&sender, to, 1, 200);
    send(&sender, to, 2, 300);
    let mut got = received(&b, 4, Duration::from_secs(10));
    got.sort();
    assert_eq!(
        got,
        vec![
            (0, 0, 240, 1),
            (0, 1, 340, 2),
            (1, 0, 240, 1),
            (1, 1, 340, 2)
        ],
        "QPs 0 and 1 of b get both messages in order; QP 2 is not attached"
    );
    assert_eq!(received(&c, 2, Duration::from_secs(10)).len(), 2);
    // The bytes: the GRH (its IPv4 destination the group) and the payload.
    // QP 1's first receive holds message 1: 200 bytes from the sender's offset 64.
    let mut buf = vec![0u8; 1024];
    b.mr.read(16 * 1024, &mut buf).unwrap();
    assert_eq!(buf[36..40], [239, 97, 0, 1]);
    assert_eq!(buf[40..240], pattern(64 << 10, 9)[64..264]);

    // Detached, QP 0 gets no more; QP 1 still does.
    b.qps[0].detach_mcast(group).unwrap();
    assert_eq!(
        b.qps[0].detach_mcast(group).unwrap_err().errno(),
        libc::EINVAL
    );
    send(&sender, to, 3, 100);
    let got = received(&b, 1, Duration::from_secs(10));
    assert_eq!(got, vec![(1, 2, 140, 3)]);
    assert_eq!(received(&c, 1, Duration::from_secs(10)).len(), 1);
    assert!(
        received(&b, 1, Duration::from_millis(300)).is_empty(),
        "nothing for the detached QP"
    );
}

#[test]
fn attach_refuses_what_the_kernel_refuses() {
    let u = ud([127, 0, 97, 5], 1);
    let pd = u._pd.clone();
    let rc = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &u.cq,
            recv_cq: &u.cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })
        .unwrap();
    let group: IpAddr = "239.97.0.5".parse().unwrap();
    assert_eq!(rc.attach_mcast(group).unwrap_err().errno(), libc::EINVAL);
    let unicast: IpAddr = "10.1.2.3".parse().unwrap();
    assert_eq!(
        u.qps[0].attach_mcast(unicast).unwrap_err().errno(),
        libc::EINVAL
    );
}

/// A destroyed QP leaves its groups; a group left by every QP of the device takes nothing
/// (the socket is closed), and joining again works.
#[test]
fn destroying_the_last_attached_qp_leaves_the_group() {
    let group: IpAddr = "239.97.0.6".parse().unwrap();
    let sender = ud([127, 0, 97, 6], 1);
    let mut r = ud([127, 0, 97, 7], 2);
    r.qps[1].attach_mcast(group).unwrap();
    let gone = r.qps.remove(1);
    drop(gone);
    r.qps[0].attach_mcast(group).unwrap();
    post_recvs(&r, 0, 2);
    send(&sender, group, 1, 64);
    assert_eq!(received(&r, 1, Duration::from_secs(10)).len(), 1);
}

/// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB` (`QueuePair::block_self_multicast_loopback`): a QP's
/// own sends to a group it is attached to do not come back to it; the device's other attached
/// QP still gets them. Without the flag its own datagram comes back (mckey's default).
#[test]
fn a_qp_that_blocks_self_loopback_does_not_get_its_own_sends() {
    let group: IpAddr = "239.98.0.1".parse().unwrap();
    for block in [false, true] {
        let u = ud([127, 0, 221, 1 + u8::from(block)], 2);
        if block {
            u.qps[0].block_self_multicast_loopback().unwrap();
        }
        for q in 0..2 {
            u.qps[q].attach_mcast(group).unwrap();
            post_recvs(&u, q, 4);
        }
        let mut w = SendWr::new(7, WrOpcode::SendWithImm);
        w.send_flags = SendFlags::SIGNALED;
        w.sg_list = vec![u.mr.sge(0, 100)].into();
        w.imm_data = 7;
        w.ud = Some(UdDest {
            ah: AhAttr::new(group),
            remote_qpn: MCAST_QPN,
            remote_qkey: QKEY,
        });
        u.qps[0].post_send(&w).unwrap();
        let want = if block { 2 } else { 3 };
        let mut wcs = wait(&u.cq, want, Duration::from_secs(10));
        wcs.extend(wait(&u.cq, 1, Duration::from_millis(300)));
        let recvs: Vec<_> = wcs
            .iter()
            .filter(|w| w.opcode == ferroce::WcOpcode::Recv)
            .map(|w| u.qps.iter().position(|q| q.qp_num() == w.qp_num).unwrap())
            .collect();
        let expect = if block { vec![1] } else { vec![0, 1] };
        let mut got = recvs.clone();
        got.sort_unstable();
        assert_eq!(got, expect, "block {block}: receives by QP index");
        assert_eq!(wcs.len(), want, "block {block}: {wcs:?}");
    }
}
