//! One queue pair: its state machine, its queues, and the three engines that work them —
//! requester (builds request packets), completer (retires send WQEs on ACKs, responses, NAKs
//! and timeouts) and responder (executes incoming requests and answers them).

mod completer;
mod notify;
mod requester;
mod responder;
mod timers;
mod why;

use std::collections::VecDeque;
use std::net::IpAddr;

use ferroce_wire::Psn;

use crate::congestion::RateLimiter;
use crate::endpoint::{AsyncEvent, Completion, Counters, WcQueue};
use crate::memory::Memory;
use crate::srq::Srq;
use crate::state::{self, ModifyLimits, ModifyQpError, Service};
use crate::time::Instant;
use crate::verbs::{
    InlineData, MAX_MSG_SZ, Mtu, QpAttr, QpAttrMask, QpCap, QpState, QpType, RecvWr, SendFlags,
    SendWr, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};

use completer::Completer;
use requester::Requester;
pub(crate) use requester::Tx;
pub use responder::GRH_LEN;
use responder::Responder;
pub(crate) use timers::Timer;
use timers::TimerTable;
pub use why::{ErrorCause, QpError};

/// The most PSNs a requester sends past the oldest unacknowledged one (rxe's
/// `RXE_MAX_UNACKED_PSNS`): its window toward kernel rxe, a NIC, and a peer not heard yet.
pub const MAX_UNACKED_PSNS: i32 = 128;

/// The window toward another ferroce (a peer whose packets come from the RoCE port, 4791;
/// kernel rxe's come from 0xC000 up). One QP's 64 KiB stream on loopback moves 3–5 % more with
/// 256 than with 128 (one ACK round trip covers twice the data) and 512 gives no more; where the
/// CPU is the limit (one core) it costs 3–5 % (docs/benchmarks.md). It fits the smallest
/// in-flight budget a device takes ([`crate::EndpointConfig::inflight_budget`]).
pub const FERROCE_PEER_UNACKED_PSNS: i32 = 256;

/// The most response packets one READ request asks for; longer READs are split.
pub const READ_CHUNK_PKTS: u32 = 64;

/// How far (in response packets) a split READ's requests may run ahead of its data.
pub const READ_WINDOW_PKTS: u32 = 128;

/// The response packets each READ request of a paired READ asks for (`SendWqe::split`): a
/// request of two packets is answered by a FIRST and a LAST, each with an AETH, so every
/// response packet of a READ stream is one size (a READ RESPONSE ONLY's too) and the
/// responder sends them in full `UDP_SEGMENT` trains, where a longer request's MIDDLEs are 4
/// bytes shorter than its FIRST and LAST and cut every response into three trains.
pub const READ_PAIR_PKTS: u32 = 2;

/// A requester sets AckReq at least this often inside a long message (rxe: every 64 packets).
pub const MAX_PKTS_PER_ACK: u32 = 64;

/// How a QP is created (`struct ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInitAttr {
    /// `qp_type`.
    pub qp_type: QpType,
    /// The protection domain (the provider's handle; keys must belong to it). An XRC receive
    /// QP has none: there it is the QP's XRC domain (`ibv_qp_init_attr_ex.xrcd`), and each
    /// request is checked against the PD of the XRC SRQ it names.
    pub pd: u32,
    /// `cap`.
    pub cap: QpCap,
    /// `srq`: the shared receive queue this QP receives from, if any.
    pub srq: Option<u32>,
    /// `sq_sig_all`: every send WR generates a completion.
    pub sq_sig_all: bool,
    /// `send_cq`: the caller's number for the CQ the send queue's completions go to; the
    /// engine returns it in each [`Completion::cq`].
    pub send_cq: u32,
    /// `recv_cq`: the CQ the receive queue's (or, with an SRQ, this QP's share of the SRQ's)
    /// completions go to.
    pub recv_cq: u32,
}

