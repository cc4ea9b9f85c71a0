//! The Ethernet frame around a RoCEv2 datagram, as kernel rxe sends it, for `FERROCE_PCAP`
//! recordings: Ethernet II, IPv4 (DF, TTL 64, TOS 0, header checksum) or IPv6 (hop limit 64),
//! and UDP (checksum 0 over IPv4, the real one over IPv6). Decoding captures is the `ferroce`
//! tool's job (`ferroce-cli`); this side only builds, from fixed offsets.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

const ETH_HEADER_LEN: usize = 14;
const IPV4_HEADER_LEN: usize = 20;
const IPV6_HEADER_LEN: usize = 40;
const UDP_HEADER_LEN: usize = 8;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;
const IPPROTO_UDP: u8 = 17;

/// Builds the Ethernet frame that carries `udp_payload` from `src` to `dst`, with the given
/// IPv4 Identification. The MAC addresses are locally administered placeholders derived from
/// the IP addresses. A mixed-family pair is framed as IPv6 with the IPv4 address mapped. A
/// payload too long for one IP datagram gets its length fields saturated (a recording of an
/// impossible packet, never a panic).
pub fn encapsulate(src: SocketAddr, dst: SocketAddr, ip_ident: u16, udp_payload: &[u8]) -> Vec<u8> {
    let udp_len = UDP_HEADER_LEN + udp_payload.len();
    let v4 = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Some((s, d)),
        _ => None,
    };
    let ip_len = if v4.is_some() {
        IPV4_HEADER_LEN
    } else {
        IPV6_HEADER_LEN
    };
    let mut f = vec![0u8; ETH_HEADER_LEN + ip_len + udp_len];
    f[0..6].copy_from_slice(&placeholder_mac(dst.ip()));
    f[6..12].copy_from_slice(&placeholder_mac(src.ip()));
    let ethertype = if v4.is_some() {
        ETHERTYPE_IPV4
    } else {
        ETHERTYPE_IPV6
    };
    f[12..14].copy_from_slice(&ethertype.to_be_bytes());
    let (ip, udp) = f[ETH_HEADER_LEN..].split_at_mut(ip_len);
    udp[0..2].copy_from_slice(&src.port().to_be_bytes());
    udp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    udp[4..6].copy_from_slice(&len16(udp_len).to_be_bytes());
    udp[UDP_HEADER_LEN..].copy_from_slice(udp_payload);
    match v4 {
        Some((s, d)) => {
            ip[0] = 0x45; // version 4, 5 words
            ip[2..4].copy_from_slice(&len16(ip_len + udp_len).to_be_bytes());
            ip[4..6].copy_from_slice(&ip_ident.to_be_bytes());
            ip[6] = 0x40; // DF
            ip[8] = 64; // TTL
            ip[9] = IPPROTO_UDP;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let c = !fold(sum16(0, ip));
            ip[10..12].copy_from_slice(&c.to_be_bytes());
        }
        None => {
            let (s, d) = (to_v6(src.ip()), to_v6(dst.ip()));
            ip[0] = 0x60; // version 6
            ip[4..6].copy_from_slice(&len16(udp_len).to_be_bytes());
            ip[6] = IPPROTO_UDP;
            ip[7] = 64; // hop limit
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
            // UDP checksum over the IPv6 pseudo-header (RFC 8200 §8.1); 0 is sent as 0xFFFF.
            let mut acc = sum16(0, &s.octets());
            acc = sum16(acc, &d.octets());
            acc += udp_len as u64 + u64::from(IPPROTO_UDP);
            acc = sum16(acc, udp);
            let c = match !fold(acc) {
                0 => 0xFFFF,
                c => c,
            };
            udp[6..8].copy_from_slice(&c.to_be_bytes());
        }
    }
    f
}

fn len16(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

/// Adds `b` as big-endian 16-bit words (odd length padded with zero) to `acc`.
fn sum16(mut acc: u64, b: &[u8]) -> u64 {
    let mut words = b.chunks_exact(2);
    for w in &mut words {
        acc += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        acc += u64::from(u16::from_be_bytes([*last, 0]));
    }
    acc
}

/// The ones' complement sum folded to 16 bits (RFC 1071).
fn fold(mut acc: u64) -> u16 {
    while acc > 0xFFFF {
        acc = (acc & 0xFFFF) + (acc >> 16);
    }
    acc as u16
}

fn to_v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

fn placeholder_mac(a: IpAddr) -> [u8; 6] {
    let o = match a {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let [a, b] = s[6].to_be_bytes();
            let [c, d] = s[7].to_be_bytes();
            [a, b, c, d]
        }
    };
    [0x02, 0x00, o[0], o[1], o[2], o[3]]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// The IPv4 frame of an rxe capture's first packet layout: fixed fields and a header
    /// checksum that verifies (the sum over a header with its checksum is 0xFFFF).
    #[test]
    fn ipv4_frame_fields_and_checksum() {
        let f = encapsulate(sa("10.0.0.1:49152"), sa("10.0.0.2:4791"), 0x1234, &[7; 20]);
        assert_eq!(f.len(), 14 + 20 + 8 + 20);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        let ip = &f[14..34];
        assert_eq!(
            (ip[0], &ip[2..4], &ip[4..6], ip[6], ip[8], ip[9]),
            (0x45, &[0, 48][..], &[0x12, 0x34][..], 0x40, 64, 17)
        );
        assert_eq!(fold(sum16(0, ip)), 0xFFFF);
        let udp = &f[34..42];
        assert_eq!(udp, &[0xC0, 0x00, 0x12, 0xB7, 0, 28, 0, 0]);
        assert_eq!(&f[42..], &[7; 20]);
    }

    /// IPv6: the UDP checksum verifies over the pseudo-header.
    #[test]
    fn ipv6_frame_checksum_verifies() {
        let f = encapsulate(sa("[fd00::1]:4791"), sa("[fd00::2]:4791"), 0, &[1; 17]);
        assert_eq!(&f[12..14], &[0x86, 0xDD]);
        let (ip, udp) = f[14..].split_at(40);
        assert_eq!((ip[0], ip[6], ip[7]), (0x60, 17, 64));
        let mut acc = sum16(0, &ip[8..40]);
        acc += udp.len() as u64 + 17;
        acc = sum16(acc, udp);
        assert_eq!(fold(acc), 0xFFFF);
    }
}
