//! Queue pairs (`ibv_qp`) and shared receive queues (`ibv_srq`).

use std::sync::Arc;

use ferroce_transport::{QpAttr, QpAttrMask, QpCap, QpModify, QpType, RecvWr, SendWr, SrqAttr};

use crate::context::limits;
use crate::cq::CompletionQueue;
use crate::events::Owned;
use crate::{Error, ProtectionDomain, Result};

/// `struct ibv_qp_init_attr`.
#[derive(Debug, Clone)]
pub struct QpInitAttr<'a> {
    /// `qp_type`.
    pub qp_type: QpType,
    /// `send_cq`.
    pub send_cq: &'a CompletionQueue,
    /// `recv_cq`.
    pub recv_cq: &'a CompletionQueue,
    /// `srq`.
    pub srq: Option<&'a SharedReceiveQueue>,
    /// `cap`.
    pub cap: QpCap,
    /// `sq_sig_all`.
    pub sq_sig_all: bool,
}

pub(crate) struct QpInner {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) sq_sig_all: bool,
    /// The QP's PD (an XRC receive QP's: its domain's holder, it has none of its own).
    pub(crate) pd: ProtectionDomain,
    /// Held while the QP lives: its (send, receive) CQs, its SRQ, an XRC receive QP's domain.
    pub(crate) cqs: Option<(CompletionQueue, CompletionQueue)>,
    pub(crate) _srq: Option<SharedReceiveQueue>,
    pub(crate) _xrcd: Option<crate::xrc::XrcDomain>,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        let qpn = self.qpn;
        self.pd.ctx.shared.destroy_qp(qpn);
        self.pd.ctx.shared.forget_events(Owned::Qp(qpn));
    }
}

/// A queue pair. Cheap to clone; destroyed when the last handle goes.
#[derive(Clone)]
pub struct QueuePair {
    inner: Arc<QpInner>,
}

/// A QP handle that does not keep the QP alive ([`QueuePair::downgrade`]): the connection
/// manager's hold on a QP its caller owns.
#[derive(Clone, Debug)]
pub struct WeakQueuePair {
    inner: std::sync::Weak<QpInner>,
}

impl WeakQueuePair {
    /// The QP, if it still exists.
    pub fn upgrade(&self) -> Option<QueuePair> {
        self.inner.upgrade().map(|inner| QueuePair { inner })
    }
}

impl QueuePair {
    /// A handle that does not keep the QP alive.
    pub fn downgrade(&self) -> WeakQueuePair {
        WeakQueuePair {
            inner: Arc::downgrade(&self.inner),
        }
    }
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QueuePair({:?} {:#x})",
            self.inner.qp_type, self.inner.qpn
        )
    }
}

fn check_cap(cap: &QpCap) -> Result<()> {
    if cap.max_send_wr > limits::MAX_QP_WR || cap.max_recv_wr > limits::MAX_QP_WR {
        return Err(Error::InvalidArgument(
            "max_send_wr/max_recv_wr above max_qp_wr",
        ));
    }
    if cap.max_send_sge > limits::MAX_SGE || cap.max_recv_sge > limits::MAX_SGE {
        return Err(Error::InvalidArgument(
            "max_send_sge/max_recv_sge above max_sge",
        ));
    }
    if cap.max_inline_data > limits::MAX_INLINE {
        return Err(Error::InvalidArgument("max_inline_data above the device's"));
    }
    Ok(())
}

/// Creates a QP with sensible defaults, each attribute a method ([`ProtectionDomain::qp`]):
/// 64 send and receive WRs, one SGE each, no inline data, not `sq_sig_all`, one CQ for both
/// directions unless [`QpBuilder::recv_cq`] says otherwise.
#[derive(Debug, Clone)]
pub struct QpBuilder<'a> {
    pd: &'a ProtectionDomain,
    init: QpInitAttr<'a>,
}

impl<'a> QpBuilder<'a> {
    /// `send_cq` (also the receive CQ unless [`QpBuilder::recv_cq`] is given).
    pub fn send_cq(mut self, cq: &'a CompletionQueue) -> Self {
        self.init.send_cq = cq;
        self
    }

