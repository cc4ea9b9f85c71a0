//! The communication manager (IBTA Vol. 1 ch. 12, as kernel `ib_cm` + `rdma_cm` do it over
//! RoCE), sans-IO like the rest of the engine: one [`CmEngine`] per device holds every
//! connection's state machine, the listeners by ServiceID, the CM timers and retries. MADs
//! come in through [`CmEngine::handle_mad`], go out through [`CmEngine::poll_transmit`]; what
//! the application must know comes out of [`CmEngine::poll_event`]; time only through `now`.
//!
//! The engine speaks IB CM: ServiceIDs, comm IDs, private data areas. The rdma_cm layer above
//! it (the rdma_cm header, ports, address resolution) is the caller's.

mod conn;
mod deadlines;
mod incoming;
pub(crate) use incoming::{unmatched_response, unserved_dreq_answer};
pub mod param;

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::Duration;

use ferroce_wire::cm::{self as wire_cm, Message, mra, rej, rej_reason, req, sidr_rep, sidr_req};
use ferroce_wire::mad::MAD_LEN;

use crate::time::Instant;
pub use conn::State;
use conn::{Conn, Role};
use deadlines::Deadlines;
pub use param::{ConnParam, DepthCaps, DepthError, Negotiated, Path, QpPlan};

/// A connection's handle: its Local Communication ID (first byte: the engine's prefix).
pub type CommId = u32;

/// How an engine is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmConfig {
    /// The device's node GUID (Local CA GUID of every REQ and REP).
    pub ca_guid: u64,
    /// The first byte of every Local Communication ID this engine hands out (a host shares
    /// QP1, and the GSI routing point sends a CM message to the process its first byte names).
    pub comm_id_prefix: u8,
    /// The device's `local_ca_ack_delay` (rxe: 15), sent as the REP's Target ACK Delay.
    pub local_ca_ack_delay: u8,
    /// Seed of the engine's PRNG (comm IDs, starting PSNs): the caller's randomness.
    pub seed: u64,
}

/// Why a CM call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmError {
    /// No connection with this ID.
    NoSuchId(CommId),
    /// The connection is not in a state that allows this call; its state.
    InvalidState(State),
    /// Private data longer than the message carries; the limit.
    PrivateDataTooLong {
        /// The most the message takes.
        max: usize,
    },
    /// Someone already listens for this ServiceID.
    ServiceInUse(u64),
    /// Every comm ID of the prefix is in use.
    NoCommIdLeft,
}

impl core::fmt::Display for CmError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CmError::NoSuchId(id) => write!(f, "no CM connection {id:#010x}"),
            CmError::InvalidState(s) => write!(f, "not allowed in CM state {s:?}"),
            CmError::PrivateDataTooLong { max } => {
                write!(
                    f,
                    "private data longer than the {max} bytes the message carries"
                )
            }
            CmError::ServiceInUse(s) => write!(f, "ServiceID {s:#x} already has a listener"),
            CmError::NoCommIdLeft => f.write_str("no communication ID left"),
        }
    }
}

impl std::error::Error for CmError {}

/// What a REQ asked for, from the passive side's point of view (kernel
/// `ib_cm_req_event_param` after rdma_cm's swap).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// The ServiceID it is for.
    pub service_id: u64,
    /// The active side's QP.
    pub remote_qpn: u32,
    /// The active side's node GUID.
    pub remote_ca_guid: u64,
    /// READs/atomics the active side wants to have outstanding here (REQ Initiator Depth).
    pub responder_resources: u8,
    /// READs/atomics this side may issue there (REQ Responder Resources).
    pub initiator_depth: u8,
    /// The active side's retry count (both QPs').
    pub retry_count: u8,
    /// The active side's RNR retry count (this side's QP's).
    pub rnr_retry_count: u8,
    /// Whether the active QP uses an SRQ.
    pub srq: bool,
    /// Flow control flag.
    pub flow_control: u8,
    /// 0 RC, 1 UC.
    pub transport_service_type: u8,
    /// The path as the REQ gives it (addresses from its GIDs, MTU, flow label, class).
    pub path: Path,
}

/// What a REP answered (the active side's view).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyInfo {
    /// The passive side's QP.
    pub remote_qpn: u32,
    /// The passive side's node GUID.
    pub remote_ca_guid: u64,
    /// READs/atomics this side may have outstanding (REP Responder Resources).
    pub initiator_depth: u8,
    /// READs/atomics the passive side may have outstanding here (REP Initiator Depth).
    pub responder_resources: u8,
    /// This QP's RNR retry count (REP RNR Retry Count).
    pub rnr_retry_count: u8,
    /// Whether the passive QP uses an SRQ.
    pub srq: bool,
    /// Flow control flag.
    pub flow_control: u8,
}

