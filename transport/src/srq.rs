//! Shared receive queues (`ibv_srq`): one pool of receive WQEs for several QPs, with the
//! limit event (`IBV_EVENT_SRQ_LIMIT_REACHED`) armed by `modify_srq`.

use std::collections::VecDeque;

use crate::endpoint::AsyncEvent;
use crate::verbs::RecvWr;

/// `struct ibv_srq_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// `max_wr`.
    pub max_wr: u32,
    /// `max_sge`.
    pub max_sge: u32,
    /// `srq_limit`: when armed, fewer WQEs than this raises the limit event once.
    pub srq_limit: u32,
}

/// What makes an SRQ an XRC SRQ (`ibv_srq_init_attr_ex` with `IBV_SRQT_XRC`): the XRC
/// domain whose receive QPs may take its WQEs, the PD their requests are checked against and
/// the CQ its receive completions go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XrcSrq {
    /// `xrcd`: the XRC domain (the provider's number for it).
    pub xrcd: u32,
    /// `pd`: the protection domain of the receive buffers and of the memory XRC requests
    /// reach through it.
    pub pd: u32,
    /// `cq`: the CQ (the caller's number) its receive completions go to.
    pub cq: u32,
}

/// A shared receive queue.
#[derive(Debug)]
pub struct Srq {
    pub(crate) srqn: u32,
    pub(crate) attr: SrqAttr,
    /// Set for an XRC SRQ.
    pub(crate) xrc: Option<XrcSrq>,
    pub(crate) queue: VecDeque<RecvWr>,
    armed: bool,
}

impl Srq {
    pub(crate) fn new(srqn: u32, attr: SrqAttr, xrc: Option<XrcSrq>) -> Srq {
        Srq {
            srqn,
            xrc,
            attr: SrqAttr {
                srq_limit: 0,
                ..attr
            },
            queue: VecDeque::new(),
            armed: false,
        }
    }

    /// `ibv_query_srq`.
    pub fn query(&self) -> SrqAttr {
        self.attr
    }

    /// Arms the limit event at `limit` WQEs (`ibv_modify_srq` with `IBV_SRQ_LIMIT`).
    pub(crate) fn arm(&mut self, limit: u32) {
        self.attr.srq_limit = limit;
        self.armed = limit > 0;
    }

    /// Takes the oldest WQE, raising the limit event if the queue falls below the limit.
    pub(crate) fn pop(&mut self, events: &mut VecDeque<AsyncEvent>) -> Option<RecvWr> {
        let w = self.queue.pop_front();
        if self.armed && (self.queue.len() as u32) < self.attr.srq_limit {
            self.armed = false;
            events.push_back(AsyncEvent::SrqLimitReached {
                srqn: self.srqn,
                limit: self.attr.srq_limit,
                left: self.queue.len() as u32,
            });
        }
        w
    }
}
