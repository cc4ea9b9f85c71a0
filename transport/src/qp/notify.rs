//! A QP's part in congestion control (see [`crate::congestion`]): as notification point it
//! answers CE-marked packets with CNPs; as reaction point it keeps a rate limiter while CNPs
//! slow it, and paces its packets by it.

use ferroce_wire::{BthRepr, CnpRepr, ExtHeaders, Opcode, PacketRepr, Psn};

use super::{Qp, Tx};
use crate::congestion::{CongestionConfig, RateLimiter};
use crate::time::Instant;

impl Qp {
    /// A packet for this QP arrived marked CE: a CNP is due unless one went less than
    /// `cnp_interval` ago. Returns whether one was queued.
    pub(crate) fn on_ce(&mut self, now: Instant, cfg: &CongestionConfig) -> bool {
        if self.cnp_pending {
            return false;
        }
        if self
            .last_cnp
            .is_some_and(|t| now.saturating_duration_since(t) < cfg.cnp_interval)
        {
            return false;
        }
        self.cnp_pending = true;
        true
    }

    /// A CNP for this QP: its rate is cut (the limiter starts at the line rate on the first).
    pub(crate) fn on_cnp(&mut self, now: Instant, cfg: &CongestionConfig) {
        match self.rate.as_mut() {
            Some(r) => r.on_cnp(now, cfg),
            None => self.rate = Some(Box::new(RateLimiter::new(now, cfg))),
        }
        if let Some(r) = &self.rate {
            log::debug!(
                "QP {:#x}: CNP received, rate cut to {} Mb/s",
                self.qpn,
                r.rate() * 8 / 1_000_000
            );
        }
    }

    /// Builds the pending CNP into `buf`: BTH opcode 0x81 with BECN set, DestQP the peer's
    /// QP, PSN 0, then 16 zero bytes (IBTA A17.9.3); the ICRC is the caller's.
    pub(crate) fn poll_cnp(&mut self, now: Instant, buf: &mut [u8]) -> Option<Tx> {
        if !self.cnp_pending {
            return None;
        }
        self.cnp_pending = false;
        let peer = self.attr.ah_attr?;
        let mut bth = BthRepr::new(Opcode::CNP, self.attr.dest_qp_num, Psn::new(0));
        bth.becn = true;
        let repr = PacketRepr {
            bth,
            ext: ExtHeaders {
                cnp: Some(CnpRepr::default()),
                ..Default::default()
            },
            payload: &[],
        };
        let len = repr.buffer_len();
        repr.emit(&mut buf[..len]);
        self.last_cnp = Some(now);
        Some(Tx {
            len,
            dest: peer.dest,
            hop_limit: peer.hop_limit,
            traffic_class: peer.traffic_class,
        })
    }

    /// `None` if this QP may send a data packet at `now`, else when it may. A limiter that
    /// has recovered to the line rate is dropped.
    pub(crate) fn pace(&mut self, now: Instant, cfg: &CongestionConfig) -> Option<Instant> {
        let r = self.rate.as_mut()?;
        if r.recovered(now, cfg) {
            log::debug!("QP {:#x}: back at the line rate, unpaced", self.qpn);
            self.rate = None;
            return None;
        }
        r.wait(now)
    }

    /// Accounts a packet of `len` bytes sent at `now` to the limiter, if any.
    pub(crate) fn charge(&mut self, now: Instant, len: usize, cfg: &CongestionConfig) {
        if let Some(r) = self.rate.as_mut() {
            r.charge(now, len, cfg);
        }
    }
}
