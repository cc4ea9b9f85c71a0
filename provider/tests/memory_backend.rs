//! The driver over the in-memory backend (`OpenOptions::memory`): no socket, so what these
//! tests check is the runtime itself — each QP's messages in order, posts from several
//! threads on one QP and on many, a sleeping progress thread woken by a post, programs that
//! never poll, and (a property test) any interleaving of posts, polls and receives delivering
//! every message once, in order, intact.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ferroce::transport::{
    Mtu, QpCap, QpType, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use ferroce::{
    AccessFlags, CompletionQueue, Context, Device, MemoryRegion, OpenOptions, ProtectionDomain,
    QpInitAttr, QueuePair,
};
use proptest::prelude::*;

const T: Duration = Duration::from_secs(20);

fn open(a: [u8; 4]) -> Context {
    Device::for_addr(IpAddr::from(a))
        .unwrap()
        .open_with(OpenOptions {
            memory: Some(true),
            ..OpenOptions::default()
        })
        .unwrap()
}

struct Side {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    mr: MemoryRegion,
}

fn side(a: [u8; 4]) -> Side {
    let ctx = open(a);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(8192, None).unwrap();
    let mr = pd
        .reg_mr(
            1 << 20,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    Side { ctx, pd, cq, mr }
}

fn qp(s: &Side, cq: &CompletionQueue) -> QueuePair {
    s.pd.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    })
    .unwrap()
}

fn connect(a: &QueuePair, a_addr: [u8; 4], b: &QueuePair, b_addr: [u8; 4]) {
    a.connect_to(IpAddr::from(b_addr), b.qp_num(), Mtu::Mtu1024, 10, 20)
        .unwrap();
    b.connect_to(IpAddr::from(a_addr), a.qp_num(), Mtu::Mtu1024, 20, 10)
        .unwrap();
}

fn send(s: &Side, id: u64, off: usize, len: u32) -> SendWr {
    let mut w = SendWr::new(id, WrOpcode::Send);
    w.send_flags = SendFlags::SIGNALED;
    w.sg_list = vec![s.mr.sge(off, len)].into();
    w
}

fn write(s: &Side, peer: &Side, id: u64, off: usize, len: u32) -> SendWr {
    let mut w = SendWr::new(id, WrOpcode::RdmaWrite);
    w.send_flags = SendFlags::SIGNALED;
    w.sg_list = vec![s.mr.sge(off, len)].into();
    w.remote.remote_addr = peer.mr.addr() + off as u64;
    w.remote.rkey = peer.mr.rkey();
    w
}

fn recv(s: &Side, id: u64, off: usize, len: u32) -> RecvWr {
    RecvWr {
        wr_id: id,
        sg_list: vec![s.mr.sge(off, len)].into(),
    }
}

/// Polls until `n` completions (all successful) are in; bounded.
fn drain(cq: &CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + T;
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} completions",
            out.len()
        );
        match cq.poll_one() {
            Some(wc) => {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                out.push(wc);
            }
            None => std::thread::yield_now(),
        }
    }
    out
}

#[test]
fn a_qps_sends_arrive_in_order_and_no_socket_is_opened() {
    let (xa, ya) = ([127, 0, 95, 1], [127, 0, 95, 2]);
    let (x, y) = (side(xa), side(ya));
    let (qx, qy) = (qp(&x, &x.cq), qp(&y, &y.cq));
    connect(&qx, xa, &qy, ya);
    // No UDP socket holds the device's address: a plain one binds there.
    std::net::UdpSocket::bind((IpAddr::from(xa), 4791)).expect("the address is free");
    let n = 500u64;
    for i in 0..n {
        qy.post_recv(&recv(&y, i, (i as usize % 100) * 64, 64))
            .unwrap();
    }
    for i in 0..n {
        let off = (i as usize % 100) * 64;
        x.mr.write(off, &i.to_le_bytes()).unwrap();
        qx.post_send(&send(&x, i, off, 8)).unwrap();
        if i % 50 == 49 {
            // Let the window drain: a posted SEND's buffer is read when its packet is built.
            drain(&x.cq, 50);
        }
    }
    let got = drain(&y.cq, n as usize);
    for (i, wc) in got.iter().enumerate() {
        assert_eq!(
            (wc.opcode, wc.wr_id, wc.byte_len),
            (WcOpcode::Recv, i as u64, 8)
        );
    }
}

