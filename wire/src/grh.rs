//! The 40-byte GRH area verbs puts before the payload of a UD receive (`struct ibv_grh`,
//! IBTA §8.3 "Global Route Header"), as RoCEv2 fills it: for a packet that came over IPv6 it
//! is the IPv6 header (the GRH's layout); for IPv4 the first 20 bytes are zero and the last 20
//! are the IPv4 header (rxe's `rxe_ud_grh`/mlx5's layout, IBTA Annex A17.4.5.1).
//!
//! The responder writes it ([`Repr::emit`]); `ibv_init_ah_from_wc` reads the sender's address
//! back out of it ([`Repr::parse`]) to answer.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::{Error, Result};

/// Bytes of the GRH area (`sizeof(struct ibv_grh)`).
pub const GRH_LEN: usize = 40;

/// Where the IPv4 header starts inside the area.
const V4_AT: usize = 20;

/// A read-only view of a GRH area.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// A view over `buffer`; accessors panic if it is shorter than [`GRH_LEN`].
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// A view over `buffer`, checked to hold a whole area.
    ///
    /// # Errors
    /// [`Error::Truncated`] if it is shorter than [`GRH_LEN`]; [`Error::BadIpHeader`] if it
    /// holds neither an IPv4 header at byte 20 nor an IPv6 header at byte 0.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        if !p.is_ipv4() && p.buffer.as_ref()[0] >> 4 != 6 {
            return Err(Error::BadIpHeader);
        }
        Ok(p)
    }

    /// Checks the length only.
    ///
    /// # Errors
    /// [`Error::Truncated`].
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < GRH_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Whether the packet came over IPv4: no IPv6 version at byte 0 (the IPv4 layout's first
    /// half is zero) and an IPv4 header at byte 20 — the order rdma-core's
    /// `ibv_init_ah_from_wc` decides in, so an IPv6 source address whose byte 12 happens to
    /// start with 4 is not mistaken for IPv4.
    pub fn is_ipv4(&self) -> bool {
        let b = self.buffer.as_ref();
        b[0] >> 4 != 6 && b[V4_AT] >> 4 == 4
    }

    fn b(&self) -> &[u8] {
        &self.buffer.as_ref()[..GRH_LEN]
    }

    /// The sender's address (the GRH's SGID).
    pub fn src(&self) -> IpAddr {
        let b = self.b();
        if self.is_ipv4() {
            IpAddr::V4(Ipv4Addr::new(b[32], b[33], b[34], b[35]))
        } else {
            IpAddr::V6(Ipv6Addr::from(field16(b, 8)))
        }
    }

    /// The receiver's address (the GRH's DGID).
    pub fn dst(&self) -> IpAddr {
        let b = self.b();
        if self.is_ipv4() {
            IpAddr::V4(Ipv4Addr::new(b[36], b[37], b[38], b[39]))
        } else {
            IpAddr::V6(Ipv6Addr::from(field16(b, 24)))
        }
    }

    /// Traffic class (IPv4 TOS).
    pub fn traffic_class(&self) -> u8 {
        let b = self.b();
        if self.is_ipv4() {
            b[V4_AT + 1]
        } else {
            ((u32::from_be_bytes([b[0], b[1], b[2], b[3]]) >> 20) & 0xff) as u8
        }
    }

    /// Hop limit (IPv4 TTL).
    pub fn hop_limit(&self) -> u8 {
        let b = self.b();
        if self.is_ipv4() { b[V4_AT + 8] } else { b[7] }
    }

    /// Flow label (0 for IPv4).
    pub fn flow_label(&self) -> u32 {
        let b = self.b();
        if self.is_ipv4() {
            0
        } else {
            u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0xf_ffff
        }
    }

    /// The bytes after the IP header (IPv4 total length − 20, or the IPv6 payload length).
    pub fn next_len(&self) -> u16 {
        let b = self.b();
        if self.is_ipv4() {
            u16::from_be_bytes([b[V4_AT + 2], b[V4_AT + 3]]).saturating_sub(20)
        } else {
            u16::from_be_bytes([b[4], b[5]])
        }
    }
}

/// The IPv4 header checksum (RFC 791) of `h`, whose checksum field is zero.
fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks_exact(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn field16(b: &[u8], at: usize) -> [u8; 16] {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[at..at + 16]);
    a
}

/// A GRH area's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The sender. An IPv4 sender and receiver make the IPv4 layout; anything else the IPv6
    /// one (an IPv4 address there is written `::ffff:a.b.c.d`).
    pub src: IpAddr,
    /// The receiver.
    pub dst: IpAddr,
    /// Traffic class / TOS.
    pub traffic_class: u8,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// Flow label (IPv6 only; 20 bits).
    pub flow_label: u32,
    /// Bytes after the IP header: UDP header, transport headers, payload, ICRC.
    pub next_len: u16,
}

fn v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(v) => v.to_ipv6_mapped(),
        IpAddr::V6(v) => v,
    }
}

