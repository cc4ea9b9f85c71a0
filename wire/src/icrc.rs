//! The invariant CRC of RoCEv2 (IBTA §7.8.1 and Annex A17.3.3), computed as kernel rxe does
//! (`rxe_icrc.c`).
//!
//! The ICRC is CRC-32 (the Ethernet polynomial, reflected) over
//! `8 × 0xFF ‖ IP header ‖ UDP header ‖ BTH ‖ extension headers ‖ payload ‖ pad`, with the
//! fields that routers may change forced to ones:
//!
//! * IPv4: TOS, TTL and the header checksum; IPv6: traffic class, flow label and hop limit;
//! * UDP: the checksum;
//! * BTH: byte 4 (FECN, BECN and the reserved bits).
//!
//! The result is stored inverted (as `crc32fast` finalises it) in little-endian order as the
//! last 4 bytes of the UDP payload.
//!
//! # What can be verified
//!
//! Everything the ICRC covers is known to a receiver except, over IPv4, the Identification
//! field, which a UDP socket never sees:
//!
//! * From a capture or a raw socket the whole IP header is known: [`compute_from_headers`]
//!   checks all 32 bits.
//! * IPv6 has no Identification: [`IcrcContext::verify`] checks all 32 bits.
//! * Over IPv4 from a peer known to send ID 0 (ferroce sends from unconnected sockets with DF,
//!   for which Linux uses ID 0), [`IcrcContext::verify`] with `ident: 0` checks all 32 bits.
//! * Over IPv4 from a peer with unpredictable IDs (kernel rxe), [`IcrcContext::solve_ipv4_ident`]
//!   uses the linearity of CRC-32 over GF(2): the 16 unknown ID bits map injectively into the
//!   32-bit CRC, so at most one ID matches; it is found by elimination and the other 16 bits of
//!   the CRC remain a check. A corrupted packet passes with probability 2^-16 instead of 2^-32.
//!   The don't-fragment flag is taken as set (rxe and ferroce always set it).

use core::net::{Ipv4Addr, Ipv6Addr};

use crate::{Error, Result};

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

const IPV4_HEADER_LEN: usize = 20;
const IPV6_HEADER_LEN: usize = 40;
const UDP_HEADER_LEN: usize = 8;
const UDP_PROTOCOL: u8 = 17;
/// The masked LRH that starts every ICRC computation.
const LRH_ONES: [u8; 8] = [0xFF; 8];
/// The reflected CRC-32 polynomial.
const POLY: u32 = 0xEDB8_8320;

/// The IP header fields the ICRC covers that a UDP socket receiver knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpHeaders {
    /// IPv4 (20-byte header, no options, protocol UDP).
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
        /// Identification field.
        ident: u16,
        /// DF (don't fragment) flag; rxe and ferroce always set it.
        dont_frag: bool,
    },
    /// IPv6 (40-byte header, next header UDP).
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
    },
}

/// Everything outside the UDP payload that the ICRC of one packet covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IcrcContext {
    /// The IP header.
    pub ip: IpHeaders,
    /// UDP source port (rxe: 0xC000 | hash of the QPNs; ferroce: the socket's port).
    pub src_port: u16,
    /// UDP destination port (4791).
    pub dst_port: u16,
}

impl IcrcContext {
    /// An IPv4 context with the given ID and DF set.
    pub const fn v4(
        src: Ipv4Addr,
        dst: Ipv4Addr,
        ident: u16,
        src_port: u16,
        dst_port: u16,
    ) -> Self {
        IcrcContext {
            ip: IpHeaders::V4 {
                src,
                dst,
                ident,
                dont_frag: true,
            },
            src_port,
            dst_port,
        }
    }

    /// An IPv6 context.
    pub const fn v6(src: Ipv6Addr, dst: Ipv6Addr, src_port: u16, dst_port: u16) -> Self {
        IcrcContext {
            ip: IpHeaders::V6 { src, dst },
            src_port,
            dst_port,
        }
    }

    /// The ICRC of a packet whose UDP payload is `covered ‖ ICRC` (`covered` is everything from
    /// the BTH up to and including the pad).
    ///
    /// # Errors
    /// [`Error::BadLength`] if the packet would not fit one IP datagram (its UDP or IPv4 total
    /// length would not fit 16 bits).
    #[inline]
    pub fn compute(&self, covered: &[u8]) -> Result<u32> {
        self.compute_then(covered, &[])
    }

    /// The ICRC kernel rxe (Linux 6.2 and later, 6.12 checked) gives an RC FLUSH: its opcode
    /// table names no payload offset for RC_FLUSH, so after the IBTA ICRC's pass over the
    /// headers the CRC goes on over `covered` (BTH, FETH, RETH) a second time, as it is. rxe
    /// sends FLUSHes so and drops those whose ICRC is not so.
    ///
    /// # Errors
    /// As [`IcrcContext::compute`].
    #[inline]
    pub fn compute_rxe_flush(&self, covered: &[u8]) -> Result<u32> {
        self.compute_then(covered, covered)
    }

