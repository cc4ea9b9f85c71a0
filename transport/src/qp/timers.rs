//! A QP's timers (quinn's `TimerTable` shape): one slot per kind, each empty or holding its
//! deadline. The endpoint's deadline heap keys on [`TimerTable::next`], so the earliest timer
//! of any QP is found without visiting the others.

use crate::time::Instant;

/// The timers of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// The requester's retransmission timer (`timeout`, IBTA C9-141): armed while requests are
    /// unacknowledged, fires go-back-N.
    Retransmit = 0,
    /// The RNR wait after an RNR NAK (`min_rnr_timer` of the peer): sending pauses until it
    /// fires.
    RnrWait = 1,
    /// The congestion pacing of a rate-limited QP (DCQCN's reaction point): nothing leaves
    /// until it fires.
    Pace = 2,
}

const TIMERS: usize = 3;

/// One deadline slot per [`Timer`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TimerTable {
    slots: [Option<Instant>; TIMERS],
}

impl TimerTable {
    /// Whether `t` is armed.
    pub(crate) fn is_armed(&self, t: Timer) -> bool {
        self.slots[t as usize].is_some()
    }

    /// Arms `t` for `at` (re-arming moves it).
    pub(crate) fn set(&mut self, t: Timer, at: Instant) {
        self.slots[t as usize] = Some(at);
    }

    /// Disarms `t`.
    pub(crate) fn stop(&mut self, t: Timer) {
        self.slots[t as usize] = None;
    }

    /// Disarms every timer.
    pub(crate) fn stop_all(&mut self) {
        self.slots = [None; TIMERS];
    }

    /// Disarms `t` and says whether it was armed and due at `now`.
    pub(crate) fn expire(&mut self, t: Timer, now: Instant) -> bool {
        let due = self.slots[t as usize].is_some_and(|d| d <= now);
        if due {
            self.slots[t as usize] = None;
        }
        due
    }

    /// The earliest armed deadline.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.slots.iter().flatten().min().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_arm_expire_and_report_the_earliest() {
        let mut t = TimerTable::default();
        assert_eq!(t.next(), None);
        t.set(Timer::Retransmit, Instant::from_nanos(50));
        t.set(Timer::RnrWait, Instant::from_nanos(20));
        assert_eq!(t.next(), Some(Instant::from_nanos(20)));
        assert!(!t.expire(Timer::Retransmit, Instant::from_nanos(49)));
        assert!(t.expire(Timer::RnrWait, Instant::from_nanos(20)));
        assert!(!t.is_armed(Timer::RnrWait));
        assert_eq!(t.next(), Some(Instant::from_nanos(50)));
        t.stop_all();
        assert_eq!(t.next(), None);
    }
}
