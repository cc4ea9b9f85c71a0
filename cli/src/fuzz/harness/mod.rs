//! The harness every campaign runs its cases on: the agent's control link ([`link`]), our UDP
//! socket on port 4791 and the pcap of every packet, fresh connections to the target (through
//! the agent, or through the target's rdma_cm with [`cm_side`]), packet steps sent and judged,
//! the target's counters, the liveness probe after each case, and shrinking.

pub mod cm_side;
pub mod link;

use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::case::{Case, Counter, Expect, MTU, PacketSpec, REGION_LEN, Step};
use super::oracle::judge;
use super::packet::{Answer, Conn, PORT, build, parse_answer};
use cm_side::{CmAnswer, CmSide};
use ferroce_transport::rng::Rng;
pub use link::Agent;

/// What one case came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every answer as the rules say.
    Conforms,
    /// An answer broke the case's rule: which step, and how.
    Deviates {
        /// Index of the first step answered wrongly.
        step: usize,
        /// What came back instead.
        why: String,
    },
    /// The target stopped answering: the liveness probe (a fresh connection, one WRITE) got
    /// no ACK.
    Hang(String),
    /// The agent is gone (its process ended, or its control connection broke).
    Crash(String),
}

/// How a campaign reaches the target.
pub struct Harness {
    /// The agent.
    pub agent: Agent,
    socket: UdpSocket,
    /// Our address.
    pub local: Ipv4Addr,
    /// The target's address.
    pub target: Ipv4Addr,
    /// How long to collect answers after each packet.
    pub window: Duration,
    pcap: Option<ferroce::pcap::Writer<io::BufWriter<std::fs::File>>>,
    started: Instant,
    /// The agent reads the target's counters (until it says it cannot).
    with_counters: bool,
    /// The port of the target's rdma_cm listener (the `cm` campaign).
    pub cm_port: u16,
    /// Whether the listener was asked for (`CMLISTEN`) yet.
    pub cm_ready: bool,
    /// The target QP of the last connection and of the one before it (destroyed since).
    last_target_qpn: Option<u32>,
    prev_target_qpn: Option<u32>,
    /// Connect the RC cases through the target's rdma_cm (`--via-cm`) instead of the agent's
    /// `CONNECT`.
    pub via_cm: bool,
    /// The live CM connection (disconnected before the next).
    cm_conn: Option<CmSide>,
    cm_accept_ready: bool,
}

/// A connected case: the connection and the fill seed of the region.
pub struct Live {
    /// The connection.
    pub conn: Conn,
    /// The seed the target's region was filled from.
    pub fill_seed: u64,
}

impl Harness {
    /// Opens our socket at `local`:4791 (DF set, so IPv4 ID 0, which the ICRCs are computed
    /// for) towards `target`, recording to `pcap` if given.
    ///
    /// # Errors
    /// The socket or the pcap file.
    pub fn new(
        agent: Agent,
        local: Ipv4Addr,
        target: Ipv4Addr,
        window: Duration,
        pcap: Option<&std::path::Path>,
    ) -> io::Result<Harness> {
        let socket = UdpSocket::bind((local, PORT))?;
        ferroce::udp::set_dont_fragment(socket.as_raw_fd(), false)?;
        let pcap = match pcap {
            Some(p) => Some(ferroce::pcap::Writer::new(
                io::BufWriter::new(std::fs::File::create(p)?),
                ferroce::pcap::LINKTYPE_RAW,
            )?),
            None => None,
        };
        Ok(Harness {
            agent,
            socket,
            local,
            target,
            window,
            pcap,
            started: Instant::now(),
            with_counters: true,
            cm_port: 7471,
            cm_ready: false,
            last_target_qpn: None,
            prev_target_qpn: None,
            via_cm: false,
            cm_conn: None,
            cm_accept_ready: false,
        })
    }

    fn record(&mut self, src: SocketAddr, dst: SocketAddr, bytes: &[u8]) {
        if let Some(w) = self.pcap.as_mut() {
            let frame = ferroce::pcap::encapsulate(src, dst, 0, bytes);
            let _ = w.write_record(self.started.elapsed(), &frame);
        }
    }