    /// The CRC over the masked headers and `covered`, continued over `tail` (empty for the
    /// IBTA's ICRC, `covered` again for rxe's FLUSH form).
    #[inline]
    fn compute_then(&self, covered: &[u8], tail: &[u8]) -> Result<u32> {
        let udp_len = UDP_HEADER_LEN + covered.len() + ICRC_LEN;
        let len16 = |n: usize| u16::try_from(n).map_err(|_| Error::BadLength);
        let udp = masked_udp(self.src_port, self.dst_port, len16(udp_len)?);
        match self.ip {
            IpHeaders::V4 {
                src,
                dst,
                ident,
                dont_frag,
            } => {
                let ip = masked_ipv4(
                    src,
                    dst,
                    ident,
                    dont_frag,
                    len16(IPV4_HEADER_LEN + udp_len)?,
                );
                Ok(crc_then(&ip, &udp, covered, tail))
            }
            IpHeaders::V6 { src, dst } => {
                let ip = masked_ipv6(src, dst, len16(udp_len)?);
                Ok(crc_then(&ip, &udp, covered, tail))
            }
        }
    }

    /// As [`IcrcContext::fill`] with rxe's FLUSH form ([`IcrcContext::compute_rxe_flush`]).
    pub fn fill_rxe_flush(&self, udp_payload: &mut [u8]) {
        if let Some(split) = udp_payload.len().checked_sub(ICRC_LEN) {
            if let Ok(icrc) = self.compute_rxe_flush(&udp_payload[..split]) {
                udp_payload[split..].copy_from_slice(&icrc.to_le_bytes());
            }
        }
    }

    /// As [`IcrcContext::verify`] with rxe's FLUSH form.
    pub fn verify_rxe_flush(&self, udp_payload: &[u8]) -> bool {
        match split_icrc(udp_payload) {
            Some((covered, got)) => self.compute_rxe_flush(covered) == Ok(got),
            None => false,
        }
    }

    /// Computes the ICRC over `udp_payload` minus its last 4 bytes and writes it there.
    /// A payload shorter than 4 bytes, or too long for one IP datagram, is left alone.
    pub fn fill(&self, udp_payload: &mut [u8]) {
        if let Some(split) = udp_payload.len().checked_sub(ICRC_LEN) {
            if let Ok(icrc) = self.compute(&udp_payload[..split]) {
                udp_payload[split..].copy_from_slice(&icrc.to_le_bytes());
            }
        }
    }

    /// Checks the ICRC at the end of a whole UDP payload, all 32 bits.
    pub fn verify(&self, udp_payload: &[u8]) -> bool {
        match split_icrc(udp_payload) {
            Some((covered, got)) => self.compute(covered) == Ok(got),
            None => false,
        }
    }

    /// For an IPv4 packet whose Identification is unknown: the one ID (if any) for which the
    /// ICRC at the end of `udp_payload` is right. The context's own `ident` is ignored; IPv6
    /// contexts are checked fully and give `Some(0)` when right.
    ///
    /// A `Some` verifies the other 16 bits of the CRC; see the module docs.
    pub fn solve_ipv4_ident(&self, udp_payload: &[u8]) -> Option<u16> {
        let (covered, got) = split_icrc(udp_payload)?;
        let IpHeaders::V4 {
            src,
            dst,
            dont_frag,
            ..
        } = self.ip
        else {
            return self.verify(udp_payload).then_some(0);
        };
        let zero_id = IcrcContext {
            ip: IpHeaders::V4 {
                src,
                dst,
                ident: 0,
                dont_frag,
            },
            ..*self
        };
        let target = zero_id.compute(covered).ok()? ^ got;
        Ipv4IdentDelta::new(udp_payload.len())?.solve(target)
    }
}

/// How the ICRC of an IPv4 packet changes with its Identification, for one packet length.
///
/// CRC-32 is linear over GF(2): the ICRC of a packet sent with IPv4 ID `k` is its ICRC for ID 0
/// XOR a value that depends only on `k` and the packet's length. A sender whose datagrams the
/// kernel numbers itself (segment `k` of a `UDP_SEGMENT` train leaves an unconnected DF socket
/// with ID `k`) computes each packet's ICRC once, for ID 0, and corrects it with
/// [`Ipv4IdentDelta::delta`]; a receiver that knows a segment's ID does the same. No CRC over the
/// payload is recomputed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4IdentDelta {
    /// The CRC change of each ID bit, in the order bit 7..0 then 15..8.
    columns: [u32; 16],
}