/// Why a work request was refused at post time (verbs returns an errno and fills `bad_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PostError {
    /// The QP is in a state that does not take this kind of work request (RESET, INIT, RTR for
    /// sends; RESET for receives).
    InvalidState(QpState),
    /// The queue already holds its `max_send_wr`/`max_recv_wr` work requests (ENOMEM).
    QueueFull,
    /// More SGEs than `max_send_sge`/`max_recv_sge`.
    TooManySge,
    /// INLINE data longer than `max_inline_data`.
    InlineTooLong,
    /// The message is longer than `max_msg_sz` (or, on UD, than the path MTU).
    MessageTooLong,
    /// The opcode is not valid on this QP type.
    InvalidOpcode,
    /// A UD send without a destination, or a UD destination on a connected QP.
    InvalidDestination,
    /// An atomic or ATOMIC WRITE whose SGEs (or inline data) are not exactly 8 bytes.
    InvalidAtomicLength,
    /// The QP receives from an SRQ; post receives there.
    UsesSrq,
    /// An INLINE send whose data could not be read from memory.
    InlineGatherFailed,
}

impl core::fmt::Display for PostError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let s = match self {
            PostError::InvalidState(s) => {
                return write!(f, "QP state {s:?} does not accept this work request");
            }
            PostError::QueueFull => "queue full",
            PostError::TooManySge => "too many scatter/gather elements",
            PostError::InlineTooLong => "inline data longer than max_inline_data",
            PostError::MessageTooLong => "message too long",
            PostError::InvalidOpcode => "opcode not valid on this QP type",
            PostError::InvalidDestination => "missing or unexpected UD destination",
            PostError::InvalidAtomicLength => {
                "atomic operations (and ATOMIC WRITE) need exactly 8 bytes of local memory"
            }
            PostError::UsesSrq => "this QP receives from an SRQ",
            PostError::InlineGatherFailed => "inline data could not be read",
        };
        f.write_str(s)
    }
}

impl std::error::Error for PostError {}

/// A posted send work request and its progress.
#[derive(Debug, Clone)]
pub(crate) struct SendWqe {
    /// The request; its `inline_data` holds the data of an INLINE send (copied at post time)
    /// and is `None` otherwise, so the payload is gathered from `sg_list` when it is sent.
    pub(crate) wr: SendWr,
    pub(crate) len: u32,
    pub(crate) signaled: bool,
    /// PSNs assigned when the WQE is first sent; they never change on retransmission.
    pub(crate) first_psn: Psn,
    pub(crate) last_psn: Psn,
    pub(crate) started: bool,
    /// An RDMA WRITE longer than the path MTU sent as one WRITE ONLY packet per MTU, each
    /// with a RETH of its own (its address and length), instead of FIRST, MIDDLE… and LAST:
    /// toward another ferroce only (`Qp::peer_ferroce` and `Ctx::split_writes`, decided when
    /// the WQE starts and kept for its retransmissions). Every packet of a WRITE stream is then
    /// one size and they leave in full `UDP_SEGMENT` trains (15 of 4 KiB), where a FIRST, 16
    /// bytes longer than the MIDDLEs after it, cuts every WRITE into two. Each packet is a
    /// whole WRITE to the responder (it checks each one's R_Key and range). Not a WRITE WITH
    /// IMMEDIATE: its receive completion's `byte_len` is the whole message's.
    ///
    /// An RDMA READ longer than two packets, likewise toward another ferroce only
    /// (`Ctx::pair_reads`), and only where `max_rd_atomic` lets its requests cover the whole
    /// [`READ_WINDOW_PKTS`]: requested in pairs ([`READ_PAIR_PKTS`]) instead of
    /// [`READ_CHUNK_PKTS`]-packet chunks, so its responses are all one size. Each pair is a
    /// READ request of its own to the responder and holds one of its resources.
    pub(crate) split: bool,
    /// READ: bytes of response data placed so far.
    pub(crate) read_done: u32,
    /// A zero-length READ: how many times its request has gone out.
    pub(crate) sends: u8,
    /// Set when the WQE is finished; it retires (and completes) once it reaches the head.
    pub(crate) status: Option<WcStatus>,
}

impl SendWqe {
    /// Packets (and PSNs) the message takes at path MTU `mtu`.
    pub(crate) fn npkts(&self, mtu: u32) -> u32 {
        if self.wr.opcode.is_atomic() {
            1
        } else {
            self.len.div_ceil(mtu).max(1)
        }
    }

    /// The response packets each READ request of this (READ) WQE asks for: a pair if it goes
    /// split, else a chunk of up to [`READ_CHUNK_PKTS`].
    pub(crate) fn read_chunk_pkts(&self) -> u32 {
        if self.split {
            READ_PAIR_PKTS
        } else {
            READ_CHUNK_PKTS
        }
    }
}

