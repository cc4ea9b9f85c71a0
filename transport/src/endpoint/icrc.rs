//! The ICRC check of received datagrams, including the IPv4 Identification that a UDP socket
//! cannot see (solved for peers that number their packets, kernel rxe), and the ICRC context
//! of a destination for sending.

use std::net::{IpAddr, SocketAddr};

use ferroce_wire::icrc::{Ipv4IdentDelta, split_icrc};
use ferroce_wire::{IcrcContext, Opcode};

use super::{Endpoint, MAX_IDENT_DELTAS, MAX_PEER_IDENTS};

impl Endpoint {
    /// The ICRC context of a packet from this endpoint to `dest` (IP ID 0: the sender's
    /// correction for the kernel's IDs comes later); `None` across address families.
    #[inline]
    pub(super) fn icrc_to(&self, dest: IpAddr) -> Option<IcrcContext> {
        match (self.cfg.local, dest) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Some(IcrcContext::v4(
                s,
                d,
                0,
                self.cfg.src_port,
                self.cfg.dst_port,
            )),
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                Some(IcrcContext::v6(s, d, self.cfg.src_port, self.cfg.dst_port))
            }
            _ => None,
        }
    }

    /// Checks the ICRC of a datagram received through a UDP socket, computing one CRC: all 32
    /// bits when the sender used the expected IP ID (ferroce: 0, or the segment's index `ident`
    /// in a coalesced train), over IPv6, or when the ID is the one predicted for the peer (the
    /// last one + 1, as kernel rxe numbers its packets); otherwise, for peers with unknown IDs,
    /// modulo the ID (16 bits, counted as `icrc_partial`), which also resets the prediction.
    pub(super) fn icrc_ok(
        &mut self,
        src: SocketAddr,
        dst: IpAddr,
        datagram: &[u8],
        ident: u16,
    ) -> bool {
        self.icrc_form_ok(src, dst, datagram, ident, false)
            || (datagram.first() == Some(&Opcode::RC_FLUSH.0)
                && self.icrc_form_ok(src, dst, datagram, ident, true))
    }

    /// [`Endpoint::icrc_ok`] for one form: the IBTA's, or (`rxe_flush`) kernel rxe's FLUSH
    /// form, whose CRC runs over the covered bytes twice.
    pub(super) fn icrc_form_ok(
        &mut self,
        src: SocketAddr,
        dst: IpAddr,
        datagram: &[u8],
        ident: u16,
        rxe_flush: bool,
    ) -> bool {
        let (s, d) = match (src.ip(), dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (s, d),
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let ctx = IcrcContext::v6(s, d, src.port(), self.cfg.dst_port);
                return if rxe_flush {
                    ctx.verify_rxe_flush(datagram)
                } else {
                    ctx.verify(datagram)
                };
            }
            _ => return false,
        };
        let Some((covered, got)) = split_icrc(datagram) else {
            return false;
        };
        let ctx = IcrcContext::v4(s, d, 0, src.port(), self.cfg.dst_port);
        let zero = if rxe_flush {
            ctx.compute_rxe_flush(covered)
        } else {
            ctx.compute(covered)
        };
        let Ok(zero) = zero else {
            return false;
        };
        if zero == got {
            return true;
        }
        // What the packet's ID changed in its ICRC, relative to ID 0: it depends only on how
        // many bytes the CRC runs over after the ID, which rxe's FLUSH form lengthens by the
        // covered bytes.
        let diff = zero ^ got;
        let crc_len = datagram.len() + if rxe_flush { covered.len() } else { 0 };
        let Some(deltas) = self.ident_delta(crc_len) else {
            return false;
        };
        if ident != 0 && deltas.delta(ident) == diff {
            return true;
        }
        if let Some(&last) = self.peer_idents.get(&src.ip()) {
            let next = last.wrapping_add(1);
            if deltas.delta(next) == diff {
                self.peer_idents.insert(src.ip(), next);
                return true;
            }
        }
        if !self.cfg.solve_unknown_ident {
            return false;
        }
        let Some(solved) = deltas.solve(diff) else {
            return false;
        };
        if self.peer_idents.len() >= MAX_PEER_IDENTS {
            self.peer_idents.clear();
        }
        self.peer_idents.insert(src.ip(), solved);
        self.counters.icrc_partial += 1;
        true
    }

    /// The ICRC ID deltas of a UDP payload length, from the small cache.
    pub(super) fn ident_delta(&mut self, len: usize) -> Option<Ipv4IdentDelta> {
        if let Some(&(_, d)) = self.ident_deltas.iter().find(|(l, _)| *l == len) {
            return Some(d);
        }
        let d = Ipv4IdentDelta::new(len)?;
        if self.ident_deltas.len() >= MAX_IDENT_DELTAS {
            self.ident_deltas.remove(0);
        }
        self.ident_deltas.push((len, d));
        Some(d)
    }
}