impl Ipv4IdentDelta {
    /// The deltas for packets whose UDP payload (BTH through ICRC) is `udp_payload_len` bytes;
    /// `None` if that is shorter than the ICRC.
    pub fn new(udp_payload_len: usize) -> Option<Self> {
        let covered = udp_payload_len.checked_sub(ICRC_LEN)?;
        let msg_len = LRH_ONES.len() + IPV4_HEADER_LEN + UDP_HEADER_LEN + covered;
        // The message is LRH(8) ‖ IPv4(20) ‖ UDP(8) ‖ covered; the ID is the big-endian u16 at
        // byte 12. The CRC change of one ID bit is its term times x^(8 · bytes after it); the
        // lowest-degree term is bit 7 of its second byte.
        let mut column = mul_mod_p(x_pow_8n(msg_len - (LRH_ONES.len() + 4) - 2), POLY);
        let mut columns = [0u32; 16];
        for c in &mut columns {
            *c = column;
            column = mul_x(column);
        }
        Some(Ipv4IdentDelta { columns })
    }

    /// The value to XOR into the ICRC computed for ID 0 to get the ICRC for ID `ident`.
    pub fn delta(&self, ident: u16) -> u32 {
        const BITS: [u32; 16] = [7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8];
        let mut d = 0;
        for (c, bit) in self.columns.iter().zip(BITS) {
            if ident & (1 << bit) != 0 {
                d ^= c;
            }
        }
        d
    }

    /// The ID whose [`Ipv4IdentDelta::delta`] is `delta`, if one is (at most one is: the 16
    /// columns are independent). With `delta` = the ICRC computed for ID 0 XOR the ICRC a
    /// packet carries, this is the ID it was sent with, if its other bits are right.
    pub fn solve(&self, delta: u32) -> Option<u16> {
        const BITS: [u32; 16] = [7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8];
        // Gaussian elimination over GF(2): basis[b] has highest set bit b; `.1` records which
        // ID bits combine into it.
        let mut basis = [(0u32, 0u16); 32];
        for (&c, bit) in self.columns.iter().zip(BITS) {
            let (mut v, mut combo) = (c, 1u16 << bit);
            while v != 0 {
                let top = 31 - v.leading_zeros() as usize;
                if basis[top].0 == 0 {
                    basis[top] = (v, combo);
                    break;
                }
                v ^= basis[top].0;
                combo ^= basis[top].1;
            }
        }
        let (mut t, mut value) = (delta, 0u16);
        while t != 0 {
            let top = 31 - t.leading_zeros() as usize;
            if basis[top].0 == 0 {
                return None;
            }
            t ^= basis[top].0;
            value ^= basis[top].1;
        }
        Some(value)
    }

    /// Rewrites the ICRC at the end of `udp_payload` (computed for `from`) for ID `to`.
    /// A payload shorter than the ICRC is left alone.
    pub fn rewrite(&self, udp_payload: &mut [u8], from: u16, to: u16) {
        let Some(split) = udp_payload.len().checked_sub(ICRC_LEN) else {
            return;
        };
        let tail = &mut udp_payload[split..];
        let mut b = [0u8; ICRC_LEN];
        b.copy_from_slice(tail);
        let icrc = u32::from_le_bytes(b) ^ self.delta(from) ^ self.delta(to);
        tail.copy_from_slice(&icrc.to_le_bytes());
    }
}

/// The ICRC of a captured packet, from its raw IP header (IPv4 without options, or IPv6
/// without extension headers), its UDP header and `covered` (BTH up to the pad). All 32 bits
/// of the result are meaningful: the whole IP header is known.
///
/// # Errors
/// [`Error::BadIpHeader`] for an IP version other than 4 or 6, IPv4 options, or a header of the
/// wrong length; [`Error::Truncated`] for a UDP header shorter than 8 bytes.
pub fn compute_from_headers(ip_header: &[u8], udp_header: &[u8], covered: &[u8]) -> Result<u32> {
    compute_from_headers_then(ip_header, udp_header, covered, &[])
}

/// As [`compute_from_headers`] in kernel rxe's FLUSH form
/// ([`IcrcContext::compute_rxe_flush`]): the CRC goes on over `covered` once more.
///
/// # Errors
/// As [`compute_from_headers`].
pub fn compute_from_headers_rxe_flush(
    ip_header: &[u8],
    udp_header: &[u8],
    covered: &[u8],
) -> Result<u32> {
    compute_from_headers_then(ip_header, udp_header, covered, covered)
}

fn compute_from_headers_then(
    ip_header: &[u8],
    udp_header: &[u8],
    covered: &[u8],
    tail: &[u8],
) -> Result<u32> {
    if udp_header.len() < UDP_HEADER_LEN {
        return Err(Error::Truncated);
    }
    let mut udp = [0u8; UDP_HEADER_LEN];
    udp.copy_from_slice(&udp_header[..UDP_HEADER_LEN]);
    udp[6] = 0xFF;
    udp[7] = 0xFF;
    match ip_header.first().map(|b| b >> 4) {
        Some(4) if ip_header.len() == IPV4_HEADER_LEN && ip_header[0] & 0x0F == 5 => {
            let mut ip = [0u8; IPV4_HEADER_LEN];
            ip.copy_from_slice(ip_header);
            ip[1] = 0xFF; // TOS
            ip[8] = 0xFF; // TTL
            ip[10] = 0xFF; // header checksum
            ip[11] = 0xFF;
            Ok(crc_then(&ip, &udp, covered, tail))
        }
        Some(6) if ip_header.len() == IPV6_HEADER_LEN => {
            let mut ip = [0u8; IPV6_HEADER_LEN];
            ip.copy_from_slice(ip_header);
            mask_ipv6(&mut ip);
            Ok(crc_then(&ip, &udp, covered, tail))
        }
        _ => Err(Error::BadIpHeader),
    }
}

