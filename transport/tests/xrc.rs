//! XRC in the simulator: an XRC send QP's requests carry the XRCETH of the SRQ they are for;
//! the XRC receive QP takes each SEND's WQE from that SRQ, checks memory against its PD,
//! completes on its CQ, and answers with XRC opcodes; an SRQ outside the QP's domain is an
//! invalid request.

mod common;

use common::script::Script;
use common::*;
use ferroce_transport::sim::xrc::{CQ_A, CQ_B, XrcPair, xrc_pair};
use ferroce_transport::sim::{LinkConfig, run_seeds};
use ferroce_transport::{RecvWr, SendWr, Service, WcOpcode, WcQueue, WcStatus, WrOpcode};
use ferroce_wire::{Opcode, Transport};

const STEPS: u64 = 200_000;

fn xrc(seed: u64, link: LinkConfig) -> XrcPair {
    xrc_pair(seed, link)
}

#[test]
fn sends_land_in_the_srq_their_xrceth_names_and_complete_on_its_cq() {
    let mut x = xrc(1, lossless());
    let sc = Script::install(&mut x.net);
    let (a, b) = (x.srq_a, x.srq_b);
    // 3000 bytes at MTU 1024: FIRST, MIDDLE, LAST, each with the XRCETH.
    x.send(1, WrOpcode::Send, a, 0, 3000, 0);
    x.send(2, WrOpcode::Send, b, 5000, 100, 0);
    x.send(3, WrOpcode::SendWithImm, a, 6000, 10, 0);
    x.send(4, WrOpcode::RdmaWrite, b, 7000, 2000, 40_000);
    x.send(5, WrOpcode::RdmaRead, a, 20_000, 1500, 40_000);
    x.send(6, WrOpcode::AtomicFetchAndAdd, a, 30_000, 8, 48_000);
    assert!(x.run_until_sends(6));
    x.net.drive(STEPS);
    let wcs = x.net.nodes[0].completions_of(x.ini, WcQueue::Send);
    assert_eq!(statuses(&wcs), vec![WcStatus::Success; 6]);
    assert_eq!(wcs[4].opcode, WcOpcode::RdmaRead);
    // Each SEND took a WQE of the SRQ it named and completed on that SRQ's CQ, as the
    // receive QP's completion.
    assert_eq!(x.recv_on(CQ_A), vec![(0, 3000, x.tgt), (1, 10, x.tgt)]);
    assert_eq!(x.recv_on(CQ_B), vec![(10, 100, x.tgt)]);
    let (ma, mb) = (
        x.net.nodes[0].mem.bytes(x.mra.lkey).unwrap(),
        x.net.nodes[1].mem.bytes(x.mrb.lkey).unwrap(),
    );
    assert_eq!(mb[..3000], ma[..3000]);
    assert_eq!(mb[4 * 4096..4 * 4096 + 100], ma[5000..5100]);
    assert_eq!(mb[40_000..42_000], ma[7000..9000]);
    // The READ came back from what the WRITE put there.
    assert_eq!(ma[20_000..21_500], ma[7000..8500]);
    // On the wire: XRC opcodes both ways, an XRCETH on every request.
    let log = sc.borrow().log.clone();
    assert!(
        log.iter().all(|s| s.opcode.transport() == Transport::Xrc),
        "{log:?}"
    );
    assert!(
        log.iter()
            .filter(|s| s.from == 0)
            .all(|s| s.opcode.has_xrceth())
    );
    assert!(
        log.iter()
            .filter(|s| s.from == 1)
            .all(|s| !s.opcode.has_xrceth())
    );
    for op in [
        Opcode::XRC_SEND_FIRST,
        Opcode::XRC_SEND_MIDDLE,
        Opcode::XRC_SEND_LAST,
        Opcode::XRC_SEND_ONLY_WITH_IMMEDIATE,
        Opcode::XRC_RDMA_WRITE_FIRST,
        Opcode::XRC_RDMA_READ_REQUEST,
        Opcode::XRC_FETCH_ADD,
        Opcode::XRC_ACKNOWLEDGE,
        Opcode::XRC_RDMA_READ_RESPONSE_FIRST,
        Opcode::XRC_ATOMIC_ACKNOWLEDGE,
    ] {
        assert!(log.iter().any(|s| s.opcode == op), "no {op} on the wire");
    }
    assert_eq!(x.net.nodes[1].endpoint.counters().no_qp, 0);
}

