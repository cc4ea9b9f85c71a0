//! Timers: one heap of QP deadlines (retransmission, RNR, ACK holds), stale entries dropped
//! as they surface, so no call scans every QP.

use std::cmp::Reverse;

use super::Endpoint;
use crate::memory::Memory;
use crate::qp::Qp;
use crate::time::Instant;

impl Endpoint {
    /// Makes sure the timer heap holds an entry for the QP at or before its deadline. A
    /// deadline that moved later (the usual case: a retransmit timer re-armed on progress)
    /// keeps its earlier entry, which re-enters the real deadline when it comes up; so most
    /// calls push nothing, and `poll_timeout` may name a time a little early, never late.
    pub(super) fn rearm(&mut self, qpn: u32) {
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
    pub(super) fn prune_timers(&mut self) {
        while let Some(&Reverse((t, qpn))) = self.timer_heap.peek() {
            if self.deadlines.get(&qpn) == Some(&t) {
                break;
            }
            self.timer_heap.pop();
        }
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
}
