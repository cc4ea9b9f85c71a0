//! The endpoint: every QP and SRQ of one device (one local address), the demultiplexer for
//! incoming datagrams, and the engine's outputs.
//!
//! # Calling the engine
//!
//! Inputs are `handle` (a received UDP payload), `handle_timeout` and the verbs commands
//! (`create_qp`, `modify_qp`, `post_send`, `post_recv`, ...). After any input, drain the
//! outputs in this order: `poll_transmit` until `None` (each call builds one datagram into the
//! caller's buffer), then `poll_completion` and `poll_event`; finally arm a timer for
//! `poll_timeout` and call `handle_timeout` when it expires. Every call takes `now` where time
//! matters; the engine never reads a clock.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};

use ferroce_wire::icrc::{Ipv4IdentDelta, split_icrc};
use ferroce_wire::{
    BthRepr, DethRepr, ExtHeaders, IcrcContext, Opcode, PacketRepr, Psn, Transport,
};

use crate::congestion::{CongestionConfig, Ecn};
use crate::memory::Memory;
use crate::qp::{Ctx, PostError, Qp, QpInitAttr, Timer};
use crate::srq::{Srq, SrqAttr, XrcSrq};
use crate::state::{ModifyLimits, ModifyQpError};
use crate::time::Instant;
use crate::verbs::{QpAttr, QpAttrMask, QpState, QpType, RecvWr, SendWr, WorkCompletion};

/// Which queue of a QP a completion belongs to (and so which CQ it goes to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcQueue {
    /// The send queue.
    Send,
    /// The receive queue (or the SRQ the QP receives from).
    Recv,
}

/// A work completion with the QP and queue it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Completion {
    /// The local QP.
    pub qpn: u32,
    /// The CQ it goes to: the QP's `send_cq` or `recv_cq` from its [`QpInitAttr`].
    pub cq: u32,
    /// Send or receive side.
    pub queue: WcQueue,
    /// The completion itself.
    pub wc: WorkCompletion,
}

