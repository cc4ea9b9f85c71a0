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
    // x's completions come through a channel: waiting for x polls nothing.
    let Sleeper {
        side: x,
        ch,
        cq: xcq,
        qp: xqp,
    } = sleeper([127, 0, 93, 1]);
    let y = side([127, 0, 93, 2], QpType::Rc, 4096);
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

/// A program that polled its CQ and then stops polling to spin on its memory (perftest's
/// ib_write_lat waiting for the peer's WRITE) still gets the WRITE: while a program polls, its
/// progress thread leaves the socket to it, and it must take the socket back once the polls
/// stop (the window, `INLINE_WINDOW`). The writer's completion needs that thread's ACK too.
#[test]
fn a_write_lands_while_its_target_spins_on_memory_after_polling() {
    let (x, y) = pair(
        [127, 0, 99, 1],
        [127, 0, 99, 2],
        QpType::Rc,
        Mtu::Mtu1024,
        4096,
    );
    for round in 0..5u8 {
        // y polls (nothing comes) until its last poll is fresh, then only reads its memory.
        for _ in 0..100 {
            assert!(y.cq.poll_one().is_none());
        }
        let data = pattern(8, round);
        x.mr.write(0, &data).unwrap();
        x.qp.post_send(&wr(&x, &y, u64::from(round), WrOpcode::RdmaWrite, 0, 8, 64))
            .unwrap();
        let deadline = std::time::Instant::now() + T;
        let mut got = [0u8; 8];
        loop {
            y.mr.read(64, &mut got).unwrap();
            if got[..] == data[..] {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: the WRITE never landed while its target did not poll"
            );
            std::thread::yield_now();
        }
        let wc = wait(&x.cq, 1, T);
        assert_eq!(wc.len(), 1, "round {round}: the WRITE never completed");
        assert_eq!(
            (wc[0].opcode, wc[0].status, wc[0].wr_id),
            (WcOpcode::RdmaWrite, WcStatus::Success, u64::from(round))
        );
    }
}

/// A program that answered a few messages, receives the last one and at once destroys its QP
/// and closes its device (ibv_rc_pingpong's end) does not take the ACK of that message with
/// it: the ACK its poll held for an answer leaves when the QP is destroyed (a NIC's or rxe's
/// ACK is on the wire whatever the program does next), and the peer's last SEND completes
/// successfully instead of retrying into "retry counter exceeded".
#[test]
fn a_held_ack_leaves_when_the_program_destroys_its_qp_and_closes_at_once() {
    for round in 0..10u8 {
        let (x, y) = pair(
            [127, 0, 94, 1 + 2 * round],
            [127, 0, 94, 2 + 2 * round],
            QpType::Rc,
            Mtu::Mtu1024,
            4096,
        );
        let warm = 20u64;
        for _ in 0..=warm {
            y.qp.post_recv(&recv(&y)).unwrap();
        }
        std::thread::scope(|sc| {
            sc.spawn(move || {
                for i in 0..warm {
                    spin_for(&y, WcOpcode::Recv, &mut 0);
                    let mut w = send(&y, i);
                    w.send_flags = SendFlags::EMPTY;
                    y.qp.post_send(&w).unwrap();
                }
                // The last message: received by this poll, never answered; then the end.
                spin_for(&y, WcOpcode::Recv, &mut 0);
                drop(y);
            });
            for i in 0..warm {
                x.qp.post_recv(&recv(&x)).unwrap();
                // The warm-up's SENDs complete silently: x's CQ holds only its receives.
                let mut w = send(&x, i);
                w.send_flags = SendFlags::EMPTY;
                x.qp.post_send(&w).unwrap();
                spin_for(&x, WcOpcode::Recv, &mut 0);
            }
            x.qp.post_send(&send(&x, warm)).unwrap();
        });
        // The last SEND completes, successfully (spin_for checks the status).
        spin_for(&x, WcOpcode::Send, &mut 0);
    }
}

