//! Running cases against a live target: the agent's TCP line protocol, our UDP socket on port
//! 4791, the pcap of every packet, the liveness probe after each case, and shrinking.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::case::{Case, Counter, Expect, MTU, PacketSpec, REGION_LEN, Step};
use super::cm::{self, CmAnswer, CmKind, CmSide};
use super::oracle::judge;
use super::packet::{Answer, Conn, PORT, build, parse_answer};
use super::requester::ReqKind;
use ferroce_transport::rng::Rng;

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

/// The agent's control connection.
pub struct Agent {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Agent {
    /// Connects to an agent's TCP port (retrying for up to `patience`, as it may still be
    /// starting).
    ///
    /// # Errors
    /// The last connection error.
    pub fn connect(at: SocketAddr, patience: Duration) -> io::Result<Agent> {
        let deadline = Instant::now() + patience;
        loop {
            match TcpStream::connect_timeout(&at, Duration::from_secs(2)) {
                Ok(s) => {
                    s.set_read_timeout(Some(Duration::from_secs(60)))?;
                    s.set_nodelay(true)?;
                    let writer = s.try_clone()?;
                    return Ok(Agent {
                        reader: BufReader::new(s),
                        writer,
                    });
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Sends one command and returns its one-line reply.
    ///
    /// # Errors
    /// A broken connection (the agent is gone), or an `ERR` reply.
    pub fn cmd(&mut self, line: &str) -> io::Result<String> {
        self.writer.write_all(format!("{line}\n").as_bytes())?;
        let mut reply = String::new();
        if self.reader.read_line(&mut reply)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the agent closed its control connection",
            ));
        }
        let reply = reply.trim().to_owned();
        if reply.starts_with("ERR") {
            return Err(io::Error::other(format!("agent: {line:?} -> {reply}")));
        }
        Ok(reply)
    }
}

/// How the runner reaches the target.
pub struct Runner {
    /// The agent.
    pub agent: Agent,
    socket: UdpSocket,
    local: Ipv4Addr,
    target: Ipv4Addr,
    /// How long to collect answers after each packet.
    pub window: Duration,
    pcap: Option<ferroce::pcap::Writer<io::BufWriter<std::fs::File>>>,
    started: Instant,
    /// The agent reads the target's counters (until it says it cannot).
    with_counters: bool,
    /// The port of the target's rdma_cm listener (the `cm` campaign).
    pub cm_port: u16,
    /// Whether the listener was asked for (`CMLISTEN`) yet.
    cm_ready: bool,
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
struct Live {
    conn: Conn,
    fill_seed: u64,
}

impl Runner {
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
    ) -> io::Result<Runner> {
        let socket = UdpSocket::bind((local, PORT))?;
        ferroce::udp::set_dont_fragment(socket.as_raw_fd(), false)?;
        let pcap = match pcap {
            Some(p) => Some(ferroce::pcap::Writer::new(
                io::BufWriter::new(std::fs::File::create(p)?),
                ferroce::pcap::LINKTYPE_RAW,
            )?),
            None => None,
        };
        Ok(Runner {
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

    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        let dst = SocketAddr::from((self.target, PORT));
        self.socket.send_to(bytes, dst)?;
        self.record(SocketAddr::from((self.local, PORT)), dst, bytes);
        Ok(())
    }

    /// Everything that arrives for `conn` within `window`.
    fn collect(&mut self, conn: &Conn, window: Duration) -> io::Result<Vec<Answer>> {
        self.collect_until(conn, window, |_| false)
    }

    /// What arrives for `conn` within `window`, or until `enough` says so.
    fn collect_until(
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
    fn recv_before(&mut self, deadline: Instant) -> io::Result<Option<(SocketAddr, Vec<u8>)>> {
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
                self.send(&cm::wrap(&m, self.local, self.target))?;
            }
        }
        let mut side =
            CmSide::connecting(u64::from(qpn) ^ fill_seed << 32, self.local, self.target);
        let mut user = fill_seed.to_be_bytes().to_vec();
        user.push(u8::from(recv));
        let mad = side
            .request_with(self.cm_port + 1, qpn, &user)
            .ok_or_else(|| io::Error::other("the CM engine built no REQ"))?;
        self.send(&cm::wrap(&mad, self.local, self.target))?;
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
    fn agent_connect(
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
    fn run_steps(&mut self, case: &Case, steps: &[Step]) -> Result<Verdict, io::Error> {
        let mut rng = Rng::new(
            case.seed ^ u64::from(case.index).rotate_left(32) ^ (case.campaign as u64) << 8,
        );
        let qpn = 0x100 + rng.below(0xFF_FE00) as u32;
        let fill_seed = rng.below(256);
        let live = self.connect(qpn, case.start_psn, fill_seed, case.needs_recv)?;
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
        if let (Some(c), Some(b), Some(a)) = (case.counter, before, self.counters()?) {
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

    /// Runs a `cm` case, then its liveness probe (a valid REQ is still answered).
    fn run_cm(&mut self, case: &Case, kind: &CmKind) -> io::Result<Verdict> {
        if !self.cm_ready {
            // The agent's own listener if it has one (fuzz-agent); otherwise one already runs
            // on the target (the lab's `cm_reject serve`).
            let _ = self.agent.cmd(&format!("CMLISTEN {}", self.cm_port));
            self.cm_ready = true;
        }
        let mut rng = Rng::new(case.seed ^ u64::from(case.index).rotate_left(28));
        let qpn = 0x100 + rng.below(0xFF_FE00) as u32;
        let mut side = CmSide::new(
            case.seed ^ u64::from(case.index) << 8,
            self.local,
            self.target,
        );
        let port = match kind {
            CmKind::ClosedPort(d) => self.cm_port.wrapping_add(*d),
            _ => self.cm_port,
        };
        let Some(mad) = side.request(port, qpn) else {
            return Err(io::Error::other("the CM engine built no REQ"));
        };
        let mut bytes = mad.to_vec();
        match kind {
            CmKind::Truncated(n) => bytes.truncate(usize::from(*n)),
            CmKind::BaseVersion(v) => bytes[0] = *v,
            CmKind::Havoc(pokes) => {
                for &(at, v) in pokes {
                    if let Some(b) = bytes.get_mut(usize::from(at)) {
                        *b = v;
                    }
                }
            }
            _ => {}
        }
        let wire = cm::wrap(&bytes, self.local, self.target);
        self.send(&wire)?;
        if *kind == CmKind::Duplicate {
            self.send(&wire)?;
        }
        let silent = matches!(kind, CmKind::Truncated(_) | CmKind::BaseVersion(_));
        let window = if silent {
            self.window
        } else {
            self.window.max(Duration::from_secs(3))
        };
        let answer = self.collect_cm(&mut side, window, !silent)?;
        let ok = matches!(
            (kind, &answer),
            (
                CmKind::Valid | CmKind::Duplicate,
                Some(CmAnswer::Rejected(28) | CmAnswer::Reply)
            ) | (CmKind::ClosedPort(_), Some(CmAnswer::Rejected(8)))
                | (CmKind::Truncated(_) | CmKind::BaseVersion(_), None)
                | (CmKind::Havoc(_), _)
        );
        if !ok {
            return Ok(Verdict::Deviates {
                step: 0,
                why: format!("the target's CM answered {answer:?}"),
            });
        }
        // Liveness: a valid REQ to the listener is still answered.
        let mut probe = CmSide::new(
            case.seed ^ 0x5EED ^ u64::from(case.index),
            self.local,
            self.target,
        );
        let Some(mad) = probe.request(self.cm_port, qpn ^ 0x40_0000) else {
            return Err(io::Error::other("the CM engine built no REQ"));
        };
        self.send(&cm::wrap(&mad, self.local, self.target))?;
        match self.collect_cm(&mut probe, self.window.max(Duration::from_secs(3)), true)? {
            Some(CmAnswer::Rejected(28) | CmAnswer::Reply) => Ok(Verdict::Conforms),
            other => Ok(Verdict::Hang(format!(
                "after {}, a valid REQ got {other:?}",
                case.what
            ))),
        }
    }

    /// What the target's CM says of `side`'s connection within `window` (the first answer if
    /// `early`); a REP is rejected at once.
    fn collect_cm(
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
            let Some(mad) = cm::unwrap(&bytes) else {
                continue;
            };
            let (a, out) = side.receive(&mad);
            for m in out {
                self.send(&cm::wrap(&m, self.local, self.target))?;
            }
            if answer.is_none() {
                answer = a;
            }
        }
        Ok(answer)
    }

    /// Runs a `requester` case: the agent's WRITE to us, answered as the case says; then the
    /// completion it reports.
    fn run_requester(&mut self, case: &Case, kind: ReqKind, len: u32) -> io::Result<Verdict> {
        let mut rng = Rng::new(case.seed ^ u64::from(case.index).rotate_left(36));
        let qpn = 0x100 + rng.below(0xFF_FE00) as u32;
        self.agent.cmd("RESET")?;
        let (retry, rnr) = match kind {
            ReqKind::Silence(n) => (n, 7),
            ReqKind::RnrExhaust(n) => (7, n),
            _ => (7, 7),
        };
        // timeout 12: 16.8 ms per try.
        let [target_qpn, target_psn, ..] =
            self.agent_connect(qpn, rng.below(1 << 24) as u32, rnr, retry, 12)?;
        let conn = Conn {
            local: self.local,
            target: self.target,
            local_qpn: qpn,
            target_qpn: target_qpn as u32,
            start_psn: target_psn as u32,
            rkey: 0,
            addr: 0,
        };
        self.agent
            .cmd(&format!("POST write 0 {len} 4096 4660 0 0 0"))?;
        let npkts = len.div_ceil(MTU).max(1);
        let last = npkts - 1;
        let mut tries = 0u32;
        let deadline = Instant::now() + Duration::from_secs(4).max(self.window * 4);
        let mut acked_once = false;
        while Instant::now() < deadline {
            let got = self.collect_until(&conn, Duration::from_millis(50), |a| !a.is_empty())?;
            let mut done = false;
            for a in got {
                // Requests only (our own answers never come back); the first packet counts tries.
                if !a.opcode.is_request() {
                    continue;
                }
                if a.psn_off == 0 {
                    tries += 1;
                }
                let first = a.psn_off == 0;
                let is_last = a.psn_off == last;
                let reply = match kind {
                    ReqKind::Ack if is_last => {
                        Some(ack_for(&conn, last, ferroce_wire::Syndrome::ACK_UNLIMITED))
                    }
                    ReqKind::AckMsn(msn) if is_last => {
                        let mut b = ack_for(&conn, last, ferroce_wire::Syndrome::ACK_UNLIMITED);
                        // The AETH's MSN: bytes 13..16 (after the 12-byte BTH and syndrome).
                        b[13..16].copy_from_slice(&msn.to_be_bytes()[1..]);
                        ferroce_wire::IcrcContext::v4(conn.local, conn.target, 0, PORT, PORT)
                            .fill(&mut b);
                        Some(b)
                    }
                    ReqKind::NakAccess if first => Some(ack_for(
                        &conn,
                        0,
                        ferroce_wire::Syndrome::nak(ferroce_wire::NakCode::RemoteAccessError),
                    )),
                    ReqKind::NakInvalid if first => Some(ack_for(
                        &conn,
                        0,
                        ferroce_wire::Syndrome::nak(ferroce_wire::NakCode::InvalidRequest),
                    )),
                    ReqKind::RnrExhaust(_) if first => {
                        Some(ack_for(&conn, 0, ferroce_wire::Syndrome::rnr_nak(1)))
                    }
                    ReqKind::GhostAck(d) if is_last => {
                        self.send(&ack_for(
                            &conn,
                            last + d,
                            ferroce_wire::Syndrome::ACK_UNLIMITED,
                        ))?;
                        Some(ack_for(&conn, last, ferroce_wire::Syndrome::ACK_UNLIMITED))
                    }
                    ReqKind::SeqNak if is_last && !acked_once => {
                        acked_once = true;
                        Some(ack_for(
                            &conn,
                            0,
                            ferroce_wire::Syndrome::nak(ferroce_wire::NakCode::PsnSeqError),
                        ))
                    }
                    ReqKind::SeqNak if is_last => {
                        Some(ack_for(&conn, last, ferroce_wire::Syndrome::ACK_UNLIMITED))
                    }
                    _ => None,
                };
                if let Some(r) = reply {
                    self.send(&r)?;
                    done = !matches!(kind, ReqKind::RnrExhaust(_) | ReqKind::SeqNak)
                        || (matches!(kind, ReqKind::SeqNak) && tries >= 2 && is_last);
                }
            }
            if done {
                break;
            }
            if let ReqKind::RnrExhaust(n) | ReqKind::Silence(n) = kind {
                // The last try's answer (or silence) given: its timer ends the WR.
                if tries > u32::from(n) {
                    let _ = self.collect(&conn, Duration::from_millis(300))?;
                    break;
                }
            }
        }
        let wc = self.agent.cmd("WC")?;
        let status: Option<i32> = wc.split_whitespace().nth(2).and_then(|s| s.parse().ok());
        // Whatever the target still sends is not the next case's.
        let _ = self.collect(&conn, Duration::from_millis(20));
        let expected = kind.status();
        if status.is_none() || (expected.is_some() && status != expected) {
            return Ok(Verdict::Deviates {
                step: 0,
                why: format!(
                    "the WR completed {wc:?}, expected status {} ({tries} tries)",
                    expected.map_or("any".to_owned(), |s| s.to_string())
                ),
            });
        }
        if let Some(t) = kind.tries() {
            if tries != t {
                return Ok(Verdict::Deviates {
                    step: 0,
                    why: format!("the message was sent {tries} times, expected {t}"),
                });
            }
        }
        Ok(Verdict::Conforms)
    }

    /// Runs a case, then the liveness probe.
    pub fn run(&mut self, case: &Case) -> Verdict {
        if let Some((kind, len)) = case.req {
            let v = match self.run_requester(case, kind, len) {
                Ok(v) => v,
                Err(e) => return Verdict::Crash(e.to_string()),
            };
            return match self
                .probe(case.seed ^ u64::from(case.index) ^ (case.campaign as u64) << 40)
            {
                Ok(true) => v,
                Ok(false) => Verdict::Hang(format!(
                    "after {}, a fresh connection's WRITE got no ACK",
                    case.what
                )),
                Err(e) => Verdict::Crash(e.to_string()),
            };
        }
        if let Some(kind) = &case.cm {
            return match self.run_cm(case, kind) {
                Ok(v) => v,
                Err(e) => Verdict::Crash(e.to_string()),
            };
        }
        let v = match self.run_steps(case, &case.steps) {
            Ok(v) => v,
            Err(e) => return Verdict::Crash(e.to_string()),
        };
        match self.probe(case.seed ^ u64::from(case.index) ^ (case.campaign as u64) << 40) {
            Ok(true) => v,
            Ok(false) => Verdict::Hang(format!(
                "after {}, a fresh connection's WRITE got no ACK",
                case.what
            )),
            Err(e) => Verdict::Crash(e.to_string()),
        }
    }

    /// The fewest steps of a deviating case that still deviate at their last step: earlier
    /// steps are dropped one at a time while the deviation stays.
    pub fn shrink(&mut self, case: &Case, failing: usize) -> Vec<Step> {
        let mut steps: Vec<Step> = case.steps[..=failing].to_vec();
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

/// One case against an unmodified `ibv_rc_pingpong -g 1 -n 1 -s SIZE` server at `server`
/// (its TCP port): the client's address exchange, the case's packets, then the run's ping
/// (which must be ACKed), the server's pong (which we ACK, so its run ends as a client's
/// would). A server that does not take the ping is a hang.
///
/// # Errors
/// A server that cannot be reached or breaks the exchange (the caller's crash).
pub fn run_pingpong(
    server: SocketAddr,
    local: Ipv4Addr,
    case: &Case,
    size: u32,
    window: Duration,
    pcap: Option<&std::path::Path>,
) -> io::Result<Verdict> {
    use std::io::Read;

    use crate::tools::pingpong::Dest;

    let std::net::IpAddr::V4(target) = server.ip() else {
        return Err(io::Error::other("an IPv4 server"));
    };
    // The server listens again between runs: wait for it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tcp = loop {
        match TcpStream::connect_timeout(&server, Duration::from_secs(2)) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut rng = Rng::new(case.seed ^ u64::from(case.index).rotate_left(40));
    let qpn = 0x100 + rng.below(0xFF_FE00) as u32;
    let me = Dest {
        lid: 0,
        qpn,
        psn: case.start_psn,
        gid: local.to_ipv6_mapped(),
    };
    tcp.write_all(&me.to_wire())?;
    let mut buf = [0u8; 52];
    tcp.read_exact(&mut buf)?;
    let rem = Dest::from_wire(&buf).map_err(|e| io::Error::other(e.to_string()))?;
    tcp.write_all(b"done\0")?;
    // The server's QP is connected now; its region grants no remote access (no R_Key).
    let agent_less = Agent {
        reader: BufReader::new(tcp.try_clone()?),
        writer: tcp,
    };
    let mut r = Runner::new(agent_less, local, target, window, pcap)?;
    let conn = Conn {
        local,
        target,
        local_qpn: qpn,
        target_qpn: rem.qpn,
        start_psn: case.start_psn,
        rkey: 0,
        addr: 0,
    };
    for (i, s) in case.steps.iter().enumerate() {
        r.send(&build(&s.packet, &conn))?;
        let answers = r.collect(&conn, window)?;
        if let Err(why) = judge(s.expect, &answers, 0) {
            r.flush();
            return Ok(Verdict::Deviates { step: i, why });
        }
    }
    // The run's ping at the expected PSN: ACKed, then the pong comes.
    let ping = PacketSpec {
        payload_len: size,
        ..PacketSpec::new(ferroce_wire::Opcode::RC_SEND_ONLY, 0)
    };
    r.send(&build(&ping, &conn))?;
    let is_pong = |x: &Answer| x.opcode == ferroce_wire::Opcode::RC_SEND_ONLY;
    let answers = r.collect_until(&conn, window.max(Duration::from_secs(5)), |a| {
        a.iter().any(Answer::is_ack) && a.iter().any(is_pong)
    })?;
    let acks: Vec<Answer> = answers.iter().filter(|a| !is_pong(a)).cloned().collect();
    if judge(Expect::Ack(0), &acks, 0).is_err() {
        r.flush();
        return Ok(Verdict::Hang(format!(
            "after {}, the run's ping got no ACK",
            case.what
        )));
    }
    // The pong: a SEND ONLY from the server's PSN; ACK it so the server's run completes.
    let Some(pong) = answers.iter().find(|x| is_pong(x)) else {
        r.flush();
        return Ok(Verdict::Hang(format!(
            "after {}, the server sent no pong",
            case.what
        )));
    };
    let pong_psn = case.start_psn.wrapping_add(pong.psn_off) & 0xFF_FFFF;
    if pong_psn != rem.psn {
        r.flush();
        return Ok(Verdict::Deviates {
            step: case.steps.len(),
            why: format!(
                "the pong's PSN {pong_psn:#x} is not the server's first, {:#x}",
                rem.psn
            ),
        });
    }
    let ack = ferroce_wire::PacketRepr {
        bth: ferroce_wire::BthRepr::new(
            ferroce_wire::Opcode::RC_ACKNOWLEDGE,
            rem.qpn,
            ferroce_wire::Psn::new(pong_psn),
        ),
        ext: ferroce_wire::ExtHeaders {
            aeth: Some(ferroce_wire::AethRepr {
                syndrome: ferroce_wire::Syndrome::ACK_UNLIMITED.0,
                msn: 1,
            }),
            ..Default::default()
        },
        payload: &[],
    };
    let mut b = vec![0u8; ack.buffer_len()];
    ack.emit(&mut b);
    ferroce_wire::IcrcContext::v4(local, target, 0, PORT, PORT).fill(&mut b);
    r.send(&b)?;
    r.flush();
    Ok(Verdict::Conforms)
}

/// An ACK or NAK (`syndrome`) from us for `conn`'s PSN offset `psn_off`, MSN 1.
fn ack_for(conn: &Conn, psn_off: u32, syndrome: ferroce_wire::Syndrome) -> Vec<u8> {
    let repr = ferroce_wire::PacketRepr {
        bth: ferroce_wire::BthRepr::new(
            ferroce_wire::Opcode::RC_ACKNOWLEDGE,
            conn.target_qpn,
            ferroce_wire::Psn::new(conn.start_psn.wrapping_add(psn_off) & 0xFF_FFFF),
        ),
        ext: ferroce_wire::ExtHeaders {
            aeth: Some(ferroce_wire::AethRepr {
                syndrome: syndrome.0,
                msn: 1,
            }),
            ..Default::default()
        },
        payload: &[],
    };
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit(&mut b);
    ferroce_wire::IcrcContext::v4(conn.local, conn.target, 0, PORT, PORT).fill(&mut b);
    b
}