/// An asynchronous event (`enum ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// `IBV_EVENT_COMM_EST`: the first packet arrived while the QP was in RTR.
    CommEst {
        /// The QP.
        qpn: u32,
    },
    /// `IBV_EVENT_SQ_DRAINED`: an SQD transition finished draining.
    SqDrained {
        /// The QP.
        qpn: u32,
    },
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP on an SRQ entered ERR.
    QpLastWqeReached {
        /// The QP.
        qpn: u32,
    },
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`.
    SrqLimitReached {
        /// The SRQ.
        srqn: u32,
        /// The limit it was armed with (`srq_limit`).
        limit: u32,
        /// Receive WQEs left in it when the event fired.
        left: u32,
    },
}

impl AsyncEvent {
    /// What the event means, with its facts, in a sentence; `qp_error` is the QP's first error
    /// ([`Endpoint::qp_error`]), which a LAST_WQE_REACHED reports as its cause.
    pub fn explain(&self, qp_error: Option<&crate::QpError>) -> String {
        match *self {
            AsyncEvent::CommEst { qpn } => format!(
                "QP {qpn:#x}: the first packet from its peer arrived while it was in RTR \
                 (IBV_EVENT_COMM_EST): the peer is sending; move the QP to RTS if it is not \
                 there yet"
            ),
            AsyncEvent::SqDrained { qpn } => format!(
                "QP {qpn:#x}: in SQD, every send work request posted before the transition has \
                 completed (IBV_EVENT_SQ_DRAINED): its attributes may be modified now"
            ),
            AsyncEvent::QpLastWqeReached { qpn } => format!(
                "QP {qpn:#x} of an SRQ is in ERR and takes no more receive WQEs from it \
                 (IBV_EVENT_QP_LAST_WQE_REACHED): {}",
                qp_error.map_or_else(
                    || { "no work request of it failed: ibv_modify_qp moved it to ERR".to_owned() },
                    |e| format!("its first error: {e}")
                )
            ),
            AsyncEvent::SrqLimitReached { srqn, limit, left } => format!(
                "SRQ {srqn}: {left} receive WQE{} left, below the limit {limit} armed with \
                 ibv_modify_srq (IBV_EVENT_SRQ_LIMIT_REACHED): post more receives; the limit \
                 stays disarmed until it is armed again",
                if left == 1 { "" } else { "s" }
            ),
        }
    }
}

/// Per-device counters, named as rxe's `hw_counters` where rxe has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Packets built for transmission.
    pub sent_pkts: u64,
    /// Packets received and accepted for processing.
    pub rcvd_pkts: u64,
    /// Requests behind the expected PSN (duplicates).
    pub duplicate_request: u64,
    /// Requests ahead of the expected PSN.
    pub out_of_seq_request: u64,
    /// PSN sequence NAKs received (and READ response gaps seen).
    pub rcvd_seq_err: u64,
    /// RNR NAKs received.
    pub rcvd_rnr_err: u64,
    /// RNR NAKs sent.
    pub send_rnr_err: u64,
    /// QPs that ran out of `retry_cnt`.
    pub retry_exceeded_err: u64,
    /// QPs that ran out of `rnr_retry`.
    pub retry_rnr_exceeded_err: u64,
    /// Retries (go-back-N restarts) after a timeout, sequence NAK or implied NAK.
    pub completer_retry_err: u64,
    /// Implied NAKs (an ACK past an unanswered READ/atomic).
    pub implied_naks: u64,
    /// Packets dropped for a bad ICRC.
    pub icrc_errors: u64,
    /// IPv4 packets whose ICRC could only be verified modulo the unknown IP ID (16 bits).
    pub icrc_partial: u64,
    /// Packets that did not parse.
    pub malformed: u64,
    /// Packets for no QP, a QP of another type, or the wrong peer.
    pub no_qp: u64,
    /// UD packets with the wrong Q_Key.
    pub qkey_violations: u64,
    /// Packets of a partition other than the default one (P_Key's low 15 bits not all ones;
    /// rxe drops the same).
    pub pkey_violations: u64,
    /// Responses for PSNs never sent (ghost ACKs).
    pub ghost_responses: u64,
    /// Duplicate responses.
    pub duplicate_responses: u64,
    /// Packets dropped for other reasons (QP not ready, no receive WQE on UC/UD, ...).
    pub dropped: u64,
    /// READ/atomic requests beyond the responder's `max_dest_rd_atomic` (a new one is NAKed
    /// invalid request; a duplicate is dropped).
    pub rd_atomic_exceeded: u64,
    /// SEND, WRITE or READ requests for a message longer than `max_msg_sz` (NAKed invalid
    /// request before any memory is touched).
    pub msg_too_long: u64,
    /// Packets received marked Congestion Experienced (IP ECN 11) by a queue on the path
    /// (mlx5's `np_ecn_marked_roce_packets`).
    pub ecn_marked_pkts: u64,
    /// CNPs sent, answering CE marks (mlx5's `np_cnp_sent`).
    pub cnp_sent: u64,
    /// CNPs received for this endpoint's QPs (mlx5's `rp_cnp_handled`).
    pub cnp_handled: u64,
    /// CNPs received for a QP that does not exist or does not take them (UD), or while the
    /// reaction point is off: ignored, as rxe ignores every CNP (mlx5's `rp_cnp_ignored`).
    pub cnp_ignored: u64,
}

impl Counters {
    /// Every counter with its name, in a fixed order (what a kernel device lists under
    /// `/sys/class/infiniband/<dev>/ports/1/hw_counters/`).
    pub fn named(&self) -> [(&'static str, u64); 26] {
        [
            ("sent_pkts", self.sent_pkts),
            ("rcvd_pkts", self.rcvd_pkts),
            ("duplicate_request", self.duplicate_request),
            ("out_of_seq_request", self.out_of_seq_request),
            ("rcvd_seq_err", self.rcvd_seq_err),
            ("rcvd_rnr_err", self.rcvd_rnr_err),
            ("send_rnr_err", self.send_rnr_err),
            ("retry_exceeded_err", self.retry_exceeded_err),
            ("retry_rnr_exceeded_err", self.retry_rnr_exceeded_err),
            ("completer_retry_err", self.completer_retry_err),
            ("implied_naks", self.implied_naks),
            ("icrc_errors", self.icrc_errors),
            ("icrc_partial", self.icrc_partial),
            ("malformed", self.malformed),
            ("no_qp", self.no_qp),
            ("qkey_violations", self.qkey_violations),
            ("pkey_violations", self.pkey_violations),
            ("ghost_responses", self.ghost_responses),
            ("duplicate_responses", self.duplicate_responses),
            ("dropped", self.dropped),
            ("rd_atomic_exceeded", self.rd_atomic_exceeded),
            ("msg_too_long", self.msg_too_long),
            ("ecn_marked_pkts", self.ecn_marked_pkts),
            ("cnp_sent", self.cnp_sent),
            ("cnp_handled", self.cnp_handled),
            ("cnp_ignored", self.cnp_ignored),
        ]
    }
}

/// The smallest buffer [`Endpoint::poll_transmit`] takes: the largest RoCEv2 packet (4 KiB
/// of payload behind the longest header chain, pad and ICRC) with room to spare.
pub const MIN_TRANSMIT_BUF: usize = 4096 + 100;

/// [`Endpoint::poll_transmit`] was given a buffer shorter than [`MIN_TRANSMIT_BUF`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferTooShort {
    /// The length given.
    pub len: usize,
}

impl core::fmt::Display for BufferTooShort {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "poll_transmit needs a buffer of at least {MIN_TRANSMIT_BUF} bytes, got {}",
            self.len
        )
    }
}

impl std::error::Error for BufferTooShort {}

/// A datagram the engine built in the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Destination address and UDP port.
    pub dst: SocketAddr,
    /// Bytes of the UDP payload in the buffer.
    pub len: usize,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// IP TOS / traffic class.
    pub traffic_class: u8,
    /// The QP that sent it.
    pub qpn: u32,
}

/// Errors of the endpoint's verbs commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerbError {
    /// No QP with this number.
    NoSuchQp(u32),
    /// No SRQ with this number.
    NoSuchSrq(u32),
    /// The SRQ still has QPs attached (EBUSY).
    Busy,
    /// The QP number is taken (QP1 created twice).
    QpExists(u32),
    /// Every QP number of the endpoint's range is in use (ENOMEM).
    NoQpnLeft,
    /// `modify_qp` refused.
    Modify(ModifyQpError),
    /// A post refused.
    Post(PostError),
    /// `ibv_attach_mcast`/`ibv_detach_mcast` refused.
    Mcast(crate::mcast::McastError),
}

impl core::fmt::Display for VerbError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            VerbError::NoSuchQp(n) => write!(f, "no QP {n:#x}"),
            VerbError::NoSuchSrq(n) => write!(f, "no SRQ {n:#x}"),
            VerbError::Busy => f.write_str("resource busy: QPs still attached"),
            VerbError::QpExists(n) => write!(f, "QP {n:#x} exists already"),
            VerbError::NoQpnLeft => f.write_str("no QP number left in this endpoint's range"),
            VerbError::Modify(e) => e.fmt(f),
            VerbError::Post(e) => e.fmt(f),
            VerbError::Mcast(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for VerbError {}

/// How an endpoint is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointConfig {
    /// The device's address: the source of every packet and the GID peers address.
    pub local: IpAddr,
    /// The UDP source port of sent packets (covered by the ICRC).
    pub src_port: u16,
    /// The UDP destination port of sent packets (4791; another only in tests).
    pub dst_port: u16,
    /// Device limits for `modify_qp`.
    pub limits: ModifyLimits,
    /// The first QPN handed out (rxe starts at 0x11).
    pub first_qpn: u32,
    /// A QPN slot: when set, every QPN this endpoint hands out has this value in bits 23:16
    /// (DestQP's high byte), so that processes sharing one address each own a QPN range the
    /// kernel can steer by (QP1 stays QP1).
    pub qpn_slot: Option<u8>,
    /// Accept IPv4 packets whose ICRC is right for some IP Identification other than 0 (kernel
    /// rxe peers, whose IDs a UDP socket cannot see). This checks only 16 bits of the ICRC, so
    /// an endpoint whose peers are all ferroce (ID 0) turns it off.
    pub solve_unknown_ident: bool,
    /// The most request PSNs all RC QPs together may have unacknowledged (READ responses
    /// asked for included). Sized to the receive buffers, it keeps a device from overrunning
    /// its own path: with many QPs the windows add up far beyond what a socket holds, every
    /// QP loses packets and times out at once, and go-back-N makes it worse. A QP held back
    /// waits for ACKs of any QP; one QP's own window (128 PSNs) always fits.
    pub inflight_budget: u32,
    /// ECN and CNPs (DCQCN's notification and reaction points); both on by default.
    pub congestion: CongestionConfig,
    /// The ICRC sent FLUSHes carry: kernel rxe's form by default, the only FLUSH peer there
    /// is (see [`FlushIcrc`]). Received FLUSHes are taken in either form.
    pub flush_icrc: FlushIcrc,
}

/// The ICRC form of an RC FLUSH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushIcrc {
    /// Kernel rxe's (Linux 6.2 to 6.12 at least): the IBTA ICRC continued over the BTH, FETH
    /// and RETH once more ([`ferroce_wire::IcrcContext::compute_rxe_flush`]); rxe drops a FLUSH
    /// whose ICRC is the IBTA one.
    #[default]
    Rxe,
    /// The IBTA's, as for every other packet.
    Ibta,
}

impl EndpointConfig {
    /// A configuration for `local` with rxe's defaults.
    pub fn new(local: IpAddr) -> EndpointConfig {
        EndpointConfig {
            local,
            src_port: ferroce_wire::ROCE_UDP_PORT,
            dst_port: ferroce_wire::ROCE_UDP_PORT,
            limits: ModifyLimits::default(),
            first_qpn: 0x11,
            qpn_slot: None,
            solve_unknown_ident: true,
            inflight_budget: u32::MAX,
            congestion: CongestionConfig::default(),
            flush_icrc: FlushIcrc::Rxe,
        }
    }
}

/// Every QP and SRQ of one device.
#[derive(Debug)]
pub struct Endpoint {
    cfg: EndpointConfig,
    qps: QpnMap<Qp>,
    srqs: QpnMap<Srq>,
    next_qpn: u32,
    next_srqn: u32,
    counters: Counters,
    events: VecDeque<AsyncEvent>,
    completions: VecDeque<Completion>,
    active: VecDeque<u32>,
    /// QPs with a timer, earliest deadline first. An entry is current only while it equals
    /// the QP's entry in `deadlines`; stale ones are dropped when they reach the top, so
    /// `poll_timeout` and `handle_timeout` never scan every QP.
    timer_heap: BinaryHeap<Reverse<(Instant, u32)>>,
    /// Each QP's deadline as last entered in `timer_heap`.
    deadlines: QpnMap<Instant>,
    /// Scratch for `handle_timeout` (kept to avoid an allocation per call).
    due: Vec<u32>,
    /// Unacknowledged request PSNs of all QPs (the sum of their `counted_inflight`).
    inflight: u32,
    /// QPs whose requester waits for in-flight budget.
    blocked: VecDeque<u32>,
    /// The last IPv4 ID solved or predicted for each peer that does not send ID 0 (kernel rxe
    /// numbers a source's packets consecutively): its next packet is checked for last + 1
    /// with all 32 ICRC bits before the 16-bit solve is tried. Bounded (cleared when full).
    peer_idents: HashMap<IpAddr, u16>,
    /// ICRC ID deltas for the last few UDP payload lengths seen (packets come in few sizes).
    ident_deltas: Vec<(usize, Ipv4IdentDelta)>,
    /// The multicast groups UD QPs are attached to.
    mcast: crate::mcast::McastTable,
    /// Answers to MADs for QP1 while this endpoint has none (no connection manager runs):
    /// (peer, its QP, the GetResp), at most [`MAX_UNSERVED_MADS`] waiting.
    unserved_mads: VecDeque<(IpAddr, u32, [u8; ferroce_wire::mad::MAD_LEN])>,
}

/// Answers to unserved MADs an endpoint holds before it sends them (more are dropped: a
/// peer cannot make it hold more).
const MAX_UNSERVED_MADS: usize = 16;

/// Peers whose IPv4 IDs an endpoint remembers.
const MAX_PEER_IDENTS: usize = 4096;
/// Payload lengths whose ICRC ID deltas an endpoint keeps.
const MAX_IDENT_DELTAS: usize = 8;

/// Hashes a QP or SRQ number (small, mostly sequential integers) by one multiply that spreads
/// it over 64 bits. A peer chooses which numbers it looks up but never what is in the table,
/// so it cannot build collisions.
#[derive(Default)]
struct QpnHasher(u64);

impl std::hash::Hasher for QpnHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type QpnMap<V> = HashMap<u32, V, std::hash::BuildHasherDefault<QpnHasher>>;

macro_rules! ctx {
    ($self:ident, $mem:expr, $now:expr, $srq:expr) => {
        Ctx {
            mem: $mem,
            now: $now,
            counters: &mut $self.counters,
            events: &mut $self.events,
            completions: &mut $self.completions,
            srq: $srq,
            budget_open: $self.inflight < $self.cfg.inflight_budget,
            budget_low: $self.inflight >= $self.cfg.inflight_budget / 2,
        }
    };
}

impl Endpoint {
    /// An endpoint with no QPs.
    pub fn new(cfg: EndpointConfig) -> Endpoint {
        Endpoint {
            next_qpn: cfg.first_qpn,
            cfg,
            qps: QpnMap::default(),
            srqs: QpnMap::default(),
            next_srqn: 1,
            counters: Counters::default(),
            events: VecDeque::new(),
            completions: VecDeque::new(),
            active: VecDeque::new(),
            inflight: 0,
            blocked: VecDeque::new(),
            peer_idents: HashMap::new(),
            ident_deltas: Vec::new(),
            unserved_mads: VecDeque::new(),
            timer_heap: BinaryHeap::new(),
            deadlines: QpnMap::default(),
            due: Vec::new(),
            mcast: crate::mcast::McastTable::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    /// Turns the notification and reaction points on or off, or retunes them, at any time
    /// (what writing mlx5's `ecn/roce_np/enable` and `ecn/roce_rp/enable` does). A QP being
    /// paced keeps its limiter until it recovers.
    pub fn set_congestion(&mut self, congestion: CongestionConfig) {
        self.cfg.congestion = congestion;
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// `ibv_create_qp`: a new QP in RESET; returns its number.
    ///
    /// # Errors
    /// [`VerbError::NoSuchSrq`] if `init.srq` names no SRQ.
    pub fn create_qp(&mut self, init: QpInitAttr) -> Result<u32, VerbError> {
        if let Some(s) = init.srq {
            if !self.srqs.contains_key(&s) {
                return Err(VerbError::NoSuchSrq(s));
            }
        }
        // Within the slot's range if there is one (bits 23:16 fixed), else the whole 24 bits.
        let (base, mask) = match self.cfg.qpn_slot {
            Some(s) => (u32::from(s) << 16, 0xFFFF),
            None => (0, 0xFF_FFFF),
        };
        let mut qpn = base | (self.next_qpn & mask);
        let mut tries = 0u32;
        while self.qps.contains_key(&qpn) || qpn < 2 || qpn == crate::mcast::MULTICAST_QPN {
            tries += 1;
            if tries > mask {
                return Err(VerbError::NoQpnLeft);
            }
            qpn = base | ((qpn + 1) & mask);
        }
        self.next_qpn = (qpn + 1) & mask;
        self.qps
            .insert(qpn, Qp::new(qpn, &init, self.cfg.limits.active_mtu));
        Ok(qpn)
    }

    /// Creates QP1, the General Services QP (UD, Q_Key 0x80010000 by convention).
    ///
    /// # Errors
    /// [`VerbError::QpExists`] if QP1 exists.
    pub fn create_gsi_qp(&mut self, mut init: QpInitAttr) -> Result<u32, VerbError> {
        if self.qps.contains_key(&1) {
            return Err(VerbError::QpExists(1));
        }
        init.qp_type = QpType::Ud;
        self.qps
            .insert(1, Qp::new(1, &init, self.cfg.limits.active_mtu));
        Ok(1)
    }

    /// `ibv_destroy_qp`: the QP and everything queued on it go, without completions.
    ///
    /// # Errors
    /// [`VerbError::NoSuchQp`].
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), VerbError> {
        self.deadlines.remove(&qpn);
        let qp = self.qps.remove(&qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        for g in self.mcast.detach_all(qpn) {
            log::debug!("QP {qpn:#x} destroyed: multicast group {g} has no QP left");
        }
        self.inflight -= qp.counted_inflight;
        self.release_blocked();
        Ok(())
    }

    /// Re-counts a QP's unacknowledged PSNs in the in-flight total (after anything that may
    /// have sent, acknowledged, rewound or reset), and lets blocked QPs go when there is room.
    fn account(&mut self, qpn: u32) {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        let now = qp.unacked_psns();
        self.inflight = self.inflight - qp.counted_inflight + now;
        qp.counted_inflight = now;
        if qp.budget_blocked && !qp.scheduled {
            qp.budget_blocked = false;
            self.blocked.push_back(qpn);
        }
        self.release_blocked();
    }

    /// Puts the next QP waiting for budget back into the rotation if there is room. One at a
    /// time: the room may be one message's, and waking every waiter to find that out costs a
    /// poll of each (a thousand QPs per ACK). The one released is accounted again after its
    /// poll, which releases the next while room is left.
    fn release_blocked(&mut self) {
        while self.inflight < self.cfg.inflight_budget {
            let Some(qpn) = self.blocked.pop_front() else {
                break;
            };
            if let Some(qp) = self.qps.get_mut(&qpn) {
                if !qp.scheduled {
                    qp.scheduled = true;
                    self.active.push_back(qpn);
                    break;
                }
            }
        }
    }

    /// Request PSNs of QP `qpn` sent (or committed to a message being sent) and not yet
    /// acknowledged; 0 for an unknown QP or one that is not RC in RTS/SQD. While it is not 0
    /// an acknowledgement (or a retransmit timer) is coming that will send whatever is posted
    /// now: the driver's cue to let posts join the next train instead of sending each alone.
    pub fn unacked_psns(&self, qpn: u32) -> u32 {
        self.qps.get(&qpn).map_or(0, Qp::unacked_psns)
    }

    /// Unacknowledged request PSNs of all QPs together (what
    /// [`EndpointConfig::inflight_budget`] limits).
    pub fn inflight(&self) -> u32 {
        self.inflight
    }

    /// Whether a QP reports to CQ `cq` (its `send_cq` or `recv_cq`), or an XRC SRQ does: what
    /// makes `ibv_destroy_cq` refuse with EBUSY. An XRC receive QP has no CQ of its own.
    pub fn cq_in_use(&self, cq: u32) -> bool {
        self.qps
            .values()
            .filter(|q| q.qp_type != QpType::XrcRecv)
            .any(|q| {
                let (s, r) = q.cqs();
                s == cq || r == cq
            })
            || self
                .srqs
                .values()
                .any(|s| s.xrc.is_some_and(|x| x.cq == cq))
    }

    /// The QP numbers in use.
    pub fn qpns(&self) -> impl Iterator<Item = u32> + '_ {
        self.qps.keys().copied()
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&mut self, attr: SrqAttr) -> u32 {
        self.new_srq(attr, None)
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: an SRQ the XRC receive QPs of `xrc.xrcd` take
    /// receive WQEs from when a request's XRCETH names it (its number, `ibv_get_srq_num`).
    pub fn create_xrc_srq(&mut self, attr: SrqAttr, xrc: XrcSrq) -> u32 {
        self.new_srq(attr, Some(xrc))
    }

    fn new_srq(&mut self, attr: SrqAttr, xrc: Option<XrcSrq>) -> u32 {
        let n = self.next_srqn;
        self.next_srqn += 1;
        self.srqs.insert(n, Srq::new(n, attr, xrc));
        n
    }

    /// `ibv_modify_srq` with `IBV_SRQ_LIMIT`: arms the limit event.
    ///
    /// # Errors
    /// [`VerbError::NoSuchSrq`].
    pub fn arm_srq(&mut self, srqn: u32, limit: u32) -> Result<(), VerbError> {
        self.srqs
            .get_mut(&srqn)
            .ok_or(VerbError::NoSuchSrq(srqn))?
            .arm(limit);
        Ok(())
    }

    /// `ibv_query_srq`.
    pub fn query_srq(&self, srqn: u32) -> Option<SrqAttr> {
        self.srqs.get(&srqn).map(Srq::query)
    }

    /// Whether a QP receives through the SRQ (what makes `ibv_destroy_srq` refuse).
    pub fn srq_in_use(&self, srqn: u32) -> bool {
        self.qps.values().any(|q| q.srq == Some(srqn))
    }

    /// `ibv_destroy_srq`.
    ///
    /// # Errors
    /// [`VerbError::Busy`] while a QP uses it; [`VerbError::NoSuchSrq`].
    pub fn destroy_srq(&mut self, srqn: u32) -> Result<(), VerbError> {
        if self.srq_in_use(srqn) {
            return Err(VerbError::Busy);
        }
        self.srqs
            .remove(&srqn)
            .map(|_| ())
            .ok_or(VerbError::NoSuchSrq(srqn))
    }

    /// `ibv_post_srq_recv` for one WR.
    ///
    /// # Errors
    /// [`VerbError::NoSuchSrq`], or `Post(QueueFull | TooManySge)`.
    pub fn post_srq_recv(&mut self, srqn: u32, wr: RecvWr) -> Result<(), VerbError> {
        let s = self.srqs.get_mut(&srqn).ok_or(VerbError::NoSuchSrq(srqn))?;
        if s.queue.len() >= s.attr.max_wr as usize {
            return Err(VerbError::Post(PostError::QueueFull));
        }
        if wr.sg_list.len() > s.attr.max_sge as usize {
            return Err(VerbError::Post(PostError::TooManySge));
        }
        s.queue.push_back(wr);
        Ok(())
    }

    /// `ibv_modify_qp`.
    ///
    /// # Errors
    /// [`VerbError::NoSuchQp`] or [`VerbError::Modify`].
    pub fn modify_qp<M: Memory + ?Sized>(
        &mut self,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
        mem: &M,
        now: Instant,
    ) -> Result<(), VerbError> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        let limits = self.cfg.limits;
        let mut ctx = ctx!(self, mem, now, None);
        let from = qp.state();
        qp.modify(attr, mask, &limits, &mut ctx)
            .map_err(VerbError::Modify)?;
        log::debug!(
            "qp {qpn:#x}: {from:?} -> {:?} dest_qp {:#x} sq_psn {:#x} rq_psn {:#x} mtu {} timeout {} retry_cnt {} rnr_retry {}",
            qp.state(),
            qp.attr.dest_qp_num,
            qp.attr.sq_psn,
            qp.attr.rq_psn,
            qp.attr.path_mtu.bytes(),
            qp.attr.timeout,
            qp.attr.retry_cnt,
            qp.attr.rnr_retry
        );
        self.schedule(qpn);
        Ok(())
    }

    /// The type of QP `qpn` (`ibv_qp.qp_type`).
    pub fn qp_type(&self, qpn: u32) -> Option<QpType> {
        self.qps.get(&qpn).map(|q| q.qp_type)
    }

    /// `ibv_query_qp`.
    pub fn query_qp(&self, qpn: u32) -> Option<QpAttr> {
        self.qps.get(&qpn).map(Qp::query)
    }

    /// `ibv_post_send` for one WR.
    ///
    /// # Errors
    /// [`VerbError::NoSuchQp`] or [`VerbError::Post`].
    pub fn post_send<M: Memory + ?Sized>(
        &mut self,
        qpn: u32,
        wr: SendWr,
        mem: &M,
        now: Instant,
    ) -> Result<(), VerbError> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        let mut ctx = ctx!(self, mem, now, None);
        qp.post_send(wr, &mut ctx).map_err(VerbError::Post)?;
        self.schedule(qpn);
        Ok(())
    }

    /// `ibv_post_recv` for one WR.
    ///
    /// # Errors
    /// [`VerbError::NoSuchQp`] or [`VerbError::Post`].
    pub fn post_recv<M: Memory + ?Sized>(
        &mut self,
        qpn: u32,
        wr: RecvWr,
        mem: &M,
        now: Instant,
    ) -> Result<(), VerbError> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        let mut ctx = ctx!(self, mem, now, None);
        qp.post_recv(wr, &mut ctx).map_err(VerbError::Post)
    }

    /// After any call that touched the QP: into the transmit rotation, timer re-entered,
    /// its in-flight PSNs re-counted.
    fn schedule(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            if !qp.scheduled {
                qp.scheduled = true;
                qp.budget_blocked = false;
                self.active.push_back(qpn);
            }
        }
        self.rearm(qpn);
        self.account(qpn);
    }

    /// Makes sure the timer heap holds an entry for the QP at or before its deadline. A
    /// deadline that moved later (the usual case: a retransmit timer re-armed on progress)
    /// keeps its earlier entry, which re-enters the real deadline when it comes up; so most
    /// calls push nothing, and `poll_timeout` may name a time a little early, never late.
    fn rearm(&mut self, qpn: u32) {
        let Some(t) = self.qps.get(&qpn).and_then(Qp::poll_timeout) else {
            return;
        };
        if self.deadlines.get(&qpn).is_some_and(|&e| e <= t) {
            return;
        }
        self.deadlines.insert(qpn, t);
        self.timer_heap.push(Reverse((t, qpn)));
    }

    /// Drops stale entries from the top of the timer heap.
    fn prune_timers(&mut self) {
        while let Some(&Reverse((t, qpn))) = self.timer_heap.peek() {
            if self.deadlines.get(&qpn) == Some(&t) {
                break;
            }
            self.timer_heap.pop();
        }
    }

    /// Handles one received UDP payload from `src`, sent to our address `dst`. Bad packets are
    /// dropped and counted; nothing a peer sends is an error here.
    pub fn handle<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        src: SocketAddr,
        dst: IpAddr,
        datagram: &[u8],
        mem: &M,
    ) {
        self.handle_segment(now, src, dst, datagram, 0, mem);
    }

    /// As [`Endpoint::handle`] for a datagram expected to carry IPv4 ID `ident`: segment
    /// `ident` of a coalesced (`UDP_GRO`) read of a ferroce sender's `UDP_SEGMENT` train, whose
    /// ICRC covers that ID. All 32 ICRC bits are checked for the expected ID (and for 0, a
    /// plain datagram in the read); other senders' IDs are solved as in [`Endpoint::handle`].
    pub fn handle_segment<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        src: SocketAddr,
        dst: IpAddr,
        datagram: &[u8],
        ident: u16,
        mem: &M,
    ) {
        self.handle_marked(now, src, dst, datagram, ident, Ecn::NotEct, mem);
    }

    /// As [`Endpoint::handle_segment`], with the ECN field of the datagram's IP header: a
    /// packet marked [`Ecn::Ce`] for a connected QP is answered with a CNP to the sender's QP
    /// (at most one per QP per [`CongestionConfig::cnp_interval`]), when the notification
    /// point is on.
    #[allow(clippy::too_many_arguments)]
    pub fn handle_marked<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        src: SocketAddr,
        dst: IpAddr,
        datagram: &[u8],
        ident: u16,
        ecn: Ecn,
        mem: &M,
    ) {
        if !self.icrc_ok(src, dst, datagram, ident) {
            self.counters.icrc_errors += 1;
            return;
        }
        let Ok(pkt) = PacketRepr::parse(datagram) else {
            self.counters.malformed += 1;
            return;
        };
        // P_Key: only the default partition exists (low 15 bits all ones; rxe checks the same).
        if pkt.bth.pkey & 0x7FFF != 0x7FFF {
            self.counters.pkey_violations += 1;
            log::debug!(
                "packet from {src} for QP {:#x} dropped: P_Key {:#06x} is not the default \
                 partition's (0xffff), the only one here",
                pkt.bth.dest_qp,
                pkt.bth.pkey
            );
            return;
        }
        let qpn = pkt.bth.dest_qp;
        if pkt.bth.opcode == Opcode::CNP {
            self.handle_cnp(now, src, qpn);
            return;
        }
        if qpn == crate::mcast::MULTICAST_QPN {
            self.handle_multicast(now, src, dst, &pkt, mem);
            return;
        }
        let Some(qp) = self.qps.get_mut(&qpn) else {
            if qpn == 1 && self.answer_unserved_mad(src.ip(), &pkt) {
                return;
            }
            self.counters.no_qp += 1;
            log::debug!(
                "{} PSN {:#x} from {src} for QP {qpn:#x} dropped: no such QP here",
                pkt.bth.opcode,
                pkt.bth.psn.value()
            );
            return;
        };
        let transport_ok = matches!(
            (pkt.bth.opcode.transport(), qp.qp_type),
            (Transport::Rc, QpType::Rc)
                | (Transport::Uc, QpType::Uc)
                | (Transport::Ud, QpType::Ud)
                | (Transport::Xrc, QpType::XrcSend | QpType::XrcRecv)
        );
        // Connected QPs only talk to their peer.
        let peer_ok = qp.qp_type == QpType::Ud || qp.peer() == Some(src.ip());
        if !transport_ok || !peer_ok {
            self.counters.no_qp += 1;
            return;
        }
        self.counters.rcvd_pkts += 1;
        if ecn == Ecn::Ce {
            self.counters.ecn_marked_pkts += 1;
            if self.cfg.congestion.np
                && qp.qp_type != QpType::Ud
                && qp.on_ce(now, &self.cfg.congestion)
            {
                log::trace!("QP {qpn:#x}: CE-marked packet from {src}: a CNP is due");
            }
        }
        // XRC runs RC's rules: requests (with an XRCETH) go to a receive QP, responses to a
        // send QP, each as the RC opcode of the same operation.
        let mut pkt = pkt;
        if let Some(rc) = pkt.bth.opcode.xrc_as_rc() {
            if pkt.bth.opcode.has_xrceth() != (qp.qp_type == QpType::XrcRecv) {
                self.counters.no_qp += 1;
                log::debug!(
                    "{} from {src} for XRC QP {qpn:#x} dropped: an XRC {} QP takes only {}",
                    pkt.bth.opcode,
                    if qp.qp_type == QpType::XrcRecv {
                        "receive"
                    } else {
                        "send"
                    },
                    if qp.qp_type == QpType::XrcRecv {
                        "requests"
                    } else {
                        "responses"
                    },
                );
                return;
            }
            pkt.bth.opcode = rc;
        }
        let srq = match (qp.qp_type, qp.srq) {
            (QpType::XrcRecv, _) => {
                // The SRQ the XRCETH names, if it is an XRC SRQ of this QP's domain: its PD
                // checks the request's memory and its CQ takes the receive completion.
                let named = pkt.ext.xrceth.map(|x| x.xrcsrq);
                let srq = named
                    .and_then(|n| self.srqs.get_mut(&n))
                    .filter(|s| s.xrc.is_some_and(|x| Some(x.xrcd) == qp.xrcd));
                qp.xrc_srq_ok = srq.is_some();
                if let Some(x) = srq.as_ref().and_then(|s| s.xrc) {
                    qp.pd = x.pd;
                    qp.cqs.1 = x.cq;
                }
                srq
            }
            (_, Some(s)) => self.srqs.get_mut(&s),
            (_, None) => None,
        };
        let mut ctx = ctx!(self, mem, now, srq);
        if pkt.bth.opcode.is_request() {
            qp.handle_request(&mut ctx, &pkt, src.ip(), dst);
        } else {
            qp.handle_response(&mut ctx, &pkt);
        }
        self.schedule(qpn);
    }

    /// A MAD for QP1 while this endpoint has none (no connection manager runs in this
    /// process): a Get or Set is answered as the kernel's MAD layer answers one that no agent
    /// serves, the MAD back to the sender's QP as a GetResp with status 0x000C (unsupported
    /// method/attribute) — how a prober (`ferroce doctor`) finds a RoCE stack here; a CM DREQ
    /// (for a connection of a process that is gone, routed to this role holder) gets its DREP,
    /// as the kernel's CM answers one for a connection it does not hold. False for anything
    /// else (counted as for no QP), or when [`MAX_UNSERVED_MADS`] answers wait.
    fn answer_unserved_mad(&mut self, src: IpAddr, pkt: &PacketRepr<'_>) -> bool {
        let Some(deth) = pkt.ext.deth else {
            return false;
        };
        if pkt.bth.opcode != Opcode::UD_SEND_ONLY || deth.qkey != ferroce_wire::GSI_QKEY {
            return false;
        }
        let (resp, answer) = if let Some(r) = crate::cm::unmatched_response(pkt.payload) {
            (
                r,
                "a Get/Set nobody serves: answered unsupported (status 0x000c), as the kernel's \
                 MAD layer does",
            )
        } else if let Some(r) = crate::cm::unserved_dreq_answer(pkt.payload) {
            (
                r,
                "a CM DREQ for a connection nobody here holds (its process is gone): answered \
                 with its DREP, as the kernel's CM does",
            )
        } else {
            return false;
        };
        if self.unserved_mads.len() >= MAX_UNSERVED_MADS {
            log::debug!(
                "a MAD from {src} QP {:#x} for QP1, which nothing here serves: dropped, \
                 {MAX_UNSERVED_MADS} answers wait already",
                deth.src_qp
            );
            return false;
        }
        log::debug!(
            "a MAD of class {:#04x} from {src} QP {:#x} for QP1, which no connection manager \
             here serves, {answer}",
            pkt.payload[1],
            deth.src_qp
        );
        self.unserved_mads.push_back((src, deth.src_qp, resp));
        true
    }

    /// The ICRC context of a packet from this endpoint to `dest` (IP ID 0: the sender's
    /// correction for the kernel's IDs comes later); `None` across address families.
    #[inline]
    fn icrc_to(&self, dest: IpAddr) -> Option<IcrcContext> {
        match (self.cfg.local, dest) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Some(IcrcContext::v4(
                s,
                d,
                0,
                self.cfg.src_port,
                self.cfg.dst_port,
            )),
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                Some(IcrcContext::v6(s, d, self.cfg.src_port, self.cfg.dst_port))
            }
            _ => None,
        }
    }

    /// The next answer to an unserved MAD, built into `buf`: a UD SEND from QP1 with the GSI
    /// Q_Key to the asking QP.
    fn next_unserved_mad(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        while let Some((dest, dest_qpn, mad)) = self.unserved_mads.pop_front() {
            let repr = PacketRepr {
                bth: BthRepr::new(Opcode::UD_SEND_ONLY, dest_qpn, Psn::new(0)),
                ext: ExtHeaders {
                    deth: Some(DethRepr {
                        qkey: ferroce_wire::GSI_QKEY,
                        src_qp: 1,
                    }),
                    ..ExtHeaders::default()
                },
                payload: &mad,
            };
            let len = repr.buffer_len();
            let Some(icrc) = self.icrc_to(dest) else {
                self.counters.dropped += 1;
                continue;
            };
            // `poll_transmit` takes no buffer shorter than MIN_TRANSMIT_BUF, above a MAD's.
            let out = buf.get_mut(..len)?;
            repr.emit(out);
            icrc.fill(out);
            self.counters.sent_pkts += 1;
            return Some(Transmit {
                dst: SocketAddr::new(dest, self.cfg.dst_port),
                len,
                hop_limit: 64,
                traffic_class: 0,
                qpn: 1,
            });
        }
        None
    }

    /// A packet for QPN 0xFFFFFF: a UD send to the multicast group `dst`, delivered to each
    /// UD QP attached to it (each takes a receive WQE of its own). Not to a group, not UD, or
    /// to a group with no QP here: counted as `no_qp`.
    fn handle_multicast<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        src: SocketAddr,
        dst: IpAddr,
        pkt: &PacketRepr<'_>,
        mem: &M,
    ) {
        let members = self.mcast.members(dst);
        if pkt.bth.opcode.transport() != Transport::Ud || members.is_empty() {
            self.counters.no_qp += 1;
            log::debug!(
                "packet for the multicast QPN from {src} to {dst} dropped: {}",
                if pkt.bth.opcode.transport() != Transport::Ud {
                    "only UD sends go to groups"
                } else {
                    "no QP of this device is attached to that group"
                }
            );
            return;
        }
        self.counters.rcvd_pkts += 1;
        // Few QPs per group (at most MAX_MCAST_QP_ATTACH): copied so each can be borrowed.
        let members = crate::SmallVec::<u32, 8>::from_slice(members);
        let own = src.ip() == self.cfg.local;
        for &qpn in members.iter() {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            if own && qp.block_self_mcast_lb && pkt.ext.deth.is_some_and(|d| d.src_qp == qpn) {
                log::trace!(
                    "QP {qpn:#x}: its own datagram to {dst} not delivered to it \
                     (IBV_QP_CREATE_BLOCK_SELF_MCAST_LB)"
                );
                continue;
            }
            let srq = match qp.srq {
                Some(s) => self.srqs.get_mut(&s),
                None => None,
            };
            let mut ctx = ctx!(self, mem, now, srq);
            qp.handle_request(&mut ctx, pkt, src.ip(), dst);
        }
    }

    /// `ibv_create_qp_ex`'s `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB` for QP `qpn`: what it sends to
    /// a group it is attached to is not delivered back to it (other QPs of the group still get
    /// it). Kept across RESET, as a creation attribute.
    ///
    /// # Errors
    /// [`VerbError::NoSuchQp`].
    pub fn block_self_mcast_lb(&mut self, qpn: u32) -> Result<(), VerbError> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        qp.block_self_mcast_lb = true;
        Ok(())
    }

    /// `ibv_attach_mcast`: UD QP `qpn` receives what is sent to the multicast `group`.
    /// Returns whether the group is new on this endpoint (the runtime joins it on the network).
    ///
    /// # Errors
    /// [`VerbError::NoSuchQp`]; [`VerbError::Mcast`] for a QP that is not UD, an address that
    /// is not a group, or a limit reached.
    pub fn attach_mcast(&mut self, qpn: u32, group: IpAddr) -> Result<bool, VerbError> {
        let qp = self.qps.get(&qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        if qp.qp_type != QpType::Ud {
            return Err(VerbError::Mcast(crate::mcast::McastError::NotUd));
        }
        self.mcast.attach(qpn, group).map_err(VerbError::Mcast)
    }

    /// The first error of QP `qpn` since its last RESET, with the facts that decide it (which
    /// retransmissions went unanswered, which NAK came back, how many RNR NAKs, what did not
    /// fit): the reason behind an error completion or a QP in ERR.
    pub fn qp_error(&self, qpn: u32) -> Option<crate::QpError> {
        self.qps.get(&qpn).and_then(|q| q.first_error())
    }

    /// [`Endpoint::qp_error`] the first time it is asked for after the error (then `None`
    /// until the QP's next error after a RESET): what a runtime logs once per failed QP.
    pub fn qp_error_to_report(&mut self, qpn: u32) -> Option<crate::QpError> {
        let qp = self.qps.get_mut(&qpn)?;
        if qp.error_reported {
            return None;
        }
        let e = qp.first_error()?;
        qp.error_reported = true;
        Some(e)
    }

    /// Whether any QP is attached to `group`.
    pub fn mcast_attached(&self, group: IpAddr) -> bool {
        !self.mcast.members(group).is_empty()
    }

    /// `ibv_detach_mcast`. Returns whether the group has no QP left on this endpoint (the
    /// runtime leaves it on the network).
    ///
    /// # Errors
    /// [`VerbError::NoSuchQp`]; [`VerbError::Mcast`] if the QP is not attached to `group`.
    pub fn detach_mcast(&mut self, qpn: u32, group: IpAddr) -> Result<bool, VerbError> {
        if !self.qps.contains_key(&qpn) {
            return Err(VerbError::NoSuchQp(qpn));
        }
        self.mcast.detach(qpn, group).map_err(VerbError::Mcast)
    }

    /// A CNP (BTH opcode 0x81) for `qpn` from `src`: the reaction point cuts the QP's rate.
    /// CNPs for UD QPs, unknown QPs, another peer's QPs or with the reaction point off are
    /// counted and ignored.
    fn handle_cnp(&mut self, now: Instant, src: SocketAddr, qpn: u32) {
        let cfg = self.cfg.congestion;
        let qp = self
            .qps
            .get_mut(&qpn)
            .filter(|qp| qp.qp_type != QpType::Ud && qp.peer() == Some(src.ip()));
        match qp {
            Some(qp) if cfg.rp => {
                self.counters.cnp_handled += 1;
                qp.on_cnp(now, &cfg);
            }
            _ => {
                self.counters.cnp_ignored += 1;
                log::debug!(
                    "CNP from {src} for QP {qpn:#x} ignored ({})",
                    if cfg.rp {
                        "no connected QP of that number with that peer"
                    } else {
                        "the reaction point is off"
                    }
                );
            }
        }
    }

    /// Checks the ICRC of a datagram received through a UDP socket, computing one CRC: all 32
    /// bits when the sender used the expected IP ID (ferroce: 0, or the segment's index `ident`
    /// in a coalesced train), over IPv6, or when the ID is the one predicted for the peer (the
    /// last one + 1, as kernel rxe numbers its packets); otherwise, for peers with unknown IDs,
    /// modulo the ID (16 bits, counted as `icrc_partial`), which also resets the prediction.
    fn icrc_ok(&mut self, src: SocketAddr, dst: IpAddr, datagram: &[u8], ident: u16) -> bool {
        self.icrc_form_ok(src, dst, datagram, ident, false)
            || (datagram.first() == Some(&Opcode::RC_FLUSH.0)
                && self.icrc_form_ok(src, dst, datagram, ident, true))
    }

    /// [`Endpoint::icrc_ok`] for one form: the IBTA's, or (`rxe_flush`) kernel rxe's FLUSH
    /// form, whose CRC runs over the covered bytes twice.
    fn icrc_form_ok(
        &mut self,
        src: SocketAddr,
        dst: IpAddr,
        datagram: &[u8],
        ident: u16,
        rxe_flush: bool,
    ) -> bool {
        let (s, d) = match (src.ip(), dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (s, d),
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let ctx = IcrcContext::v6(s, d, src.port(), self.cfg.dst_port);
                return if rxe_flush {
                    ctx.verify_rxe_flush(datagram)
                } else {
                    ctx.verify(datagram)
                };
            }
            _ => return false,
        };
        let Some((covered, got)) = split_icrc(datagram) else {
            return false;
        };
        let ctx = IcrcContext::v4(s, d, 0, src.port(), self.cfg.dst_port);
        let zero = if rxe_flush {
            ctx.compute_rxe_flush(covered)
        } else {
            ctx.compute(covered)
        };
        let Ok(zero) = zero else {
            return false;
        };
        if zero == got {
            return true;
        }
        // What the packet's ID changed in its ICRC, relative to ID 0: it depends only on how
        // many bytes the CRC runs over after the ID, which rxe's FLUSH form lengthens by the
        // covered bytes.
        let diff = zero ^ got;
        let crc_len = datagram.len() + if rxe_flush { covered.len() } else { 0 };
        let Some(deltas) = self.ident_delta(crc_len) else {
            return false;
        };
        if ident != 0 && deltas.delta(ident) == diff {
            return true;
        }
        if let Some(&last) = self.peer_idents.get(&src.ip()) {
            let next = last.wrapping_add(1);
            if deltas.delta(next) == diff {
                self.peer_idents.insert(src.ip(), next);
                return true;
            }
        }
        if !self.cfg.solve_unknown_ident {
            return false;
        }
        let Some(solved) = deltas.solve(diff) else {
            return false;
        };
        if self.peer_idents.len() >= MAX_PEER_IDENTS {
            self.peer_idents.clear();
        }
        self.peer_idents.insert(src.ip(), solved);
        self.counters.icrc_partial += 1;
        true
    }

    /// The ICRC ID deltas of a UDP payload length, from the small cache.
    fn ident_delta(&mut self, len: usize) -> Option<Ipv4IdentDelta> {
        if let Some(&(_, d)) = self.ident_deltas.iter().find(|(l, _)| *l == len) {
            return Some(d);
        }
        let d = Ipv4IdentDelta::new(len)?;
        if self.ident_deltas.len() >= MAX_IDENT_DELTAS {
            self.ident_deltas.remove(0);
        }
        self.ident_deltas.push((len, d));
        Some(d)
    }

    /// Builds the next datagram to send into `buf`, with its ICRC; `Ok(None)` when nothing is
    /// waiting.
    ///
    /// # Errors
    /// [`BufferTooShort`] if `buf` is shorter than [`MIN_TRANSMIT_BUF`] (nothing is consumed).
    pub fn poll_transmit<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        mem: &M,
    ) -> Result<Option<Transmit>, BufferTooShort> {
        if buf.len() < MIN_TRANSMIT_BUF {
            return Err(BufferTooShort { len: buf.len() });
        }
        Ok(self.next_transmit(now, buf, mem))
    }

    fn next_transmit<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        mem: &M,
    ) -> Option<Transmit> {
        if let Some(tx) = self.next_unserved_mad(buf) {
            return Some(tx);
        }
        while let Some(qpn) = self.active.pop_front() {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            let cc = self.cfg.congestion;
            let mut ctx = ctx!(self, mem, now, None);
            // A CNP first (never paced), then what the QP's pacing allows: everything, or
            // only bare acknowledgements while it waits.
            let tx = if let Some(cnp) = qp.poll_cnp(now, buf) {
                ctx.counters.cnp_sent += 1;
                Some(cnp)
            } else if let Some(until) = qp.pace(now, &cc) {
                let ack = if qp.resp.ack_first() {
                    qp.poll_response(&mut ctx, buf)
                } else {
                    None
                };
                if ack.is_none() {
                    qp.timers.set(Timer::Pace, until);
                }
                ack
            } else {
                let tx = qp
                    .poll_response(&mut ctx, buf)
                    .or_else(|| qp.poll_request(&mut ctx, buf));
                if let Some(tx) = &tx {
                    qp.charge(now, tx.len, &cc);
                }
                tx
            };
            if tx.is_none() {
                qp.scheduled = false;
            }
            // Sending arms the retransmit timer; a failed request may have stopped it.
            self.rearm(qpn);
            self.account(qpn);
            if let Some(tx) = tx {
                // More may follow: back to the end of the rotation.
                self.active.push_back(qpn);
                let dst = SocketAddr::new(tx.dest, self.cfg.dst_port);
                let Some(icrc) = self.icrc_to(tx.dest) else {
                    self.counters.dropped += 1;
                    continue;
                };
                if buf[0] == Opcode::RC_FLUSH.0 && self.cfg.flush_icrc == FlushIcrc::Rxe {
                    icrc.fill_rxe_flush(&mut buf[..tx.len]);
                } else {
                    icrc.fill(&mut buf[..tx.len]);
                }
                return Some(Transmit {
                    dst,
                    len: tx.len,
                    hop_limit: tx.hop_limit,
                    traffic_class: tx.traffic_class,
                    qpn,
                });
            }
        }
        None
    }

    /// The earliest timer deadline, if any: the top of a heap of QPs with a deadline, so its
    /// cost does not grow with the number of QPs. It may be a little early (a deadline that
    /// moved later); `handle_timeout` then only re-enters the later one.
    #[must_use]
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        self.prune_timers();
        self.timer_heap.peek().map(|&Reverse((t, _))| t)
    }

    /// Runs every timer that expired at `now` (a call before any deadline does nothing).
    pub fn handle_timeout<M: Memory + ?Sized>(&mut self, now: Instant, mem: &M) {
        let mut due = std::mem::take(&mut self.due);
        loop {
            self.prune_timers();
            match self.timer_heap.peek() {
                Some(&Reverse((t, qpn))) if t <= now => {
                    self.timer_heap.pop();
                    self.deadlines.remove(&qpn);
                    due.push(qpn);
                }
                _ => break,
            }
        }
        for &qpn in &due {
            if let Some(qp) = self.qps.get_mut(&qpn) {
                let mut ctx = ctx!(self, mem, now, None);
                qp.handle_timeout(&mut ctx);
                qp.retire_done(&mut ctx);
            }
            self.schedule(qpn);
        }
        due.clear();
        self.due = due;
    }

    /// The next work completion.
    #[must_use]
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// The next asynchronous event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    /// The state of a QP.
    pub fn qp_state(&self, qpn: u32) -> Option<QpState> {
        self.qps.get(&qpn).map(Qp::state)
    }

    /// Whether any QP (or QP1's stand-in, answering unserved MADs) has something to send now.
    pub fn has_transmit(&self) -> bool {
        !self.unserved_mads.is_empty()
            || self
                .active
                .iter()
                .any(|q| self.qps.get(q).is_some_and(Qp::has_work))
    }
}