/// What happened, for the application (rdma_cm's events, IB CM's view).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a listened ServiceID: a new connection `id` in `ReqRcvd`, to accept or
    /// reject. `private_data` is the whole area (92 bytes).
    ConnectRequest {
        /// The new connection.
        id: CommId,
        /// Where the REQ came from.
        peer: IpAddr,
        /// What it asked for.
        info: RequestInfo,
        /// The REQ's private data.
        private_data: Vec<u8>,
    },
    /// The REP to this side's REQ: program the QP ([`CmEngine::qp_plan`]), then
    /// [`CmEngine::establish`]. `private_data`: 196 bytes.
    ConnectResponse {
        /// The connection.
        id: CommId,
        /// What the passive side chose.
        info: ReplyInfo,
        /// The REP's private data.
        private_data: Vec<u8>,
    },
    /// The connection is up (passive: the RTU came, or the QP saw traffic first; active:
    /// the RTU was sent).
    Established {
        /// The connection.
        id: CommId,
    },
    /// The peer (or its CM) refused: REJ `reason` with its 148 bytes of private data.
    Rejected {
        /// The connection.
        id: CommId,
        /// The REJ reason (8 nobody listens, 28 the application said no, ...).
        reason: u16,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// A REQ, REP or SIDR_REQ went unanswered through every retry (rdma_cm's
    /// `RDMA_CM_EVENT_UNREACHABLE`, status −ETIMEDOUT).
    Unreachable {
        /// The connection.
        id: CommId,
    },
    /// The connection is closing: the peer's DREQ arrived, or this side's DREQ was answered
    /// (or, with `timed_out`, never was).
    Disconnected {
        /// The connection.
        id: CommId,
        /// This side's DREQ went unanswered.
        timed_out: bool,
    },
    /// The connection left timewait: its ID and QP may be reused.
    TimewaitExit {
        /// The connection.
        id: CommId,
    },
    /// A SIDR_REQ for a listened ServiceID: accept with a QP and Q_Key, or reject.
    SidrRequest {
        /// The request.
        id: CommId,
        /// Where it came from.
        peer: IpAddr,
        /// The ServiceID asked for.
        service_id: u64,
        /// Its 216 bytes of private data.
        private_data: Vec<u8>,
    },
    /// The SIDR_REP to this side's SIDR_REQ: `status` 0 with the QP and Q_Key to send to.
    SidrResponse {
        /// The request.
        id: CommId,
        /// SIDR status (0 success, 1 nobody serves it, 2 rejected, ...).
        status: u8,
        /// The QP that serves it.
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
        /// The SIDR_REP's 136 bytes of private data.
        private_data: Vec<u8>,
    },
}

/// A MAD to send: 256 bytes for QP `dest_qpn` at `dest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The peer's address.
    pub dest: IpAddr,
    /// The peer's QP: 1 (its GSI QP) for every CM message; the requester's own QP for the
    /// answer to a Get or Set nobody serves, as the kernel's MAD layer answers to the
    /// request's source QP.
    pub dest_qpn: u32,
    /// The MAD.
    pub mad: [u8; MAD_LEN],
}

/// What the active side asks for in a REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectReq {
    /// The ServiceID (rdma_cm: `port_space << 16 | port`).
    pub service_id: u64,
    /// The route.
    pub path: Path,
    /// The local QP.
    pub qpn: u32,
    /// 0 RC, 1 UC.
    pub transport_service_type: u8,
    /// The negotiated-ready parameters ([`ConnParam::for_connect`] applied), with the whole
    /// private data (rdma_cm header included), ≤ 92 bytes.
    pub param: ConnParam,
    /// The QP `timeout` both sides program (rdma_cm's ACK_TIMEOUT option, or 19).
    pub ack_timeout: u8,
}

/// Counters of the CM (kernel `cm_rx_duplicates` and friends).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// MADs received.
    pub received: u64,
    /// MADs sent (first sends and retries).
    pub sent: u64,
    /// Retransmissions after a timeout.
    pub retries: u64,
    /// Duplicates seen (REQ, REP, RTU, DREQ).
    pub duplicates: u64,
    /// MADs dropped: unreadable, for no connection, or not expected in the state.
    pub dropped: u64,
    /// REJs sent.
    pub rejects_sent: u64,
    /// Requests dropped unanswered because their listener's backlog was full
    /// ([`CmEngine::drop_request`]).
    pub backlog_drops: u64,
    /// REQs for a bound ServiceID not listened yet that found 64 already waiting, rejected at
    /// once (invalid service ID) instead of held.
    pub held_full: u64,
    /// Connections given up after every retry of a REQ, REP, MRA or SIDR_REQ left unanswered
    /// (ended UNREACHABLE: `RDMA_CM_EVENT_UNREACHABLE`).
    pub unreachable: u64,
}