#[test]
fn an_srq_of_another_domain_is_an_invalid_request() {
    for srqn in [None, Some(999)] {
        let mut x = xrc(2, lossless());
        let target = srqn.unwrap_or(x.srq_other);
        x.send(1, WrOpcode::Send, target, 0, 64, 0);
        assert!(x.run_until_sends(1));
        let wcs = x.net.nodes[0].completions_of(x.ini, WcQueue::Send);
        assert_eq!(wcs[0].status, WcStatus::RemInvReqErr, "SRQ {target}");
        assert!(x.recv_on(CQ_A).is_empty() && x.recv_on(CQ_B).is_empty());
        let err = x.net.nodes[0].endpoint.qp_error(x.ini).unwrap();
        assert!(format!("{err}").contains("invalid request"), "{err}");
    }
}

#[test]
fn xrc_recovers_from_loss_like_rc() {
    let lossy = LinkConfig {
        loss: 0.05,
        ..lossless()
    };
    run_seeds(30..34, |seed| {
        let mut x = xrc(seed, lossy);
        let (a, b) = (x.srq_a, x.srq_b);
        for k in 0..4u64 {
            x.send(k, WrOpcode::Send, a, k * 4096, 4096, 0);
            x.send(10 + k, WrOpcode::Send, b, k * 4096 + 7, 2500, 0);
        }
        if !x.run_until_sends(8) {
            return Err("not every send completed".into());
        }
        x.net.drive(STEPS);
        let wcs = x.net.nodes[0].completions_of(x.ini, WcQueue::Send);
        if statuses(&wcs) != vec![WcStatus::Success; 8] {
            return Err(format!("{:?}", statuses(&wcs)));
        }
        let (ra, rb) = (x.recv_on(CQ_A), x.recv_on(CQ_B));
        let want_a: Vec<_> = (0..4).map(|k| (k, 4096, x.tgt)).collect();
        let want_b: Vec<_> = (0..4).map(|k| (10 + k, 2500, x.tgt)).collect();
        if ra != want_a || rb != want_b {
            return Err(format!("{ra:?} {rb:?}"));
        }
        let (ma, mb) = (
            x.net.nodes[0].mem.bytes(x.mra.lkey).unwrap(),
            x.net.nodes[1].mem.bytes(x.mrb.lkey).unwrap(),
        );
        for k in 0..4usize {
            let (sa, sb) = (k * 4096, (4 + k) * 4096);
            if mb[sa..sa + 4096] != ma[k * 4096..k * 4096 + 4096]
                || mb[sb..sb + 2500] != ma[k * 4096 + 7..k * 4096 + 2507]
            {
                return Err(format!("message {k} corrupted"));
            }
        }
        Ok(())
    });
}

