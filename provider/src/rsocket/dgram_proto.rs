//! The bytes of librdmacm's datagram rsockets (`SOCK_DGRAM` over UD QPs), as rdma-core's put
//! them on the wire:
//!
//! - every UD SEND carries a [`DsHeader`] before the data: the sender's UDP address (version
//!   4 or 6, the header's length, the port, the IP address), which `rrecvfrom` reports;
//! - until a side knows its peer's QPN, it sends through its plain UDP socket, each datagram
//!   behind a [`UdpHeader`] (tag `0x55555555`, version, op, length, the sender's QPN and IP
//!   address); a receiver answers a DATA one with a CTRL one carrying its own QPN, and from
//!   then on both use UD SENDs (Q_Key `RDMA_UDP_QKEY`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

/// [`UdpHeader`]'s tag.
pub const UDP_TAG: u32 = 0x5555_5555;
/// [`DsHeader`]'s length for IPv4 and IPv6.
pub const DS_V4_LEN: usize = 8;
/// See [`DS_V4_LEN`].
pub const DS_V6_LEN: usize = 24;
/// [`UdpHeader`]'s length for IPv4 and IPv6.
pub const UDP_V4_LEN: usize = 16;
/// See [`UDP_V4_LEN`].
pub const UDP_V6_LEN: usize = 28;
/// [`UdpHeader::op`]: data follows (the receiver answers with [`OP_CTRL`]).
pub const OP_DATA: u8 = 0;
/// [`UdpHeader::op`]: only the sender's QPN.
pub const OP_CTRL: u8 = 7;

/// `struct ds_header`: the source address in front of each UD datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsHeader {
    /// The sender's UDP address (for IPv6 with its flow info).
    pub src: SocketAddr,
}

impl DsHeader {
    /// The header's bytes (8 for IPv4, 24 for IPv6); returns the length used.
    pub fn write(&self, out: &mut [u8; DS_V6_LEN]) -> usize {
        out[2..4].copy_from_slice(&self.src.port().to_be_bytes());
        match self.src {
            SocketAddr::V4(a) => {
                out[0] = 4;
                out[1] = DS_V4_LEN as u8;
                out[4..8].copy_from_slice(&a.ip().octets());
                DS_V4_LEN
            }
            SocketAddr::V6(a) => {
                out[0] = 6;
                out[1] = DS_V6_LEN as u8;
                out[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
                out[8..24].copy_from_slice(&a.ip().octets());
                DS_V6_LEN
            }
        }
    }

    /// Parses the header at the start of `b` (the bytes after the GRH); returns it and its
    /// length, or `None` for a version/length pair rdma-core would not send (such a
    /// datagram is dropped, as `ds_valid_recv` drops it).
    pub fn parse(b: &[u8]) -> Option<(DsHeader, usize)> {
        let port = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]);
        match (b.first()?, b.get(1)?) {
            (4, 8) => {
                let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
                Some((
                    DsHeader {
                        src: SocketAddr::new(IpAddr::V4(ip), port),
                    },
                    DS_V4_LEN,
                ))
            }
            (6, 24) if b.len() >= DS_V6_LEN => {
                let flow = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
                let mut ip = [0u8; 16];
                ip.copy_from_slice(&b[8..24]);
                let a = SocketAddrV6::new(Ipv6Addr::from(ip), port, flow, 0);
                Some((
                    DsHeader {
                        src: SocketAddr::V6(a),
                    },
                    DS_V6_LEN,
                ))
            }
            _ => None,
        }
    }
}

/// `struct ds_udp_header`: in front of each datagram sent through the UDP socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpHeader {
    /// [`OP_DATA`] or [`OP_CTRL`].
    pub op: u8,
    /// The sender's UD QPN (24 bits).
    pub qpn: u32,
    /// The sender's IP address.
    pub addr: IpAddr,
}