/// How long a REQ for a ServiceID that is bound but not listened yet waits for the listen
/// before it is rejected (invalid service ID, as at once for a port nobody holds).
pub const BOUND_REQ_HOLD: Duration = Duration::from_millis(1000);

/// Most REQs held at once (more are rejected at once).
const MAX_HELD: usize = 64;

/// A REQ waiting for the listen of its bound ServiceID.
#[derive(Debug, Clone)]
struct HeldReq {
    service_id: u64,
    until: Instant,
    src: IpAddr,
    mad: [u8; MAD_LEN],
}

/// The connection manager of one device.
#[derive(Debug)]
pub struct CmEngine {
    cfg: CmConfig,
    rng: u64,
    conns: HashMap<CommId, Conn>,
    /// Every armed connection timer, earliest first.
    deadlines: Deadlines,
    /// Listened ServiceIDs.
    listeners: HashMap<u64, ()>,
    /// Bound ServiceIDs (`rdma_bind_addr` took the port; a listen may follow).
    bound: HashMap<u64, ()>,
    /// REQs for a bound ServiceID that arrived before its listen.
    held: Vec<HeldReq>,
    /// (remote comm ID, remote CA GUID) → local ID: finds duplicate REQs.
    by_remote: HashMap<(u32, u64), CommId>,
    out: VecDeque<Outgoing>,
    events: VecDeque<CmEvent>,
    counters: CmCounters,
}

impl CmEngine {
    /// An engine with no connections and no listeners.
    pub fn new(cfg: CmConfig) -> CmEngine {
        CmEngine {
            rng: cfg.seed ^ 0x9E37_79B9_7F4A_7C15,
            cfg,
            conns: HashMap::new(),
            deadlines: Deadlines::default(),
            listeners: HashMap::new(),
            bound: HashMap::new(),
            held: Vec::new(),
            by_remote: HashMap::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            counters: CmCounters::default(),
        }
    }

    /// The counters.
    pub fn counters(&self) -> CmCounters {
        self.counters
    }

    /// The state of connection `id`.
    pub fn state(&self, id: CommId) -> Option<State> {
        self.conns.get(&id).map(|c| c.state)
    }

    /// How many connections the engine holds (timewait included).
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    fn next_random(&mut self) -> u64 {
        // splitmix64: the caller's seed, stepped.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A fresh 24-bit starting PSN.
    fn next_psn(&mut self) -> u32 {
        (self.next_random() & 0xFF_FFFF) as u32
    }

    fn new_comm_id(&mut self) -> Result<CommId, CmError> {
        for _ in 0..64 {
            let low = (self.next_random() & 0xFF_FFFF) as u32;
            let id = u32::from(self.cfg.comm_id_prefix) << 24 | low;
            // 0 is "no connection" in a REJ's Local Comm ID.
            if low != 0 && !self.conns.contains_key(&id) {
                return Ok(id);
            }
        }
        Err(CmError::NoCommIdLeft)
    }

    /// Listens for REQs and SIDR_REQs to `service_id`.
    ///
    /// # Errors
    /// [`CmError::ServiceInUse`] if it is listened already.
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if self.listeners.insert(service_id, ()).is_some() {
            return Err(CmError::ServiceInUse(service_id));
        }
        Ok(())
    }

    /// Stops listening for `service_id` (connections made through it stay).
    pub fn unlisten(&mut self, service_id: u64) {
        self.listeners.remove(&service_id);
    }

    /// Marks `service_id` bound (`rdma_bind_addr` took its port, a listen may follow): a REQ
    /// for it that arrives before [`CmEngine::listen`] waits up to [`BOUND_REQ_HOLD`] for it
    /// instead of being rejected at once. A program that sends its port to its peer between
    /// bind and listen (qperf does) thus never loses the race to a peer faster than itself; the
    /// kernel rejects such a REQ, where the window is microseconds rather than a descheduled
    /// process's milliseconds.
    pub fn bind(&mut self, service_id: u64) {
        self.bound.insert(service_id, ());
    }

    /// Ends [`CmEngine::bind`]: REQs still held for `service_id` are rejected now.
    pub fn unbind(&mut self, service_id: u64) {
        self.bound.remove(&service_id);
        let held = std::mem::take(&mut self.held);
        for h in held {
            if h.service_id == service_id && !self.listeners.contains_key(&service_id) {
                self.reject_held(&h);
            } else {
                self.held.push(h);
            }
        }
    }

