//! A seeded, deterministic network of endpoints for tests and fuzzing: links with latency,
//! jitter, loss, duplication, reordering and corruption; virtual time that jumps to the next
//! event; a bounded number of steps. The same seed always gives the same run.
//!
//! A failing seed is printed by [`run_seeds`]; `ROCE_SIM_SEED=<n>` replays just that seed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ferroce_wire::PacketRepr;

use crate::congestion::Ecn;
use crate::endpoint::{AsyncEvent, Completion, Datagram, Endpoint, EndpointConfig, WcQueue};
use crate::memory::VecMemory;
use crate::time::Instant;

pub mod pair;
pub mod workload;
pub mod xrc;

pub use crate::rng::Rng;

/// The faults and delays of one direction of a link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkConfig {
    /// One-way delay.
    pub latency: Duration,
    /// Extra random delay, 0..jitter; a link stays FIFO (jitter never reorders).
    pub jitter: Duration,
    /// Probability a packet is lost.
    pub loss: f64,
    /// Probability a packet is delivered twice.
    pub dup: f64,
    /// Probability a packet is held back by up to 4 × latency (reordering).
    pub reorder: f64,
    /// Probability one bit of a packet is flipped.
    pub corrupt: f64,
    /// The bottleneck's rate in bytes per second, 0 for none: packets queue behind one
    /// another for `len / rate` each, as at a switch port.
    pub rate: u64,
    /// Drop-tail: a packet that would wait longer than this in the bottleneck's queue is lost.
    pub queue_limit: Option<Duration>,
    /// ECN marking of the bottleneck's queue: a packet that waits longer than this is marked
    /// CE (every ferroce packet is ECN-capable), as a switch with ECN thresholds does.
    pub ce_threshold: Option<Duration>,
    /// Probability a packet is marked CE regardless of the queue (netem's `ecn` option).
    pub ce: f64,
}

impl Default for LinkConfig {
    fn default() -> LinkConfig {
        LinkConfig {
            latency: Duration::from_micros(10),
            jitter: Duration::ZERO,
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            rate: 0,
            queue_limit: None,
            ce_threshold: None,
            ce: 0.0,
        }
    }
}

/// One simulated host: an endpoint, its memory, and what it has produced.
#[derive(Debug)]
pub struct Node {
    /// The engine.
    pub endpoint: Endpoint,
    /// Its registered memory.
    pub mem: VecMemory,
    /// Its address (10.0.0.n).
    pub addr: IpAddr,
    /// Completions polled so far.
    pub completions: Vec<Completion>,
    /// Async events polled so far.
    pub events: Vec<AsyncEvent>,
    /// Whether the node is switched off (drops everything, sends nothing).
    pub down: bool,
}

impl Node {
    /// Completions of one QP's queue, in order.
    pub fn completions_of(&self, qpn: u32, queue: WcQueue) -> Vec<crate::verbs::WorkCompletion> {
        self.completions
            .iter()
            .filter(|c| c.qpn == qpn && c.queue == queue)
            .map(|c| c.wc)
            .collect()
    }
}

/// A packet on the wire.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at: Instant,
    seq: u64,
    to: usize,
    /// The IP destination: the node's address, or a multicast group.
    dst: IpAddr,
    from: SocketAddr,
    ecn: Ecn,
    bytes: Vec<u8>,
}

/// What happens to one packet, decided by a script before the link's random faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Goes on to the link (which may still lose, duplicate or corrupt it).
    Deliver,
    /// Lost.
    Drop,
    /// Delivered twice.
    Duplicate,
    /// One bit flipped (the index is taken modulo the packet's bits).
    Corrupt(u32),
    /// Held back this much longer (later packets overtake it).
    Delay(Duration),
}