/// One queue pair.
#[derive(Debug)]
pub struct Qp {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) service: Service,
    pub(crate) pd: u32,
    pub(crate) srq: Option<u32>,
    /// An XRC receive QP's XRC domain.
    pub(crate) xrcd: Option<u32>,
    /// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`: the QP's own sends to a group do not come back to it.
    pub(crate) block_self_mcast_lb: bool,
    /// An XRC receive QP: whether the request being handled names an XRC SRQ of its domain
    /// (set by the endpoint before each request; `pd` and the receive CQ are that SRQ's).
    pub(crate) xrc_srq_ok: bool,
    pub(crate) sq_sig_all: bool,
    /// (send CQ, receive CQ): where completions are reported.
    pub(crate) cqs: (u32, u32),
    pub(crate) cap: QpCap,
    /// The port's active MTU: the packet size of UD QPs (rxe's `get_mtu`).
    pub(crate) port_mtu: Mtu,
    pub(crate) state: QpState,
    pub(crate) attr: QpAttr,
    pub(crate) sq: VecDeque<SendWqe>,
    pub(crate) rq: VecDeque<RecvWr>,
    /// The requester's part: what it sends next.
    pub(crate) req: Requester,
    /// The completer's part: what is acknowledged, the retry budgets.
    pub(crate) comp: Completer,
    /// The retransmission and RNR timers.
    pub(crate) timers: TimerTable,
    // Responder.
    pub(crate) resp: Responder,
    /// Whether the endpoint has this QP in its transmit rotation.
    pub(crate) scheduled: bool,
    /// The unacknowledged PSNs of this QP counted in the endpoint's in-flight total.
    pub(crate) counted_inflight: u32,
    /// The requester stopped because the endpoint's in-flight budget was used up.
    pub(crate) budget_blocked: bool,
    /// The reaction point's rate limiter while this QP is slowed by CNPs (boxed: most QPs
    /// never have one).
    pub(crate) rate: Option<Box<RateLimiter>>,
    /// A CE-marked packet arrived: a CNP is to go to the peer's QP.
    pub(crate) cnp_pending: bool,
    /// When the last CNP for this QP was sent (at most one per `cnp_interval`).
    pub(crate) last_cnp: Option<Instant>,
    /// The QP's first error and why (kept until RESET).
    pub(crate) first_error: Option<QpError>,
    /// Whether `first_error` was handed to the runtime to report (once).
    pub(crate) error_reported: bool,
    /// Whether a response has come from the peer since RTS.
    pub(crate) heard_since_rts: bool,
    /// RNR NAKs received since RTS.
    pub(crate) rnr_naks: u32,
    /// Whether an answer has acknowledged anything since RTS.
    pub(crate) progressed: bool,
    /// Answers since RTS whose PSN fit nothing outstanding, and the last one's PSN.
    pub(crate) strays: (u32, Psn),
    /// The peer is another ferroce (its RC packets come from the RoCE port, UDP 4791, where
    /// rxe and NICs send from ports of their own): it takes split WRITEs (see
    /// [`SendWqe::split`], when the endpoint's `split_writes` is on) and the send window is
    /// [`FERROCE_PEER_UNACKED_PSNS`] rather than [`MAX_UNACKED_PSNS`]. Learned from its
    /// packets, forgotten at RESET and when the address vector changes.
    pub(crate) peer_ferroce: bool,
}

/// What the QP needs from its endpoint while it works.
pub(crate) struct Ctx<'a, M: Memory + ?Sized> {
    pub(crate) mem: &'a M,
    pub(crate) now: Instant,
    pub(crate) counters: &'a mut Counters,
    pub(crate) events: &'a mut VecDeque<AsyncEvent>,
    pub(crate) completions: &'a mut VecDeque<Completion>,
    pub(crate) srq: Option<&'a mut Srq>,
    /// Whether a new request PSN may go out (the endpoint's in-flight budget is not used up).
    pub(crate) budget_open: bool,
    /// Whether half the endpoint's in-flight budget is used: every message's last packet then
    /// asks for an ACK.
    pub(crate) budget_low: bool,
    /// The endpoint's [`EndpointConfig::split_writes`](crate::EndpointConfig::split_writes):
    /// long WRITEs to another ferroce go split.
    pub(crate) split_writes: bool,
    /// The endpoint's [`EndpointConfig::pair_reads`](crate::EndpointConfig::pair_reads):
    /// long READs from another ferroce are requested in pairs.
    pub(crate) pair_reads: bool,
}

