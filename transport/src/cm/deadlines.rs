//! The CM's timers as the QP engine keeps its own: one heap of (deadline, comm ID), entered
//! whenever a connection's timer is armed, stale entries (a timer re-armed or cancelled since)
//! dropped as they surface. `poll_timeout` reads the top and `handle_timeout` visits only
//! what is due, however many connections there are.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::CommId;
use super::conn::Conn;
use crate::time::Instant;

/// Connections' deadlines, earliest first.
#[derive(Debug, Default)]
pub(super) struct Deadlines {
    heap: BinaryHeap<Reverse<(Instant, CommId)>>,
}

impl Deadlines {
    /// Arms `c`'s timer for `at` (a retransmission or the end of timewait).
    pub(super) fn arm(&mut self, c: &mut Conn, at: Instant) {
        c.timer = Some(at);
        self.heap.push(Reverse((at, c.local_id)));
    }

    /// The earliest entry: a connection's deadline, or a little early when the top entry is
    /// stale (never late: every armed timer has its entry).
    pub(super) fn earliest(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((t, _))| *t)
    }

    /// Takes the next entry due at `now`, stale or not; the caller checks it against the
    /// connection's timer.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<(Instant, CommId)> {
        match self.heap.peek() {
            Some(Reverse((t, _))) if *t <= now => self.heap.pop().map(|Reverse(e)| e),
            _ => None,
        }
    }

    /// Entries held, stale ones included.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;
    use crate::cm::conn::Role;

    fn conn(id: CommId) -> Conn {
        Conn::new(Role::Active, id, IpAddr::V4(Ipv4Addr::LOCALHOST), 1)
    }

    fn at(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    #[test]
    fn a_rearmed_timer_leaves_a_stale_entry_that_is_early_never_late() {
        let mut d = Deadlines::default();
        let (mut a, mut b) = (conn(1), conn(2));
        d.arm(&mut a, at(50));
        d.arm(&mut b, at(20));
        d.arm(&mut b, at(90));
        assert_eq!(d.earliest(), Some(at(20)), "b's old entry: early");
        assert_eq!(d.pop_due(at(10)), None);
        assert_eq!(d.pop_due(at(60)), Some((at(20), 2)), "stale: b.timer is 90");
        assert_eq!(b.timer, Some(at(90)));
        assert_eq!(d.pop_due(at(60)), Some((at(50), 1)));
        assert_eq!(d.pop_due(at(60)), None);
        assert_eq!(d.earliest(), Some(at(90)));
        assert_eq!(d.len(), 1);
    }
}
