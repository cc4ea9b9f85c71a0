//! The pump's rules over real UDP on loopback: the ACK of a received SEND leaves in the pump
//! that received it, so the sender's completion never waits for the receiving program to
//! answer, to poll again or to call any verb — whether the receiver's poll took the packet
//! in or its progress thread did, and whether the sender polls or sleeps on a channel.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::*;
use ferroce::transport::{Mtu, QpType, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus, WrOpcode};

const T: Duration = Duration::from_secs(20);

fn recv(s: &Side) -> RecvWr {
    RecvWr {
        wr_id: 7,
        sg_list: vec![s.mr.sge(0, 8)].into(),
    }
}

fn send(s: &Side, id: u64) -> SendWr {
    let mut w = SendWr::new(id, WrOpcode::Send);
    w.send_flags = SendFlags::SIGNALED;
    w.sg_list = vec![s.mr.sge(64, 8)].into();
    w
}

/// Polls `s` until a completion of `opcode` (others are checked and counted in `sends` if
/// SENDs); bounded.
fn spin_for(s: &Side, opcode: WcOpcode, sends: &mut u64) {
    let deadline = std::time::Instant::now() + T;
    loop {
        if let Some(wc) = s.cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if wc.opcode == WcOpcode::Send {
                *sends += 1;
            }
            if wc.opcode == opcode {
                return;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {opcode:?} in time"
        );
        std::hint::spin_loop();
    }
}

#[test]
fn a_send_completes_while_its_receiver_answers_nothing() {
    let (x, y) = pair(
        [127, 0, 92, 1],
        [127, 0, 92, 2],
        QpType::Rc,
        Mtu::Mtu1024,
        4096,
    );
    for i in 0..50 {
        y.qp.post_recv(&recv(&y)).unwrap();
        x.qp.post_send(&send(&x, i)).unwrap();
        spin_for(&y, WcOpcode::Recv, &mut 0);
        // y never answers: x's SEND completes all the same.
        spin_for(&x, WcOpcode::Send, &mut 0);
    }
}

#[test]
fn a_send_completes_while_its_receiver_calls_no_verb_and_nobody_polls() {
    let x = side([127, 0, 93, 1], QpType::Rc, 4096);
    let y = side([127, 0, 93, 2], QpType::Rc, 4096);
    // x's completions come through a channel: waiting for x polls nothing.
    let ch = x.ctx.create_comp_channel().unwrap();
    let xcq = x.ctx.create_cq(16, Some(&ch)).unwrap();
    let xqp =
        x.pd.create_qp(&ferroce::QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &xcq,
            recv_cq: &xcq,
            srq: None,
            cap: ferroce::transport::QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })
        .unwrap();
    let lo = |b: u8| std::net::IpAddr::from([127, 0, 93, b]);
    connect(&xqp, lo(2), y.qp.qp_num(), Mtu::Mtu1024, 100, 200);
    connect(&y.qp, lo(1), xqp.qp_num(), Mtu::Mtu1024, 200, 100);
    for i in 0..20 {
        y.qp.post_recv(&recv(&y)).unwrap();
        xcq.req_notify(false).unwrap();
        xqp.post_send(&send(&x, i)).unwrap();
        spin_for(&y, WcOpcode::Recv, &mut 0);
        // Nobody polls now: y's ACK left when y's poll took the SEND in.
        let cq = ch
            .get_event_timeout(T)
            .expect("the SEND was never acknowledged");
        cq.ack_events(1);
        let wc = xcq.poll_one().expect("an event, so a completion");
        assert_eq!((wc.opcode, wc.status), (WcOpcode::Send, WcStatus::Success));
    }
}
