//! Congestion control for RoCEv2 in the DCQCN manner (IBTA Annex A17.9; Zhu et al., "Congestion
//! Control for Large-Scale RDMA Deployments", SIGCOMM 2015), as RoCE NICs do it and kernel rxe
//! does not:
//!
//! - every packet leaves ECN-capable (ECT(0) in the IP header: the runtime's socket sets it);
//! - the **notification point** (the receiving QP) answers a packet that a switch or queue
//!   marked CE with a CNP (BTH opcode 0x81, BECN set, DestQP = the sender's QP), at most one per
//!   QP per [`CongestionConfig::cnp_interval`];
//! - the **reaction point** (the sending QP) cuts its rate on each CNP,
//!   `Rt = Rc; Rc = Rc × (1 − α/2); α = (1 − g)·α + g`, lets α decay by `(1 − g)` every
//!   [`CongestionConfig::alpha_period`] without a CNP, and recovers every
//!   [`CongestionConfig::increase_period`]: five fast-recovery steps `Rc = (Rt + Rc)/2`, then
//!   additive (`Rt += ai_rate`) and hyper increase (`Rt += i·hai_rate`). A QP is paced only
//!   while it is below the line rate; once recovered it runs unpaced again, so a path that never
//!   marks costs nothing.
//!
//! DCQCN's byte counter is not kept: the rate recovers on time alone. Peers that ignore CNPs
//! (kernel rxe) and peers that never mark ECT are unaffected.

use core::time::Duration;

use crate::time::Instant;

/// `α` in fixed point: this value is 1.0.
const ALPHA_ONE: u32 = 1 << 16;

/// DCQCN's `g`, the weight of a new observation in `α`: 1/256 (as a shift).
const G_SHIFT: u32 = 8;

/// Fast-recovery steps after a cut (DCQCN's `F`).
const FAST_RECOVERY_STEPS: u32 = 5;

/// Additive-increase steps before hyper increase starts.
const ADDITIVE_STEPS: u32 = 5;

/// The most periods caught up in one go; past it the QP is simply recovered.
const MAX_CATCH_UP: u64 = 4096;

/// Bytes a paced QP may send back to back after a pause (about one `UDP_SEGMENT` train of
/// 4 KiB packets would be 64 KiB; a smaller burst keeps queues short).
const BURST_BYTES: u64 = 16 * 1024;

/// The knobs of the notification and reaction points (what mlx5 exposes as `roce_np`/`roce_rp`
/// parameters in its `ecn/` sysfs directory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CongestionConfig {
    /// Notification point on: answer CE-marked packets with CNPs.
    pub np: bool,
    /// Reaction point on: cut the sending rate on CNPs.
    pub rp: bool,
    /// The least time between two CNPs sent for one QP (DCQCN's 50 µs).
    pub cnp_interval: Duration,
    /// The rate a QP starts from at its first CNP and recovers to, in bytes per second.
    pub line_rate: u64,
    /// The lowest rate a cut reaches, in bytes per second.
    pub min_rate: u64,
    /// DCQCN's `T`: one rate-increase step per period without a CNP.
    pub increase_period: Duration,
    /// DCQCN's `K`: `α` decays once per period without a CNP.
    pub alpha_period: Duration,
    /// Additive increase of the target rate per step, bytes per second (DCQCN's `R_AI`).
    pub ai_rate: u64,
    /// Hyper increase of the target rate per step, bytes per second (DCQCN's `R_HAI`).
    pub hai_rate: u64,
}

impl Default for CongestionConfig {
    /// Both points on; 50 µs between CNPs; a 25 Gb/s line (what the port advertises), a
    /// 10 Mb/s floor; `T` = `K` = 55 µs; `R_AI` 5 Mb/s and `R_HAI` 50 Mb/s (the paper's).
    fn default() -> CongestionConfig {
        CongestionConfig {
            np: true,
            rp: true,
            cnp_interval: Duration::from_micros(50),
            line_rate: 25_000_000_000 / 8,
            min_rate: 10_000_000 / 8,
            increase_period: Duration::from_micros(55),
            alpha_period: Duration::from_micros(55),
            ai_rate: 5_000_000 / 8,
            hai_rate: 50_000_000 / 8,
        }
    }
}

impl CongestionConfig {
    /// Neither point: no CNPs sent, none acted on.
    pub fn off() -> CongestionConfig {
        CongestionConfig {
            np: false,
            rp: false,
            ..CongestionConfig::default()
        }
    }
}

/// The ECN field of a received packet's IP header (RFC 3168).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(u8)]
pub enum Ecn {
    /// Not ECN-capable (00).
    #[default]
    NotEct = 0,
    /// ECT(1) (01).
    Ect1 = 1,
    /// ECT(0) (10): what ferroce sends.
    Ect0 = 2,
    /// Congestion Experienced (11): a queue on the path marked it.
    Ce = 3,
}