#[test]
fn xrc_transitions_follow_the_kernels_table() {
    use ferroce_transport::{QpAttrMask as M, QpState::*, state::transition};
    // XRC_RECV's RTR -> RTS takes only TIMEOUT and SQ_PSN; XRC_SEND's RTR needs no responder
    // resources, as the kernel's XRC_INI and XRC_TGT columns say.
    assert_eq!(
        transition(Service::XrcRecv, Rtr, Rts).unwrap().0,
        M::TIMEOUT | M::SQ_PSN
    );
    let (req, _) = transition(Service::XrcSend, Init, Rtr).unwrap();
    assert!(!req.contains(M::MAX_DEST_RD_ATOMIC) && req.contains(M::DEST_QPN));
    let (req, _) = transition(Service::XrcRecv, Init, Rtr).unwrap();
    assert!(req.contains(M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER));
    // RC's masks on XRC QPs: the bits the kernel ignores for the type are taken off.
    assert_eq!(
        Service::XrcSend.effective_mask(M::STATE | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER),
        M::STATE
    );
    assert_eq!(
        Service::XrcRecv
            .effective_mask(M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC),
        M::TIMEOUT
    );
    // Neither posts receives; the receive QP posts nothing.
    let mut x = xrc(3, lossless());
    let n = &mut x.net.nodes[1];
    let now = x.net.now;
    assert!(
        n.endpoint
            .post_send(x.tgt, SendWr::new(1, WrOpcode::Send), &n.mem, now)
            .is_err()
    );
    let n = &mut x.net.nodes[0];
    assert!(
        n.endpoint
            .post_send(x.ini, SendWr::new(1, WrOpcode::Flush), &n.mem, now)
            .is_err()
    );
    assert!(
        n.endpoint
            .post_recv(x.ini, RecvWr::default(), &n.mem, now)
            .is_err()
    );
}

#[test]
fn an_xrc_srqs_cq_is_in_use_and_a_receive_qps_is_not() {
    let mut x = xrc(4, lossless());
    let (a, tgt) = (x.srq_a, x.tgt);
    x.send(1, WrOpcode::Send, a, 0, 64, 0);
    assert!(x.run_until_sends(1));
    let ep = &mut x.net.nodes[1].endpoint;
    // The receive QP reported to CQ_A (its SRQ's), yet holds no CQ; CQ 0 was never named.
    assert!(ep.cq_in_use(CQ_A) && ep.cq_in_use(CQ_B) && !ep.cq_in_use(0));
    ep.destroy_srq(x.srq_b).unwrap();
    assert!(!ep.cq_in_use(CQ_B));
    assert!(ep.qp_state(tgt).is_some());
}

/// Two SRQs of one domain with different PDs: a long READ through the first is answered from
/// the first's PD even while a SEND through the second (its buffer in the other PD) arrives
/// between the READ's response packets.
#[test]
fn a_read_is_answered_through_the_pd_it_was_checked_against() {
    use ferroce_transport::sim::xrc::XRCD;
    use ferroce_transport::{AccessFlags, SrqAttr, XrcSrq};
    let mut x = xrc(5, lossless());
    let other_pd = 8;
    let n = &mut x.net.nodes[1];
    let mr8 = n
        .mem
        .register(other_pd, vec![0; 4096], AccessFlags::LOCAL_WRITE);
    let srq8 = n.endpoint.create_xrc_srq(
        SrqAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        },
        XrcSrq {
            xrcd: XRCD,
            pd: other_pd,
            cq: 70,
        },
    );
    n.endpoint
        .post_srq_recv(
            srq8,
            RecvWr {
                wr_id: 80,
                sg_list: vec![mr8.sge(0, 4096)].into(),
            },
        )
        .unwrap();
    // B's region holds a pattern to READ back (written by a first WRITE).
    x.send(1, WrOpcode::RdmaWrite, x.srq_a, 0, 32768, 0);
    assert!(x.run_until_sends(1));
    x.send(2, WrOpcode::RdmaRead, x.srq_a, 32768, 32768, 0);
    x.send(3, WrOpcode::Send, srq8, 0, 100, 0);
    assert!(x.run_until_sends(3));
    x.net.drive(STEPS);
    let wcs = x.net.nodes[0].completions_of(x.ini, WcQueue::Send);
    assert_eq!(statuses(&wcs), vec![WcStatus::Success; 3], "{wcs:?}");
    assert_eq!(x.recv_on(70), vec![(80, 100, x.tgt)]);
    let a = x.net.nodes[0].mem.bytes(x.mra.lkey).unwrap();
    assert_eq!(a[32768..65536], a[..32768]);
}