/// Splits a UDP payload into the bytes the ICRC covers and the ICRC it carries.
pub fn split_icrc(udp_payload: &[u8]) -> Option<(&[u8], u32)> {
    let split = udp_payload.len().checked_sub(ICRC_LEN)?;
    let (covered, tail) = udp_payload.split_at(split);
    let mut b = [0u8; ICRC_LEN];
    b.copy_from_slice(tail);
    Some((covered, u32::from_le_bytes(b)))
}

/// The masked headers' bytes before a packet's own: the LRH, the larger IP header, UDP, and the
/// BTH's first 5 bytes.
const HEAD_MAX: usize = LRH_ONES.len() + IPV6_HEADER_LEN + UDP_HEADER_LEN + 5;
/// The most bytes of the packet after the BTH's fifth copied beside the headers: a packet up
/// to this long is one CRC update (crc32fast takes pieces under 64 bytes a few bytes at a time).
const HEAD_SPILL: usize = 64;
/// The block crc32fast's widest folding loop takes (16 lanes of 16 bytes with AVX-512, 8 of 32
/// with AVX2; its SSE loop takes 64): a long packet's bulk is handed over as a whole number of
/// them, and what is left over goes beside the headers, where it would otherwise be folded 16
/// bytes at a time after the bulk. A 4 KiB MIDDLE packet's ICRC: 89 ns instead of 123 on this
/// machine kind (72 with the bulk's CRC taken first: [`bulk_first`]).
const FOLD_BLOCK: usize = 256;
/// The SSE loop's block, for a leftover too long to go beside the headers.
const FOLD_BLOCK_SSE: usize = 64;

/// How many bytes of `rest` (the packet after the BTH's fifth) go beside the headers: all of a
/// short packet; of a long one, what leaves the rest a whole number of folding blocks.
fn spill_len(rest: usize) -> usize {
    if rest <= HEAD_SPILL {
        rest
    } else if rest % FOLD_BLOCK <= HEAD_SPILL {
        rest % FOLD_BLOCK
    } else {
        rest % FOLD_BLOCK_SSE
    }
}

/// The CRC over the masked headers and `covered` (the BTH's byte 4 masked), continued over
/// `tail`, taken as it is (rxe's FLUSH form; empty for the IBTA's ICRC).
///
/// The masked headers and the start of the packet are gathered into one buffer on the stack:
/// one CRC update over them (and over the whole packet when it is small), where updating
/// piece by piece took 50 ns for an 8-byte WRITE's packet.
fn crc_then(
    ip_masked: &[u8],
    udp_masked: &[u8; UDP_HEADER_LEN],
    covered: &[u8],
    tail: &[u8],
) -> u32 {
    let mut buf = [0u8; HEAD_MAX + HEAD_SPILL];
    let mut n = 0;
    for piece in [&LRH_ONES[..], ip_masked, &udp_masked[..]] {
        buf[n..n + piece.len()].copy_from_slice(piece);
        n += piece.len();
    }
    // BTH byte 4 (FECN, BECN, resv6) counts as all ones.
    let rest = match covered.split_at_checked(5) {
        Some((head, rest)) => {
            buf[n..n + 4].copy_from_slice(&head[..4]);
            buf[n + 4] = 0xFF;
            n += 5;
            rest
        }
        None => {
            buf[n..n + covered.len()].copy_from_slice(covered);
            n += covered.len();
            &[]
        }
    };
    let (near, far) = rest.split_at(spill_len(rest.len()));
    buf[n..n + near.len()].copy_from_slice(near);
    n += near.len();
    if tail.is_empty() && !far.is_empty() && far.len() % SHIFT_BLOCK == 0 {
        return bulk_first(&buf[..n], far);
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&buf[..n]);
    h.update(far);
    h.update(tail);
    h.finalize()
}

/// The bulk whose CRC is taken first when it is a whole number of these (a 1, 2 or 4 KiB MTU
/// packet's payload): [`SHIFT_1K`] carries the head's register across it.
const SHIFT_BLOCK: usize = 1024;