/// A busy ping-pong on loopback, where each side holds the ACK of what it received for its
/// answer and the two leave as one train, the answer first (`mmsg`): each side's SEND still
/// completes before the answer to it is received, as with a NIC, which ACKs before the
/// program answers (perftest's `-e` waits on both CQs through one channel and relies on it).
#[test]
fn a_held_ack_rides_behind_the_answer_and_the_send_still_completes_first() {
    let (x, y) = pair(
        [127, 0, 98, 1],
        [127, 0, 98, 2],
        QpType::Rc,
        Mtu::Mtu1024,
        4096,
    );
    let rounds = 3000u64;
    let trains = || x.ctx.counters().1.trains + y.ctx.counters().1.trains;
    let before = trains();
    y.qp.post_recv(&recv(&y)).unwrap();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut sends = 0;
            for i in 0..rounds {
                spin_for(&y, WcOpcode::Recv, &mut sends);
                // Message i came with the ACK of answer i - 1.
                assert_eq!(
                    sends,
                    i,
                    "y: message {i} received before its answer {} completed",
                    i.max(1) - 1
                );
                y.qp.post_recv(&recv(&y)).unwrap();
                y.qp.post_send(&send(&y, i)).unwrap();
            }
            spin_for(&y, WcOpcode::Send, &mut sends);
        });
        let mut sends = 0;
        for i in 0..rounds {
            x.qp.post_recv(&recv(&x)).unwrap();
            x.qp.post_send(&send(&x, i)).unwrap();
            spin_for(&x, WcOpcode::Recv, &mut sends);
            assert_eq!(
                sends,
                i + 1,
                "x: answer {i} received before its SEND completed"
            );
        }
    });
    // The rounds went the way this test is about: answers with ACKs behind them in trains.
    let n = trains() - before;
    assert!(
        n > 0,
        "no answer left with its ACK in a train in {rounds} rounds"
    );
}

/// One end of a blocking ping-pong: a CQ on a completion channel and a QP on it.
struct Sleeper {
    side: Side,
    ch: ferroce::CompletionChannel,
    cq: ferroce::CompletionQueue,
    qp: ferroce::QueuePair,
}

fn sleeper(addr: [u8; 4]) -> Sleeper {
    let side = side(addr, QpType::Rc, 4096);
    let ch = side.ctx.create_comp_channel().unwrap();
    let cq = side.ctx.create_cq(64, Some(&ch)).unwrap();
    let qp = side
        .pd
        .create_qp(&ferroce::QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
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
    Sleeper { side, ch, cq, qp }
}

impl Sleeper {
    /// Sleeps on the channel (arm, poll again, get the event) until a receive completes.
    fn wait_recv(&self) {
        let deadline = std::time::Instant::now() + T;
        loop {
            while let Some(wc) = self.cq.poll_one() {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                if wc.opcode == WcOpcode::Recv {
                    return;
                }
            }
            self.cq.req_notify(false).unwrap();
            if let Some(wc) = self.cq.poll_one() {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                if wc.opcode == WcOpcode::Recv {
                    return;
                }
                continue;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let cq = self.ch.get_event_timeout(left).expect("no receive in time");
            cq.ack_events(1);
        }
    }
}

/// Two programs ping-pong, each asleep on its completion channel between messages: the
/// sleeping program receives the datagram that wakes it (`sleeper_recvs`; typically most of
/// them, never one before, when the progress thread took every datagram and then woke the
/// program: two wake-ups per message).
#[test]
fn a_program_asleep_on_its_channel_receives_for_itself() {
    let (x, y) = (sleeper([127, 0, 95, 1]), sleeper([127, 0, 95, 2]));
    let lo = |b: u8| std::net::IpAddr::from([127, 0, 95, b]);
    connect(&x.qp, lo(2), y.qp.qp_num(), Mtu::Mtu1024, 100, 200);
    connect(&y.qp, lo(1), x.qp.qp_num(), Mtu::Mtu1024, 200, 100);
    let before = |s: &Sleeper| s.side.ctx.counters().1;
    let (bx, by) = (before(&x), before(&y));
    let iters = 300u64;
    let ping = |s: &Sleeper, i: u64| {
        let mut w = send(&s.side, i);
        // Every 8th signalled, so the send queue's slots come back.
        if i % 8 != 7 {
            w.send_flags = SendFlags::EMPTY;
        }
        s.qp.post_send(&w).unwrap();
    };
    let post_recv = |s: &Sleeper| {
        s.qp.post_recv(&recv(&s.side)).unwrap();
    };
    post_recv(&x);
    post_recv(&y);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for i in 0..iters {
                y.wait_recv();
                post_recv(&y);
                ping(&y, i);
            }
        });
        for i in 0..iters {
            ping(&x, i);
            x.wait_recv();
            post_recv(&x);
        }
    });
    let (ax, ay) = (before(&x), before(&y));
    let sleeper_recvs = ax.sleeper_recvs - bx.sleeper_recvs + ay.sleeper_recvs - by.sleeper_recvs;
    let wakeups = ax.wakeups - bx.wakeups + ay.wakeups - by.wakeups;
    let rcvd = ax.udp_rcvd - bx.udp_rcvd + ay.udp_rcvd - by.udp_rcvd;
    eprintln!("sleeper_recvs {sleeper_recvs} wakeups {wakeups} datagrams {rcvd}");
    assert!(rcvd >= 2 * iters, "{rcvd} datagrams");
    // Two receipts per round trip; a loaded machine may leave some to the progress threads.
    assert!(
        sleeper_recvs >= iters / 4,
        "the sleepers received {sleeper_recvs} times in {iters} round trips"
    );
}
