//! XRC domains (`ibv_xrcd`) and what lives in them: XRC SRQs (`ibv_create_srq_ex` with
//! `IBV_SRQT_XRC`) and XRC receive QPs (`IBV_QPT_XRC_RECV`). XRC send QPs are made by
//! [`ProtectionDomain::create_qp`] with [`QpType::XrcSend`] and name the target's SRQ in each
//! work request's `remote_srqn`.
//!
//! A domain is this process's: two processes reach one target through their own receive QPs,
//! not by sharing one (see docs/semantics.md).

use std::sync::Arc;

use ferroce_transport::{QpCap, QpType, SrqAttr, XrcSrq};

use crate::context::limits;
use crate::cq::CompletionQueue;
use crate::events::Owned;
use crate::qp::{QpInner, QueuePair, SharedReceiveQueue, SrqInner};
use crate::{Context, Error, ProtectionDomain, Result};

struct XrcdInner {
    /// The domain's number (unique on the device, from the PD numbers).
    xrcd: u32,
    /// What the domain's receive QPs hold as their PD: they have none of their own (each
    /// request uses its SRQ's), but a QP handle keeps its context through one.
    holder: ProtectionDomain,
}

/// An XRC domain (`struct ibv_xrcd`, `ibv_open_xrcd`): the scope in which XRC receive QPs
/// take receive WQEs from XRC SRQs. Cheap to clone; closed when the last handle, SRQ and QP
/// of it go.
#[derive(Clone)]
pub struct XrcDomain {
    inner: Arc<XrcdInner>,
}

impl std::fmt::Debug for XrcDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "XrcDomain({})", self.inner.xrcd)
    }
}

impl Context {
    /// `ibv_open_xrcd`: a new XRC domain of this device.
    pub fn open_xrcd(&self) -> XrcDomain {
        let holder = self.alloc_pd();
        XrcDomain {
            inner: Arc::new(XrcdInner {
                xrcd: self.shared.next_pd_number(),
                holder,
            }),
        }
    }
}

impl XrcDomain {
    /// The domain's number on its device.
    pub fn handle(&self) -> u32 {
        self.inner.xrcd
    }

    /// The device context the domain belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.holder.ctx
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: an SRQ of this domain whose receive buffers
    /// (and the memory XRC requests reach through it) belong to `pd`, its completions going
    /// to `cq`. Senders name it by [`SharedReceiveQueue::srq_num`] (`ibv_get_srq_num`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for sizes above the device's; [`Error::WrongParent`] for a
    /// PD or CQ of another context.
    pub fn create_srq(
        &self,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        attr: SrqAttr,
    ) -> Result<SharedReceiveQueue> {
        if attr.max_wr == 0 || attr.max_wr > limits::MAX_SRQ_WR || attr.max_sge > limits::MAX_SGE {
            return Err(Error::InvalidArgument("SRQ max_wr/max_sge"));
        }
        let ctx = self.context();
        if !pd.ctx.same(ctx) || !cq.ctx.same(ctx) {
            return Err(Error::WrongParent(
                "PD or CQ of another context than the XRCD's",
            ));
        }
        let xrc = XrcSrq {
            xrcd: self.inner.xrcd,
            pd: pd.handle(),
            cq: cq.handle(),
        };
        let srqn = ctx
            .shared
            .create_xrc_srq(attr, xrc, |n| ctx.register_events(Owned::Srq(n)));
        Ok(SharedReceiveQueue::from_inner(SrqInner {
            srqn,
            pd: pd.clone(),
            xrc: Some((cq.clone(), self.clone())),
        }))
    }

    /// `ibv_create_qp_ex` with `IBV_QPT_XRC_RECV`: a receive QP of this domain. It has no
    /// queues, PD or CQs of its own: each request takes its WQE, PD and CQ from the XRC SRQ
    /// of this domain its XRCETH names. Bring it up as an RC QP's responder (INIT, RTR; RTS
    /// with `timeout` and `sq_psn`).
    ///
    /// # Errors
    /// As [`ProtectionDomain::create_qp`].
    pub fn create_qp(&self) -> Result<QueuePair> {
        let ctx = self.context();
        let t_init = ferroce_transport::QpInitAttr {
            qp_type: QpType::XrcRecv,
            // An XRC receive QP's `pd` is its domain (the engine's rule).
            pd: self.inner.xrcd,
            cap: QpCap::default(),
            srq: None,
            sq_sig_all: false,
            send_cq: 0,
            recv_cq: 0,
        };
        let qpn = ctx.shared.create_qp(t_init, false, |qpn| {
            ctx.register_events(Owned::Qp(qpn));
        })?;
        Ok(QueuePair::from_inner(QpInner {
            qpn,
            qp_type: QpType::XrcRecv,
            sq_sig_all: false,
            pd: self.inner.holder.clone(),
            cqs: None,
            _srq: None,
            _xrcd: Some(self.clone()),
        }))
    }
}