#[test]
fn posts_from_several_threads_on_one_qp_and_on_many() {
    let (xa, ya) = ([127, 0, 95, 3], [127, 0, 95, 4]);
    let (x, y) = (side(xa), side(ya));
    // One QP, four threads; then eight QPs, a thread each. Every WRITE a region of its own.
    let one = (qp(&x, &x.cq), qp(&y, &y.cq));
    connect(&one.0, xa, &one.1, ya);
    let many: Vec<(QueuePair, QueuePair)> = (0..8)
        .map(|_| {
            let p = (qp(&x, &x.cq), qp(&y, &y.cq));
            connect(&p.0, xa, &p.1, ya);
            p
        })
        .collect();
    let per = 100usize;
    let pattern = |k: usize| -> Vec<u8> { (0..64).map(|j| (k * 7 + j) as u8).collect() };
    for k in 0..(4 + 8) * per {
        x.mr.write(k * 64, &pattern(k)).unwrap();
    }
    std::thread::scope(|s| {
        for t in 0..4 {
            let (q, x, y) = (&one.0, &x, &y);
            s.spawn(move || {
                for i in 0..per {
                    let k = t * per + i;
                    q.post_send(&write(x, y, k as u64, k * 64, 64)).unwrap();
                }
            });
        }
        for (t, p) in many.iter().enumerate() {
            let (q, x, y) = (&p.0, &x, &y);
            s.spawn(move || {
                for i in 0..per {
                    let k = (4 + t) * per + i;
                    q.post_send(&write(x, y, k as u64, k * 64, 64)).unwrap();
                }
            });
        }
    });
    let got = drain(&x.cq, (4 + 8) * per);
    let mut ids: Vec<u64> = got.iter().map(|w| w.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..((4 + 8) * per) as u64).collect::<Vec<_>>());
    for k in 0..(4 + 8) * per {
        let mut b = vec![0u8; 64];
        y.mr.read(k * 64, &mut b).unwrap();
        assert_eq!(b, pattern(k), "WRITE {k}");
    }
}

#[test]
fn a_sleeping_runtime_is_woken_by_a_post_and_nobody_polls() {
    let (xa, ya) = ([127, 0, 95, 5], [127, 0, 95, 6]);
    let (x, y) = (side(xa), side(ya));
    let ch = x.ctx.create_comp_channel().unwrap();
    let cq = x.ctx.create_cq(16, Some(&ch)).unwrap();
    let (qx, qy) = (qp(&x, &cq), qp(&y, &y.cq));
    connect(&qx, xa, &qy, ya);
    for i in 0..20u64 {
        // Both progress threads sleep between WRITEs: nothing polls y, and x sleeps on its
        // channel, so the post's wake-up and the peer's receive are all that moves it.
        std::thread::sleep(Duration::from_millis(5));
        x.mr.write(0, &i.to_le_bytes()).unwrap();
        cq.req_notify(false).unwrap();
        qx.post_send(&write(&x, &y, i, 0, 8)).unwrap();
        let ev = ch.get_event_timeout(T).expect("the WRITE completed");
        ev.ack_events(1);
        let wc = cq.poll_one().expect("an event, so a completion");
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
        let mut b = [0u8; 8];
        y.mr.read(0, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), i);
    }
}

/// Spins on `s`'s CQ until a receive completion comes (send completions are skipped);
/// bounded.
fn spin_recv(s: &Side) -> WorkCompletion {
    let deadline = Instant::now() + T;
    loop {
        if let Some(wc) = s.cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if wc.opcode == WcOpcode::Recv {
                return wc;
            }
        }
        assert!(Instant::now() < deadline, "no receive completion");
        std::hint::spin_loop();
    }
}