    /// Flushes the pcap.
    pub fn flush(&mut self) {
        if let Some(w) = self.pcap.as_mut() {
            let _ = w.inner_mut().flush();
        }
    }

    pub(crate) fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        let dst = SocketAddr::from((self.target, PORT));
        self.socket.send_to(bytes, dst)?;
        self.record(SocketAddr::from((self.local, PORT)), dst, bytes);
        Ok(())
    }

    /// Everything that arrives for `conn` within `window`.
    pub(crate) fn collect(&mut self, conn: &Conn, window: Duration) -> io::Result<Vec<Answer>> {
        self.collect_until(conn, window, |_| false)
    }

    /// What arrives for `conn` within `window`, or until `enough` says so.
    pub(crate) fn collect_until(
        &mut self,
        conn: &Conn,
        window: Duration,
        enough: impl Fn(&[Answer]) -> bool,
    ) -> io::Result<Vec<Answer>> {
        let deadline = Instant::now() + window;
        let mut answers = Vec::new();
        while let Some((from, bytes)) = self.recv_before(deadline)? {
            if let Some(a) = parse_answer(&bytes, from.port(), conn) {
                answers.push(a);
                if enough(&answers) {
                    break;
                }
            }
        }
        Ok(answers)
    }

    /// The next datagram from the target before `deadline` (recorded), or `None` once it
    /// passed.
    pub(crate) fn recv_before(
        &mut self,
        deadline: Instant,
    ) -> io::Result<Option<(SocketAddr, Vec<u8>)>> {
        let mut buf = [0u8; 9000];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.socket.set_read_timeout(Some(left))?;
            match self.socket.recv_from(&mut buf) {
                Ok((n, from)) => {
                    let bytes = buf[..n].to_vec();
                    self.record(from, SocketAddr::from((self.local, PORT)), &bytes);
                    if from.ip() == self.target {
                        return Ok(Some((from, bytes)));
                    }
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A connection through the target's rdma_cm (its accepting listener on the cm port + 1):
    /// our REQ (the fill seed and whether to post
    /// a receive in its private data), the target's REP (its QP, the PSN we start from, and its
    /// region's R_Key and address in the private data), our RTU. The PSN is the CM's.
    fn connect_cm(&mut self, qpn: u32, fill_seed: u64, recv: bool) -> io::Result<Live> {
        if !self.cm_accept_ready {
            // The agent's own accepting listener if it has one; else one runs on the target.
            let _ = self.agent.cmd(&format!("CMACCEPT {}", self.cm_port + 1));
            self.cm_accept_ready = true;
        }
        if let Some(mut old) = self.cm_conn.take() {
            for m in old.disconnect() {
                self.send(&cm_side::wrap(&m, self.local, self.target))?;
            }
        }
        let mut side =
            CmSide::connecting(u64::from(qpn) ^ fill_seed << 32, self.local, self.target);
        let mut user = fill_seed.to_be_bytes().to_vec();
        user.push(u8::from(recv));
        let mad = side
            .request_with(self.cm_port + 1, qpn, &user)
            .ok_or_else(|| io::Error::other("the CM engine built no REQ"))?;
        self.send(&cm_side::wrap(&mad, self.local, self.target))?;
        let answer = self.collect_cm(&mut side, self.window.max(Duration::from_secs(3)), true)?;
        let (Some(CmAnswer::Reply), Some(pd), Some((target_qpn, psn))) =
            (answer.clone(), side.accepted.clone(), side.negotiated())
        else {
            return Err(io::Error::other(format!(
                "the target's rdma_cm did not accept the connection: {answer:?}"
            )));
        };
        let rkey = pd
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes);
        let addr = pd
            .get(4..12)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes);
        let (Some(rkey), Some(addr)) = (rkey, addr) else {
            return Err(io::Error::other("the REP names no region"));
        };
        // The RTU the REP brought out went with it; give the target a moment to reach RTS.
        std::thread::sleep(Duration::from_millis(5));
        self.prev_target_qpn = self.last_target_qpn.replace(target_qpn);
        self.cm_conn = Some(side);
        Ok(Live {
            conn: Conn {
                local: self.local,
                target: self.target,
                local_qpn: qpn,
                target_qpn,
                start_psn: psn,
                rkey,
                addr,
            },
            fill_seed,
        })
    }

    /// `CONNECT`: the target's QP to our `qpn` expecting `psn`, with its `rnr_retry`,
    /// `retry_cnt` and `timeout`; its (QPN, PSN, R_Key, region address).
    pub(crate) fn agent_connect(
        &mut self,
        qpn: u32,
        psn: u32,
        rnr: u8,
        retry: u8,
        timeout: u8,
    ) -> io::Result<[u64; 4]> {
        let reply = self.agent.cmd(&format!(
            "CONNECT {MTU} {} {qpn} {psn} {rnr} {retry} {timeout}",
            self.local
        ))?;
        let f: Vec<u64> = reply
            .split_whitespace()
            .skip(1)
            .filter_map(|s| s.parse().ok())
            .collect();
        <[u64; 4]>::try_from(f.as_slice())
            .map_err(|_| io::Error::other(format!("agent: bad CONNECT reply {reply:?}")))
    }

    /// A fresh target QP connected to our QP `qpn` expecting `start_psn`, its region filled.
    fn connect(
        &mut self,
        qpn: u32,
        start_psn: u32,
        fill_seed: u64,
        recv: bool,
    ) -> io::Result<Live> {
        if self.via_cm {
            return self.connect_cm(qpn, fill_seed, recv);
        }
        self.agent.cmd("RESET")?;
        self.agent
            .cmd(&format!("FILL 0 {REGION_LEN} {fill_seed}"))?;
        let [target_qpn, _, rkey, addr] = self.agent_connect(qpn, start_psn, 7, 7, 14)?;
        self.prev_target_qpn = self.last_target_qpn.replace(target_qpn as u32);
        if recv {
            self.agent.cmd(&format!("RECV 0 {}", 4 * MTU))?;
        }
        // Whatever a previous case left on the way is not this case's.
        let _ = self.collect(
            &Conn {
                local: self.local,
                target: self.target,
                local_qpn: u32::MAX,
                target_qpn: 0,
                start_psn: 0,
                rkey: 0,
                addr: 0,
            },
            Duration::from_millis(1),
        );
        Ok(Live {
            conn: Conn {
                local: self.local,
                target: self.target,
                local_qpn: qpn,
                target_qpn: target_qpn as u32,
                start_psn,
                rkey: rkey as u32,
                addr,
            },
            fill_seed,
        })
    }

    /// Runs `steps` of `case` on a fresh connection.
    pub(crate) fn run_steps(&mut self, case: &Case, steps: &[Step]) -> Result<Verdict, io::Error> {
        let mut rng = Rng::new(
            case.seed ^ u64::from(case.index).rotate_left(32) ^ (case.campaign as u64) << 8,
        );
        let qpn = 0x100 + rng.below(0xFF_FE00) as u32;
        let fill_seed = rng.below(256);
        let (needs_recv, counter) = match &case.body {
            super::case::Body::Packets(p) => (p.needs_recv, p.counter),
            _ => (false, None),
        };
        let live = self.connect(qpn, case.start_psn, fill_seed, needs_recv)?;
        let before = self.counters()?;
        for (i, s) in steps.iter().enumerate() {
            let conn = if s.packet.to_previous_qp {
                Conn {
                    target_qpn: self
                        .prev_target_qpn
                        .unwrap_or(live.conn.target_qpn.wrapping_sub(1)),
                    ..live.conn
                }
            } else {
                live.conn
            };
            let bytes = build(&s.packet, &conn);
            self.send(&bytes)?;
            let answers = self.collect(&live.conn, self.window)?;
            if let Err(why) = judge(s.expect, &answers, live.fill_seed) {
                return Ok(Verdict::Deviates { step: i, why });
            }
        }
        if let (Some(c), Some(b), Some(a)) = (counter, before, self.counters()?) {
            let (b, a) = match c {
                Counter::DuplicateRequest => (b.0, a.0),
                Counter::OutOfSeqRequest => (b.1, a.1),
            };
            if a <= b {
                return Ok(Verdict::Deviates {
                    step: steps.len() - 1,
                    why: format!("the target's {} stayed at {a}", c.name()),
                });
            }
        }
        Ok(Verdict::Conforms)
    }

    /// The target's (duplicate_request, out_of_seq_request), if its agent can read them.
    fn counters(&mut self) -> io::Result<Option<(u64, u64)>> {
        if !self.with_counters {
            return Ok(None);
        }
        let reply = match self.agent.cmd("COUNTERS") {
            Ok(r) => r,
            // An agent without the command (an older rdma_peer): no counter checks.
            Err(e) if e.kind() == io::ErrorKind::Other => {
                self.with_counters = false;
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let v: Vec<i64> = reply
            .split_whitespace()
            .skip(1)
            .filter_map(|s| s.parse().ok())
            .collect();
        match v[..] {
            [d, o] if d >= 0 && o >= 0 => Ok(Some((d as u64, o as u64))),
            _ => {
                self.with_counters = false;
                Ok(None)
            }
        }
    }

    /// A fresh connection still works: one WRITE is acknowledged (two tries).
    fn probe(&mut self, seed: u64) -> Result<bool, io::Error> {
        for t in 0..2u64 {
            let mut rng = Rng::new(seed ^ 0xABCD ^ t);
            let qpn = 0x100 + rng.below(0xFF_FE00) as u32;
            let psn = rng.below(1 << 24) as u32;
            let live = self.connect(qpn, psn, 1, false)?;
            let step = Step {
                packet: PacketSpec::write_only(0, 0, 8),
                expect: Expect::Ack(0),
            };
            self.send(&build(&step.packet, &live.conn))?;
            let answers = self.collect_until(
                &live.conn,
                self.window.max(Duration::from_millis(500)),
                |a| a.iter().any(Answer::is_ack),
            )?;
            if judge(step.expect, &answers, live.fill_seed).is_ok() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// What the target's CM says of `side`'s connection within `window` (the first answer if
    /// `early`); a REP is rejected at once.
    pub(crate) fn collect_cm(
        &mut self,
        side: &mut CmSide,
        window: Duration,
        early: bool,
    ) -> io::Result<Option<CmAnswer>> {
        let deadline = Instant::now() + window;
        let mut answer = None;
        while !(early && answer.is_some()) {
            let Some((_, bytes)) = self.recv_before(deadline)? else {
                break;
            };
            let Some(mad) = cm_side::unwrap(&bytes) else {
                continue;
            };
            let (a, out) = side.receive(&mad);
            for m in out {
                self.send(&cm_side::wrap(&m, self.local, self.target))?;
            }
            if answer.is_none() {
                answer = a;
            }
        }
        Ok(answer)
    }

    /// A case's verdict `v`, unless the liveness probe after it finds the target gone deaf: a
    /// fresh connection's WRITE must still be ACKed.
    ///
    /// # Errors
    /// Reaching the agent.
    pub fn probed(&mut self, case: &Case, v: Verdict) -> io::Result<Verdict> {
        let seed = case.seed ^ u64::from(case.index) ^ (case.campaign as u64) << 40;
        Ok(if self.probe(seed)? {
            v
        } else {
            Verdict::Hang(format!(
                "after {}, a fresh connection's WRITE got no ACK",
                case.what
            ))
        })
    }

    /// The fewest steps of a deviating case that still deviate at their last step: earlier
    /// steps are dropped one at a time while the deviation stays.
    pub fn shrink(&mut self, case: &Case, failing: usize) -> Vec<Step> {
        let mut steps: Vec<Step> = case.steps()[..=failing].to_vec();
        let mut i = 0;
        while i + 1 < steps.len() {
            let mut fewer = steps.clone();
            fewer.remove(i);
            let last = fewer.len() - 1;
            match self.run_steps(case, &fewer) {
                Ok(Verdict::Deviates { step, .. }) if step == last => steps = fewer,
                _ => i += 1,
            }
        }
        steps
    }
}