impl Qp {
    /// Queues a completion of `queue` for the CQ that queue reports to.
    pub(crate) fn report<M: Memory + ?Sized>(
        &self,
        ctx: &mut Ctx<'_, M>,
        queue: WcQueue,
        wc: WorkCompletion,
    ) {
        let cq = match queue {
            WcQueue::Send => self.cqs.0,
            WcQueue::Recv => self.cqs.1,
        };
        ctx.completions.push_back(Completion {
            qpn: self.qpn,
            cq,
            queue,
            wc,
        });
    }

    /// The CQs this QP reports to: (send, receive).
    pub(crate) fn cqs(&self) -> (u32, u32) {
        self.cqs
    }

    pub(crate) fn new(qpn: u32, init: &QpInitAttr, port_mtu: Mtu) -> Qp {
        Qp {
            port_mtu,
            qpn,
            qp_type: init.qp_type,
            service: Service::of(init.qp_type, qpn),
            pd: init.pd,
            srq: init.srq,
            xrcd: (init.qp_type == QpType::XrcRecv).then_some(init.pd),
            xrc_srq_ok: false,
            block_self_mcast_lb: false,
            sq_sig_all: init.sq_sig_all,
            cqs: (init.send_cq, init.recv_cq),
            cap: init.cap,
            state: QpState::Reset,
            attr: QpAttr {
                cap: init.cap,
                ..QpAttr::default()
            },
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            req: Requester::default(),
            comp: Completer::default(),
            timers: TimerTable::default(),
            resp: Responder::default(),
            scheduled: false,
            counted_inflight: 0,
            budget_blocked: false,
            rate: None,
            cnp_pending: false,
            last_cnp: None,
            first_error: None,
            error_reported: false,
            heard_since_rts: false,
            rnr_naks: 0,
            progressed: false,
            strays: (0, Psn::new(0)),
            peer_ferroce: false,
        }
    }