    /// `recv_cq`.
    pub fn recv_cq(mut self, cq: &'a CompletionQueue) -> Self {
        self.init.recv_cq = cq;
        self
    }

    /// `srq`: receives come from this SRQ (the QP gets no receive queue of its own).
    pub fn srq(mut self, srq: &'a SharedReceiveQueue) -> Self {
        self.init.srq = Some(srq);
        self.init.cap.max_recv_wr = 0;
        self.init.cap.max_recv_sge = 0;
        self
    }

    /// `cap.max_send_wr`.
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.init.cap.max_send_wr = n;
        self
    }

    /// `cap.max_recv_wr`.
    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.init.cap.max_recv_wr = n;
        self
    }

    /// `cap.max_send_sge`.
    pub fn max_send_sge(mut self, n: u32) -> Self {
        self.init.cap.max_send_sge = n;
        self
    }

    /// `cap.max_recv_sge`.
    pub fn max_recv_sge(mut self, n: u32) -> Self {
        self.init.cap.max_recv_sge = n;
        self
    }

    /// `cap.max_inline_data`.
    pub fn max_inline_data(mut self, n: u32) -> Self {
        self.init.cap.max_inline_data = n;
        self
    }

    /// `sq_sig_all`: every send WR completes, signaled or not.
    pub fn sq_sig_all(mut self, on: bool) -> Self {
        self.init.sq_sig_all = on;
        self
    }

    /// `ibv_create_qp` with these attributes.
    ///
    /// # Errors
    /// As [`ProtectionDomain::create_qp`].
    pub fn build(self) -> Result<QueuePair> {
        self.pd.create_qp(&self.init)
    }
}

impl ProtectionDomain {
    /// A [`QpBuilder`] for a QP of `qp_type` reporting to `cq`.
    pub fn qp<'a>(&'a self, qp_type: QpType, cq: &'a CompletionQueue) -> QpBuilder<'a> {
        QpBuilder {
            pd: self,
            init: QpInitAttr {
                qp_type,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 64,
                    max_recv_wr: 64,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            },
        }
    }

    /// `ibv_create_qp`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for caps above the device's; [`Error::WrongParent`] for CQs
    /// or an SRQ of another context or PD.
    pub fn create_qp(&self, init: &QpInitAttr<'_>) -> Result<QueuePair> {
        self.create_qp_inner(init, false)
    }

    /// Creates QP1, the General Services QP (UD; verbs programs reach it through the CM).
    ///
    /// # Errors
    /// As [`ProtectionDomain::create_qp`], or [`Error::Busy`] if QP1 exists.
    pub fn create_gsi_qp(&self, init: &QpInitAttr<'_>) -> Result<QueuePair> {
        self.create_qp_inner(init, true)
    }

    fn create_qp_inner(&self, init: &QpInitAttr<'_>, gsi: bool) -> Result<QueuePair> {
        check_cap(&init.cap)?;
        if init.qp_type == QpType::XrcRecv {
            return Err(Error::InvalidArgument(
                "an XRC receive QP is created in its XRC domain (XrcDomain::create_qp)",
            ));
        }
        if init.qp_type == QpType::XrcSend && init.srq.is_some() {
            return Err(Error::InvalidArgument(
                "an XRC send QP has no receive side (no SRQ)",
            ));
        }
        let shared = &self.ctx.shared;
        for cq in [init.send_cq, init.recv_cq] {
            if !cq.ctx.same(&self.ctx) {
                return Err(Error::WrongParent("CQ of another context"));
            }
        }
        if let Some(srq) = init.srq {
            if !Arc::ptr_eq(&srq.inner.pd.inner, &self.inner) {
                return Err(Error::WrongParent("SRQ of another PD"));
            }
        }
        let t_init = ferroce_transport::QpInitAttr {
            qp_type: init.qp_type,
            pd: self.handle(),
            cap: init.cap,
            srq: init.srq.map(|s| s.inner.srqn),
            sq_sig_all: init.sq_sig_all,
            send_cq: init.send_cq.inner.handle,
            recv_cq: init.recv_cq.inner.handle,
        };
        // Registered under the engine lock: no event of the QP can come before.
        let qpn = shared.create_qp(t_init, gsi, |qpn| {
            self.ctx.register_events(Owned::Qp(qpn));
        })?;
        Ok(QueuePair {
            inner: Arc::new(QpInner {
                qpn,
                qp_type: init.qp_type,
                sq_sig_all: init.sq_sig_all,
                pd: self.clone(),
                cqs: Some((init.send_cq.clone(), init.recv_cq.clone())),
                _srq: init.srq.cloned(),
                _xrcd: None,
            }),
        })
    }

