//! Turning a case's packet specs into bytes for one connection, and reading the target's
//! answers back, sans IO.

use std::net::Ipv4Addr;

use ferroce_wire::icrc::{Ipv4IdentDelta, split_icrc};
use ferroce_wire::{
    AethRepr, AtomicEthRepr, BthRepr, ExtHeaders, IcrcContext, NakCode, Opcode, PacketRepr, Psn,
    RethRepr, Syndrome,
};

use super::case::PacketSpec;

/// The RoCEv2 UDP port.
pub const PORT: u16 = ferroce_wire::ROCE_UDP_PORT;

/// One connection of a case: both ends' addresses, QPs and the target's region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conn {
    /// Our address (the fuzzer's socket).
    pub local: Ipv4Addr,
    /// The target's address.
    pub target: Ipv4Addr,
    /// Our QPN (what the target's QP was connected to).
    pub local_qpn: u32,
    /// The target's QPN.
    pub target_qpn: u32,
    /// Our first PSN (the target's `rq_psn`).
    pub start_psn: u32,
    /// The target region's R_Key.
    pub rkey: u32,
    /// The target region's address.
    pub addr: u64,
}

/// The payload byte `i` of every packet a case sends.
pub fn payload_byte(i: usize) -> u8 {
    (i as u32).wrapping_mul(7).wrapping_add(0x3C) as u8
}

/// The bytes of `spec` on `conn`: the UDP payload with its ICRC (for IPv4 ID 0, which an
/// unconnected socket with DF set sends), then the spec's own damage (TVer, ICRC bit).
pub fn build(spec: &PacketSpec, conn: &Conn) -> Vec<u8> {
    let payload: Vec<u8> = (0..spec.payload_len as usize).map(payload_byte).collect();
    let va = |off: i64| conn.addr.wrapping_add_signed(off);
    let mut bth = BthRepr::new(
        spec.opcode,
        conn.target_qpn ^ spec.qpn_xor,
        Psn::new(conn.start_psn.wrapping_add(spec.psn_off)),
    );
    if let Some(p) = spec.pkey {
        bth.pkey = p;
    }
    // Every request that ends a message asks for its answer, as requesters do (each step is
    // judged on its own); FIRST and MIDDLE packets do not.
    bth.ack_req = !matches!(
        spec.opcode.info().map(|i| i.position),
        Some(ferroce_wire::opcode::Position::First | ferroce_wire::opcode::Position::Middle)
    );
    let repr = PacketRepr {
        bth,
        ext: ExtHeaders {
            reth: spec.reth.map(|(off, len)| RethRepr {
                va: va(off),
                rkey: conn.rkey ^ spec.rkey_xor,
                dma_len: len,
            }),
            atomic_eth: spec.atomic.map(|(off, swap_add, compare)| AtomicEthRepr {
                va: va(off),
                rkey: conn.rkey ^ spec.rkey_xor,
                swap_add,
                compare,
            }),
            ..Default::default()
        },
        payload: &payload,
    }
    .with_pad();
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf);
    if spec.tver != 0 {
        buf[1] = (buf[1] & 0xF0) | (spec.tver & 0x0F);
    }
    if let Some(pad) = spec.pad {
        buf[1] = (buf[1] & !0x30) | ((pad & 3) << 4);
    }
    // Havoc: bytes overwritten and the length changed before the ICRC (which stays last).
    let body = buf.len() - 4;
    for &(at, v) in &spec.pokes {
        if let Some(b) = buf[..body].get_mut(usize::from(at)) {
            *b = v;
        }
    }
    if let Some(n) = spec.resize {
        buf.resize(usize::from(n), 0);
        buf.extend_from_slice(&[0; 4]);
    }
    IcrcContext::v4(conn.local, conn.target, 0, PORT, PORT).fill(&mut buf);
    if spec.bad_icrc {
        let n = buf.len();
        buf[n - 1] ^= 0x01;
    }
    buf
}

/// One answer of the target, as far as the oracle needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// BTH opcode.
    pub opcode: Opcode,
    /// PSN - our first PSN (mod 2^24).
    pub psn_off: u32,
    /// The AETH's syndrome, if any.
    pub syndrome: Option<u8>,
    /// The atomic ACK's original value.
    pub orig: Option<u64>,
    /// READ response data.
    pub payload: Vec<u8>,
    /// Whether the ICRC checked (all 32 bits for IPv4 ID 0 or last + 1, else 16 bits).
    pub icrc_ok: bool,
}

impl Answer {
    /// The NAK code, if this is a NAK.
    pub fn nak(&self) -> Option<NakCode> {
        let s = Syndrome(self.syndrome?);
        match s.ack_type() {
            ferroce_wire::AckType::Nak(c) => Some(c),
            _ => None,
        }
    }

    /// Whether this is an RNR NAK.
    pub fn is_rnr(&self) -> bool {
        matches!(
            self.syndrome.map(|s| Syndrome(s).ack_type()),
            Some(ferroce_wire::AckType::RnrNak { .. })
        )
    }

    /// Whether this is a positive ACK (plain or atomic).
    pub fn is_ack(&self) -> bool {
        matches!(
            self.syndrome.map(|s| Syndrome(s).ack_type()),
            Some(ferroce_wire::AckType::Ack(_))
        ) && (self.opcode == Opcode::RC_ACKNOWLEDGE || self.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE)
    }

    /// A one-line description for reports.
    pub fn describe(&self) -> String {
        let what = match (self.nak(), self.is_rnr()) {
            (Some(c), _) => format!("NAK {}", c.name()),
            (None, true) => "RNR NAK".to_owned(),
            _ => self.opcode.name().to_owned(),
        };
        format!("{what} psn+{}", self.psn_off)
    }
}