    /// Request PSNs not yet acknowledged of the messages started (RC in RTS or SQD; 0
    /// otherwise), at most one window: what this QP may have in the network, or has asked the
    /// peer to send back (READ responses), without asking its endpoint's budget again.
    pub(crate) fn unacked_psns(&self) -> u32 {
        if !self.qp_type.is_reliable() || !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return 0;
        }
        let n = self.comp.psn().distance_to(self.req.committed_psn());
        u32::try_from(n.min(self.send_window())).unwrap_or(0)
    }

    /// The most request PSNs this QP sends past the oldest unacknowledged one: rxe's window,
    /// or a wider one toward another ferroce.
    pub(crate) fn send_window(&self) -> i32 {
        if self.peer_ferroce {
            FERROCE_PEER_UNACKED_PSNS
        } else {
            MAX_UNACKED_PSNS
        }
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// `query_qp`: the current attributes.
    pub fn query(&self) -> QpAttr {
        QpAttr {
            qp_state: self.state,
            cur_qp_state: self.state,
            sq_draining: self.req.draining(),
            cap: self.cap,
            ..self.attr
        }
    }

    /// The packet payload size in bytes: the path MTU of a connected QP, the port MTU on UD.
    pub(crate) fn mtu(&self) -> u32 {
        match self.qp_type {
            QpType::Ud => self.port_mtu.bytes(),
            _ => self.attr.path_mtu.bytes(),
        }
    }

    /// The peer of a connected QP.
    pub(crate) fn peer(&self) -> Option<IpAddr> {
        self.attr.ah_attr.map(|a| a.dest)
    }

    pub(crate) fn modify<M: Memory + ?Sized>(
        &mut self,
        attr: &QpAttr,
        mask: QpAttrMask,
        limits: &ModifyLimits,
        ctx: &mut Ctx<'_, M>,
    ) -> Result<(), ModifyQpError> {
        let mask = self.service.effective_mask(mask);
        let next = state::check_modify(self.service, self.state, attr, mask, limits)?;
        if self.state == QpState::Sqd
            && self.req.draining()
            && next != QpState::Err
            && next != QpState::Reset
        {
            return Err(ModifyQpError::InvalidAttr {
                attr: QpAttrMask::STATE,
                reason: "the send queue is still draining (wait for IBV_EVENT_SQ_DRAINED)",
                values: None,
            });
        }
        let from = self.state;
        self.apply_attrs(attr, mask);
        match next {
            QpState::Reset => self.reset(),
            QpState::Rtr if from == QpState::Init => {
                self.resp = Responder::new(Psn::new(self.attr.rq_psn));
            }
            QpState::Rts if from == QpState::Rtr => {
                self.heard_since_rts = false;
                self.rnr_naks = 0;
                self.progressed = false;
                self.strays = (0, Psn::new(0));
                let sq_psn = Psn::new(self.attr.sq_psn);
                self.req.start(sq_psn);
                self.comp
                    .start(sq_psn, self.attr.retry_cnt, self.attr.rnr_retry);
            }
            QpState::Sqd if from == QpState::Rts => {
                self.req.start_draining();
            }
            QpState::Err if from != QpState::Err => {
                self.state = QpState::Err;
                self.flush(ctx, None);
            }
            _ => {}
        }
        self.state = next;
        if next == QpState::Sqd {
            self.check_drained(ctx);
        }
        Ok(())
    }

    fn apply_attrs(&mut self, attr: &QpAttr, mask: QpAttrMask) {
        let a = &mut self.attr;
        let set = |bit: QpAttrMask| mask.contains(bit);
        if set(QpAttrMask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if set(QpAttrMask::QKEY) {
            a.qkey = attr.qkey;
        }
        if set(QpAttrMask::RQ_PSN) {
            a.rq_psn = attr.rq_psn;
        }
        if set(QpAttrMask::SQ_PSN) {
            a.sq_psn = attr.sq_psn;
        }
        if set(QpAttrMask::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if set(QpAttrMask::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if set(QpAttrMask::AV) {
            if a.ah_attr != attr.ah_attr {
                self.peer_ferroce = false;
            }
            a.ah_attr = attr.ah_attr;
        }
        if set(QpAttrMask::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if set(QpAttrMask::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }
        if set(QpAttrMask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if set(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if set(QpAttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if set(QpAttrMask::PORT) {
            a.port_num = attr.port_num;
        }
        if set(QpAttrMask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if set(QpAttrMask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
            self.comp.set_retry_cnt(attr.retry_cnt);
        }
        if set(QpAttrMask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
            self.comp.set_rnr_retry(attr.rnr_retry);
        }
    }

    /// RESET: every queue emptied without completions, every counter and PSN back to zero.
    fn reset(&mut self) {
        let keep = (
            self.qpn,
            self.qp_type,
            self.pd,
            self.srq,
            self.sq_sig_all,
            self.cap,
            self.attr,
        );
        let init = QpInitAttr {
            qp_type: keep.1,
            pd: self.xrcd.unwrap_or(keep.2),
            cap: keep.5,
            srq: keep.3,
            sq_sig_all: keep.4,
            send_cq: self.cqs.0,
            recv_cq: self.cqs.1,
        };
        let block = self.block_self_mcast_lb;
        *self = Qp::new(keep.0, &init, self.port_mtu);
        self.block_self_mcast_lb = block;
        self.attr = QpAttr {
            qp_state: QpState::Reset,
            ..keep.6
        };
    }

    /// Validates and queues a send work request (`ibv_post_send` for one WR).
    pub(crate) fn post_send<M: Memory + ?Sized>(
        &mut self,
        wr: &SendWr,
        ctx: &mut Ctx<'_, M>,
    ) -> Result<(), PostError> {
        match self.state {
            QpState::Reset | QpState::Init | QpState::Rtr => {
                return Err(PostError::InvalidState(self.state));
            }
            _ => {}
        }
        if self.sq.len() >= self.cap.max_send_wr as usize {
            return Err(PostError::QueueFull);
        }
        if wr.sg_list.len() > self.cap.max_send_sge as usize {
            return Err(PostError::TooManySge);
        }
        if !wr.opcode.allowed_on(self.qp_type) {
            return Err(PostError::InvalidOpcode);
        }
        if (self.qp_type == QpType::Ud) != wr.ud.is_some() {
            return Err(PostError::InvalidDestination);
        }
        let len = wr.length();
        if len > MAX_MSG_SZ || (self.qp_type == QpType::Ud && len > u64::from(self.mtu())) {
            return Err(PostError::MessageTooLong);
        }
        let atomic_write = wr.opcode == crate::verbs::WrOpcode::AtomicWrite;
        if (wr.opcode.is_atomic() || atomic_write) && len != 8 {
            return Err(PostError::InvalidAtomicLength);
        }
        if wr.opcode == crate::verbs::WrOpcode::Flush && !wr.flush.is_some_and(|f| f.is_valid()) {
            // A FLUSH names its placement type and level (`ibv_wr_flush`).
            return Err(PostError::InvalidOpcode);
        }
        if wr.opcode == crate::verbs::WrOpcode::BindMw && wr.bind_mw.is_none() {
            // A BIND_MW names its window and range in `bind_mw`.
            return Err(PostError::InvalidOpcode);
        }
        // An ATOMIC WRITE's 8 bytes are taken at post time, as rxe does (the extended API's
        // `ibv_wr_atomic_write` passes them by pointer, valid only during the call).
        let inline_req = (wr.send_flags.contains(SendFlags::INLINE)
            && !wr.opcode.is_read_or_atomic())
            || atomic_write;
        let inline = if inline_req {
            if len > u64::from(self.cap.max_inline_data) && !atomic_write {
                return Err(PostError::InlineTooLong);
            }
            match &wr.inline_data {
                Some(d) => Some(d.clone()),
                None => {
                    let mut data = InlineData::filled(len as usize, 0);
                    crate::memory::gather(ctx.mem, self.pd, &wr.sg_list, 0, &mut data)
                        .map_err(|_| PostError::InlineGatherFailed)?;
                    Some(data)
                }
            }
        } else {
            None
        };
        let signaled = self.sq_sig_all || wr.send_flags.contains(SendFlags::SIGNALED);
        self.sq.push_back(SendWqe {
            wr: wr.queued_with(inline),
            len: len as u32,
            signaled,
            first_psn: Psn::new(0),
            last_psn: Psn::new(0),
            started: false,
            split: false,
            read_done: 0,
            sends: 0,
            status: None,
        });
        if matches!(self.state, QpState::Err | QpState::Sqe) {
            self.flush(ctx, None);
        }
        Ok(())
    }

    /// Validates and queues a receive work request (`ibv_post_recv` for one WR).
    pub(crate) fn post_recv<M: Memory + ?Sized>(
        &mut self,
        wr: RecvWr,
        ctx: &mut Ctx<'_, M>,
    ) -> Result<(), PostError> {
        if self.srq.is_some() {
            return Err(PostError::UsesSrq);
        }
        if self.state == QpState::Reset {
            return Err(PostError::InvalidState(self.state));
        }
        if self.rq.len() >= self.cap.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        if wr.sg_list.len() > self.cap.max_recv_sge as usize {
            return Err(PostError::TooManySge);
        }
        self.rq.push_back(wr);
        if self.state == QpState::Err {
            self.flush(ctx, None);
        }
        Ok(())
    }

    /// Completes every outstanding WR with `WrFlushErr`, in order; the send WQE at `failed`
    /// (if any) completes with its own error status instead.
    pub(crate) fn flush<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        failed: Option<(usize, WcStatus)>,
    ) {
        let sq = std::mem::take(&mut self.sq);
        for (i, w) in sq.into_iter().enumerate() {
            let status = match failed {
                Some((f, s)) if f == i => s,
                _ => w
                    .status
                    .filter(|s| *s != WcStatus::Success)
                    .unwrap_or(WcStatus::WrFlushErr),
            };
            self.report(
                ctx,
                WcQueue::Send,
                wc(self.qpn, w.wr.wr_id, status, w.wr.opcode.into(), 0),
            );
        }
        self.req.restart();
        self.timers.stop_all();
        if let Some(w) = self.resp.take_in_progress_recv() {
            self.complete_recv_flush(ctx, w.wr_id);
        }
        while let Some(w) = self.rq.pop_front() {
            self.complete_recv_flush(ctx, w.wr_id);
        }
        if self.srq.is_some() {
            ctx.events
                .push_back(AsyncEvent::QpLastWqeReached { qpn: self.qpn });
        }
    }

    fn complete_recv_flush<M: Memory + ?Sized>(&self, ctx: &mut Ctx<'_, M>, wr_id: u64) {
        self.report(
            ctx,
            WcQueue::Recv,
            wc(self.qpn, wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0),
        );
    }

    /// Moves the QP to ERR because of a transport error: the send WQE at `idx` completes with
    /// `status`, everything else is flushed; `cause` is what the QP's first error keeps.
    pub(crate) fn fail_because<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        idx: usize,
        status: WcStatus,
        cause: ErrorCause,
    ) {
        let wr_id = self.sq.get(idx).map_or(0, |w| w.wr.wr_id);
        self.note_error(status, wr_id, cause);
        self.state = QpState::Err;
        self.attr.qp_state = QpState::Err;
        self.flush(ctx, Some((idx, status)));
    }

    /// Keeps the QP's first error (later ones are its consequences), and says it at debug.
    pub(crate) fn note_error(&mut self, status: WcStatus, wr_id: u64, cause: ErrorCause) {
        if self.first_error.is_some() {
            return;
        }
        let e = QpError {
            status,
            wr_id,
            cause,
            peer: self.peer(),
            dest_qp_num: self.attr.dest_qp_num,
        };
        log::debug!("QP {:#x}: {status:?} (wr_id {wr_id}): {e}", self.qpn);
        self.first_error = Some(e);
    }

    /// The QP's first error since RESET, with its cause.
    pub fn first_error(&self) -> Option<QpError> {
        self.first_error
    }

    /// Retires finished WQEs at the head of the send queue, in order, completing the signaled
    /// (and every failed) one.
    pub(crate) fn retire_done<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>) {
        while let Some(w) = self.sq.front() {
            let Some(status) = w.status else { break };
            // What the completion needs, read in place: the WQE is large and is dropped
            // where it lies rather than moved out.
            let (report, wr_id, opcode, len) = (
                w.signaled || status != WcStatus::Success,
                w.wr.wr_id,
                w.wr.opcode,
                w.len,
            );
            self.sq.pop_front();
            // If the requester was about to resend this WQE (after a rewind) when the ACK
            // covering it arrived, it resumes the next one where the peer's ACKs leave it.
            let resume = self.sq.front().map_or(0, |n| self.resume_offset(n));
            self.req.head_retired(|| resume);
            if report {
                self.report(
                    ctx,
                    WcQueue::Send,
                    wc(self.qpn, wr_id, status, opcode.into(), len),
                );
            }
        }
        self.check_drained(ctx);
    }

    /// Where go-back-N resumes inside a started WQE: for a SEND/WRITE the bytes before
    /// `comp_psn`, for a READ the bytes already received.
    pub(crate) fn resume_offset(&self, w: &SendWqe) -> u32 {
        if w.wr.opcode == crate::verbs::WrOpcode::RdmaRead && w.started {
            return w.read_done;
        }
        if !w.started || w.wr.opcode.is_atomic() {
            return 0;
        }
        let pkts = w.first_psn.distance_to(self.comp.psn()).max(0) as u32;
        pkts.saturating_mul(self.mtu()).min(w.len)
    }

    /// In SQD, raises `SqDrained` once nothing sent is unacknowledged.
    pub(crate) fn check_drained<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>) {
        if self.req.draining() && self.sq.front().is_none_or(|w| !w.started) {
            self.req.finish_draining();
            ctx.events
                .push_back(AsyncEvent::SqDrained { qpn: self.qpn });
        }
    }

    /// The earliest deadline of this QP's timers.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Whether the requester may have a packet to send or the responder a response.
    pub(crate) fn has_work(&self) -> bool {
        if self.cnp_pending {
            return true;
        }
        if self.timers.is_armed(Timer::Pace) {
            return self.resp.ack_first();
        }
        self.resp.has_output()
            || (self.req.has_pending(self.sq.len()) && !self.timers.is_armed(Timer::RnrWait))
    }
}

/// A work completion with the fields every completion shares.
pub(crate) fn wc(
    qpn: u32,
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    byte_len: u32,
) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode,
        vendor_err: 0,
        byte_len,
        imm_data: 0,
        qp_num: qpn,
        src_qp: 0,
        wc_flags: WcFlags::EMPTY,
        sl: 0,
        completion_ts: 0,
        completion_wallclock_ns: 0,
        invalidated_rkey: 0,
    }
}