    /// `ibv_create_srq`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for sizes above the device's.
    pub fn create_srq(&self, attr: SrqAttr) -> Result<SharedReceiveQueue> {
        if attr.max_wr == 0 || attr.max_wr > limits::MAX_SRQ_WR || attr.max_sge > limits::MAX_SGE {
            return Err(Error::InvalidArgument("SRQ max_wr/max_sge"));
        }
        let srqn = self
            .ctx
            .shared
            .create_srq(attr, |n| self.ctx.register_events(Owned::Srq(n)));
        Ok(SharedReceiveQueue {
            inner: Arc::new(SrqInner {
                srqn,
                pd: self.clone(),
                xrc: None,
            }),
        })
    }
}

impl QueuePair {
    pub(crate) fn from_inner(inner: QpInner) -> QueuePair {
        QueuePair {
            inner: Arc::new(inner),
        }
    }

    /// `qp_num`.
    pub fn qp_num(&self) -> u32 {
        self.inner.qpn
    }

    /// `sq_sig_all` as created (`ibv_query_qp`'s `init_attr`).
    pub fn sq_sig_all(&self) -> bool {
        self.inner.sq_sig_all
    }

    /// `qp_type`.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    /// The XRC domain of an XRC receive QP (its [`crate::XrcDomain::handle`]).
    pub fn xrc_domain(&self) -> Option<u32> {
        self.inner._xrcd.as_ref().map(crate::XrcDomain::handle)
    }

    /// Why the QP's work failed: its first error since RESET — the failed work request, its
    /// status and the facts that decide it (unanswered retransmissions and whether the peer
    /// was ever heard, the NAK the peer sent, RNR NAKs against `rnr_retry`, the sizes that did
    /// not fit). `Display` says it in a sentence. A ferroce extension: no verb reports this.
    pub fn last_error(&self) -> Option<ferroce_transport::QpError> {
        self.inner.pd.ctx.shared.qp_error(self.inner.qpn)
    }

    /// `ibv_attach_mcast`: this UD QP receives what is sent to the multicast `group` (the
    /// MGID as an IP address: IPv4-mapped for an IPv4 group, as rdma_cm makes it), from
    /// every sender, with a receive WQE per datagram. The first QP of the process to attach
    /// joins the group on the device's interface. Attaching twice is not an error.
    ///
    /// # Errors
    /// [`Error::Invalid`] (EINVAL) for a QP that is not UD or an address that is not a
    /// group; ENOMEM past 56 QPs per group or 8192 groups; [`Error::Io`] if the host refuses
    /// the group (its port bound by a non-ferroce socket such as kernel rxe's).
    pub fn attach_mcast(&self, group: std::net::IpAddr) -> Result<()> {
        self.inner.pd.ctx.shared.attach_mcast(self.inner.qpn, group)
    }

    /// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB` (a creation flag: set it before the QP sends): what
    /// this QP sends to a multicast group it is attached to does not come back to it; the
    /// group's other QPs, on this device too, still receive it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the QP is gone.
    pub fn block_self_multicast_loopback(&self) -> Result<()> {
        self.inner
            .pd
            .ctx
            .shared
            .block_self_mcast_lb(self.inner.qpn)?;
        Ok(())
    }

    /// `ibv_detach_mcast`: the QP no longer receives `group`'s datagrams; the last QP of the
    /// process to detach leaves the group. Destroying a QP detaches it from every group.
    ///
    /// # Errors
    /// [`Error::Invalid`] (EINVAL) if the QP is not attached to `group`.
    pub fn detach_mcast(&self, group: std::net::IpAddr) -> Result<()> {
        self.inner.pd.ctx.shared.detach_mcast(self.inner.qpn, group)
    }

    /// The context the QP belongs to.
    pub fn context(&self) -> &crate::Context {
        &self.inner.pd.ctx
    }

