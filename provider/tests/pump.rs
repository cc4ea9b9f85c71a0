//! The pump's rules over real UDP on loopback: a program that polls its CQ sees a completion
//! before the system call that carries its ACK, and the ACK waits for the program's answer
//! so that both leave in one `sendmmsg` (a SEND ping-pong costs one system call per message
//! per side, not two); an ACK whose program does not answer leaves at the program's next
//! empty poll, or, if the program stops polling altogether, from the progress thread.

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
fn a_ping_pong_sends_each_ack_with_the_answer() {
    let (x, y) = pair(
        [127, 0, 91, 1],
        [127, 0, 91, 2],
        QpType::Rc,
        Mtu::Mtu1024,
        4096,
    );
    x.qp.post_recv(&recv(&x)).unwrap();
    y.qp.post_recv(&recv(&y)).unwrap();
    let rounds = 400u64;
    let calls = |s: &Side| s.ctx.counters().1.send_calls;
    let (x0, y0) = (calls(&x), calls(&y));
    let (mut xsends, mut ysends) = (0u64, 0u64);
    for i in 0..rounds {
        x.qp.post_send(&send(&x, i)).unwrap();
        // y's poll takes the ping off the socket: its completion is there now, its ACK waits.
        spin_for(&y, WcOpcode::Recv, &mut ysends);
        y.qp.post_recv(&recv(&y)).unwrap();
        y.qp.post_send(&send(&y, i)).unwrap();
        spin_for(&x, WcOpcode::Recv, &mut xsends);
        x.qp.post_recv(&recv(&x)).unwrap();
    }
    let (xs, ys) = (calls(&x) - x0, calls(&y) - y0);
    // Without joining, each side makes two calls per round (its SEND, its ACK of the other's).
    // A round where the progress thread took the datagram first (it leaves the socket to a
    // polling program, but may hold it at the moment the program starts) makes two: allow a
    // quarter of the rounds.
    let most = rounds + rounds / 4 + 2;
    assert!(
        xs <= most && ys <= most,
        "{rounds} rounds took {xs} sendmmsg calls on x and {ys} on y (at most {most} each)"
    );
    // Every SEND of both sides completes.
    while xsends < rounds {
        spin_for(&x, WcOpcode::Send, &mut xsends);
    }
    while ysends < rounds {
        spin_for(&y, WcOpcode::Send, &mut ysends);
    }
}

#[test]
fn an_ack_without_an_answer_leaves_at_the_next_empty_poll() {
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
        // y never answers: x's SEND completes all the same (the next poll, of any CQ of the
        // process, sends the ACK y's device holds).
        spin_for(&x, WcOpcode::Send, &mut 0);
    }
}

#[test]
fn an_ack_held_for_a_program_that_stops_polling_leaves_from_the_progress_thread() {
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
        // Nobody polls now: the ACK y holds must leave without a poll.
        let cq = ch
            .get_event_timeout(T)
            .expect("the SEND was never acknowledged");
        cq.ack_events(1);
        let wc = xcq.poll_one().expect("an event, so a completion");
        assert_eq!((wc.opcode, wc.status), (WcOpcode::Send, WcStatus::Success));
    }
}