/// A ping-pong in which `y` answers every message at once: once `y` has answered a few, the
/// bare ACK its poll builds waits for its answer and both leave in one send call, so `y` makes
/// about one call per message instead of two (ACK, then answer). One thread drives both ends
/// (as `ferroce lat` does), so a loaded machine's scheduler cannot put the answer far from the
/// receipt; a preempted iteration only sends one ACK alone.
#[test]
fn a_ping_pongs_ack_leaves_with_the_answer_in_one_send_call() {
    let (xa, ya) = ([127, 0, 95, 7], [127, 0, 95, 8]);
    let (x, y) = (side(xa), side(ya));
    let (qx, qy) = (qp(&x, &x.cq), qp(&y, &y.cq));
    connect(&qx, xa, &qy, ya);
    let (warm, n) = (50u64, 400u64);
    let calls = |s: &Side| s.ctx.counters().1.send_calls;
    let mut before = 0;
    qx.post_recv(&recv(&x, 0, 64, 8)).unwrap();
    qy.post_recv(&recv(&y, 0, 64, 8)).unwrap();
    for i in 0..warm + n {
        if i == warm {
            before = calls(&y);
        }
        x.mr.write(0, &i.to_le_bytes()).unwrap();
        qx.post_send(&send(&x, i, 0, 8)).unwrap();
        // y: the message, and its answer at once.
        let wc = spin_recv(&y);
        assert_eq!(wc.byte_len, 8);
        let mut b = [0u8; 8];
        y.mr.read(64, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), i, "message {i} intact");
        qy.post_recv(&recv(&y, i + 1, 64, 8)).unwrap();
        y.mr.write(0, &(i + 1_000_000).to_le_bytes()).unwrap();
        qy.post_send(&send(&y, i, 0, 8)).unwrap();
        // x: the answer.
        spin_recv(&x);
        x.mr.read(64, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), i + 1_000_000, "answer {i} intact");
        qx.post_recv(&recv(&x, i + 1, 64, 8)).unwrap();
    }
    let per = (calls(&y) - before) as f64 / n as f64;
    eprintln!("y: {per:.2} send calls per message");
    // Two calls per message when every ACK leaves alone; one when it waits for the answer.
    assert!(per < 1.5, "y made {per:.2} send calls per message");
}

/// A program that answered a few messages and then stops (it neither polls nor posts) does
/// not keep its peer's send from completing: the held ACK leaves on its own (the progress
/// thread's timer), with x not polling either until its device has received it.
#[test]
fn a_held_ack_leaves_when_the_program_stops_answering() {
    let (xa, ya) = ([127, 0, 95, 9], [127, 0, 95, 10]);
    let (x, y) = (side(xa), side(ya));
    let (qx, qy) = (qp(&x, &x.cq), qp(&y, &y.cq));
    connect(&qx, xa, &qy, ya);
    let warm = 20u64;
    for i in 0..=warm {
        qy.post_recv(&recv(&y, i, 64, 8)).unwrap();
    }
    // x's SENDs of the warm-up complete silently: its CQ holds only its receives.
    let quiet = |i: u64| {
        let mut w = send(&x, i, 0, 8);
        w.send_flags = SendFlags::EMPTY;
        w
    };
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|sc| {
        sc.spawn(move || {
            for i in 0..warm {
                spin_recv(&y);
                qy.post_send(&send(&y, i, 0, 8)).unwrap();
            }
            go_rx.recv_timeout(T).unwrap();
            // The last message: received by this poll, never answered.
            spin_recv(&y);
            stop_tx.send(()).unwrap();
        });
        for i in 0..warm {
            qx.post_recv(&recv(&x, i, 64, 8)).unwrap();
            qx.post_send(&quiet(i)).unwrap();
            spin_recv(&x);
        }
        // Every ACK of the warm-up came with y's answers, which are all in.
        let rcvd = x.ctx.counters().1.udp_rcvd;
        go_tx.send(()).unwrap();
        qx.post_send(&send(&x, warm, 0, 8)).unwrap();
        stop_rx
            .recv_timeout(T)
            .expect("y received the last message");
        // Neither program calls the library now: only y's runtime can send the ACK.
        let deadline = Instant::now() + T;
        while x.ctx.counters().1.udp_rcvd == rcvd {
            assert!(Instant::now() < deadline, "the held ACK never left");
            std::thread::sleep(Duration::from_millis(1));
        }
        let wc = drain(&x.cq, 1);
        assert_eq!((wc[0].wr_id, wc[0].opcode), (warm, WcOpcode::Send));
    });
}

