//! The connection manager in the simulator: two CM engines (A active at 10.0.0.1, B passive
//! at 10.0.0.2) joined by a scripted network with a 1 ms latency, every loss and duplicate of
//! IBTA ch. 12's timers and retries, deterministically (simulated time).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Duration;

use ferroce_transport::cm::{
    BOUND_REQ_HOLD, CmConfig, CmEngine, CmError, CmEvent, ConnParam, ConnectReq, Path, State,
};
use ferroce_transport::{Instant, Mtu};
use ferroce_wire::cm::{Message, port_space, service_id};

const SID: u64 = service_id(port_space::TCP, 7174);
const MS: Duration = Duration::from_millis(1);

fn addr(n: u8) -> IpAddr {
    IpAddr::from([10, 0, 0, n])
}

/// A rule dropping (or duplicating) the first `times` messages of a name from a side.
struct Rule {
    from: usize,
    name: &'static str,
    times: u32,
    dup: bool,
}

struct Net {
    cm: [CmEngine; 2],
    now: Instant,
    /// (deliver at, to, mad)
    wire: VecDeque<(Instant, usize, [u8; 256])>,
    events: [Vec<(Instant, CmEvent)>; 2],
    /// Names of the messages each side sent, in order.
    sent: [Vec<&'static str>; 2],
    rules: Vec<Rule>,
    down: [bool; 2],
}

impl Net {
    fn new() -> Net {
        let cfg = |n: u8| CmConfig {
            ca_guid: 0x0200_00ff_fe00_0000 | u64::from(n),
            comm_id_prefix: n,
            local_ca_ack_delay: 15,
            seed: u64::from(n) * 77,
        };
        Net {
            cm: [CmEngine::new(cfg(1)), CmEngine::new(cfg(2))],
            now: Instant::ZERO,
            wire: VecDeque::new(),
            events: [Vec::new(), Vec::new()],
            sent: [Vec::new(), Vec::new()],
            rules: Vec::new(),
            down: [false; 2],
        }
    }

    fn drop_first(&mut self, from: usize, name: &'static str, times: u32) {
        self.rules.push(Rule {
            from,
            name,
            times,
            dup: false,
        });
    }

    fn dup_first(&mut self, from: usize, name: &'static str, times: u32) {
        self.rules.push(Rule {
            from,
            name,
            times,
            dup: true,
        });
    }

    /// Moves what the engines sent onto the wire and their events into the logs.
    fn collect(&mut self) {
        for side in 0..2 {
            while let Some(o) = self.cm[side].poll_transmit() {
                // Answers to strangers (the garbage test's 10.0.0.3) leave the network.
                let to = match o.dest {
                    d if d == addr(1) => 0,
                    d if d == addr(2) => 1,
                    _ => continue,
                };
                assert_ne!(to, side, "a MAD addressed to its own sender");
                let name = Message::parse(&o.mad).map(|(_, m)| m.name()).unwrap_or("?");
                self.sent[side].push(name);
                let mut copies = 1;
                for r in self.rules.iter_mut() {
                    if r.from == side && r.name == name && r.times > 0 {
                        r.times -= 1;
                        copies = if r.dup { 2 } else { 0 };
                        break;
                    }
                }
                if self.down[side] || self.down[to] {
                    copies = 0;
                }
                for _ in 0..copies {
                    self.wire.push_back((self.now + MS, to, o.mad));
                }
            }
            while let Some(e) = self.cm[side].poll_event() {
                self.events[side].push((self.now, e));
            }
        }
    }

    /// Runs until `until` (simulated), delivering and firing timers in time order.
    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        loop {
            self.collect();
            let next_wire = self.wire.iter().map(|w| w.0).min();
            let next_timer = [self.cm[0].poll_timeout(), self.cm[1].poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            let Some(t) = [next_wire, next_timer].into_iter().flatten().min() else {
                self.now = end;
                return;
            };
            if t > end {
                self.now = end;
                return;
            }
            self.now = t.max(self.now);
            if next_wire == Some(t) {
                let i = self.wire.iter().position(|w| w.0 == t).unwrap();
                let (_, to, mad) = self.wire.remove(i).unwrap();
                let from = addr(2 - to as u8);
                self.cm[to].handle_mad(self.now, from, &mad);
            } else {
                self.cm[0].handle_timeout(self.now);
                self.cm[1].handle_timeout(self.now);
            }
        }
    }

    fn take_events(&mut self, side: usize) -> Vec<CmEvent> {
        self.collect();
        std::mem::take(&mut self.events[side])
            .into_iter()
            .map(|(_, e)| e)
            .collect()
    }

    fn connect(&mut self, private: &[u8]) -> u32 {
        let r = ConnectReq {
            service_id: SID,
            path: Path {
                local: addr(1),
                remote: addr(2),
                mtu: Mtu::Mtu1024,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0x612F6,
            },
            qpn: 0x11,
            transport_service_type: 0,
            param: ConnParam {
                private_data: private.to_vec(),
                responder_resources: 4,
                initiator_depth: 2,
                retry_count: 5,
                rnr_retry_count: 7,
                ..ConnParam::default()
            },
            ack_timeout: 19,
        };
        let now = self.now;
        self.cm[0].connect(now, r).unwrap()
    }

