//! Decoding the Ethernet, IPv4, IPv6 and UDP framing around RoCEv2 payloads in captures.
//!
//! Decoding goes through `pnet_packet`'s checked views; every length is cross-checked (IP total
//! length, UDP length, Ethernet padding trimmed) so the UDP payload handed on is exactly the
//! RoCEv2 packet. Frames are built by the library's recorder (`ferroce::pcap::encapsulate`);
//! the tests here decode what it builds, so the two are checked against each other.

use std::net::{IpAddr, SocketAddr};

use pnet_packet::ethernet::{EtherType, EtherTypes, EthernetPacket};
use pnet_packet::ip::IpNextHeaderProtocols;
use pnet_packet::ipv4::{Ipv4Flags, Ipv4Packet};
use pnet_packet::ipv6::Ipv6Packet;
use pnet_packet::udp::UdpPacket;
use pnet_packet::vlan::VlanPacket;

use ferroce_wire::ROCE_UDP_PORT;

use ferroce::pcap::{LINKTYPE_ETHERNET, LINKTYPE_LINUX_SLL, LINKTYPE_RAW};

const ETH_HEADER_LEN: usize = 14;
const SLL_HEADER_LEN: usize = 16;
const IPV4_HEADER_LEN: usize = 20;
const IPV6_HEADER_LEN: usize = 40;
const UDP_HEADER_LEN: usize = 8;

/// A UDP datagram to port 4791 found in a frame, with the raw headers the ICRC covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceDatagram<'a> {
    /// IP source address and UDP source port.
    pub src: SocketAddr,
    /// IP destination address and UDP destination port (4791).
    pub dst: SocketAddr,
    /// The IP header as captured (20 bytes for IPv4 without options, 40 for IPv6).
    pub ip_header: &'a [u8],
    /// The UDP header as captured.
    pub udp_header: &'a [u8],
    /// The UDP payload: the RoCEv2 packet, BTH through ICRC.
    pub udp_payload: &'a [u8],
}

impl RoceDatagram<'_> {
    /// The ICRC this datagram should carry, computed over the captured headers.
    ///
    /// # Errors
    /// An IP header the ICRC is not defined over (IPv4 options) or a payload under 4 bytes.
    pub fn expected_icrc(&self) -> ferroce_wire::Result<u32> {
        let (covered, _) = ferroce_wire::icrc::split_icrc(self.udp_payload)
            .ok_or(ferroce_wire::Error::Truncated)?;
        ferroce_wire::icrc::compute_from_headers(self.ip_header, self.udp_header, covered)
    }

    /// Whether the ICRC at the end of the payload is right (all 32 bits checked): the IBTA's,
    /// or for an RC FLUSH also kernel rxe's form ([`RoceDatagram::rxe_flush_icrc`]).
    pub fn icrc_ok(&self) -> bool {
        match (
            self.expected_icrc(),
            ferroce_wire::icrc::split_icrc(self.udp_payload),
        ) {
            (Ok(want), Some((_, got))) => want == got || self.rxe_flush_icrc(),
            _ => false,
        }
    }

    /// Whether this is an RC FLUSH carrying kernel rxe's ICRC form (the headers covered twice:
    /// rxe's opcode table gives RC_FLUSH no payload offset).
    pub fn rxe_flush_icrc(&self) -> bool {
        let Some((covered, got)) = ferroce_wire::icrc::split_icrc(self.udp_payload) else {
            return false;
        };
        self.udp_payload.first() == Some(&ferroce_wire::Opcode::RC_FLUSH.0)
            && ferroce_wire::icrc::compute_from_headers_rxe_flush(
                self.ip_header,
                self.udp_header,
                covered,
            ) == Ok(got)
    }
}

/// What a captured frame holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A RoCEv2 datagram (UDP to port 4791).
    Roce(RoceDatagram<'a>),
    /// UDP to port 4791 whose IP or UDP framing is broken; the reason.
    Malformed(&'static str),
    /// Anything else (other protocols, other ports, non-first fragments).
    Other,
}

/// Decodes a captured frame of the given pcap link type.
pub fn decode(link_type: u32, frame: &[u8]) -> Decoded<'_> {
    match link_type {
        LINKTYPE_ETHERNET => decode_ethernet(frame),
        LINKTYPE_RAW => decode_ip(frame),
        LINKTYPE_LINUX_SLL if frame.len() >= SLL_HEADER_LEN => {
            let proto = EtherType(u16::from_be_bytes([frame[14], frame[15]]));
            decode_ethertype(proto, &frame[SLL_HEADER_LEN..])
        }
        _ => Decoded::Other,
    }
}