    /// Keeps a REQ for a bound ServiceID until its listen; false if it cannot be kept.
    pub(crate) fn hold_req(
        &mut self,
        now: Instant,
        src: IpAddr,
        service_id: u64,
        mad: &[u8],
    ) -> bool {
        if !self.bound.contains_key(&service_id) {
            return false;
        }
        if self.held.len() >= MAX_HELD {
            self.counters.held_full += 1;
            log::debug!(
                "CM: REQ from {src} for ServiceID {service_id:#x}, bound but not listened yet: \
                 {MAX_HELD} REQs wait already, rejected at once"
            );
            return false;
        }
        let Ok(mad) = <[u8; MAD_LEN]>::try_from(mad) else {
            return false;
        };
        log::debug!(
            "CM: REQ from {src} for ServiceID {service_id:#x}, bound but not listened yet: held \
             for up to {} ms",
            BOUND_REQ_HOLD.as_millis()
        );
        self.held.push(HeldReq {
            service_id,
            until: now + BOUND_REQ_HOLD,
            src,
            mad,
        });
        true
    }

    fn reject_held(&mut self, h: &HeldReq) {
        if let Ok((hdr, Message::Req(r, _))) = Message::parse(&h.mad) {
            log::debug!(
                "CM: REQ from {} for ServiceID {:#x}: no listen came, REJ invalid service ID",
                h.src,
                h.service_id
            );
            self.send_rej(
                h.src,
                hdr.transaction_id,
                0,
                r.local_comm_id,
                rej::rejected::REQ,
                rej_reason::INVALID_SERVICE_ID,
                &[],
            );
        }
    }

    /// Runs the held REQs: those whose ServiceID is listened now are taken as if they had
    /// just arrived, those whose wait is over (or whose bind ended) are rejected.
    fn run_held(&mut self, now: Instant) {
        let held = std::mem::take(&mut self.held);
        for h in held {
            if self.listeners.contains_key(&h.service_id) {
                self.dispatch(now, h.src, &h.mad);
            } else if h.until <= now || !self.bound.contains_key(&h.service_id) {
                self.reject_held(&h);
            } else {
                self.held.push(h);
            }
        }
    }