impl Repr {
    /// Reads a checked area.
    ///
    /// # Errors
    /// As [`Packet::new_checked`].
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        let p = Packet::new_checked(p.buffer.as_ref())?;
        Ok(Repr {
            src: p.src(),
            dst: p.dst(),
            traffic_class: p.traffic_class(),
            hop_limit: p.hop_limit(),
            flow_label: p.flow_label(),
            next_len: p.next_len(),
        })
    }

    /// Whether this is the IPv4 layout.
    pub fn is_ipv4(&self) -> bool {
        self.src.is_ipv4() && self.dst.is_ipv4()
    }

    /// Bytes [`Repr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        GRH_LEN
    }

    /// Writes the area into the first [`GRH_LEN`] bytes of `buf` (all of them: the unused
    /// first half of the IPv4 layout is zeroed). The IPv4 header has DF set, IP ID 0,
    /// protocol UDP and a valid header checksum, as the header rxe copies from the packet.
    ///
    /// # Panics
    /// If `buf` is shorter than [`GRH_LEN`] (a caller's sizing error).
    pub fn emit(&self, buf: &mut [u8]) {
        let g = &mut buf[..GRH_LEN];
        g.fill(0);
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let ip = &mut g[V4_AT..];
                ip[0] = 0x45;
                ip[1] = self.traffic_class;
                let total = self.next_len.saturating_add(20);
                ip[2..4].copy_from_slice(&total.to_be_bytes());
                ip[6] = 0x40;
                ip[8] = self.hop_limit;
                ip[9] = 17;
                ip[12..16].copy_from_slice(&s.octets());
                ip[16..20].copy_from_slice(&d.octets());
                let sum = ipv4_checksum(&ip[..20]);
                ip[10..12].copy_from_slice(&sum.to_be_bytes());
            }
            (s, d) => {
                let vtf = (6u32 << 28)
                    | (u32::from(self.traffic_class) << 20)
                    | (self.flow_label & 0xf_ffff);
                g[0..4].copy_from_slice(&vtf.to_be_bytes());
                g[4..6].copy_from_slice(&self.next_len.to_be_bytes());
                g[6] = 17;
                g[7] = self.hop_limit;
                g[8..24].copy_from_slice(&v6(s).octets());
                g[24..40].copy_from_slice(&v6(d).octets());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A UD SEND of 8 bytes from 10.0.0.1 to 10.0.0.2 over IPv4: IPv4 total length 20 + UDP 8
    /// + BTH 12 + DETH 8 + payload 8 + ICRC 4 = 60.
    const V4: [u8; GRH_LEN] = [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, //
        0x45, 0x00, 0x00, 60, 0x00, 0x00, 0x40, 0x00, 64, 17, 0x26, 0xaf, //
        10, 0, 0, 1, 10, 0, 0, 2,
    ];

    fn v4_repr() -> Repr {
        Repr {
            src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            next_len: 40,
        }
    }

    /// The same over IPv6 between fd00::1 and fd00::2, traffic class 0x28, flow label 0x12345.
    const V6: [u8; GRH_LEN] = [
        0x62, 0x81, 0x23, 0x45, 0x00, 40, 17, 64, //
        0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, //
        0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2,
    ];

    fn v6_repr() -> Repr {
        Repr {
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
            traffic_class: 0x28,
            hop_limit: 64,
            flow_label: 0x12345,
            next_len: 40,
        }
    }

    #[test]
    fn vectors_parse_and_emit() {
        for (bytes, repr) in [(V4, v4_repr()), (V6, v6_repr())] {
            let p = Packet::new_checked(&bytes[..]).unwrap();
            assert_eq!(Repr::parse(&p), Ok(repr));
            let mut buf = [0xa5u8; GRH_LEN];
            repr.emit(&mut buf);
            assert_eq!(buf, bytes);
        }
        assert!(Packet::new_checked(&V4[..]).unwrap().is_ipv4());
        assert!(!Packet::new_checked(&V6[..]).unwrap().is_ipv4());
    }

    #[test]
    fn truncated_and_garbage_are_errors() {
        assert_eq!(
            Packet::new_checked(&V4[..GRH_LEN - 1]).map(|_| ()),
            Err(Error::Truncated)
        );
        assert_eq!(
            Packet::new_checked(&[0u8; GRH_LEN][..]).map(|_| ()),
            Err(Error::BadIpHeader)
        );
    }

    #[test]
    fn mixed_families_use_the_ipv6_layout_with_mapped_addresses() {
        let r = Repr {
            dst: "fd00::2".parse().unwrap(),
            ..v4_repr()
        };
        let mut buf = [0u8; GRH_LEN];
        r.emit(&mut buf);
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert!(!p.is_ipv4());
        assert_eq!(
            p.src(),
            IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped())
        );
    }

    fn arb_repr() -> impl Strategy<Value = Repr> {
        let v4 = (
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            any::<u8>(),
            any::<u8>(),
            0u16..65000,
        )
            .prop_map(|(s, d, tc, hop, len)| Repr {
                src: IpAddr::V4(Ipv4Addr::from(s)),
                dst: IpAddr::V4(Ipv4Addr::from(d)),
                traffic_class: tc,
                hop_limit: hop,
                flow_label: 0,
                next_len: len,
            });
        let v6 = (
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
            any::<u8>(),
            any::<u8>(),
            0u32..1 << 20,
            any::<u16>(),
        )
            .prop_map(|(s, d, tc, hop, fl, len)| Repr {
                src: IpAddr::V6(Ipv6Addr::from(s)),
                dst: IpAddr::V6(Ipv6Addr::from(d)),
                traffic_class: tc,
                hop_limit: hop,
                flow_label: fl,
                next_len: len,
            });
        prop_oneof![v4, v6]
    }

    proptest! {
        #[test]
        fn roundtrip(r in arb_repr()) {
            let mut buf = [0u8; GRH_LEN];
            r.emit(&mut buf);
            let p = Packet::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(Repr::parse(&p), Ok(r));
        }

        #[test]
        fn any_bytes_parse_without_panic(b in any::<[u8; GRH_LEN]>()) {
            let _ = Packet::new_checked(&b[..]).and_then(|p| Repr::parse(&p));
        }
    }
}