impl UdpHeader {
    /// The header's bytes (16 for IPv4, 28 for IPv6); returns the length used.
    pub fn write(&self, out: &mut [u8; UDP_V6_LEN]) -> usize {
        out[..4].copy_from_slice(&UDP_TAG.to_be_bytes());
        out[5] = self.op;
        out[7] = 0;
        out[8..12].copy_from_slice(&(self.qpn & 0xFF_FFFF).to_be_bytes());
        match self.addr {
            IpAddr::V4(a) => {
                out[4] = 4;
                out[6] = UDP_V4_LEN as u8;
                out[12..16].copy_from_slice(&a.octets());
                UDP_V4_LEN
            }
            IpAddr::V6(a) => {
                out[4] = 6;
                out[6] = UDP_V6_LEN as u8;
                out[12..28].copy_from_slice(&a.octets());
                UDP_V6_LEN
            }
        }
    }

    /// Parses a header that came from `from` (its family must match, as rdma-core checks);
    /// returns it and its length.
    pub fn parse(b: &[u8], from: &SocketAddr) -> Option<(UdpHeader, usize)> {
        if b.len() < UDP_V4_LEN || b[..4] != UDP_TAG.to_be_bytes() {
            return None;
        }
        let qpn = u32::from_be_bytes([b[8], b[9], b[10], b[11]]) & 0xFF_FFFF;
        let (addr, len) = match (b[4], b[6], from) {
            (4, 16, SocketAddr::V4(_)) => (
                IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15])),
                UDP_V4_LEN,
            ),
            (6, 28, SocketAddr::V6(_)) if b.len() >= UDP_V6_LEN => {
                let mut ip = [0u8; 16];
                ip.copy_from_slice(&b[12..28]);
                (IpAddr::V6(Ipv6Addr::from(ip)), UDP_V6_LEN)
            }
            _ => return None,
        };
        Some((
            UdpHeader {
                op: b[5],
                qpn,
                addr,
            },
            len,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ds_header_bytes() {
        let h = DsHeader {
            src: "10.77.0.1:7174".parse().unwrap(),
        };
        let mut b = [0u8; DS_V6_LEN];
        assert_eq!(h.write(&mut b), 8);
        assert_eq!(b[..8], [4, 8, 0x1C, 0x06, 10, 77, 0, 1]);
        assert_eq!(DsHeader::parse(&b[..8]), Some((h, 8)));
        let h6 = DsHeader {
            src: "[fd77::1]:9".parse().unwrap(),
        };
        assert_eq!(h6.write(&mut b), 24);
        assert_eq!(b[..4], [6, 24, 0, 9]);
        assert_eq!(DsHeader::parse(&b), Some((h6, 24)));
        // A version/length pair rdma-core never sends.
        assert_eq!(DsHeader::parse(&[4, 24, 0, 9, 1, 2, 3, 4]), None);
        assert_eq!(DsHeader::parse(&[6, 24, 0, 9]), None);
        assert_eq!(DsHeader::parse(&[]), None);
    }

    #[test]
    fn udp_header_bytes() {
        let h = UdpHeader {
            op: OP_DATA,
            qpn: 0x12_3456,
            addr: "10.77.0.11".parse().unwrap(),
        };
        let mut b = [0u8; UDP_V6_LEN];
        assert_eq!(h.write(&mut b), 16);
        assert_eq!(
            b[..16],
            [
                0x55, 0x55, 0x55, 0x55, 4, 0, 16, 0, 0, 0x12, 0x34, 0x56, 10, 77, 0, 11
            ]
        );
        let from: SocketAddr = "10.77.0.11:5000".parse().unwrap();
        assert_eq!(UdpHeader::parse(&b[..16], &from), Some((h, 16)));
        // The family must match the datagram's source; the tag must be there.
        let from6: SocketAddr = "[::1]:5000".parse().unwrap();
        assert_eq!(UdpHeader::parse(&b[..16], &from6), None);
        b[0] = 0;
        assert_eq!(UdpHeader::parse(&b[..16], &from), None);
        let h6 = UdpHeader {
            op: OP_CTRL,
            qpn: 7,
            addr: "fd77::11".parse().unwrap(),
        };
        assert_eq!(h6.write(&mut b), 28);
        assert_eq!(UdpHeader::parse(&b, &from6), Some((h6, 28)));
    }
}