impl Ecn {
    /// The ECN bits of an IPv4 TOS or IPv6 traffic class byte.
    pub const fn from_tos(tos: u8) -> Ecn {
        match tos & 3 {
            0 => Ecn::NotEct,
            1 => Ecn::Ect1,
            2 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }
}

/// A QP's reaction point: its current and target rates, `α`, and the pacing of its packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateLimiter {
    /// `Rc`, bytes per second.
    rc: u64,
    /// `Rt`, bytes per second.
    rt: u64,
    /// `α`, in units of 1/[`ALPHA_ONE`].
    alpha: u32,
    /// Increase steps since the last cut.
    steps: u32,
    /// Where the current increase period began.
    increase_from: Instant,
    /// Where the current `α` period began.
    alpha_from: Instant,
    /// The earliest time the next packet may leave.
    ready_at: Instant,
}

impl RateLimiter {
    /// The limiter of a QP at its first CNP: at the line rate, `α` = 1 (DCQCN's start), and
    /// cut at once.
    pub(crate) fn new(now: Instant, cfg: &CongestionConfig) -> RateLimiter {
        let mut r = RateLimiter {
            rc: cfg.line_rate,
            rt: cfg.line_rate,
            alpha: ALPHA_ONE,
            steps: 0,
            increase_from: now,
            alpha_from: now,
            ready_at: now,
        };
        r.on_cnp(now, cfg);
        r
    }

    /// The current rate `Rc` in bytes per second.
    pub(crate) fn rate(&self) -> u64 {
        self.rc
    }

    /// A CNP for this QP: the rate cut.
    pub(crate) fn on_cnp(&mut self, now: Instant, cfg: &CongestionConfig) {
        self.advance(now, cfg);
        self.rt = self.rc;
        let cut = (u128::from(self.rc) * u128::from(self.alpha) / u128::from(2 * ALPHA_ONE)) as u64;
        self.rc = self.rc.saturating_sub(cut).max(cfg.min_rate);
        self.alpha = self.alpha - (self.alpha >> G_SHIFT) + (ALPHA_ONE >> G_SHIFT);
        self.steps = 0;
        self.increase_from = now;
        self.alpha_from = now;
    }

    /// Applies the `α` decays and rate increases of the whole periods up to `now`.
    fn advance(&mut self, now: Instant, cfg: &CongestionConfig) {
        let k = cfg.alpha_period.as_nanos().max(1) as u64;
        let n = now.saturating_duration_since(self.alpha_from).as_nanos() as u64 / k;
        for _ in 0..n.min(MAX_CATCH_UP) {
            self.alpha -= self.alpha >> G_SHIFT;
        }
        if n > 0 {
            self.alpha_from = self.alpha_from + Duration::from_nanos(n * k);
        }
        let t = cfg.increase_period.as_nanos().max(1) as u64;
        let m = now.saturating_duration_since(self.increase_from).as_nanos() as u64 / t;
        if m > MAX_CATCH_UP {
            self.rc = cfg.line_rate;
            self.rt = cfg.line_rate;
        } else {
            for _ in 0..m {
                self.increase(cfg);
            }
        }
        if m > 0 {
            self.increase_from = self.increase_from + Duration::from_nanos(m * t);
        }
    }

    /// One increase step: fast recovery towards `Rt`, then additive and hyper increase of `Rt`.
    fn increase(&mut self, cfg: &CongestionConfig) {
        self.steps = self.steps.saturating_add(1);
        if self.steps > FAST_RECOVERY_STEPS + ADDITIVE_STEPS {
            let i = u64::from(self.steps - FAST_RECOVERY_STEPS - ADDITIVE_STEPS);
            self.rt = self.rt.saturating_add(i.saturating_mul(cfg.hai_rate));
        } else if self.steps > FAST_RECOVERY_STEPS {
            self.rt = self.rt.saturating_add(cfg.ai_rate);
        }
        self.rt = self.rt.min(cfg.line_rate);
        self.rc = (self.rc / 2 + self.rt / 2).min(cfg.line_rate);
        // Halving towards Rt never quite gets there: within 1 % counts as there.
        if self.rt - self.rc.min(self.rt) <= self.rt / 100 {
            self.rc = self.rt;
        }
    }

    /// Whether the QP is back at the line rate (its limiter can go).
    pub(crate) fn recovered(&mut self, now: Instant, cfg: &CongestionConfig) -> bool {
        self.advance(now, cfg);
        self.rc >= cfg.line_rate
    }

    /// `None` if a packet may leave at `now`, else when it may.
    pub(crate) fn wait(&self, now: Instant) -> Option<Instant> {
        (self.ready_at > now).then_some(self.ready_at)
    }