/// Decides the fate of each packet: `(from node, to node, packet) -> Fate`.
pub type FateFilter = Box<dyn FnMut(usize, usize, &PacketRepr<'_>) -> Fate>;

/// A network of nodes, all links alike unless set per direction.
pub struct Network {
    /// The hosts.
    pub nodes: Vec<Node>,
    /// Virtual time.
    pub now: Instant,
    links: Vec<Vec<LinkConfig>>,
    /// The latest in-order delivery time scheduled on each link.
    fifo: Vec<Vec<Instant>>,
    /// When each link's bottleneck has sent everything queued (links with a `rate`).
    busy: Vec<Vec<Instant>>,
    wire: BinaryHeap<Reverse<InFlight>>,
    rng: Rng,
    seq: u64,
    /// Steps taken so far.
    pub steps: u64,
    /// Packets put on the wire.
    pub packets: u64,
    /// Packets lost to a full bottleneck queue (`queue_limit`).
    pub queue_drops: u64,
    /// Packets marked CE on the way (`ce_threshold`, `ce`).
    pub ce_marked: u64,
    /// Scripted fates, applied before the random faults.
    pub fate: Option<FateFilter>,
    /// Multicast memberships: (group, node), as the nodes' sockets joined them.
    groups: Vec<(IpAddr, usize)>,
    /// Print every packet sent, lost and delivered to stderr (for replaying a failing seed;
    /// `ROCE_SIM_TRACE=1` turns it on).
    pub trace: bool,
    buf: Vec<u8>,
}

impl core::fmt::Debug for Network {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Network")
            .field("now", &self.now)
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl Network {
    /// `n` nodes at 10.0.0.1 … 10.0.0.n joined by links of the given kind.
    pub fn new(seed: u64, n: usize, link: LinkConfig) -> Network {
        let nodes = (0..n)
            .map(|i| {
                let addr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, i as u8 + 1));
                Node {
                    endpoint: Endpoint::new(EndpointConfig {
                        // Simulated peers are ferroce peers: they send IP ID 0, so accept only
                        // fully verified ICRCs.
                        solve_unknown_ident: false,
                        ..EndpointConfig::new(addr)
                    }),
                    mem: VecMemory::new(),
                    addr,
                    completions: Vec::new(),
                    events: Vec::new(),
                    down: false,
                }
            })
            .collect();
        Network {
            nodes,
            now: Instant::ZERO,
            links: vec![vec![link; n]; n],
            fifo: vec![vec![Instant::ZERO; n]; n],
            busy: vec![vec![Instant::ZERO; n]; n],
            wire: BinaryHeap::new(),
            rng: Rng::new(seed),
            seq: 0,
            steps: 0,
            packets: 0,
            queue_drops: 0,
            ce_marked: 0,
            fate: None,
            groups: Vec::new(),
            trace: std::env::var_os("ROCE_SIM_TRACE").is_some(),
            buf: vec![0u8; 8192],
        }
    }

    /// Sets the link from node `from` to node `to`.
    pub fn set_link(&mut self, from: usize, to: usize, link: LinkConfig) {
        self.links[from][to] = link;
    }

    /// Sets every link.
    pub fn set_all_links(&mut self, link: LinkConfig) {
        for row in &mut self.links {
            for l in row.iter_mut() {
                *l = link;
            }
        }
    }

    /// Node `node`'s host joins the IP multicast `group` (what the runtime's socket does when
    /// its first QP attaches): datagrams sent to the group reach it from then on.
    pub fn join(&mut self, node: usize, group: IpAddr) {
        if !self.groups.contains(&(group, node)) {
            self.groups.push((group, node));
        }
    }

    fn node_of(&self, ip: IpAddr) -> Option<usize> {
        self.nodes.iter().position(|n| n.addr == ip)
    }

    /// Collects every packet the endpoints want to send and puts it on the wire.
    fn pump(&mut self) {
        for i in 0..self.nodes.len() {
            loop {
                let node = &mut self.nodes[i];
                let Some(tx) = node
                    .endpoint
                    .poll_transmit(self.now, &mut self.buf, &node.mem)
                    .expect("the simulator's buffer is MIN_TRANSMIT_BUF long or more")
                else {
                    break;
                };
                while let Some(c) = node.endpoint.poll_completion() {
                    node.completions.push(c);
                }
                if node.down {
                    continue;
                }
                self.packets += 1;
                let from = SocketAddr::new(node.addr, node.endpoint.config().src_port);
                let dst = tx.dst.ip();
                // A multicast datagram reaches every node that joined its group (the sender
                // too, as IP_MULTICAST_LOOP does); any other its address's node.
                let targets: Vec<usize> = if crate::mcast::is_group(dst) {
                    self.groups
                        .iter()
                        .filter(|(g, _)| *g == dst)
                        .map(|&(_, n)| n)
                        .collect()
                } else {
                    self.node_of(dst).into_iter().collect()
                };
                let sent = self.buf[..tx.len].to_vec();
                for to in targets {
                    let bytes = sent.clone();
                    let mut fate = Fate::Deliver;
                    if let Some(f) = self.fate.as_mut() {
                        if let Ok(p) = PacketRepr::parse(&bytes) {
                            fate = f(i, to, &p);
                        }
                    }
                    if fate == Fate::Drop {
                        if self.trace {
                            trace(self.now, i, to, "DROPPED", &bytes);
                        }
                        continue;
                    }
                    let link = self.links[i][to];
                    if self.rng.chance(link.loss) {
                        if self.trace {
                            trace(self.now, i, to, "LOST", &bytes);
                        }
                        continue;
                    }
                    // The bottleneck: the packet waits for those ahead of it, may find the queue
                    // full, and is marked CE past the marking threshold.
                    let mut depart = self.now;
                    let mut ecn = Ecn::Ect0;
                    if let Some(ns_per_kb) = 1_000_000_000_000u64.checked_div(link.rate) {
                        let start = self.busy[i][to].max(self.now);
                        let wait = start - self.now;
                        if link.queue_limit.is_some_and(|l| wait > l) {
                            self.queue_drops += 1;
                            if self.trace {
                                trace(self.now, i, to, "QUEUE FULL", &bytes);
                            }
                            continue;
                        }
                        if link.ce_threshold.is_some_and(|t| wait > t) {
                            ecn = Ecn::Ce;
                        }
                        depart =
                            start + Duration::from_nanos(bytes.len() as u64 * ns_per_kb / 1000);
                        self.busy[i][to] = depart;
                    }
                    if self.rng.chance(link.ce) {
                        ecn = Ecn::Ce;
                    }
                    if ecn == Ecn::Ce {
                        self.ce_marked += 1;
                    }
                    let copies = if self.rng.chance(link.dup) || fate == Fate::Duplicate {
                        2
                    } else {
                        1
                    };
                    for _ in 0..copies {
                        let mut b = bytes.clone();
                        if let Fate::Corrupt(bit) = fate {
                            let bit = bit as usize % (b.len() * 8);
                            b[bit / 8] ^= 1 << (bit % 8);
                        }
                        if self.rng.chance(link.corrupt) && !b.is_empty() {
                            let bit = self.rng.below(b.len() as u64 * 8);
                            b[(bit / 8) as usize] ^= 1 << (bit % 8);
                        }
                        let mut delay = link.latency;
                        if !link.jitter.is_zero() {
                            delay +=
                                Duration::from_nanos(self.rng.below(link.jitter.as_nanos() as u64));
                        }
                        let mut at = (depart + delay).max(self.fifo[i][to]);
                        if let Fate::Delay(d) = fate {
                            at = at + d;
                        } else if self.rng.chance(link.reorder) {
                            // Held back: later packets overtake this one.
                            at = at
                                + Duration::from_nanos(
                                    1 + self.rng.below(4 * link.latency.as_nanos() as u64 + 1),
                                );
                        } else {
                            self.fifo[i][to] = at;
                        }
                        self.seq += 1;
                        self.wire.push(Reverse(InFlight {
                            at,
                            seq: self.seq,
                            to,
                            dst,
                            from,
                            ecn,
                            bytes: b,
                        }));
                    }
                }
            }
            let node = &mut self.nodes[i];
            while let Some(c) = node.endpoint.poll_completion() {
                node.completions.push(c);
            }
            while let Some(e) = node.endpoint.poll_event() {
                node.events.push(e);
            }
        }
    }

    /// One step: send what is ready, then jump to the next delivery or timer and handle
    /// everything due then. Returns false when nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.steps += 1;
        self.pump();
        let next_packet = self.wire.peek().map(|r| r.0.at);
        let next_timer = self
            .nodes
            .iter_mut()
            .filter(|n| !n.down)
            .filter_map(|n| n.endpoint.poll_timeout())
            .min();
        let Some(next) = [next_packet, next_timer].into_iter().flatten().min() else {
            return false;
        };
        self.now = self.now.max(next);
        while self.wire.peek().is_some_and(|r| r.0.at <= self.now) {
            let Some(Reverse(p)) = self.wire.pop() else {
                break;
            };
            if self.nodes[p.to].down {
                continue;
            }
            if self.trace {
                let from = self
                    .nodes
                    .iter()
                    .position(|n| n.addr == p.from.ip())
                    .unwrap_or(usize::MAX);
                trace(self.now, from, p.to, "recv", &p.bytes);
            }
            let node = &mut self.nodes[p.to];
            node.endpoint.receive(
                self.now,
                Datagram::new(p.from, p.dst, &p.bytes).with_ecn(p.ecn),
                &node.mem,
            );
        }
        for node in &mut self.nodes {
            if !node.down && node.endpoint.poll_timeout().is_some_and(|t| t <= self.now) {
                node.endpoint.handle_timeout(self.now, &node.mem);
            }
        }
        self.pump();
        true
    }

    /// Steps until nothing is left to happen or `max_steps` steps were taken; true if idle.
    pub fn drive(&mut self, max_steps: u64) -> bool {
        for _ in 0..max_steps {
            if !self.step() {
                return true;
            }
        }
        false
    }

    /// Steps until `done` holds (checked after each step), for at most `max_steps` steps.
    pub fn drive_until(&mut self, max_steps: u64, mut done: impl FnMut(&Network) -> bool) -> bool {
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        done(self)
    }
}

fn trace(now: Instant, from: usize, to: usize, what: &str, bytes: &[u8]) {
    match PacketRepr::parse(bytes) {
        Ok(p) => eprintln!("{now:?} {from}->{to} {what} {p}"),
        Err(e) => eprintln!("{now:?} {from}->{to} {what} unparsable ({e})"),
    }
}

/// Runs `test` for each seed in `seeds` (or only `ROCE_SIM_SEED` if set), and on the first
/// failure panics with the seed so it can be replayed.
pub fn run_seeds(seeds: core::ops::Range<u64>, mut test: impl FnMut(u64) -> Result<(), String>) {
    let seeds: Vec<u64> = match std::env::var("ROCE_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(s) => vec![s],
        None => seeds.collect(),
    };
    for seed in seeds {
        if let Err(e) = test(seed) {
            panic!("simulation failed with seed {seed} (replay: ROCE_SIM_SEED={seed}): {e}");
        }
    }
}