/// Decodes an Ethernet frame (with up to two VLAN tags).
pub fn decode_ethernet(frame: &[u8]) -> Decoded<'_> {
    let Some(eth) = EthernetPacket::new(frame) else {
        return Decoded::Other;
    };
    decode_ethertype(eth.get_ethertype(), &frame[ETH_HEADER_LEN..])
}

fn decode_ethertype(mut ethertype: EtherType, mut rest: &[u8]) -> Decoded<'_> {
    for _ in 0..2 {
        if ethertype != EtherTypes::Vlan && ethertype != EtherTypes::QinQ {
            break;
        }
        let Some(tag) = VlanPacket::new(rest) else {
            return Decoded::Other;
        };
        ethertype = tag.get_ethertype();
        rest = &rest[4..];
    }
    match ethertype {
        EtherTypes::Ipv4 | EtherTypes::Ipv6 => decode_ip(rest),
        _ => Decoded::Other,
    }
}

/// Decodes an IPv4 or IPv6 packet (by its version nibble).
pub fn decode_ip(packet: &[u8]) -> Decoded<'_> {
    match packet.first().map(|b| b >> 4) {
        Some(4) => decode_ipv4(packet),
        Some(6) => decode_ipv6(packet),
        _ => Decoded::Other,
    }
}

fn decode_ipv4(packet: &[u8]) -> Decoded<'_> {
    let Some(ip) = Ipv4Packet::new(packet) else {
        return Decoded::Other;
    };
    if ip.get_next_level_protocol() != IpNextHeaderProtocols::Udp || ip.get_fragment_offset() != 0 {
        return Decoded::Other;
    }
    let hl = usize::from(ip.get_header_length()) * 4;
    let total = usize::from(ip.get_total_length());
    if hl < IPV4_HEADER_LEN || total < hl || total > packet.len() {
        return udp_to_roce_or_other(packet.get(hl..).unwrap_or(&[]), "bad IPv4 lengths");
    }
    let body = &packet[hl..total];
    let more_fragments = ip.get_flags() & Ipv4Flags::MoreFragments != 0;
    let src = IpAddr::V4(ip.get_source());
    let dst = IpAddr::V4(ip.get_destination());
    finish_udp(&packet[..hl], body, src, dst, more_fragments)
}

fn decode_ipv6(packet: &[u8]) -> Decoded<'_> {
    let Some(ip) = Ipv6Packet::new(packet) else {
        return Decoded::Other;
    };
    if ip.get_next_header() != IpNextHeaderProtocols::Udp {
        return Decoded::Other;
    }
    let total = IPV6_HEADER_LEN + usize::from(ip.get_payload_length());
    if total > packet.len() {
        return udp_to_roce_or_other(
            &packet[IPV6_HEADER_LEN..],
            "IPv6 payload length exceeds the frame",
        );
    }
    let src = IpAddr::V6(ip.get_source());
    let dst = IpAddr::V6(ip.get_destination());
    finish_udp(
        &packet[..IPV6_HEADER_LEN],
        &packet[IPV6_HEADER_LEN..total],
        src,
        dst,
        false,
    )
}

/// A broken IP packet is only our business if it carries UDP to port 4791.
fn udp_to_roce_or_other<'a>(udp: &[u8], why: &'static str) -> Decoded<'a> {
    match UdpPacket::new(udp) {
        Some(u) if u.get_destination() == ROCE_UDP_PORT => Decoded::Malformed(why),
        _ => Decoded::Other,
    }
}