/// The CRC of `head ‖ far`, the bulk's taken first (from a zero register) and the head's after
/// it, then joined: the head's register times x^(8·|far|) xor the bulk's. `head` was written to
/// the stack just before; vector loads of bytes just stored in narrower pieces wait for those
/// stores to reach the cache (about 22 ns for a 4 KiB packet's ICRC on this machine kind), and
/// with the bulk first they have long reached it.
fn bulk_first(head: &[u8], far: &[u8]) -> u32 {
    // crc32fast's state is the complement of the CRC register: `!0` starts from a zero register.
    let mut bulk = crc32fast::Hasher::new_with_initial(!0);
    bulk.update(far);
    let far_register = !bulk.finalize();
    let mut h = crc32fast::Hasher::new();
    h.update(head);
    let mut register = !h.finalize();
    for _ in 0..far.len() / SHIFT_BLOCK {
        register = shift_1k(register);
    }
    !(register ^ far_register)
}

/// `register` times x^(8·1024) modulo the polynomial: the register after 1024 zero bytes, as
/// four table lookups, one for each byte of the register (the product is linear in it).
fn shift_1k(register: u32) -> u32 {
    let b = register.to_le_bytes();
    SHIFT_1K[0][usize::from(b[0])]
        ^ SHIFT_1K[1][usize::from(b[1])]
        ^ SHIFT_1K[2][usize::from(b[2])]
        ^ SHIFT_1K[3][usize::from(b[3])]
}

/// `SHIFT_1K[j][v]` = x^(8·1024) times the register whose byte `j` is `v` (the others zero).
static SHIFT_1K: [[u32; 256]; 4] = {
    let k = x_pow_8n(SHIFT_BLOCK);
    let mut t = [[0u32; 256]; 4];
    let mut j = 0;
    while j < 4 {
        let mut v = 0;
        while v < 256 {
            t[j][v] = mul_mod_p(k, (v as u32) << (8 * j));
            v += 1;
        }
        j += 1;
    }
    t
};

fn masked_udp(src_port: u16, dst_port: u16, len: u16) -> [u8; UDP_HEADER_LEN] {
    let s = src_port.to_be_bytes();
    let d = dst_port.to_be_bytes();
    let l = len.to_be_bytes();
    [s[0], s[1], d[0], d[1], l[0], l[1], 0xFF, 0xFF]
}

fn masked_ipv4(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ident: u16,
    df: bool,
    tot_len: u16,
) -> [u8; IPV4_HEADER_LEN] {
    let mut ip = [0u8; IPV4_HEADER_LEN];
    ip[0] = 0x45;
    ip[1] = 0xFF; // TOS
    ip[2..4].copy_from_slice(&tot_len.to_be_bytes());
    ip[4..6].copy_from_slice(&ident.to_be_bytes());
    ip[6] = if df { 0x40 } else { 0 };
    ip[8] = 0xFF; // TTL
    ip[9] = UDP_PROTOCOL;
    ip[10] = 0xFF; // checksum
    ip[11] = 0xFF;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    ip
}

fn masked_ipv6(src: Ipv6Addr, dst: Ipv6Addr, payload_len: u16) -> [u8; IPV6_HEADER_LEN] {
    let mut ip = [0u8; IPV6_HEADER_LEN];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&payload_len.to_be_bytes());
    ip[6] = UDP_PROTOCOL;
    ip[8..24].copy_from_slice(&src.octets());
    ip[24..40].copy_from_slice(&dst.octets());
    mask_ipv6(&mut ip);
    ip
}

fn mask_ipv6(ip: &mut [u8; IPV6_HEADER_LEN]) {
    ip[0] |= 0x0F; // traffic class, high nibble
    ip[1] = 0xFF; // traffic class low nibble and flow label
    ip[2] = 0xFF;
    ip[3] = 0xFF;
    ip[7] = 0xFF; // hop limit
}

/// Multiplies two polynomials modulo the CRC-32 polynomial, in the reflected representation
/// (bit 31 is x^0).
const fn mul_mod_p(a: u32, mut b: u32) -> u32 {
    let mut p = 0;
    let mut i = 0;
    while i < 32 {
        if a & (0x8000_0000 >> i) != 0 {
            p ^= b;
        }
        b = mul_x(b);
        i += 1;
    }
    p
}