    fn accept(&mut self, id: u32) {
        let now = self.now;
        let p = ConnParam {
            qp_num: 0x22,
            responder_resources: 2,
            initiator_depth: 4,
            rnr_retry_count: 6,
            ..ConnParam::default()
        };
        self.cm[1].accept(now, id, p).unwrap();
    }

    /// Connects, accepts, establishes; returns (A's id, B's id).
    fn established(&mut self) -> (u32, u32) {
        assert!(self.cm[1].listen(SID).is_ok());
        let a = self.connect(b"hello");
        self.run_for(10 * MS);
        let b = match self.take_events(1).as_slice() {
            [CmEvent::ConnectRequest { id, .. }] => *id,
            other => panic!("{other:?}"),
        };
        self.accept(b);
        self.run_for(10 * MS);
        assert!(matches!(
            self.take_events(0).as_slice(),
            [CmEvent::ConnectResponse { .. }]
        ));
        let now = self.now;
        self.cm[0].establish(now, a).unwrap();
        self.run_for(10 * MS);
        assert_eq!(self.take_events(0), vec![CmEvent::Established { id: a }]);
        assert_eq!(self.take_events(1), vec![CmEvent::Established { id: b }]);
        (a, b)
    }
}

#[test]
fn a_connection_goes_up_with_crossed_values_and_closes() {
    let mut n = Net::new();
    n.cm[1].listen(SID).unwrap();
    let a = n.connect(b"hello");
    assert_eq!(a >> 24, 1, "the comm ID carries the engine's prefix");
    n.run_for(10 * MS);
    let (b, info, pd) = match n.take_events(1).remove(0) {
        CmEvent::ConnectRequest {
            id,
            peer,
            info,
            private_data,
        } => {
            assert_eq!(peer, addr(1));
            (id, info, private_data)
        }
        other => panic!("{other:?}"),
    };
    // The passive side sees the depths swapped (cm-facts §3.2).
    assert_eq!((info.responder_resources, info.initiator_depth), (2, 4));
    assert_eq!(
        (info.retry_count, info.rnr_retry_count, info.remote_qpn),
        (5, 7, 0x11)
    );
    assert_eq!(pd.len(), 92);
    assert_eq!(&pd[..5], b"hello");
    // Before the accept the plan is the request's (a program bringing its own QP up reads it
    // first); the PSN it advertises stays the same through the accept.
    let early = n.cm[1].qp_plan(b).unwrap();
    assert_eq!(
        (early.rtr.0.max_dest_rd_atomic, early.rts.0.max_rd_atomic),
        (2, 4)
    );
    n.accept(b);
    assert_eq!(n.cm[1].qp_plan(b).unwrap().rtr.0.rq_psn, early.rtr.0.rq_psn);
    n.run_for(10 * MS);
    let info = match n.take_events(0).remove(0) {
        CmEvent::ConnectResponse {
            info, private_data, ..
        } => {
            assert_eq!(private_data.len(), 196);
            info
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (
            info.remote_qpn,
            info.initiator_depth,
            info.responder_resources
        ),
        (0x22, 2, 4)
    );
    let now = n.now;
    n.cm[0].establish(now, a).unwrap();
    n.run_for(10 * MS);
    assert_eq!(n.take_events(0), vec![CmEvent::Established { id: a }]);
    assert_eq!(n.take_events(1), vec![CmEvent::Established { id: b }]);
    // The plans meet: each side sends with the PSN the other expects, to the other's QP.
    let pa = n.cm[0].qp_plan(a).unwrap();
    let pb = n.cm[1].qp_plan(b).unwrap();
    assert_eq!(pa.rts.0.sq_psn, pb.rtr.0.rq_psn);
    assert_eq!(pb.rts.0.sq_psn, pa.rtr.0.rq_psn);
    assert_eq!((pa.rtr.0.dest_qp_num, pb.rtr.0.dest_qp_num), (0x22, 0x11));
    // A: max_rd_atomic = B's initiator... B's responder_resources (2); max_dest = B's
    // initiator_depth (4). B programs what it accepted.
    assert_eq!(
        (pa.rts.0.max_rd_atomic, pa.rtr.0.max_dest_rd_atomic),
        (2, 4)
    );
    assert_eq!(
        (pb.rts.0.max_rd_atomic, pb.rtr.0.max_dest_rd_atomic),
        (4, 2)
    );
    // retry_cnt is A's on both; rnr_retry the other side's.
    assert_eq!((pa.rts.0.retry_cnt, pb.rts.0.retry_cnt), (5, 5));
    assert_eq!((pa.rts.0.rnr_retry, pb.rts.0.rnr_retry), (6, 7));
    assert_eq!(
        (pa.rtr.0.min_rnr_timer, pa.rts.0.timeout, pb.rts.0.timeout),
        (0, 19, 19)
    );
    assert_eq!(pb.rtr.0.ah_attr.unwrap().dest, addr(1));
    assert_eq!(pb.rtr.0.ah_attr.unwrap().flow_label, 0x612F6);
    // A closes: B hears it, answers with its own disconnect; both end in timewait.
    let now = n.now;
    n.cm[0].disconnect(now, a).unwrap();
    n.run_for(10 * MS);
    assert_eq!(
        n.take_events(1),
        vec![CmEvent::Disconnected {
            id: b,
            timed_out: false
        }]
    );
    assert_eq!(n.cm[1].state(b), Some(State::DreqRcvd));
    let now = n.now;
    n.cm[1].disconnect(now, b).unwrap();
    n.run_for(10 * MS);
    assert_eq!(
        n.take_events(0),
        vec![CmEvent::Disconnected {
            id: a,
            timed_out: false
        }]
    );
    n.run_for(Duration::from_secs(3));
    assert_eq!(n.take_events(0), vec![CmEvent::TimewaitExit { id: a }]);
    assert_eq!(n.take_events(1), vec![CmEvent::TimewaitExit { id: b }]);
    assert!(n.cm[0].is_empty() && n.cm[1].is_empty());
    assert_eq!(n.sent[0], ["REQ", "RTU", "DREQ"]);
    assert_eq!(n.sent[1], ["REP", "DREP"]);
}

#[test]
fn a_mad_cut_short_is_dropped_not_answered() {
    // Found by `ferroce fuzz --campaign cm`: a REQ cut to 200 bytes was taken as a REQ whose
    // missing tail read as zeros, and answered.
    let mut n = Net::new();
    n.cm[1].listen(SID).unwrap();
    n.connect(&[]);
    n.collect();
    let (_, to, mad) = n.wire.pop_front().expect("the REQ");
    assert_eq!(to, 1);
    let now = n.now;
    for len in [0, 23, 24, 100, 200, 232, 255] {
        n.cm[1].handle_mad(now, addr(1), &mad[..len]);
    }
    assert!(n.take_events(1).is_empty(), "no request from a short MAD");
    assert_eq!(n.cm[1].counters().dropped, 7);
    n.cm[1].handle_mad(now, addr(1), &mad);
    assert!(matches!(
        n.take_events(1).as_slice(),
        [CmEvent::ConnectRequest { .. }]
    ));
}

#[test]
fn a_req_nobody_listens_for_is_rejected_at_once() {
    let mut n = Net::new();
    let a = n.connect(&[]);
    n.run_for(10 * MS);
    let e = n.take_events(0);
    match e.as_slice() {
        [
            CmEvent::Rejected {
                id,
                reason: 8,
                private_data,
            },
        ] => {
            assert_eq!((*id, private_data.len()), (a, 148));
        }
        other => panic!("{other:?}"),
    }
    assert!(n.cm[0].is_empty() && n.cm[1].is_empty());
    assert_eq!(n.cm[1].counters().rejects_sent, 1);
}

#[test]
fn a_reject_carries_its_private_data() {
    let mut n = Net::new();
    n.cm[1].listen(SID).unwrap();
    let a = n.connect(&[]);
    n.run_for(10 * MS);
    let b = match n.take_events(1).as_slice() {
        [CmEvent::ConnectRequest { id, .. }] => *id,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        n.cm[1].reject(b, &[7; 149]),
        Err(CmError::PrivateDataTooLong { max: 148 })
    );
    n.cm[1].reject(b, b"server full").unwrap();
    n.run_for(10 * MS);
    match n.take_events(0).as_slice() {
        [
            CmEvent::Rejected {
                id,
                reason: 28,
                private_data,
            },
        ] => {
            assert_eq!(*id, a);
            assert_eq!(&private_data[..11], b"server full");
            assert!(private_data[11..].iter().all(|&b| b == 0));
        }
        other => panic!("{other:?}"),
    }
    assert!(n.cm[1].is_empty());
}

#[test]
fn private_data_limits() {
    let mut n = Net::new();
    let r = ConnectReq {
        service_id: SID,
        path: Path {
            local: addr(1),
            remote: addr(2),
            mtu: Mtu::Mtu1024,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        },
        qpn: 1,
        transport_service_type: 0,
        param: ConnParam {
            private_data: vec![0; 93],
            ..ConnParam::default()
        },
        ack_timeout: 19,
    };
    assert_eq!(
        n.cm[0].connect(Instant::ZERO, r),
        Err(CmError::PrivateDataTooLong { max: 92 })
    );
    assert!(n.cm[0].is_empty());
}

#[test]
fn a_lost_req_is_sent_again_after_6_1_seconds() {
    let mut n = Net::new();
    n.drop_first(0, "REQ", 1);
    n.cm[1].listen(SID).unwrap();
    n.connect(&[]);
    n.run_for(Duration::from_millis(6000));
    assert!(n.take_events(1).is_empty());
    n.run_for(Duration::from_millis(200));
    assert!(matches!(
        n.take_events(1).as_slice(),
        [CmEvent::ConnectRequest { .. }]
    ));
    assert_eq!(n.sent[0], ["REQ", "REQ"]);
}

#[test]
fn a_lost_rep_is_resent_and_the_duplicate_req_is_ignored() {
    let mut n = Net::new();
    n.drop_first(1, "REP", 1);
    n.cm[1].listen(SID).unwrap();
    let a = n.connect(&[]);
    n.run_for(10 * MS);
    let b = match n.take_events(1).as_slice() {
        [CmEvent::ConnectRequest { id, .. }] => *id,
        other => panic!("{other:?}"),
    };
    n.accept(b);
    // The REP times out at B after 4.1 s and goes again; A gets it.
    n.run_for(Duration::from_millis(4200));
    assert!(matches!(
        n.take_events(0).as_slice(),
        [CmEvent::ConnectResponse { .. }]
    ));
    let now = n.now;
    n.cm[0].establish(now, a).unwrap();
    n.run_for(Duration::from_secs(10));
    assert_eq!(n.take_events(1), vec![CmEvent::Established { id: b }]);
    assert_eq!(n.sent[1], ["REP", "REP"]);
}

#[test]
fn a_lost_rtu_brings_the_rep_again_and_a_second_rtu() {
    let mut n = Net::new();
    n.drop_first(0, "RTU", 1);
    n.cm[1].listen(SID).unwrap();
    let a = n.connect(&[]);
    n.run_for(10 * MS);
    let b = match n.take_events(1).as_slice() {
        [CmEvent::ConnectRequest { id, .. }] => *id,
        other => panic!("{other:?}"),
    };
    n.accept(b);
    n.run_for(10 * MS);
    let now = n.now;
    n.cm[0].establish(now, a).unwrap();
    n.run_for(Duration::from_secs(1));
    assert!(n.take_events(1).is_empty(), "no RTU yet");
    n.run_for(Duration::from_secs(4));
    assert_eq!(n.take_events(1), vec![CmEvent::Established { id: b }]);
    assert_eq!(n.sent[0], ["REQ", "RTU", "RTU"]);
    assert_eq!(n.sent[1], ["REP", "REP"]);
    assert_eq!(n.cm[0].counters().duplicates, 1);
}

#[test]
fn traffic_before_the_rtu_establishes_the_passive_side() {
    let mut n = Net::new();
    n.drop_first(0, "RTU", 16);
    let (_a, b) = {
        n.cm[1].listen(SID).unwrap();
        let a = n.connect(&[]);
        n.run_for(10 * MS);
        let b = match n.take_events(1).as_slice() {
            [CmEvent::ConnectRequest { id, .. }] => *id,
            other => panic!("{other:?}"),
        };
        n.accept(b);
        n.run_for(10 * MS);
        let now = n.now;
        n.cm[0].establish(now, a).unwrap();
        (a, b)
    };
    n.run_for(Duration::from_millis(100));
    // The QP got a packet (IBV_EVENT_COMM_EST): rdma_notify.
    n.cm[1].notify(b).unwrap();
    n.collect();
    assert_eq!(n.take_events(1), vec![CmEvent::Established { id: b }]);
    n.run_for(Duration::from_secs(120));
    assert!(
        n.take_events(1).is_empty(),
        "no REP retries, no unreachable"
    );
}

#[test]
fn a_slow_acceptor_keeps_the_connection_alive_with_an_mra() {
    let mut n = Net::new();
    n.cm[1].listen(SID).unwrap();
    let a = n.connect(&[]);
    n.run_for(10 * MS);
    let b = match n.take_events(1).as_slice() {
        [CmEvent::ConnectRequest { id, .. }] => *id,
        other => panic!("{other:?}"),
    };
    // B's application takes 30 s. A resends the REQ at 6.1 s; B's CM answers with an MRA.
    n.run_for(Duration::from_secs(30));
    assert_eq!(n.cm[1].state(b), Some(State::MraReqSent));
    assert_eq!(n.sent[1], ["MRA"]);
    assert_eq!(
        n.sent[0],
        ["REQ", "REQ"],
        "the MRA stretched A's wait past 30 s"
    );
    n.accept(b);
    n.run_for(10 * MS);
    assert!(matches!(
        n.take_events(0).as_slice(),
        [CmEvent::ConnectResponse { .. }]
    ));
    let now = n.now;
    n.cm[0].establish(now, a).unwrap();
    n.run_for(10 * MS);
    assert_eq!(n.take_events(1), vec![CmEvent::Established { id: b }]);
}

#[test]
fn a_vanished_peer_is_unreachable_after_every_retry() {
    let mut n = Net::new();
    n.down[1] = true;
    let a = n.connect(&[]);
    n.run_for(Duration::from_secs(97));
    assert!(n.take_events(0).is_empty());
    n.run_for(Duration::from_secs(2));
    assert_eq!(n.take_events(0), vec![CmEvent::Unreachable { id: a }]);
    assert_eq!(n.sent[0].len(), 16, "the REQ and 15 retries");
    assert!(n.cm[0].is_empty());
    assert_eq!(n.cm[0].counters().unreachable, 1);
}

#[test]
fn a_passive_side_whose_rep_is_never_answered_is_unreachable() {
    let mut n = Net::new();
    n.cm[1].listen(SID).unwrap();
    n.connect(&[]);
    n.run_for(10 * MS);
    let b = match n.take_events(1).as_slice() {
        [CmEvent::ConnectRequest { id, .. }] => *id,
        other => panic!("{other:?}"),
    };
    n.down[0] = true;
    n.accept(b);
    n.run_for(Duration::from_secs(16 * 4 + 2));
    assert_eq!(n.take_events(1), vec![CmEvent::Unreachable { id: b }]);
    assert_eq!(n.sent[1].len(), 16);
    assert_eq!(n.cm[1].counters().unreachable, 1);
}

/// A flood of REQs for a port bound but not listened yet holds at most 64 of them; the rest
/// are rejected at once and counted, and a listen then takes the 64 held.
#[test]
fn reqs_for_a_bound_port_are_held_64_at_most() {
    let mut n = Net::new();
    n.cm[1].bind(SID);
    for _ in 0..100 {
        n.connect(&[]);
    }
    n.run_for(10 * MS);
    let rejected = n
        .take_events(0)
        .iter()
        .filter(|e| matches!(e, CmEvent::Rejected { reason: 8, .. }))
        .count();
    assert_eq!(rejected, 36);
    assert_eq!(n.cm[1].counters().held_full, 36);
    n.cm[1].listen(SID).unwrap();
    n.run_for(10 * MS);
    let requests = n
        .take_events(1)
        .iter()
        .filter(|e| matches!(e, CmEvent::ConnectRequest { .. }))
        .count();
    assert!((1..=64).contains(&requests), "{requests}");
}

#[test]
fn lost_and_duplicated_dreqs() {
    let mut n = Net::new();
    n.drop_first(0, "DREQ", 2);
    let (a, b) = n.established();
    let now = n.now;
    n.cm[0].disconnect(now, a).unwrap();
    n.run_for(Duration::from_secs(13));
    assert_eq!(
        n.take_events(1),
        vec![CmEvent::Disconnected {
            id: b,
            timed_out: false
        }]
    );
    assert_eq!(n.sent[0].iter().filter(|m| **m == "DREQ").count(), 3);
    let now = n.now;
    n.cm[1].disconnect(now, b).unwrap();
    n.run_for(10 * MS);
    assert_eq!(
        n.take_events(0),
        vec![CmEvent::Disconnected {
            id: a,
            timed_out: false
        }]
    );

    // A duplicated DREQ is counted, once answered.
    let mut n = Net::new();
    n.dup_first(0, "DREQ", 1);
    let (a, b) = n.established();
    let now = n.now;
    n.cm[0].disconnect(now, a).unwrap();
    n.run_for(10 * MS);
    assert_eq!(
        n.take_events(1),
        vec![CmEvent::Disconnected {
            id: b,
            timed_out: false
        }]
    );
    assert_eq!(n.cm[1].counters().duplicates, 1);
}

/// A process about to exit cannot wait for a DREQ's retry timer (seconds): it resends its
/// unanswered DREQs at once while it waits (until the DREP, which the peer's program sends
/// with its own `rdma_disconnect`), and a lost first DREQ still reaches the peer.
#[test]
fn resent_dreqs_reach_the_peer_before_the_retry_timer() {
    let mut n = Net::new();
    n.drop_first(0, "DREQ", 1);
    let (a, b) = n.established();
    assert_eq!(n.cm[0].dreqs_unanswered(), 0);
    let now = n.now;
    n.cm[0].disconnect(now, a).unwrap();
    n.run_for(10 * MS);
    assert_eq!(n.cm[0].dreqs_unanswered(), 1, "the first DREQ was lost");
    assert!(n.take_events(1).is_empty());
    n.cm[0].resend_dreqs();
    n.run_for(10 * MS);
    assert_eq!(
        n.take_events(1),
        vec![CmEvent::Disconnected {
            id: b,
            timed_out: false
        }]
    );
    // The peer's program answers (rdma_disconnect: the DREP), as rping's does.
    let now = n.now;
    n.cm[1].disconnect(now, b).unwrap();
    n.run_for(10 * MS);
    assert_eq!(n.cm[0].dreqs_unanswered(), 0, "the DREP came");
    assert_eq!(n.sent[0].iter().filter(|m| **m == "DREQ").count(), 2);
    // Nothing to resend any more.
    n.cm[0].resend_dreqs();
    n.run_for(10 * MS);
    assert_eq!(n.sent[0].iter().filter(|m| **m == "DREQ").count(), 2);
}

#[test]
fn an_unanswered_dreq_times_out() {
    let mut n = Net::new();
    let (a, _b) = n.established();
    n.down[1] = true;
    let now = n.now;
    n.cm[0].disconnect(now, a).unwrap();
    n.run_for(Duration::from_secs(16 * 7));
    assert_eq!(
        n.take_events(0),
        vec![
            CmEvent::Disconnected {
                id: a,
                timed_out: true
            },
            CmEvent::TimewaitExit { id: a }
        ]
    );
}

#[test]
fn simultaneous_disconnects_give_one_event_each() {
    let mut n = Net::new();
    let (a, b) = n.established();
    let now = n.now;
    n.cm[0].disconnect(now, a).unwrap();
    n.cm[1].disconnect(now, b).unwrap();
    n.run_for(Duration::from_secs(5));
    assert_eq!(
        n.take_events(0),
        vec![
            CmEvent::Disconnected {
                id: a,
                timed_out: false
            },
            CmEvent::TimewaitExit { id: a }
        ]
    );
    assert_eq!(
        n.take_events(1),
        vec![
            CmEvent::Disconnected {
                id: b,
                timed_out: false
            },
            CmEvent::TimewaitExit { id: b }
        ]
    );
    assert!(n.cm[0].is_empty() && n.cm[1].is_empty());
}

#[test]
fn a_dreq_for_an_unknown_connection_gets_a_drep() {
    let mut n = Net::new();
    let (a, b) = n.established();
    // B forgets everything (a crashed process's CM); A's DREQ is still answered.
    n.cm[1] = CmEngine::new(CmConfig {
        ca_guid: 2,
        comm_id_prefix: 2,
        local_ca_ack_delay: 15,
        seed: 9,
    });
    let _ = b;
    let now = n.now;
    n.cm[0].disconnect(now, a).unwrap();
    n.run_for(10 * MS);
    assert_eq!(
        n.take_events(0),
        vec![CmEvent::Disconnected {
            id: a,
            timed_out: false
        }]
    );
    assert_eq!(n.sent[1].last(), Some(&"DREP"));
}

/// qperf's server: DISCONNECTED comes, the program never destroys the connection's ID and
/// exits. Its CM tears down what is left (as the kernel does when the process's rdma_cm file
/// closes): the DREQ is answered at once, the active side never waits for its DREQ timeout.
#[test]
fn destroy_all_answers_a_dreq_received() {
    let mut n = Net::new();
    let (a, b) = n.established();
    let now = n.now;
    n.cm[0].disconnect(now, a).unwrap();
    n.run_for(10 * MS);
    assert_eq!(
        n.take_events(1),
        vec![CmEvent::Disconnected {
            id: b,
            timed_out: false
        }]
    );
    assert_eq!(n.cm[1].state(b), Some(State::DreqRcvd));
    let now = n.now;
    n.cm[1].destroy_all(now);
    n.run_for(10 * MS);
    assert_eq!(
        n.take_events(0),
        vec![CmEvent::Disconnected {
            id: a,
            timed_out: false
        }]
    );
    assert_eq!(n.sent[1].last(), Some(&"DREP"));

    // An established connection left at exit sends its DREQ; the peer hears of it at once.
    let mut n = Net::new();
    let (a, b) = n.established();
    let now = n.now;
    n.cm[0].destroy_all(now);
    n.run_for(10 * MS);
    assert_eq!(
        n.take_events(1),
        vec![CmEvent::Disconnected {
            id: b,
            timed_out: false
        }]
    );
    let _ = a;
}

/// qperf's server sends its port to the client between `rdma_bind_addr` and `rdma_listen`: a
/// REQ that arrives in between waits for the listen (up to `BOUND_REQ_HOLD`) instead of being
/// rejected; without a listen it is rejected when the wait is over, or when the bind ends.
#[test]
fn a_req_for_a_bound_port_waits_for_the_listen() {
    let mut n = Net::new();
    n.cm[1].bind(SID);
    let a = n.connect(b"early");
    n.run_for(50 * MS);
    assert!(n.take_events(0).is_empty() && n.take_events(1).is_empty());
    assert!(!n.sent[1].contains(&"REJ"), "{:?}", n.sent[1]);
    n.cm[1].listen(SID).unwrap();
    n.run_for(10 * MS);
    let b = match n.take_events(1).as_slice() {
        [
            CmEvent::ConnectRequest {
                id, private_data, ..
            },
        ] => {
            assert_eq!(&private_data[..5], b"early");
            *id
        }
        other => panic!("{other:?}"),
    };
    n.accept(b);
    n.run_for(10 * MS);
    assert!(matches!(
        n.take_events(0).as_slice(),
        [CmEvent::ConnectResponse { id, .. }] if *id == a
    ));

    // Bound, never listened: REJ invalid service ID once the wait is over.
    let mut n = Net::new();
    n.cm[1].bind(SID);
    let a = n.connect(&[]);
    n.run_for(BOUND_REQ_HOLD - 10 * MS);
    assert!(n.take_events(0).is_empty());
    n.run_for(20 * MS);
    match n.take_events(0).as_slice() {
        [CmEvent::Rejected { id, reason: 8, .. }] => assert_eq!(*id, a),
        other => panic!("{other:?}"),
    }

    // The bind ends (the ID destroyed): rejected at once.
    let mut n = Net::new();
    n.cm[1].bind(SID);
    let a = n.connect(&[]);
    n.run_for(10 * MS);
    n.cm[1].unbind(SID);
    n.run_for(5 * MS);
    match n.take_events(0).as_slice() {
        [CmEvent::Rejected { id, reason: 8, .. }] => assert_eq!(*id, a),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_second_req_from_a_connected_qp_is_stale() {
    let mut n = Net::new();
    let (_a, b) = n.established();
    // A (restarted, same QP number and GUID) connects again while B still holds the old one.
    let a2 = n.connect(&[]);
    n.run_for(10 * MS);
    match n.take_events(0).as_slice() {
        [CmEvent::Rejected { id, reason: 10, .. }, ..] => assert_eq!(*id, a2),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        n.cm[1].state(b),
        Some(State::DreqSent),
        "the old connection is closed"
    );
}

#[test]
fn sidr_resolves_a_ud_service_or_says_unsupported() {
    let mut n = Net::new();
    let sid = service_id(port_space::UDP, 7174);
    let now = n.now;
    let q = n.cm[0].sidr_request(now, addr(2), sid, b"udaddy").unwrap();
    n.run_for(10 * MS);
    match n.take_events(0).as_slice() {
        [CmEvent::SidrResponse { id, status: 1, .. }] => assert_eq!(*id, q),
        other => panic!("{other:?}"),
    }
    n.cm[1].listen(sid).unwrap();
    n.drop_first(0, "SIDR_REQ", 1);
    let now = n.now;
    let q = n.cm[0].sidr_request(now, addr(2), sid, b"udaddy").unwrap();
    n.run_for(Duration::from_secs(5));
    let s = match n.take_events(1).as_slice() {
        [
            CmEvent::SidrRequest {
                id,
                service_id,
                private_data,
                ..
            },
        ] => {
            assert_eq!((*service_id, &private_data[..6]), (sid, &b"udaddy"[..]));
            *id
        }
        other => panic!("{other:?}"),
    };
    n.cm[1].sidr_accept(s, 0x33, 0x0123_4567, b"ok").unwrap();
    n.run_for(10 * MS);
    match n.take_events(0).as_slice() {
        [
            CmEvent::SidrResponse {
                id,
                status: 0,
                qpn: 0x33,
                qkey: 0x0123_4567,
                private_data,
            },
        ] => {
            assert_eq!((*id, &private_data[..2]), (q, &b"ok"[..]));
        }
        other => panic!("{other:?}"),
    }
    assert!(n.cm[0].is_empty() && n.cm[1].is_empty());
}

#[test]
fn calls_in_the_wrong_state_are_refused() {
    let mut n = Net::new();
    let (a, b) = n.established();
    let now = n.now;
    assert_eq!(
        n.cm[0].establish(now, a),
        Err(CmError::InvalidState(State::Established))
    );
    assert_eq!(
        n.cm[1].accept(now, b, ConnParam::default()),
        Err(CmError::InvalidState(State::Established))
    );
    assert_eq!(
        n.cm[1].reject(b, &[]),
        Err(CmError::InvalidState(State::Established))
    );
    assert_eq!(
        n.cm[0].disconnect(now, 12345),
        Err(CmError::NoSuchId(12345))
    );
    assert_eq!(n.cm[1].listen(SID), Err(CmError::ServiceInUse(SID)));
}

#[test]
fn garbage_never_panics_an_engine_and_is_counted() {
    let mut n = Net::new();
    let (a, b) = n.established();
    let mut rng = 1u64;
    for i in 0..20_000u32 {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut mad = [0u8; 256];
        for (j, x) in mad.iter_mut().enumerate() {
            *x = (rng.rotate_left(j as u32 % 64) >> 7) as u8;
        }
        // Mostly well-formed CM headers, attributes REQ..APR, comm IDs aimed at the live ones.
        if i % 4 != 0 {
            mad[..4].copy_from_slice(&[1, 7, 2, 3]);
            mad[16..18].copy_from_slice(&(0x10 + (i as u16 % 11)).to_be_bytes());
            let target = if i % 2 == 0 { a } else { b };
            mad[28..32].copy_from_slice(&target.to_be_bytes());
        }
        let now = n.now;
        n.cm[(i % 2) as usize].handle_mad(now, addr(3), &mad);
        n.cm[(i % 2) as usize].handle_mad(now, addr(3), &mad[..i as usize % 256]);
    }
    n.run_for(Duration::from_secs(200));
    let _ = n.take_events(0);
    let _ = n.take_events(1);
    assert!(n.cm[0].counters().dropped > 0);
}

/// A listener whose backlog is full drops a request unanswered (the kernel's CM: no REJ, so
/// the peer may try again): nothing of it stays, and the peer's REQ retransmission 6.1 s later
/// is a new request that can be accepted.
#[test]
fn a_request_dropped_for_a_full_backlog_comes_again_with_the_retry() {
    let mut n = Net::new();
    n.cm[1].listen(SID).unwrap();
    let a = n.connect(&[]);
    n.run_for(10 * MS);
    let first = match n.take_events(1).as_slice() {
        [CmEvent::ConnectRequest { id, .. }] => *id,
        other => panic!("{other:?}"),
    };
    n.cm[1].drop_request(first).unwrap();
    assert_eq!(n.cm[1].state(first), None);
    assert!(n.cm[1].is_empty());
    assert_eq!(n.cm[1].counters().backlog_drops, 1);
    assert_eq!(
        n.cm[1].drop_request(first),
        Err(CmError::NoSuchId(first)),
        "dropped once"
    );
    n.run_for(Duration::from_millis(6200));
    assert!(n.sent[1].is_empty(), "nothing answered: {:?}", n.sent[1]);
    let second = match n.take_events(1).as_slice() {
        [CmEvent::ConnectRequest { id, .. }] => *id,
        other => panic!("{other:?}"),
    };
    n.accept(second);
    n.run_for(10 * MS);
    assert!(matches!(
        n.take_events(0).as_slice(),
        [CmEvent::ConnectResponse { .. }]
    ));
    let now = n.now;
    n.cm[0].establish(now, a).unwrap();
    n.run_for(10 * MS);
    assert_eq!(n.take_events(1), vec![CmEvent::Established { id: second }]);
    // An answered request is not the backlog's to drop.
    assert!(matches!(
        n.cm[1].drop_request(second),
        Err(CmError::InvalidState(_))
    ));
}

/// A Get or Set that no agent serves is answered as the kernel's MAD layer answers it
/// (`generate_unmatched_resp`): the MAD back to its sender's QP as a GetResp with status
/// 0x000C, everything else as it came; a GetResp, or a Send the CM does not know, is never
/// answered (two stacks cannot ping-pong).
#[test]
fn a_get_nobody_serves_is_answered_unsupported_to_its_qp() {
    let mut n = Net::new();
    let mut get = [0u8; 256];
    get[..4].copy_from_slice(&[1, 0x07, 2, 0x01]); // base 1, class CM, version 2, Get
    get[8..16].copy_from_slice(&0x1122_3344_5566_7788u64.to_be_bytes());
    get[16..18].copy_from_slice(&0x0001u16.to_be_bytes()); // ClassPortInfo
    get[100] = 0xab;
    let now = n.now;
    n.cm[1].handle_mad_from(now, addr(1), 0x12_3456, &get);
    let out = n.cm[1].poll_transmit().expect("an answer");
    assert_eq!((out.dest, out.dest_qpn), (addr(1), 0x12_3456));
    let mut want = get;
    want[3] = 0x81;
    want[4..6].copy_from_slice(&0x000Cu16.to_be_bytes());
    assert_eq!(out.mad, want);
    assert!(n.cm[1].poll_transmit().is_none());

    // A Set of another class (PerformanceManagement) alike; the answers are never answered.
    let mut set = get;
    set[1] = 0x04;
    set[3] = 0x02;
    n.cm[1].handle_mad_from(now, addr(1), 7, &set);
    let out = n.cm[1].poll_transmit().expect("an answer");
    assert_eq!((out.mad[3], out.dest_qpn), (0x81, 7));
    n.cm[0].handle_mad_from(now, addr(2), 1, &out.mad);
    let mut send = get;
    send[3] = 0x03;
    n.cm[0].handle_mad_from(now, addr(2), 1, &send);
    assert!(n.cm[0].poll_transmit().is_none());
    // A short one is dropped, not answered.
    n.cm[0].handle_mad_from(now, addr(2), 1, &get[..100]);
    assert!(n.cm[0].poll_transmit().is_none());
}

/// Many connections' timers, each armed at its own time: every REQ is retried 15 times and
/// every connection becomes unreachable, in the order they were made (the deadline heap
/// visits what is due, earliest first, and loses no connection however many there are).
#[test]
fn many_connections_time_out_each_on_its_own_deadline() {
    let mut n = Net::new();
    n.down[1] = true;
    let ids: Vec<u32> = (0..300)
        .map(|_| {
            let id = n.connect(&[]);
            n.run_for(MS);
            id
        })
        .collect();
    n.run_for(Duration::from_secs(100));
    let unreachable: Vec<u32> = n
        .take_events(0)
        .into_iter()
        .map(|e| match e {
            CmEvent::Unreachable { id } => id,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(unreachable, ids);
    assert_eq!(n.sent[0].len(), 300 * 16, "each REQ and its 15 retries");
    assert!(n.cm[0].is_empty());
    assert_eq!(n.cm[0].poll_timeout(), None, "no timer left behind");
}