    /// The PD.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// `ibv_modify_qp`.
    ///
    /// # Errors
    /// [`Error::Modify`] saying which transition or attribute bits are wrong.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let qpn = self.inner.qpn;
        if mask.contains(QpAttrMask::AV) {
            if let Some(ah) = &attr.ah_attr {
                self.inner
                    .pd
                    .ctx
                    .check_path(ah)
                    .inspect_err(|e| log::debug!("modify_qp({qpn:#x}): {e}"))?;
            }
        }
        self.inner.pd.ctx.shared.modify_qp(qpn, attr, mask)?;
        if mask.contains(QpAttrMask::STATE) && attr.qp_state == ferroce_transport::QpState::Reset {
            // A QP back in RESET starts clean: the completions it left in its CQs (the flushes
            // of an earlier error) go, as mlx5 cleans its CQs, so the next poll after the QP
            // is brought up again sees only new work.
            if let Some((s, r)) = &self.inner.cqs {
                s.remove_qp(qpn);
                r.remove_qp(qpn);
            }
        }
        Ok(())
    }

    /// `ibv_modify_qp` with the attributes and mask a [`QpModify`] built (each of its setters
    /// sets its own mask bit):
    /// `qp.modify_with(&QpModify::new(QpState::Init).port_num(1).qp_access_flags(access))`.
    ///
    /// # Errors
    /// As [`QueuePair::modify`].
    pub fn modify_with(&self, m: &QpModify) -> Result<()> {
        self.modify(m.attr(), m.mask())
    }

    /// Walks the QP RESET → INIT → RTR → RTS towards the QP `dest_qp_num` at `peer`, with
    /// verbs' usual values: every access right, `timeout` 14, `retry_cnt` 7, `rnr_retry` 7,
    /// `min_rnr_timer` 12, `max_rd_atomic` = `max_dest_rd_atomic` = 16, Q_Key 0x11111111 for
    /// UD (whose QPs need no peer: `peer` and `dest_qp_num` are ignored there). `sq_psn` is
    /// this side's first PSN, `rq_psn` the peer's.
    ///
    /// # Errors
    /// [`Error::Modify`] if the device refuses an attribute (an MTU above its active MTU, say).
    pub fn connect_to(
        &self,
        peer: std::net::IpAddr,
        dest_qp_num: u32,
        path_mtu: ferroce_transport::Mtu,
        sq_psn: u32,
        rq_psn: u32,
    ) -> Result<()> {
        self.connect_to_rd_atomic(peer, dest_qp_num, path_mtu, (sq_psn, rq_psn), 16)
    }

    /// [`QueuePair::connect_to`] (its `sq_psn` and `rq_psn` as a pair) with `max_rd_atomic` =
    /// `max_dest_rd_atomic` = `rd_atomic` (perftest's `-o`): how many READs and atomics may be
    /// outstanding each way. The device allows up to `max_qp_rd_atom` (128); at 64 or more a
    /// long READ toward another ferroce goes in pairs, whose responses leave in full trains.
    ///
    /// # Errors
    /// As [`QueuePair::connect_to`]; also [`Error::Modify`] for a depth above the device's.
    pub fn connect_to_rd_atomic(
        &self,
        peer: std::net::IpAddr,
        dest_qp_num: u32,
        path_mtu: ferroce_transport::Mtu,
        (sq_psn, rq_psn): (u32, u32),
        rd_atomic: u8,
    ) -> Result<()> {
        let up = ferroce_transport::BringUp {
            peer,
            dest_qp_num,
            path_mtu,
            sq_psn,
            rq_psn,
            qp_access_flags: ferroce_transport::AccessFlags::LOCAL_WRITE
                | ferroce_transport::AccessFlags::REMOTE_WRITE
                | ferroce_transport::AccessFlags::REMOTE_READ
                | ferroce_transport::AccessFlags::REMOTE_ATOMIC,
            qkey: 0x1111_1111,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: rd_atomic,
            max_dest_rd_atomic: rd_atomic,
        };
        for (attr, mask) in up.steps(ferroce_transport::Service::of(
            self.qp_type(),
            self.qp_num(),
        )) {
            self.modify(&attr, mask)?;
        }
        Ok(())
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> QpAttr {
        let qpn = self.inner.qpn;
        self.inner.pd.ctx.shared.query_qp(qpn).unwrap_or_default()
    }

    /// `ibv_post_send` for one work request. The SGEs name registered memory by address and
    /// lkey, as in verbs; a bad lkey or range is not an error here but a `LocProtErr`
    /// completion, as on rxe.
    ///
    /// # Errors
    /// [`Error::Post`]: wrong state, full queue, too many SGEs, an opcode the QP type does not
    /// have, a message too long.
    pub fn post_send(&self, wr: &SendWr) -> Result<()> {
        self.post_send_batch(std::slice::from_ref(wr))
            .map_err(|e| match e {
                Error::Refused { error, .. } => *error,
                e => e,
            })
    }

    /// `ibv_post_send` for a list of work requests (one lock, one batch of packets). Stops at
    /// the first refused WR.
    ///
    /// # Errors
    /// [`Error::Refused`] with the index of the refused WR and why (as
    /// [`QueuePair::post_send`]); the WRs before it were posted.
    pub fn post_send_batch(&self, wrs: &[SendWr]) -> Result<()> {
        let qpn = self.inner.qpn;
        self.inner
            .pd
            .ctx
            .shared
            .post_send(qpn, wrs)
            .map_err(|(index, e)| Error::Refused {
                index,
                error: Box::new(Error::from(e)),
            })
    }

    /// `ibv_post_recv` for one work request.
    ///
    /// # Errors
    /// [`Error::Post`]: wrong state, full queue, too many SGEs, or the QP uses an SRQ.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        let qpn = self.inner.qpn;
        self.inner.pd.ctx.shared.post_recv(qpn, wr)?;
        Ok(())
    }
}