    /// Sends a REQ; the connection is in `ReqSent` until the REP, a REJ, or
    /// [`CmEvent::Unreachable`] after 16 sends 6.1 s apart (an MRA stretches the wait).
    ///
    /// # Errors
    /// [`CmError::PrivateDataTooLong`] beyond 92 bytes; [`CmError::NoCommIdLeft`].
    pub fn connect(&mut self, now: Instant, r: ConnectReq) -> Result<CommId, CmError> {
        if r.param.private_data.len() > req::PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong {
                max: req::PRIVATE_DATA_LEN,
            });
        }
        let id = self.new_comm_id()?;
        let psn = self.next_psn();
        let mut c = Conn::new(Role::Active, id, r.path.remote, r.service_id);
        c.path = r.path;
        c.local_qpn = r.qpn;
        c.local_psn = psn;
        c.param = r.param;
        c.ack_timeout = r.ack_timeout;
        c.transport_service_type = r.transport_service_type;
        c.tid = 0x0000_0002_0000_0000 | u64::from(id.swap_bytes());
        c.state = State::ReqSent;
        let msg = c.req(self.cfg.ca_guid);
        log::info!(
            "CM {id:#010x}: REQ to {} for ServiceID {:#x}: qpn {:#x}, responder_resources {}, \
             initiator_depth {}, retry_count {}, rnr_retry_count {}",
            r.path.remote,
            r.service_id,
            r.qpn,
            c.param.responder_resources,
            c.param.initiator_depth,
            c.param.retry_count,
            c.param.rnr_retry_count
        );
        let tid = c.tid;
        let pd = c.param.private_data.clone();
        self.send_retrying(
            now,
            &mut c,
            &Message::Req(msg, &pd),
            tid,
            req_timeout(),
            param::MAX_CM_RETRIES,
        );
        self.conns.insert(id, c);
        Ok(id)
    }

    /// Accepts a [`CmEvent::ConnectRequest`]: sends the REP with `param` (already through
    /// [`ConnParam::for_accept`]; `qp_num` the local QP) and returns the QP plan to program
    /// (rdma_cm programs RTR and RTS before sending the REP). `Established` follows the RTU.
    ///
    /// # Errors
    /// [`CmError::NoSuchId`], [`CmError::InvalidState`] unless the request is pending,
    /// [`CmError::PrivateDataTooLong`] beyond 196 bytes.
    pub fn accept(
        &mut self,
        now: Instant,
        id: CommId,
        param: ConnParam,
    ) -> Result<QpPlan, CmError> {
        let mut c = self.conns.remove(&id).ok_or(CmError::NoSuchId(id))?;
        let r = self.accept_conn(now, &mut c, param);
        self.conns.insert(id, c);
        r
    }

    fn accept_conn(
        &mut self,
        now: Instant,
        c: &mut Conn,
        param: ConnParam,
    ) -> Result<QpPlan, CmError> {
        if !matches!(c.state, State::ReqRcvd | State::MraReqSent) || c.role != Role::Passive {
            return Err(CmError::InvalidState(c.state));
        }
        if param.private_data.len() > wire_cm::rep::PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong {
                max: wire_cm::rep::PRIVATE_DATA_LEN,
            });
        }
        c.local_qpn = param.qp_num;
        if c.remote_initiator_depth > param.responder_resources {
            log::warn!(
                "CM {:#010x}: the peer asks to have {} READs/atomics outstanding \
                 (initiator_depth) but this side accepts {} (responder_resources): its \
                 READs beyond that will be NAKed",
                c.local_id,
                c.remote_initiator_depth,
                param.responder_resources
            );
        }
        c.param = param;
        c.state = State::RepSent;
        let msg = c.rep(self.cfg.ca_guid, self.cfg.local_ca_ack_delay);
        let tid = c.tid;
        let timeout = Duration::from_millis(wire_cm::timeout_ms(c.remote_cm_response_timeout));
        let retries = c.remote_max_cm_retries;
        let pd = c.param.private_data.clone();
        self.send_retrying(now, c, &Message::Rep(msg, &pd), tid, timeout, retries);
        let n = c.negotiated();
        log_negotiated(c.local_id, "accept", &n);
        Ok(n.plan())
    }

    /// The QP plan of a connection whose values are both known (active side after the REP;
    /// passive side once the REQ is in, with the request's depths until the accept).
    pub fn qp_plan(&self, id: CommId) -> Option<QpPlan> {
        let c = self.conns.get(&id)?;
        matches!(
            c.state,
            State::ReqRcvd
                | State::MraReqSent
                | State::RepRcvd
                | State::MraRepSent
                | State::RepSent
                | State::Established
        )
        .then(|| c.negotiated().plan())
    }

    /// The negotiated values of a connection (what [`CmEngine::qp_plan`] programs).
    pub fn negotiated(&self, id: CommId) -> Option<Negotiated> {
        let c = self.conns.get(&id)?;
        matches!(
            c.state,
            State::ReqRcvd
                | State::MraReqSent
                | State::RepRcvd
                | State::MraRepSent
                | State::RepSent
                | State::Established
        )
        .then(|| c.negotiated())
    }

    /// Active side, after the QP is in RTS: sends the RTU; the connection is established.
    ///
    /// # Errors
    /// [`CmError::NoSuchId`]; [`CmError::InvalidState`] unless a REP was received.
    pub fn establish(&mut self, now: Instant, id: CommId) -> Result<(), CmError> {
        let mut c = self.conns.remove(&id).ok_or(CmError::NoSuchId(id))?;
        let r = if matches!(c.state, State::RepRcvd | State::MraRepSent) {
            c.state = State::Established;
            c.cancel_timer();
            let msg = wire_cm::rtu::Repr {
                local_comm_id: c.local_id,
                remote_comm_id: c.remote_id,
            };
            let tid = c.tid;
            self.send_once(c.peer, &Message::Rtu(msg, &[]), tid);
            log_negotiated(id, "establish", &c.negotiated());
            self.events.push_back(CmEvent::Established { id });
            let _ = now;
            Ok(())
        } else {
            Err(CmError::InvalidState(c.state))
        };
        self.conns.insert(id, c);
        r
    }

    /// Passive side: the QP saw the peer's traffic before the RTU (`rdma_notify` on
    /// `IBV_EVENT_COMM_EST`): the connection is established now.
    ///
    /// # Errors
    /// [`CmError::NoSuchId`]; [`CmError::InvalidState`] unless a REP was sent.
    pub fn notify(&mut self, id: CommId) -> Result<(), CmError> {
        let c = self.conns.get_mut(&id).ok_or(CmError::NoSuchId(id))?;
        match c.state {
            State::RepSent => {
                c.state = State::Established;
                c.cancel_timer();
                self.events.push_back(CmEvent::Established { id });
                Ok(())
            }
            State::Established => Ok(()),
            s => Err(CmError::InvalidState(s)),
        }
    }

    /// Refuses a pending request (REJ "consumer defined", 28) with up to 148 bytes of private
    /// data; the connection is gone.
    ///
    /// # Errors
    /// [`CmError::NoSuchId`], [`CmError::InvalidState`] unless a request is pending,
    /// [`CmError::PrivateDataTooLong`].
    pub fn reject(&mut self, id: CommId, private_data: &[u8]) -> Result<(), CmError> {
        let c = self.conns.get(&id).ok_or(CmError::NoSuchId(id))?;
        if private_data.len() > rej::PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong {
                max: rej::PRIVATE_DATA_LEN,
            });
        }
        let rejected = match c.state {
            State::ReqRcvd | State::MraReqSent => rej::rejected::REQ,
            State::RepRcvd | State::MraRepSent => rej::rejected::REP,
            State::SidrReqRcvd => {
                return self.sidr_answer(id, sidr_rep::status::REJECT, 0, 0, private_data);
            }
            s => return Err(CmError::InvalidState(s)),
        };
        let (peer, tid, remote, local) = (c.peer, c.tid, c.remote_id, c.local_id);
        self.send_rej(
            peer,
            tid,
            local,
            remote,
            rejected,
            rej_reason::CONSUMER_DEFINED,
            private_data,
        );
        self.remove(id);
        Ok(())
    }

    /// Starts closing an established connection (DREQ; `Disconnected` when the DREP comes or
    /// the retries run out), or answers the peer's DREQ (DREP; into timewait).
    ///
    /// # Errors
    /// [`CmError::NoSuchId`]; [`CmError::InvalidState`] unless established or closing.
    pub fn disconnect(&mut self, now: Instant, id: CommId) -> Result<(), CmError> {
        let mut c = self.conns.remove(&id).ok_or(CmError::NoSuchId(id))?;
        let r = self.disconnect_conn(now, &mut c);
        self.conns.insert(id, c);
        r
    }

    fn disconnect_conn(&mut self, now: Instant, c: &mut Conn) -> Result<(), CmError> {
        match c.state {
            State::Established | State::RepSent | State::RepRcvd | State::MraRepSent => {
                c.state = State::DreqSent;
                let tid = 0x0000_0002_0000_0000 | u64::from(c.local_id.swap_bytes());
                c.dreq_tid = tid;
                let msg = wire_cm::dreq::Repr {
                    local_comm_id: c.local_id,
                    remote_comm_id: c.remote_id,
                    remote_qpn: c.remote_qpn,
                };
                let timeout = if c.role == Role::Active {
                    req_timeout()
                } else {
                    Duration::from_millis(wire_cm::timeout_ms(param::CM_RESPONSE_TIMEOUT))
                };
                self.send_retrying(
                    now,
                    c,
                    &Message::Dreq(msg, &[]),
                    tid,
                    timeout,
                    param::MAX_CM_RETRIES,
                );
                Ok(())
            }
            State::DreqRcvd => {
                self.send_drep(c.peer, c.dreq_tid, c.local_id, c.remote_id);
                c.enter_timewait(now, &mut self.deadlines);
                Ok(())
            }
            State::DreqSent | State::Timewait => Ok(()),
            s => Err(CmError::InvalidState(s)),
        }
    }

    /// Destroys a connection as `ib_destroy_cm_id` does: a pending request is rejected, an
    /// established connection disconnected (it stays until timewait ends, answering its
    /// peer), anything else dropped at once.
    pub fn destroy(&mut self, now: Instant, id: CommId) {
        let Some(state) = self.state(id) else { return };
        match state {
            State::ReqRcvd | State::MraReqSent | State::RepRcvd | State::MraRepSent => {
                let _ = self.reject(id, &[]);
            }
            State::SidrReqRcvd => {
                let _ = self.reject(id, &[]);
            }
            State::Established | State::RepSent | State::DreqRcvd => {
                let _ = self.disconnect(now, id);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.destroyed = true;
                }
            }
            State::DreqSent | State::Timewait => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.destroyed = true;
                }
            }
            State::ReqSent | State::SidrReqSent => self.remove(id),
        }
    }

    /// Forgets a request just received without answering it, as the kernel's CM does when the
    /// listener's backlog is full (`ib_destroy_cm_id` with ENOMEM in REQ_RCVD: not rejected,
    /// so that the peer may try again): nothing is kept of it, and the peer's retransmitted
    /// REQ (or SIDR_REQ) arrives as a new request. Counted as `backlog_drops`.
    ///
    /// # Errors
    /// [`CmError::NoSuchId`]; [`CmError::InvalidState`] unless the connection is a request
    /// received and not yet answered.
    pub fn drop_request(&mut self, id: CommId) -> Result<(), CmError> {
        match self.state(id) {
            None => Err(CmError::NoSuchId(id)),
            Some(State::ReqRcvd | State::SidrReqRcvd) => {
                self.remove(id);
                self.counters.backlog_drops += 1;
                Ok(())
            }
            Some(s) => Err(CmError::InvalidState(s)),
        }
    }

    /// Destroys every connection as [`CmEngine::destroy`] does each — what the kernel does
    /// when a process's rdma_cm file closes: a DREQ received is answered with its DREP, an
    /// established connection sends its DREQ, a pending request is rejected. The caller
    /// transmits what [`CmEngine::poll_transmit`] then gives before its process goes.
    pub fn destroy_all(&mut self, now: Instant) {
        let mut ids: Vec<CommId> = self.conns.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.destroy(now, id);
        }
    }

    /// Connections whose DREQ is sent and not yet answered (DREQ_SENT): what a process that is
    /// about to exit waits for, since its retransmissions go with it.
    pub fn dreqs_unanswered(&self) -> usize {
        self.conns
            .values()
            .filter(|c| c.state == State::DreqSent)
            .count()
    }

    /// Sends every unanswered DREQ again now (counted as retries; the retry timers are left
    /// as they are). An exiting process does this a few times, a few tens of milliseconds
    /// apart, while it waits for the DREPs: the kernel's CM goes on retrying a DREQ after the
    /// process that asked for it is gone, ferroce's cannot, and a peer whose only DREQ was lost
    /// would otherwise wait for ever on a connection nobody holds.
    pub fn resend_dreqs(&mut self) {
        for c in self.conns.values() {
            if c.state != State::DreqSent {
                continue;
            }
            if let Some(m) = c.last_sent {
                self.counters.retries += 1;
                self.counters.sent += 1;
                self.out.push_back(Outgoing {
                    dest: c.peer,
                    dest_qpn: 1,
                    mad: m,
                });
            }
        }
    }

    /// Sends a SIDR_REQ for `service_id` to `peer` (UD service resolution): a
    /// [`CmEvent::SidrResponse`] or [`CmEvent::Unreachable`] after 16 sends 4.1 s apart.
    ///
    /// # Errors
    /// [`CmError::PrivateDataTooLong`] beyond 216 bytes; [`CmError::NoCommIdLeft`].
    pub fn sidr_request(
        &mut self,
        now: Instant,
        peer: IpAddr,
        service_id: u64,
        private_data: &[u8],
    ) -> Result<CommId, CmError> {
        if private_data.len() > sidr_req::PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong {
                max: sidr_req::PRIVATE_DATA_LEN,
            });
        }
        let id = self.new_comm_id()?;
        let mut c = Conn::new(Role::Active, id, peer, service_id);
        c.state = State::SidrReqSent;
        c.tid = 0x0000_0002_0000_0000 | u64::from(id.swap_bytes());
        let msg = sidr_req::Repr {
            request_id: id,
            partition_key: ferroce_wire::DEFAULT_PKEY,
            service_id,
        };
        let tid = c.tid;
        let timeout = Duration::from_millis(wire_cm::timeout_ms(param::CM_RESPONSE_TIMEOUT));
        self.send_retrying(
            now,
            &mut c,
            &Message::SidrReq(msg, private_data),
            tid,
            timeout,
            param::MAX_CM_RETRIES,
        );
        self.conns.insert(id, c);
        Ok(id)
    }

    /// Answers a [`CmEvent::SidrRequest`] with the QP and Q_Key that serve it.
    ///
    /// # Errors
    /// [`CmError::NoSuchId`], [`CmError::InvalidState`], [`CmError::PrivateDataTooLong`]
    /// beyond 136 bytes.
    pub fn sidr_accept(
        &mut self,
        id: CommId,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        self.sidr_answer(id, sidr_rep::status::SUCCESS, qpn, qkey, private_data)
    }

    fn sidr_answer(
        &mut self,
        id: CommId,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.conns.get(&id).ok_or(CmError::NoSuchId(id))?;
        if c.state != State::SidrReqRcvd {
            return Err(CmError::InvalidState(c.state));
        }
        if private_data.len() > sidr_rep::PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong {
                max: sidr_rep::PRIVATE_DATA_LEN,
            });
        }
        let msg = sidr_rep::Repr {
            request_id: c.remote_id,
            status,
            qpn,
            service_id: c.service_id,
            qkey,
            ..sidr_rep::Repr::default()
        };
        let (peer, tid) = (c.peer, c.tid);
        self.send_once(peer, &Message::SidrRep(msg, &[], private_data), tid);
        self.remove(id);
        Ok(())
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The earliest CM timer (a retransmission or the end of a timewait).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let held = self.held.iter().map(|h| {
            if self.listeners.contains_key(&h.service_id) {
                Instant::ZERO
            } else {
                h.until
            }
        });
        self.deadlines.earliest().into_iter().chain(held).min()
    }

    /// Runs the timers due at `now`: retransmissions, their exhaustion, timewait ends.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.run_held(now);
        // What is due now, taken first: a timer armed while these run (a retry's next
        // deadline) waits for the next call even if it is already due.
        let due: Vec<(Instant, CommId)> =
            std::iter::from_fn(|| self.deadlines.pop_due(now)).collect();
        for (at, id) in due {
            // A stale entry: the timer was re-armed or cancelled since.
            if self.conns.get(&id).is_none_or(|c| c.timer != Some(at)) {
                continue;
            }
            let Some(mut c) = self.conns.remove(&id) else {
                continue;
            };
            c.timer = None;
            if c.state == State::Timewait {
                self.by_remote.remove(&(c.remote_id, c.remote_guid));
                self.events.push_back(CmEvent::TimewaitExit { id });
                continue;
            }
            if c.retries_left > 0 {
                c.retries_left -= 1;
                let at = now + c.timeout;
                self.deadlines.arm(&mut c, at);
                self.counters.retries += 1;
                self.counters.sent += 1;
                if let Some(m) = c.last_sent {
                    self.out.push_back(Outgoing {
                        dest: c.peer,
                        dest_qpn: 1,
                        mad: m,
                    });
                }
                self.conns.insert(id, c);
                continue;
            }
            // Out of retries.
            match c.state {
                State::ReqSent | State::RepSent | State::MraReqSent | State::SidrReqSent => {
                    log::debug!(
                        "CM {id:#010x}: no answer after every retry in {:?}: unreachable",
                        c.state
                    );
                    self.counters.unreachable += 1;
                    if c.role == Role::Passive {
                        self.by_remote.remove(&(c.remote_id, c.remote_guid));
                    }
                    self.events.push_back(CmEvent::Unreachable { id });
                }
                State::DreqSent => {
                    log::debug!("CM {id:#010x}: DREQ unanswered after every retry");
                    self.events.push_back(CmEvent::Disconnected {
                        id,
                        timed_out: true,
                    });
                    c.enter_timewait(now, &mut self.deadlines);
                    self.conns.insert(id, c);
                }
                _ => {
                    self.conns.insert(id, c);
                }
            }
        }
    }

    fn remove(&mut self, id: CommId) {
        if let Some(c) = self.conns.remove(&id) {
            self.by_remote.remove(&(c.remote_id, c.remote_guid));
        }
    }

    fn emit(&mut self, dest: IpAddr, msg: &Message<'_>, tid: u64) -> Option<[u8; MAD_LEN]> {
        let mut mad = [0u8; MAD_LEN];
        match msg.emit(tid, &mut mad) {
            Ok(()) => {
                self.counters.sent += 1;
                self.out.push_back(Outgoing {
                    dest,
                    dest_qpn: 1,
                    mad,
                });
                Some(mad)
            }
            Err(e) => {
                // Lengths are checked before every send; this is a bug, said loudly.
                log::error!("CM: cannot build a {} for {dest}: {e}", msg.name());
                None
            }
        }
    }

    fn send_once(&mut self, dest: IpAddr, msg: &Message<'_>, tid: u64) {
        let _ = self.emit(dest, msg, tid);
    }

    fn send_retrying(
        &mut self,
        now: Instant,
        c: &mut Conn,
        msg: &Message<'_>,
        tid: u64,
        timeout: Duration,
        retries: u8,
    ) {
        c.last_sent = self.emit(c.peer, msg, tid);
        c.timeout = timeout;
        c.retries_left = retries;
        self.deadlines.arm(c, now + timeout);
    }

    #[allow(clippy::too_many_arguments)]
    fn send_rej(
        &mut self,
        dest: IpAddr,
        tid: u64,
        local: u32,
        remote: u32,
        rejected: u8,
        reason: u16,
        private_data: &[u8],
    ) {
        self.counters.rejects_sent += 1;
        let msg = rej::Repr {
            local_comm_id: local,
            remote_comm_id: remote,
            message_rejected: rejected,
            rejected_info_length: 0,
            reason,
        };
        self.send_once(dest, &Message::Rej(msg, &[], private_data), tid);
    }

    fn send_drep(&mut self, dest: IpAddr, tid: u64, local: u32, remote: u32) {
        let msg = wire_cm::drep::Repr {
            local_comm_id: local,
            remote_comm_id: remote,
        };
        self.send_once(dest, &Message::Drep(msg, &[]), tid);
    }

    fn send_mra(&mut self, c: &Conn, mraed: u8) {
        let msg = mra::Repr {
            local_comm_id: c.local_id,
            remote_comm_id: c.remote_id,
            message_mraed: mraed,
            service_timeout: param::MRA_SERVICE_TIMEOUT,
        };
        self.send_once(c.peer, &Message::Mra(msg, &[]), c.tid);
    }
}

/// The active side's wait for a REP (and for a DREP): 2 × packet life + the remote CM
/// response time, 2 × 1024 + 4096 ms on RoCE.
fn req_timeout() -> Duration {
    Duration::from_millis(
        2 * wire_cm::timeout_ms(param::PACKET_LIFE_TIME)
            + wire_cm::timeout_ms(param::CM_RESPONSE_TIMEOUT),
    )
}

fn log_negotiated(id: CommId, when: &str, n: &Negotiated) {
    log::info!(
        "CM {id:#010x} ({when}): QP to {} qpn {:#x}: path_mtu {:?}, rq_psn {:#x}, sq_psn {:#x}, \
         max_dest_rd_atomic {}, max_rd_atomic {}, retry_cnt {}, rnr_retry {}, timeout {}, \
         min_rnr_timer 0",
        n.path.remote,
        n.dest_qp_num,
        n.path.mtu,
        n.rq_psn,
        n.sq_psn,
        n.responder_resources,
        n.initiator_depth,
        n.retry_cnt,
        n.rnr_retry,
        n.ack_timeout
    );
}
