//! The endpoint's vocabulary: its configuration, what it outputs (datagrams, completions,
//! events), its counters and its errors.

use std::net::{IpAddr, SocketAddr};

use crate::congestion::CongestionConfig;
use crate::qp::PostError;
use crate::state::{ModifyLimits, ModifyQpError};
use crate::verbs::WorkCompletion;

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
    /// The CQ it goes to: the QP's `send_cq` or `recv_cq` from its
    /// [`QpInitAttr`](crate::QpInitAttr).
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
    /// ([`Endpoint::qp_error`](crate::Endpoint::qp_error)), which a LAST_WQE_REACHED reports as
    /// its cause.
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

impl core::ops::AddAssign for Counters {
    /// Adds `other`'s counts to these (the counters of a device's shards summed).
    fn add_assign(&mut self, other: Counters) {
        self.sent_pkts += other.sent_pkts;
        self.rcvd_pkts += other.rcvd_pkts;
        self.duplicate_request += other.duplicate_request;
        self.out_of_seq_request += other.out_of_seq_request;
        self.rcvd_seq_err += other.rcvd_seq_err;
        self.rcvd_rnr_err += other.rcvd_rnr_err;
        self.send_rnr_err += other.send_rnr_err;
        self.retry_exceeded_err += other.retry_exceeded_err;
        self.retry_rnr_exceeded_err += other.retry_rnr_exceeded_err;
        self.completer_retry_err += other.completer_retry_err;
        self.implied_naks += other.implied_naks;
        self.icrc_errors += other.icrc_errors;
        self.icrc_partial += other.icrc_partial;
        self.malformed += other.malformed;
        self.no_qp += other.no_qp;
        self.qkey_violations += other.qkey_violations;
        self.pkey_violations += other.pkey_violations;
        self.ghost_responses += other.ghost_responses;
        self.duplicate_responses += other.duplicate_responses;
        self.dropped += other.dropped;
        self.rd_atomic_exceeded += other.rd_atomic_exceeded;
        self.msg_too_long += other.msg_too_long;
        self.ecn_marked_pkts += other.ecn_marked_pkts;
        self.cnp_sent += other.cnp_sent;
        self.cnp_handled += other.cnp_handled;
        self.cnp_ignored += other.cnp_ignored;
    }
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

/// The smallest buffer [`Endpoint::poll_transmit`](crate::Endpoint::poll_transmit) takes: the
/// largest RoCEv2 packet (4 KiB of payload behind the longest header chain, pad and ICRC) with
/// room to spare.
pub const MIN_TRANSMIT_BUF: usize = 4096 + 100;

/// [`Endpoint::poll_transmit`](crate::Endpoint::poll_transmit) was given a buffer shorter than
/// [`MIN_TRANSMIT_BUF`].
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
    /// waits for ACKs of any QP; one QP's own window (128 PSNs, 256 toward another ferroce)
    /// always fits.
    pub inflight_budget: u32,
    /// ECN and CNPs (DCQCN's notification and reaction points); both on by default.
    pub congestion: CongestionConfig,
    /// The ICRC sent FLUSHes carry: kernel rxe's form by default, the only FLUSH peer there
    /// is (see [`FlushIcrc`]). Received FLUSHes are taken in either form.
    pub flush_icrc: FlushIcrc,
    /// Send an RC RDMA WRITE longer than the path MTU to another ferroce as one WRITE ONLY
    /// packet per MTU, each with its own RETH, so a stream of WRITEs leaves in full trains (on
    /// by default). A peer counts as ferroce when its packets come from the RoCE port itself
    /// (`dst_port`, 4791), which ferroce's sockets are bound to: kernel rxe's come from 0xC000
    /// and up, and WRITEs to it keep the FIRST/MIDDLE/LAST shape.
    pub split_writes: bool,
    /// Request an RC RDMA READ longer than two packets from another ferroce as READ requests
    /// of two packets each (on by default), whose responses (a FIRST and a LAST, each with an
    /// AETH) are all one size and leave the responder in full trains; only where the QP's
    /// `max_rd_atomic` is at least half of the packets a READ may have requested ahead of its
    /// data (64 of 128), so its depth in flight is unchanged. Each pair holds a responder
    /// resource (`max_dest_rd_atomic`) as any READ request does. Toward kernel rxe a long READ
    /// keeps its requests of up to 64 packets.
    pub pair_reads: bool,
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
            split_writes: true,
            pair_reads: true,
        }
    }
}