/// Polls `who` once: a receive completion goes to `y_got`, a send completion counts in
/// `x_done`.
fn poll(who: &Side, x_done: &mut usize, y_got: &mut Vec<WorkCompletion>) {
    if let Some(wc) = who.cq.poll_one() {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        if wc.opcode == WcOpcode::Recv {
            y_got.push(wc);
        } else {
            *x_done += 1;
        }
    }
}

/// One step of a program driving both ends from one thread.
#[derive(Debug, Clone)]
enum Step {
    /// x posts SENDs of these lengths.
    Send(Vec<u8>),
    /// y posts this many receives.
    Recv(u8),
    /// x polls its CQ once.
    PollX,
    /// y polls its CQ once.
    PollY,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        prop::collection::vec(1u8..=200, 1..8).prop_map(Step::Send),
        (1u8..8).prop_map(Step::Recv),
        Just(Step::PollX),
        Just(Step::PollY),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// Whatever the order of posts, polls and receives, every SEND arrives once, in order,
    /// with its bytes, and every WR completes successfully (a SEND before its receive is
    /// posted waits on RNR and goes again).
    #[test]
    fn any_interleaving_delivers_every_send_once_in_order(
        steps in prop::collection::vec(step(), 1..40),
        salt in any::<u8>(),
    ) {
        use std::sync::atomic::{AtomicU32, Ordering};
        // Two addresses of their own per case (shrinking runs many).
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let (hi, lo) = ((n >> 7) as u8, ((n & 127) * 2) as u8);
        let (xa, ya) = ([127, 97, hi, lo], [127, 97, hi, lo + 1]);
        let (x, y) = (side(xa), side(ya));
        let (qx, qy) = (qp(&x, &x.cq), qp(&y, &y.cq));
        qx.connect_to(IpAddr::from(ya), qy.qp_num(), Mtu::Mtu1024, 10, 20).unwrap();
        qy.connect_to(IpAddr::from(xa), qx.qp_num(), Mtu::Mtu1024, 20, 10).unwrap();
        let mut sent: Vec<Vec<u8>> = Vec::new();
        let (mut recvs, mut x_done, mut y_got) = (0usize, 0usize, Vec::new());
        for s in &steps {
            match s {
                Step::Send(lens) => {
                    for &len in lens {
                        let k = sent.len();
                        let bytes: Vec<u8> = (0..len).map(|j| j ^ salt ^ k as u8).collect();
                        // Each SEND from a slot of its own, untouched until the end.
                        x.mr.write(k * 256, &bytes).unwrap();
                        qx.post_send(&send(&x, k as u64, k * 256, u32::from(len))).unwrap();
                        sent.push(bytes);
                    }
                }
                Step::Recv(n) => {
                    for _ in 0..*n {
                        qy.post_recv(&recv(&y, recvs as u64, recvs * 256, 256)).unwrap();
                        recvs += 1;
                    }
                }
                Step::PollX => poll(&x, &mut x_done, &mut y_got),
                Step::PollY => poll(&y, &mut x_done, &mut y_got),
            }
        }
        // Enough receives for every SEND, then drain both ends.
        while recvs < sent.len() {
            qy.post_recv(&recv(&y, recvs as u64, recvs * 256, 256)).unwrap();
            recvs += 1;
        }
        let deadline = Instant::now() + T;
        while (x_done < sent.len() || y_got.len() < sent.len()) && Instant::now() < deadline {
            poll(&x, &mut x_done, &mut y_got);
            poll(&y, &mut x_done, &mut y_got);
        }
        prop_assert_eq!(x_done, sent.len());
        prop_assert_eq!(y_got.len(), sent.len());
        for (k, wc) in y_got.iter().enumerate() {
            // The k-th receive completion is the k-th receive, holding the k-th SEND.
            prop_assert_eq!(wc.wr_id, k as u64);
            prop_assert_eq!(wc.byte_len as usize, sent[k].len());
            let mut b = vec![0u8; sent[k].len()];
            y.mr.read(k * 256, &mut b).unwrap();
            prop_assert_eq!(&b, &sent[k]);
        }
    }
}
