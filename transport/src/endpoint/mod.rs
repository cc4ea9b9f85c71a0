//! The endpoint: every QP and SRQ of one device (one local address), the demultiplexer for
//! incoming datagrams, and the engine's outputs.
//!
//! # Calling the engine
//!
//! Inputs are `receive` (a received [`Datagram`]), `handle_timeout` and the verbs commands
//! (`create_qp`, `modify_qp`, `post_send`, `post_recv`, ...). After any input, drain the
//! outputs in this order: `poll_transmit` until `None` (each call builds one datagram into the
//! caller's buffer), then `poll_completion` and `poll_event`; finally arm a timer for
//! `poll_timeout` and call `handle_timeout` when it expires. Every call takes `now` where time
//! matters; the engine never reads a clock.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::IpAddr;

use ferroce_wire::icrc::Ipv4IdentDelta;

use crate::congestion::CongestionConfig;
use crate::memory::Memory;
use crate::qp::{PostError, Qp, QpInitAttr};
use crate::srq::{Srq, SrqAttr, XrcSrq};
use crate::time::Instant;
use crate::verbs::{QpAttr, QpAttrMask, QpState, QpType, RecvWr, SendWr};

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

use crate::hash::NumberMap as QpnMap;

macro_rules! ctx {
    ($self:ident, $mem:expr, $now:expr, $srq:expr) => {
        crate::qp::Ctx {
            mem: $mem,
            now: $now,
            counters: &mut $self.counters,
            events: &mut $self.events,
            completions: &mut $self.completions,
            srq: $srq,
            budget_open: $self.inflight < $self.cfg.inflight_budget,
            budget_low: $self.inflight >= $self.cfg.inflight_budget / 2,
            split_writes: $self.cfg.split_writes,
            pair_reads: $self.cfg.pair_reads,
        }
    };
}

mod budget;
mod icrc;
mod receive;
mod timers;
mod transmit;
mod types;

pub use receive::Datagram;
pub use types::{
    AsyncEvent, BufferTooShort, Completion, Counters, EndpointConfig, FlushIcrc, MIN_TRANSMIT_BUF,
    Transmit, VerbError, WcQueue,
};

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
        wr: impl core::borrow::Borrow<SendWr>,
        mem: &M,
        now: Instant,
    ) -> Result<(), VerbError> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbError::NoSuchQp(qpn))?;
        let mut ctx = ctx!(self, mem, now, None);
        qp.post_send(wr.borrow(), &mut ctx)
            .map_err(VerbError::Post)?;
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