fn finish_udp<'a>(
    ip_header: &'a [u8],
    body: &'a [u8],
    src: IpAddr,
    dst: IpAddr,
    fragmented: bool,
) -> Decoded<'a> {
    let Some(udp) = UdpPacket::new(body) else {
        return Decoded::Other;
    };
    if udp.get_destination() != ROCE_UDP_PORT {
        return Decoded::Other;
    }
    if fragmented {
        return Decoded::Malformed("fragmented IPv4 (RoCEv2 is sent with DF)");
    }
    let ulen = usize::from(udp.get_length());
    if ulen < UDP_HEADER_LEN || ulen > body.len() {
        return Decoded::Malformed("bad UDP length");
    }
    Decoded::Roce(RoceDatagram {
        src: SocketAddr::new(src, udp.get_source()),
        dst: SocketAddr::new(dst, udp.get_destination()),
        ip_header,
        udp_header: &body[..UDP_HEADER_LEN],
        udp_payload: &body[UDP_HEADER_LEN..ulen],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroce::pcap::encapsulate;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A FLUSH kernel rxe 6.12 sent in the interop lab (2026-12-03), Ethernet and all: its
    /// ICRC is rxe's FLUSH form, which the decoder takes and names.
    #[test]
    fn an_rxe_flush_carries_rxes_icrc_form() {
        let hex = "ba7d4b2b502e52540077000b08004500\
                   0040cb4940004011 5abe0a4d000b0a4d\
                   0001c16412b7002c00001c00ffff0001\
                   001380b85bf10000000100007ff9b90f\
                   a000e97b65d2000010007ae3040a";
        let hex: String = hex.chars().filter(char::is_ascii_hexdigit).collect();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let Decoded::Roce(d) = decode_ethernet(&bytes) else {
            panic!("a RoCEv2 datagram");
        };
        assert!(d.rxe_flush_icrc());
        assert!(d.icrc_ok());
        assert_ne!(
            d.expected_icrc().ok(),
            ferroce_wire::icrc::split_icrc(d.udp_payload).map(|(_, i)| i)
        );
        let mut bad = bytes.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let Decoded::Roce(d) = decode_ethernet(&bad) else {
            panic!("a RoCEv2 datagram");
        };
        assert!(!d.icrc_ok() && !d.rxe_flush_icrc());
    }

    #[test]
    fn ipv4_roundtrip() {
        let f = encapsulate(sa("10.0.0.1:49152"), sa("10.0.0.2:4791"), 0x1234, &[7; 20]);
        assert_eq!(f.len(), 14 + 20 + 8 + 20);
        let Decoded::Roce(d) = decode(LINKTYPE_ETHERNET, &f) else {
            panic!("{:?}", decode(1, &f))
        };
        assert_eq!(d.src, sa("10.0.0.1:49152"));
        assert_eq!(d.dst, sa("10.0.0.2:4791"));
        assert_eq!(d.udp_payload, &[7; 20]);
        assert_eq!(d.ip_header[6], 0x40, "DF");
        assert_eq!(&d.ip_header[4..6], &[0x12, 0x34]);
        // Ethernet padding after the IP packet is not payload.
        let mut padded = f.clone();
        padded.extend_from_slice(&[0xEE; 6]);
        let Decoded::Roce(p) = decode_ethernet(&padded) else {
            panic!()
        };
        assert_eq!(p.udp_payload, &[7; 20]);
    }

    #[test]
    fn ipv6_roundtrip_and_vlan() {
        let f = encapsulate(sa("[fd00::1]:4791"), sa("[fd00::2]:4791"), 0, &[1; 16]);
        let Decoded::Roce(d) = decode_ethernet(&f) else {
            panic!()
        };
        assert_eq!(d.ip_header.len(), 40);
        assert_eq!(d.udp_payload, &[1; 16]);
        // The same frame with an 802.1Q tag.
        let mut tagged = f[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        tagged.extend_from_slice(&f[12..]);
        assert!(matches!(decode_ethernet(&tagged), Decoded::Roce(_)));
    }

    #[test]
    fn other_and_malformed() {
        let f = encapsulate(sa("10.0.0.1:5000"), sa("10.0.0.2:53"), 0, &[0; 8]);
        assert_eq!(decode_ethernet(&f), Decoded::Other);
        let mut bad = encapsulate(sa("10.0.0.1:5000"), sa("10.0.0.2:4791"), 0, &[0; 8]);
        let udp_len_at = 14 + 20 + 4;
        bad[udp_len_at..udp_len_at + 2].copy_from_slice(&200u16.to_be_bytes());
        assert_eq!(decode_ethernet(&bad), Decoded::Malformed("bad UDP length"));
        let mut frag = encapsulate(sa("10.0.0.1:5000"), sa("10.0.0.2:4791"), 0, &[0; 8]);
        frag[14 + 6] = 0x20; // MF, no DF
        assert!(matches!(decode_ethernet(&frag), Decoded::Malformed(_)));
        assert_eq!(decode_ethernet(&[0u8; 3]), Decoded::Other);
        assert_eq!(decode(999, &f), Decoded::Other);
    }

    proptest::proptest! {
        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = decode(LINKTYPE_ETHERNET, &b);
            let _ = decode(LINKTYPE_RAW, &b);
            let _ = decode(LINKTYPE_LINUX_SLL, &b);
        }
    }
}
