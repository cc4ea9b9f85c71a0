//! The device's in-flight budget: request PSNs all RC QPs together may have unacknowledged
//! ([`crate::EndpointConfig::inflight_budget`]), and the QPs waiting for some of it.

use super::Endpoint;
use crate::qp::Qp;

impl Endpoint {
    /// Re-counts a QP's unacknowledged PSNs in the in-flight total (after anything that may
    /// have sent, acknowledged, rewound or reset), and lets blocked QPs go when there is room.
    pub(super) fn account(&mut self, qpn: u32) {
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
    pub(super) fn release_blocked(&mut self) {
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
    /// [`EndpointConfig::inflight_budget`](crate::EndpointConfig::inflight_budget) limits).
    pub fn inflight(&self) -> u32 {
        self.inflight
    }
}