pub(crate) struct SrqInner {
    pub(crate) srqn: u32,
    pub(crate) pd: ProtectionDomain,
    /// An XRC SRQ's CQ and domain, held while it lives.
    pub(crate) xrc: Option<(CompletionQueue, crate::xrc::XrcDomain)>,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        let n = self.srqn;
        self.pd.ctx.shared.destroy_srq(n);
        self.pd.ctx.shared.forget_events(Owned::Srq(n));
    }
}

/// A shared receive queue (`ibv_srq`).
#[derive(Clone)]
pub struct SharedReceiveQueue {
    inner: Arc<SrqInner>,
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedReceiveQueue({})", self.inner.srqn)
    }
}

impl SharedReceiveQueue {
    pub(crate) fn from_inner(inner: SrqInner) -> SharedReceiveQueue {
        SharedReceiveQueue {
            inner: Arc::new(inner),
        }
    }

    /// Whether this is an XRC SRQ (`IBV_SRQT_XRC`).
    pub fn is_xrc(&self) -> bool {
        self.inner.xrc.is_some()
    }

    /// The SRQ number (`ibv_get_srq_num`: what an XRC sender puts in `remote_srqn`).
    pub fn srq_num(&self) -> u32 {
        self.inner.srqn
    }

    /// Whether a QP receives through this SRQ (what makes `ibv_destroy_srq` refuse with
    /// EBUSY, as on rxe).
    pub fn in_use(&self) -> bool {
        let n = self.inner.srqn;
        self.inner.pd.ctx.shared.srq_in_use(n)
    }

    /// `ibv_post_srq_recv` for one work request.
    ///
    /// # Errors
    /// [`Error::Post`] for a full queue or too many SGEs.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        let n = self.inner.srqn;
        self.inner.pd.ctx.shared.post_srq_recv(n, wr)?;
        Ok(())
    }

    /// `ibv_modify_srq` with `IBV_SRQ_LIMIT`: arms the limit event.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the limit exceeds `max_wr`.
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        let n = self.inner.srqn;
        match self.inner.pd.ctx.shared.arm_srq(n, limit) {
            Some(r) => r.map_err(Error::from),
            None => Err(Error::InvalidArgument("srq_limit above max_wr")),
        }
    }

    /// `ibv_query_srq`.
    pub fn query(&self) -> SrqAttr {
        let n = self.inner.srqn;
        self.inner.pd.ctx.shared.query_srq(n).unwrap_or_default()
    }
}
