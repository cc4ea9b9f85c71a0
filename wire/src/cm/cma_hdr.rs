//! The rdma_cm header (kernel `struct cma_hdr`, 36 bytes): the first bytes of the private
//! data of a REQ or SIDR_REQ in the IP port spaces: version, IP version, the active side's
//! port and both addresses. An IPv4 address is 12 zero bytes then the address (not
//! IPv4-mapped, unlike the port GIDs).

fixed_header! {
    name: "rdma_cm header";
    len: 36;
    fields: {
        /// `cma_version`: 0.
        cma_version, set_cma_version: U8 as u8 @ 0,
        /// `ip_version` in the high nibble: 4 or 6.
        ip_version, set_ip_version: Bits8<7, 4> as u8 @ 1,
        /// `port`: the active side's rdma_cm port (its bound source port).
        port, set_port: U16 as u16 @ 2,
        /// `src_addr`: the active side's address.
        src_addr, set_src_addr: Bytes<16> as [u8; 16] @ 4,
        /// `dst_addr`: the passive side's address.
        dst_addr, set_dst_addr: Bytes<16> as [u8; 16] @ 20,
    }
}

/// `CMA_VERSION`.
pub const CMA_VERSION: u8 = 0;

impl Repr {
    /// The header of a connection from `src:port` to `dst` (both of one family).
    pub fn new(src: core::net::IpAddr, port: u16, dst: core::net::IpAddr) -> Repr {
        Repr {
            cma_version: CMA_VERSION,
            ip_version: if src.is_ipv4() { 4 } else { 6 },
            port,
            src_addr: to_bytes(src),
            dst_addr: to_bytes(dst),
        }
    }

    /// The active side's address, if the header is well formed (version 0, IP version 4 or
    /// 6 with an address of that form).
    pub fn src(&self) -> Option<core::net::IpAddr> {
        self.addr(&self.src_addr)
    }

    /// The passive side's address, likewise.
    pub fn dst(&self) -> Option<core::net::IpAddr> {
        self.addr(&self.dst_addr)
    }

    fn addr(&self, b: &[u8; 16]) -> Option<core::net::IpAddr> {
        if self.cma_version != CMA_VERSION {
            return None;
        }
        match self.ip_version {
            4 if b[..12].iter().all(|&x| x == 0) => Some(core::net::IpAddr::V4(
                core::net::Ipv4Addr::new(b[12], b[13], b[14], b[15]),
            )),
            6 => Some(core::net::IpAddr::V6(core::net::Ipv6Addr::from(*b))),
            _ => None,
        }
    }
}

fn to_bytes(a: core::net::IpAddr) -> [u8; 16] {
    match a {
        core::net::IpAddr::V4(v4) => {
            let mut b = [0u8; 16];
            b[12..].copy_from_slice(&v4.octets());
            b
        }
        core::net::IpAddr::V6(v6) => v6.octets(),
    }
}

#[cfg(test)]
mod tests {
    // The captured REQ's header: version 0, IPv4, port 46425, 10.77.0.12 -> 10.77.0.11.
    fixed_header_tests! {
        bytes: crate::cm::golden::fields("req", 176)[140..],
        repr: Repr::new(
            core::net::IpAddr::from([10, 77, 0, 12]),
            46425,
            core::net::IpAddr::from([10, 77, 0, 11]),
        ),
        arb: crate::cm::golden::arb_bytes(HEADER_LEN)
            .prop_map(|b| Repr::parse(&Packet::new_unchecked(&b[..])).unwrap()),
    }

    use super::*;

    #[test]
    fn addresses_of_both_families_and_bad_headers() {
        let v6 = core::net::IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 1]);
        let r = Repr::new(v6, 7, v6);
        assert_eq!((r.ip_version, r.src(), r.dst()), (6, Some(v6), Some(v6)));
        let mapped = Repr {
            src_addr: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1],
            ..Repr::new(v6, 7, v6)
        };
        assert_eq!(
            Repr {
                ip_version: 4,
                ..mapped
            }
            .src(),
            None,
            "IPv4 is zero-padded"
        );
        assert_eq!(
            Repr {
                cma_version: 1,
                ..r
            }
            .src(),
            None
        );
        assert_eq!(Repr { ip_version: 5, ..r }.dst(), None);
    }
}