/// `X8_POW2[k]` = x^(8·2^k) modulo the polynomial, for k < 64.
const X8_POW2: [u32; 64] = {
    let mut t = [0u32; 64];
    t[0] = 0x0080_0000; // x^8
    let mut k = 1;
    while k < 64 {
        t[k] = mul_mod_p(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
};

/// x^(8·n) modulo the CRC-32 polynomial: the effect on the CRC register of `n` more zero bytes.
const fn x_pow_8n(mut n: usize) -> u32 {
    let mut result = 0x8000_0000; // x^0
    let mut k = 0;
    while n != 0 {
        if n & 1 != 0 {
            result = mul_mod_p(X8_POW2[k], result);
        }
        n >>= 1;
        k += 1;
    }
    result
}

/// The CRC register after one byte `v` from a zero register.
#[cfg(test)]
fn byte_register(v: u8) -> u32 {
    let mut s = u32::from(v);
    for _ in 0..8 {
        s = if s & 1 != 0 { (s >> 1) ^ POLY } else { s >> 1 };
    }
    s
}

/// Multiplies a reflected polynomial by x modulo the CRC-32 polynomial.
const fn mul_x(b: u32) -> u32 {
    if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A complete RC SEND_ONLY from rxe (rc_pingpong_small capture, frame 1 of its RoCE
    /// traffic): IPv4 header, UDP header and UDP payload.
    fn rxe_send_only() -> ([u8; 20], [u8; 8], [u8; 80]) {
        let ip = hex20("4500006c8f6240004011966e0a4d000c0a4d000b");
        let udp = [0xc1, 0x69, 0x12, 0xb7, 0x00, 0x58, 0x00, 0x00];
        let mut roce = [0x7bu8; 80];
        roce[..12].copy_from_slice(&[
            0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x13, 0x80, 0x4e, 0x8e, 0xf5,
        ]);
        (ip, udp, roce)
    }

    /// An RC FLUSH rxe sent (Linux 6.12.117, the interop lab of 2026-12-03; range, global
    /// visibility, 4096 bytes): its ICRC is rxe's FLUSH form, not the IBTA one.
    #[test]
    fn rxe_flush_icrc_covers_the_headers_twice() {
        let flush: [u8; 36] = [
            0x1c, 0x00, 0xff, 0xff, 0x00, 0x01, 0x00, 0x13, 0x80, 0xb8, 0x5b, 0xf1, // BTH
            0x00, 0x00, 0x00, 0x01, // FETH
            0x00, 0x00, 0x7f, 0xf9, 0xb9, 0x0f, 0xa0, 0x00, 0xe9, 0x7b, 0x65, 0xd2, 0x00, 0x00,
            0x10, 0x00, // RETH
            0x7a, 0xe3, 0x04, 0x0a, // ICRC
        ];
        let ctx = IcrcContext::v4(
            Ipv4Addr::new(10, 77, 0, 11),
            Ipv4Addr::new(10, 77, 0, 1),
            0xcb49,
            0xc164,
            4791,
        );
        assert!(ctx.verify_rxe_flush(&flush));
        assert!(!ctx.verify(&flush));
        let mut again = flush;
        again[32..].fill(0);
        ctx.fill_rxe_flush(&mut again);
        assert_eq!(again, flush);
        ctx.fill(&mut again);
        assert!(ctx.verify(&again) && !ctx.verify_rxe_flush(&again));
    }

    fn hex20(s: &str) -> [u8; 20] {
        let mut out = [0u8; 20];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
        }
        out
    }

    /// The table's product is the register after 1024 zero bytes, as crc32fast computes it.
    #[test]
    fn shift_1k_is_1024_zero_bytes() {
        let zeros = [0u8; SHIFT_BLOCK];
        for register in [
            0,
            1,
            0x8000_0000,
            0xFFFF_FFFF,
            0x1234_5678,
            0xDEAD_BEEF,
            0x0F0F_00FF,
        ] {
            let mut h = crc32fast::Hasher::new_with_initial(!register);
            h.update(&zeros);
            assert_eq!(shift_1k(register), !h.finalize(), "{register:#x}");
        }
    }

    /// The headers and the packet's head gathered beside them, then the rest in whole
    /// folding blocks: the same CRC as one update over the masked bytes in order, at every
    /// length that takes each branch of `spill_len` (short, leftover beside the headers,
    /// leftover cut to the SSE block) and at MTU-sized packets, whose bulk's CRC is taken
    /// first (`bulk_first`).
    #[test]
    fn gathered_crc_equals_one_pass_over_the_masked_bytes() {
        let ip = masked_ipv4(
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            7,
            true,
            0,
        );
        let udp = masked_udp(49152, 4791, 0);
        let packet: Vec<u8> = (0..9000u32).map(|i| (i * 31 + 7) as u8).collect();
        let lens = (0..=700)
            .chain(1020..1045)
            .chain(4090..4140)
            .chain([8200, 8999]);
        let mut spills = [false; 3];
        let mut bulk_first_taken = 0;
        for len in lens {
            let covered = &packet[..len];
            let mut whole = Vec::new();
            whole.extend_from_slice(&LRH_ONES);
            whole.extend_from_slice(&ip);
            whole.extend_from_slice(&udp);
            whole.extend_from_slice(covered);
            if len > 4 {
                whole[LRH_ONES.len() + ip.len() + udp.len() + 4] = 0xFF;
            }
            assert_eq!(
                crc_then(&ip, &udp, covered, &[]),
                crc32fast::hash(&whole),
                "length {len}"
            );
            let rest = len.saturating_sub(5);
            let spill = spill_len(rest);
            assert!(spill <= HEAD_SPILL);
            let far = rest - spill;
            spills[0] |= far == 0;
            spills[1] |= far > 0 && far % FOLD_BLOCK == 0;
            spills[2] |= far % FOLD_BLOCK != 0 && far % FOLD_BLOCK_SSE == 0;
            assert_eq!(far % FOLD_BLOCK_SSE, 0, "length {len}");
            if far > 0 && far % SHIFT_BLOCK == 0 {
                bulk_first_taken += 1;
            }
        }
        assert_eq!(spills, [true; 3]);
        assert!(bulk_first_taken > 20, "{bulk_first_taken}");
        // A 4 KiB MIDDLE packet's bulk is a whole number of wide blocks.
        assert_eq!((12 + 4096 - 5 - spill_len(12 + 4096 - 5)) % FOLD_BLOCK, 0);
    }

    #[test]
    fn raw_and_synthetic_headers_agree() {
        let (ip, udp, roce) = rxe_send_only();
        let covered = &roce[..76];
        let raw = compute_from_headers(&ip, &udp, covered).unwrap();
        let ctx = IcrcContext::v4(
            Ipv4Addr::new(10, 77, 0, 12),
            Ipv4Addr::new(10, 77, 0, 11),
            0x8f62,
            0xc169,
            4791,
        );
        assert_eq!(ctx.compute(covered), Ok(raw));
        // Masked fields do not matter: another TTL, TOS and checksum give the same CRC.
        let mut ip2 = ip;
        ip2[1] = 0x02;
        ip2[8] = 1;
        ip2[10] = 0;
        let mut udp2 = udp;
        udp2[6] = 0x12;
        let mut cov2 = [0u8; 76];
        cov2.copy_from_slice(covered);
        cov2[4] = 0x80; // FECN
        assert_eq!(compute_from_headers(&ip2, &udp2, &cov2).unwrap(), raw);
        // Covered fields do: the ID and a payload bit.
        ip2[5] ^= 1;
        assert_ne!(compute_from_headers(&ip2, &udp2, &cov2).unwrap(), raw);
    }

    #[test]
    fn ident_delta_gives_the_icrc_of_every_id() {
        let (_, _, mut roce) = rxe_send_only();
        let ctx = |ident| {
            IcrcContext::v4(
                Ipv4Addr::new(10, 77, 0, 12),
                Ipv4Addr::new(10, 77, 0, 11),
                ident,
                0xc169,
                4791,
            )
        };
        let d = Ipv4IdentDelta::new(roce.len()).unwrap();
        assert_eq!(d.delta(0), 0);
        let zero = ctx(0).compute(&roce[..76]).unwrap();
        for ident in [1u16, 2, 7, 14, 127, 0x8f62, 0xffff] {
            assert_eq!(
                zero ^ d.delta(ident),
                ctx(ident).compute(&roce[..76]).unwrap()
            );
        }
        ctx(0).fill(&mut roce);
        d.rewrite(&mut roce, 0, 9);
        assert!(ctx(9).verify(&roce));
        assert!(!ctx(0).verify(&roce));
        d.rewrite(&mut roce, 9, 3);
        assert!(ctx(3).verify(&roce));
        assert!(Ipv4IdentDelta::new(3).is_none());
        for ident in [0u16, 1, 0x8f62, 0xffff] {
            assert_eq!(d.solve(d.delta(ident)), Some(ident));
        }
    }

    #[test]
    fn solve_finds_the_wire_ident() {
        let (ip, udp, mut roce) = rxe_send_only();
        let icrc = compute_from_headers(&ip, &udp, &roce[..76]).unwrap();
        roce[76..].copy_from_slice(&icrc.to_le_bytes());
        let ctx = IcrcContext::v4(
            Ipv4Addr::new(10, 77, 0, 12),
            Ipv4Addr::new(10, 77, 0, 11),
            0,
            0xc169,
            4791,
        );
        assert!(!ctx.verify(&roce));
        assert_eq!(ctx.solve_ipv4_ident(&roce), Some(0x8f62));
        // A flipped payload bit is caught (this one has no matching ID).
        roce[40] ^= 0x10;
        let solved = ctx.solve_ipv4_ident(&roce);
        assert_ne!(solved, Some(0x8f62));
    }

    #[test]
    fn ipv6_masks_traffic_class_flow_label_and_hop_limit() {
        let src: Ipv6Addr = "fd00::1".parse().unwrap();
        let dst: Ipv6Addr = "fd00::2".parse().unwrap();
        let ctx = IcrcContext::v6(src, dst, 0xc000, 4791);
        let mut payload = [0u8; 32];
        payload[0] = 0x04;
        payload[7] = 0x11;
        ctx.fill(&mut payload);
        assert!(ctx.verify(&payload));
        // The same packet as a raw header with TC, flow label and hop limit set.
        let mut ip = [0u8; 40];
        ip[0] = 0x6A;
        ip[1] = 0xB1;
        ip[2] = 0x23;
        ip[3] = 0x45;
        ip[4..6].copy_from_slice(&40u16.to_be_bytes());
        ip[6] = 17;
        ip[7] = 64;
        ip[8..24].copy_from_slice(&src.octets());
        ip[24..40].copy_from_slice(&dst.octets());
        let udp = [0xc0, 0x00, 0x12, 0xb7, 0x00, 40, 0x12, 0x34];
        let (covered, got) = split_icrc(&payload).unwrap();
        assert_eq!(compute_from_headers(&ip, &udp, covered), Ok(got));
        assert_eq!(ctx.solve_ipv4_ident(&payload), Some(0));
    }

    #[test]
    fn bad_headers() {
        let (ip, udp, roce) = rxe_send_only();
        let mut opt = ip;
        opt[0] = 0x46;
        assert_eq!(
            compute_from_headers(&opt, &udp, &roce),
            Err(Error::BadIpHeader)
        );
        assert_eq!(
            compute_from_headers(&ip[..19], &udp, &roce),
            Err(Error::BadIpHeader)
        );
        assert_eq!(
            compute_from_headers(&ip, &udp[..7], &roce),
            Err(Error::Truncated)
        );
        let ctx = IcrcContext::v4(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, 0, 1, 2);
        assert!(!ctx.verify(&[1, 2, 3]));
        assert_eq!(ctx.solve_ipv4_ident(&[1, 2, 3]), None);
        let mut short = [1u8, 2];
        ctx.fill(&mut short);
        assert_eq!(short, [1, 2]);
    }

    #[test]
    fn polynomial_helpers() {
        // x^8 · 1 is what one zero byte does to a register.
        assert_eq!(x_pow_8n(0), 0x8000_0000);
        let r = byte_register(0x5a);
        assert_eq!(mul_mod_p(x_pow_8n(1), r), (r >> 8) ^ byte_register(r as u8));
        assert_eq!(byte_register(0x80), POLY);
        assert_eq!(mul_x(byte_register(0x02)), byte_register(0x01));
    }

    proptest! {
        #[test]
        fn solve_recovers_any_ident(
            ident in any::<u16>(),
            body in proptest::collection::vec(any::<u8>(), 12..600),
            sport in any::<u16>(),
            a in any::<[u8; 4]>(),
            b in any::<[u8; 4]>(),
        ) {
            let mut pkt = body.clone();
            pkt.extend_from_slice(&[0; 4]);
            let ctx = IcrcContext::v4(a.into(), b.into(), ident, sport, 4791);
            ctx.fill(&mut pkt);
            prop_assert!(ctx.verify(&pkt));
            let unknown = IcrcContext::v4(a.into(), b.into(), 0, sport, 4791);
            prop_assert_eq!(unknown.solve_ipv4_ident(&pkt), Some(ident));
        }

        #[test]
        fn ident_delta_matches_a_full_computation(
            ident in any::<u16>(),
            body in proptest::collection::vec(any::<u8>(), 12..5000),
            a in any::<[u8; 4]>(),
        ) {
            let mut pkt = body.clone();
            pkt.extend_from_slice(&[0; 4]);
            let at = |id| IcrcContext::v4(a.into(), Ipv4Addr::new(10, 0, 0, 2), id, 4791, 4791);
            at(0).fill(&mut pkt);
            let d = Ipv4IdentDelta::new(pkt.len()).unwrap();
            d.rewrite(&mut pkt, 0, ident);
            prop_assert!(at(ident).verify(&pkt));
            prop_assert_eq!(d.solve(d.delta(ident)), Some(ident));
        }

        #[test]
        fn any_single_bit_flip_fails_full_verification(
            body in proptest::collection::vec(any::<u8>(), 16..300),
            bit in any::<proptest::sample::Index>(),
        ) {
            let ctx = IcrcContext::v4(Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2), 0, 4791, 4791);
            let mut pkt = body.clone();
            pkt.extend_from_slice(&[0; 4]);
            ctx.fill(&mut pkt);
            let i = bit.index(pkt.len() * 8);
            // Byte 4 of the BTH is masked out of the ICRC by design.
            prop_assume!(i / 8 != 4);
            pkt[i / 8] ^= 1 << (i % 8);
            prop_assert!(!ctx.verify(&pkt));
        }
    }

    /// A payload too long for one datagram is an error, not a truncated length field.
    #[test]
    fn oversized_payloads_are_refused() {
        let ctx = IcrcContext::v6(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST, 4791, 4791);
        let big = [0u8; 70_000];
        assert_eq!(ctx.compute(&big), Err(Error::BadLength));
        assert!(!ctx.verify(&big));
        let v4 = IcrcContext::v4(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, 0, 4791, 4791);
        // Fits UDP's 16 bits but not IPv4's total length.
        let near = [0u8; 65_510];
        assert_eq!(v4.compute(&near), Err(Error::BadLength));
        assert!(v4.compute(&near[..1000]).is_ok());
    }
}