    /// Accounts a packet of `len` bytes sent at `now`: the next may leave `len / Rc` later,
    /// with up to [`BURST_BYTES`] of credit kept from an idle spell.
    pub(crate) fn charge(&mut self, now: Instant, len: usize, cfg: &CongestionConfig) {
        self.advance(now, cfg);
        let rate = self.rc.max(1);
        let credit = Duration::from_nanos(BURST_BYTES * 1_000_000_000 / rate);
        let floor = Instant::from_nanos(now.as_nanos().saturating_sub(credit.as_nanos() as u64));
        let start = self.ready_at.max(floor);
        self.ready_at = start + Duration::from_nanos(len as u64 * 1_000_000_000 / rate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(us: u64) -> Instant {
        Instant::from_nanos(us * 1000)
    }

    #[test]
    fn ecn_bits_of_a_tos_byte() {
        assert_eq!(Ecn::from_tos(0x00), Ecn::NotEct);
        assert_eq!(Ecn::from_tos(0x01), Ecn::Ect1);
        assert_eq!(Ecn::from_tos(0xB8 | 2), Ecn::Ect0);
        assert_eq!(Ecn::from_tos(0xC3), Ecn::Ce);
    }

    #[test]
    fn the_first_cnp_halves_the_line_rate_and_alpha_stays_near_one() {
        let cfg = CongestionConfig::default();
        let r = RateLimiter::new(at(0), &cfg);
        assert_eq!(r.rate(), cfg.line_rate / 2);
        assert_eq!(r.rt, cfg.line_rate);
        assert_eq!(r.alpha, ALPHA_ONE, "(1 - g) * 1 + g = 1");
    }

    #[test]
    fn repeated_cnps_cut_down_to_the_floor_never_below() {
        let cfg = CongestionConfig::default();
        let mut r = RateLimiter::new(at(0), &cfg);
        let mut last = r.rate();
        for i in 1..40 {
            r.on_cnp(at(i), &cfg);
            assert!(r.rate() <= last);
            last = r.rate();
        }
        assert_eq!(r.rate(), cfg.min_rate);
    }

    #[test]
    fn alpha_decays_without_cnps_so_a_later_cut_is_smaller() {
        let cfg = CongestionConfig::default();
        let mut r = RateLimiter::new(at(0), &cfg);
        // 100 alpha periods without a CNP: alpha = (255/256)^100 ≈ 0.68.
        r.advance(at(5500), &cfg);
        let a = f64::from(r.alpha) / f64::from(ALPHA_ONE);
        assert!((a - (255.0f64 / 256.0).powi(100)).abs() < 0.01, "alpha {a}");
        let before = r.rate();
        r.on_cnp(at(5500), &cfg);
        let kept = r.rate() as f64 / before as f64;
        assert!(
            (kept - (1.0 - a / 2.0)).abs() < 0.01,
            "kept {kept}, alpha {a}"
        );
    }

    #[test]
    fn fast_recovery_halves_the_gap_to_the_target_each_period() {
        let cfg = CongestionConfig::default();
        let mut r = RateLimiter::new(at(0), &cfg);
        let target = r.rt;
        let mut gap = target - r.rate();
        for k in 1..=3 {
            r.advance(at(55 * k), &cfg);
            let g = target - r.rate();
            assert!(g <= gap / 2 + 1, "step {k}: gap {g} after {gap}");
            gap = g;
        }
        assert_eq!(r.rt, target, "fast recovery leaves the target alone");
    }

    #[test]
    fn a_quiet_path_recovers_to_the_line_rate() {
        let cfg = CongestionConfig::default();
        let mut r = RateLimiter::new(at(0), &cfg);
        for i in 1..20 {
            r.on_cnp(at(i), &cfg);
        }
        assert!(!r.recovered(at(100), &cfg));
        // Hyper increase adds i * 50 Mb/s per 55 us: back to 25 Gb/s within a few ms.
        assert!(r.recovered(at(20_000), &cfg), "rate {}", r.rate());
        // A long silence is caught up without a long loop.
        let mut s = RateLimiter::new(at(0), &cfg);
        assert!(s.recovered(at(10_000_000_000), &cfg));
    }

    #[test]
    fn pacing_spaces_packets_by_their_length_at_the_current_rate() {
        let cfg = CongestionConfig {
            line_rate: 2_000_000_000,
            // No increase during the test.
            increase_period: Duration::from_secs(10),
            alpha_period: Duration::from_secs(10),
            ..CongestionConfig::default()
        };
        // Cut to 1 GB/s: a 4,000-byte packet takes 4 us.
        let mut r = RateLimiter::new(at(0), &cfg);
        assert_eq!(r.rate(), 1_000_000_000);
        let now = at(1000);
        assert_eq!(r.wait(now), None);
        // The burst credit (16 KiB = 16.384 us) lets the first few go back to back.
        let mut sent = 0;
        while r.wait(now).is_none() {
            r.charge(now, 4000, &cfg);
            sent += 1;
            assert!(sent < 100);
        }
        assert_eq!(
            sent, 5,
            "16,384 bytes of credit: 4 packets free, the 5th starts the debt"
        );
        let until = r.wait(now).unwrap();
        assert_eq!(until, now + Duration::from_nanos(20_000 - 16_384));
        assert_eq!(r.wait(until), None);
        // Back to back from there: one packet per 4 us.
        r.charge(until, 4000, &cfg);
        assert_eq!(r.wait(until), Some(until + Duration::from_micros(4)));
    }
}