/// Reads a datagram from the target as an answer on `conn`: `None` if it does not parse or is
/// for another QP.
pub fn parse_answer(datagram: &[u8], src_port: u16, conn: &Conn) -> Option<Answer> {
    let p = PacketRepr::parse(datagram).ok()?;
    if p.bth.dest_qp != conn.local_qpn {
        return None;
    }
    Some(Answer {
        opcode: p.bth.opcode,
        psn_off: p.bth.psn.value().wrapping_sub(conn.start_psn) & 0xFF_FFFF,
        syndrome: p.ext.aeth.map(|a: AethRepr| a.syndrome),
        orig: p.ext.atomic_ack_eth.map(|a| a.orig),
        payload: p.payload.to_vec(),
        icrc_ok: icrc_ok(datagram, src_port, conn),
    })
}

/// The ICRC of an answer: all 32 bits for IPv4 ID 0 (ferroce), else modulo the ID (which a UDP
/// socket cannot see; kernel rxe numbers its packets), as the engine checks it.
fn icrc_ok(datagram: &[u8], src_port: u16, conn: &Conn) -> bool {
    let Some((covered, got)) = split_icrc(datagram) else {
        return false;
    };
    let Ok(zero) = IcrcContext::v4(conn.target, conn.local, 0, src_port, PORT).compute(covered)
    else {
        return false;
    };
    zero == got
        || Ipv4IdentDelta::new(datagram.len()).is_some_and(|d| d.solve(zero ^ got).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Conn {
        Conn {
            local: Ipv4Addr::new(10, 0, 0, 1),
            target: Ipv4Addr::new(10, 0, 0, 2),
            local_qpn: 0x123,
            target_qpn: 0x11,
            start_psn: 0xFF_FFFE,
            rkey: 0xABCD_0001,
            addr: 0x7000_0000,
        }
    }

    #[test]
    fn a_built_packet_parses_back_with_a_valid_icrc() {
        let c = conn();
        let spec = PacketSpec::write_only(3, -8, 13);
        let b = build(&spec, &c);
        let p = PacketRepr::parse(&b).unwrap();
        assert_eq!(p.bth.opcode, Opcode::RC_RDMA_WRITE_ONLY);
        assert_eq!(p.bth.psn.value(), 1, "start + 3 wraps");
        assert_eq!(p.bth.dest_qp, 0x11);
        assert!(p.bth.ack_req);
        let r = p.ext.reth.unwrap();
        assert_eq!(
            (r.va, r.rkey, r.dma_len),
            (0x7000_0000 - 8, 0xABCD_0001, 13)
        );
        assert_eq!(p.payload.len(), 13);
        assert_eq!(p.bth.pad_count, 3);
        assert!(IcrcContext::v4(c.local, c.target, 0, PORT, PORT).verify(&b));
    }

    #[test]
    fn damage_is_what_the_spec_asks_for() {
        let c = conn();
        let bad = build(
            &PacketSpec {
                bad_icrc: true,
                ..PacketSpec::write_only(0, 0, 8)
            },
            &c,
        );
        assert!(!IcrcContext::v4(c.local, c.target, 0, PORT, PORT).verify(&bad));
        let tver = build(
            &PacketSpec {
                tver: 5,
                ..PacketSpec::write_only(0, 0, 8)
            },
            &c,
        );
        assert_eq!(tver[1] & 0x0F, 5);
        assert!(IcrcContext::v4(c.local, c.target, 0, PORT, PORT).verify(&tver));
        assert!(
            PacketRepr::parse(&tver).is_err(),
            "the codec refuses TVer 5"
        );
        let other = build(
            &PacketSpec {
                pkey: Some(0x1234),
                rkey_xor: 0xFF,
                qpn_xor: 0x100,
                ..PacketSpec::write_only(0, 0, 8)
            },
            &c,
        );
        let p = PacketRepr::parse(&other).unwrap();
        assert_eq!(p.bth.pkey, 0x1234);
        assert_eq!(p.bth.dest_qp, 0x111);
        assert_eq!(p.ext.reth.unwrap().rkey, 0xABCD_00FE);
    }

    #[test]
    fn answers_are_read_relative_to_the_connection() {
        let c = conn();
        // The target's NAK (sequence error, expected PSN = start) for our QP.
        let repr = PacketRepr {
            bth: BthRepr::new(Opcode::RC_ACKNOWLEDGE, 0x123, Psn::new(0xFF_FFFE)),
            ext: ExtHeaders {
                aeth: Some(AethRepr {
                    syndrome: Syndrome::nak(NakCode::PsnSeqError).0,
                    msn: 0,
                }),
                ..Default::default()
            },
            payload: &[],
        };
        let mut b = vec![0u8; repr.buffer_len()];
        repr.emit(&mut b);
        IcrcContext::v4(c.target, c.local, 0, 50000, PORT).fill(&mut b);
        let a = parse_answer(&b, 50000, &c).unwrap();
        assert_eq!(a.nak(), Some(NakCode::PsnSeqError));
        assert_eq!(a.psn_off, 0);
        assert!(a.icrc_ok && !a.is_ack() && !a.is_rnr());
        // Another QP's: not ours.
        let other = Conn {
            local_qpn: 0x999,
            ..c
        };
        assert!(parse_answer(&b, 50000, &other).is_none());
        // A damaged one: parsed, flagged.
        let n = b.len();
        b[n - 2] ^= 0x40;
        b[n - 1] ^= 0x01;
        assert!(!parse_answer(&b, 50000, &c).unwrap().icrc_ok);
    }
}
