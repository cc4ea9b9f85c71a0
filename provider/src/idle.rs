//! A polling thread's run of polls that found nothing to do, and when it gives up its CPU.
//!
//! A program that busy-polls an empty CQ drives the network itself (`Shared::poll_inline`),
//! but what it waits for may first need another thread of its process: the progress thread
//! of a device it does not poll (the responder of a loopback stream between two devices of
//! one process, a peer process's datagrams for a QP it never polls), or a progress thread
//! preempted while it held the receive path. Where runnable threads outnumber cores (a
//! one-CPU container, oversubscribed MPI ranks, two spinning programs on two cores), a
//! spinning poller keeps that thread off the CPU until the scheduler's slice runs out (1.4 ms
//! here). So after a run of polls that found nothing, the poller yields: when nothing else is
//! runnable that costs one `sched_yield` (about 0.5 µs) per run, and when something is, it
//! runs now — Open MPI's progress loop does the same when oversubscribed
//! (`mpi_yield_when_idle`). Measured in docs/benchmarks.md: one core, 8-byte WRITEs 3× and
//! 64 KiB WRITEs 1.5× faster; two cores and the ping-pong's latency unchanged; perftest's
//! `ib_write_lat` p99 from 30× its typical to 3–8×.
//!
//! Both yields are on by default; `FERROCE_YIELD_WHEN_IDLE=0` turns off the one after empty
//! receives (a program alone on its cores that would rather spin). It was opt-in while two
//! failures seemed to follow it, both explained since: perftest `-R`'s REJ 8 is perftest's own
//! race (its server listens for the data connection only after the first one is set up; the
//! kernel's rdma_cm rejects that client the same way), and the shared address's lost ACK was a
//! closing member's rebalance that held the registry for 5 s (`host::group`).

/// Receives that found nothing, in a row, before a poller yields: 16 empty `recvmmsg` calls
/// are about 7 µs of spinning.
pub(crate) const EMPTY_POLLS_PER_YIELD: u32 = 16;

/// Polls that found another thread receiving, in a row, before a poller yields (each is a
/// failed `try_lock`, far cheaper than an empty receive).
pub(crate) const BUSY_POLLS_PER_YIELD: u32 = 64;

/// Whether a poller yields after [`EMPTY_POLLS_PER_YIELD`] empty receives: yes unless
/// `FERROCE_YIELD_WHEN_IDLE=0`, read once per process.
pub(crate) fn yield_when_idle() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let on = setting_on(std::env::var("FERROCE_YIELD_WHEN_IDLE").ok().as_deref());
        if !on {
            log::debug!("FERROCE_YIELD_WHEN_IDLE=0: pollers spin on empty receives");
        }
        on
    })
}

/// The setting's value: on unless it is `0`.
fn setting_on(value: Option<&str>) -> bool {
    value.is_none_or(|v| v.trim() != "0")
}

/// One thread's streak of polls that found nothing, against the length after which it
/// yields.
#[derive(Debug)]
pub(crate) struct IdleStreak {
    polls: u32,
    period: u32,
}

impl IdleStreak {
    /// A streak that yields every `period` idle polls in a row (at least 1).
    pub(crate) const fn new(period: u32) -> IdleStreak {
        IdleStreak {
            polls: 0,
            period: if period == 0 { 1 } else { period },
        }
    }

    /// A poll that found work: the streak ends.
    pub(crate) fn worked(&mut self) {
        self.polls = 0;
    }

    /// A poll that found nothing: whether the poller should yield its CPU now.
    pub(crate) fn idle(&mut self) -> bool {
        self.polls = self.polls.wrapping_add(1);
        self.polls % self.period == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poller_yields_once_per_run_of_idle_polls_and_work_restarts_the_run() {
        let mut s = IdleStreak::new(EMPTY_POLLS_PER_YIELD);
        let yields = |s: &mut IdleStreak, n: u32| (0..n).filter(|_| s.idle()).count();
        assert_eq!(yields(&mut s, EMPTY_POLLS_PER_YIELD - 1), 0);
        assert!(s.idle(), "the 16th empty poll in a row yields");
        assert_eq!(yields(&mut s, 3 * EMPTY_POLLS_PER_YIELD), 3);
        s.worked();
        assert_eq!(
            yields(&mut s, EMPTY_POLLS_PER_YIELD - 1),
            0,
            "work restarted the run"
        );
        assert!(s.idle());
    }

    #[test]
    fn the_yield_is_on_unless_set_to_zero() {
        assert!(setting_on(None));
        assert!(setting_on(Some("1")));
        assert!(!setting_on(Some("0")));
        assert!(!setting_on(Some(" 0 ")));
    }

    #[test]
    fn a_period_of_zero_yields_on_every_idle_poll() {
        let mut s = IdleStreak::new(0);
        assert!(s.idle() && s.idle());
    }
}
