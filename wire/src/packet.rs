//! A whole RoCEv2 UDP payload: `BTH ‖ extension headers ‖ payload ‖ pad ‖ ICRC`
//! (IBTA §9.2 and Annex A17.4).
//!
//! Parsing is driven by the opcode table: the opcode says which extension headers follow, in
//! which order, and whether payload may follow them.

use crate::icrc::ICRC_LEN;
use crate::opcode::HeaderSet;
use crate::{
    AethPacket, AethRepr, AtomicAckEthPacket, AtomicAckEthRepr, AtomicEthPacket, AtomicEthRepr,
    BthPacket, BthRepr, CnpPacket, CnpRepr, DethPacket, DethRepr, Error, FethPacket, FethRepr,
    IethPacket, IethRepr, ImmDtPacket, ImmDtRepr, Result, RethPacket, RethRepr, XrcEthPacket,
    XrcEthRepr, bth,
};

/// A view of a whole RoCEv2 UDP payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it (for emitting into a sized buffer).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps an untrusted UDP payload, checking that the BTH, the extension headers its opcode
    /// calls for, the pad and the ICRC all fit.
    ///
    /// # Errors
    /// [`Error::Truncated`], [`Error::BadLength`], [`Error::BadVersion`] or
    /// [`Error::UnknownOpcode`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the structure of the packet; after it succeeds no accessor panics.
    ///
    /// # Errors
    /// As [`Packet::new_checked`].
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < bth::HEADER_LEN + ICRC_LEN {
            return Err(Error::Truncated);
        }
        let bth = self.bth();
        if bth.tver() != 0 {
            return Err(Error::BadVersion);
        }
        let info = bth
            .opcode()
            .info()
            .ok_or(Error::UnknownOpcode(bth.opcode().0))?;
        let hdrs = bth::HEADER_LEN + info.headers.len();
        if len < hdrs + ICRC_LEN {
            return Err(Error::Truncated);
        }
        let pad = usize::from(bth.pad_count());
        let Some(payload_len) = (len - hdrs - ICRC_LEN).checked_sub(pad) else {
            return Err(Error::BadLength);
        };
        let payload_ok = match info.operation {
            crate::Operation::AtomicWrite => payload_len == 8,
            _ => info.has_payload || payload_len == 0,
        };
        if !payload_ok {
            return Err(Error::BadLength);
        }
        Ok(())
    }

    /// Returns the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The BTH.
    pub fn bth(&self) -> BthPacket<&[u8]> {
        BthPacket::new_unchecked(self.buffer.as_ref())
    }

    /// The length of the BTH and the extension headers of this packet's opcode.
    pub fn header_len(&self) -> usize {
        bth::HEADER_LEN + self.bth().opcode().info().map_or(0, |i| i.headers.len())
    }

    /// The ICRC carried in the last 4 bytes (as the little-endian integer rxe compares).
    pub fn icrc(&self) -> u32 {
        let b = self.buffer.as_ref();
        let mut a = [0u8; ICRC_LEN];
        a.copy_from_slice(&b[b.len() - ICRC_LEN..]);
        u32::from_le_bytes(a)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The payload: the bytes between the extension headers and the pad.
    pub fn payload(&self) -> &'a [u8] {
        let b = self.buffer.as_ref();
        let end = b.len() - ICRC_LEN - usize::from(self.bth().pad_count());
        &b[self.header_len()..end]
    }

    /// Everything the ICRC covers that is in the UDP payload: BTH up to and including the pad.
    pub fn icrc_covered(&self) -> &'a [u8] {
        let b = self.buffer.as_ref();
        &b[..b.len() - ICRC_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Writes the ICRC into the last 4 bytes.
    pub fn set_icrc(&mut self, icrc: u32) {
        let b = self.buffer.as_mut();
        let n = b.len();
        b[n - ICRC_LEN..].copy_from_slice(&icrc.to_le_bytes());
    }

    /// The payload bytes, for filling in place after [`PacketRepr::emit_header`].
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        let pad = usize::from(self.bth().pad_count());
        let b = self.buffer.as_mut();
        let end = b.len() - ICRC_LEN - pad;
        &mut b[start..end]
    }
}

/// The extension headers of one packet. Which ones are present follows the opcode table;
/// [`PacketRepr::parse`] fills exactly those, and [`PacketRepr::emit`] writes the ones present
/// in wire order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtHeaders {
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// XRCETH (XRC requests).
    pub xrceth: Option<XrcEthRepr>,
    /// FETH (FLUSH).
    pub feth: Option<FethRepr>,
    /// RETH (WRITE FIRST/ONLY, READ request, FLUSH, ATOMIC WRITE).
    pub reth: Option<RethRepr>,
    /// AtomicETH (CMP_SWAP, FETCH_ADD).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH (ACK, READ response FIRST/LAST/ONLY, ATOMIC ACK).
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH (ATOMIC ACK).
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// ImmDt (… WITH IMMEDIATE).
    pub immdt: Option<ImmDtRepr>,
    /// IETH (SEND … WITH INVALIDATE).
    pub ieth: Option<IethRepr>,
    /// The reserved block of a CNP.
    pub cnp: Option<CnpRepr>,
}

impl ExtHeaders {
    /// The set of headers present.
    #[inline]
    pub fn present(&self) -> HeaderSet {
        let mut s = HeaderSet::NONE;
        let mut add = |on: bool, h: HeaderSet| {
            if on {
                s = s | h;
            }
        };
        add(self.deth.is_some(), HeaderSet::DETH);
        add(self.xrceth.is_some(), HeaderSet::XRCETH);
        add(self.feth.is_some(), HeaderSet::FETH);
        add(self.reth.is_some(), HeaderSet::RETH);
        add(self.atomic_eth.is_some(), HeaderSet::ATOMIC_ETH);
        add(self.aeth.is_some(), HeaderSet::AETH);
        add(self.atomic_ack_eth.is_some(), HeaderSet::ATOMIC_ACK_ETH);
        add(self.immdt.is_some(), HeaderSet::IMMDT);
        add(self.ieth.is_some(), HeaderSet::IETH);
        add(self.cnp.is_some(), HeaderSet::CNP);
        s
    }

    /// Total length of the headers present.
    #[inline]
    pub fn buffer_len(&self) -> usize {
        self.present().len()
    }

    // Inlined into `PacketRepr::parse` (instantiated in the caller's crate), so the headers
    // are parsed into the caller's `PacketRepr` rather than moved there through `Result`s.
    #[inline]
    fn parse(headers: HeaderSet, mut b: &[u8]) -> Result<ExtHeaders> {
        let mut ext = ExtHeaders::default();
        // Each step parses one header at the front of `b` and advances past it.
        macro_rules! take {
            ($flag:ident, $field:ident, $view:ident, $repr:ident, $len:expr) => {
                if headers.contains(HeaderSet::$flag) {
                    ext.$field = Some($repr::parse(&$view::new_checked(b)?)?);
                    b = &b[$len..];
                }
            };
        }
        take!(DETH, deth, DethPacket, DethRepr, crate::deth::HEADER_LEN);
        take!(
            XRCETH,
            xrceth,
            XrcEthPacket,
            XrcEthRepr,
            crate::xrceth::HEADER_LEN
        );
        take!(FETH, feth, FethPacket, FethRepr, crate::feth::HEADER_LEN);
        take!(RETH, reth, RethPacket, RethRepr, crate::reth::HEADER_LEN);
        take!(
            ATOMIC_ETH,
            atomic_eth,
            AtomicEthPacket,
            AtomicEthRepr,
            crate::atomic_eth::HEADER_LEN
        );
        take!(AETH, aeth, AethPacket, AethRepr, crate::aeth::HEADER_LEN);
        take!(
            ATOMIC_ACK_ETH,
            atomic_ack_eth,
            AtomicAckEthPacket,
            AtomicAckEthRepr,
            crate::atomic_ack_eth::HEADER_LEN
        );
        take!(
            IMMDT,
            immdt,
            ImmDtPacket,
            ImmDtRepr,
            crate::immdt::HEADER_LEN
        );
        take!(IETH, ieth, IethPacket, IethRepr, crate::ieth::HEADER_LEN);
        take!(CNP, cnp, CnpPacket, CnpRepr, crate::cnp::HEADER_LEN);
        let _ = b;
        Ok(ext)
    }

    fn emit(&self, mut b: &mut [u8]) {
        macro_rules! put {
            ($field:ident, $view:ident) => {
                if let Some(r) = &self.$field {
                    let n = r.buffer_len();
                    let (head, rest) = core::mem::take(&mut b).split_at_mut(n);
                    r.emit(&mut $view::new_unchecked(head));
                    b = rest;
                }
            };
        }
        put!(deth, DethPacket);
        put!(xrceth, XrcEthPacket);
        put!(feth, FethPacket);
        put!(reth, RethPacket);
        put!(atomic_eth, AtomicEthPacket);
        put!(aeth, AethPacket);
        put!(atomic_ack_eth, AtomicAckEthPacket);
        put!(immdt, ImmDtPacket);
        put!(ieth, IethPacket);
        put!(cnp, CnpPacket);
        let _ = b;
    }
}

/// A parsed RoCEv2 packet: BTH, extension headers and a borrowed payload. The ICRC is not part
/// of the representation: it is checked and written with [`crate::icrc`], which needs the IP and
/// UDP headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketRepr<'a> {
    /// The BTH; its `pad_count` is emitted as given (see [`PacketRepr::with_pad`]).
    pub bth: BthRepr,
    /// The extension headers; they must be those of `bth.opcode` (see [`PacketRepr::is_consistent`]).
    pub ext: ExtHeaders,
    /// The payload, without pad.
    pub payload: &'a [u8],
}

impl<'a> PacketRepr<'a> {
    /// Parses an untrusted UDP payload (BTH … ICRC). The ICRC is not checked here.
    ///
    /// # Errors
    /// As [`Packet::new_checked`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(buffer: &'a T) -> Result<PacketRepr<'a>> {
        let p = Packet::new_checked(buffer.as_ref())?;
        let bth = BthRepr::parse(&p.bth())?;
        let headers = bth.opcode.info().map_or(HeaderSet::NONE, |i| i.headers);
        let ext = ExtHeaders::parse(headers, &buffer.as_ref()[bth::HEADER_LEN..])?;
        Ok(PacketRepr {
            bth,
            ext,
            payload: p.payload(),
        })
    }

    /// The same packet with `bth.pad_count` set to align the payload to 4 bytes, as every
    /// sender must (IBTA 9.2.1.4).
    #[must_use]
    pub fn with_pad(mut self) -> PacketRepr<'a> {
        self.bth.pad_count = BthRepr::pad_for(self.payload.len());
        self
    }

    /// Whether the extension headers present are exactly those the opcode calls for.
    pub fn is_consistent(&self) -> bool {
        self.bth
            .opcode
            .info()
            .is_some_and(|i| i.headers == self.ext.present())
    }

    /// The length of the headers (BTH and extensions).
    #[inline]
    pub fn header_len(&self) -> usize {
        bth::HEADER_LEN + self.ext.buffer_len()
    }

    /// The length of the whole UDP payload: headers, payload, pad and ICRC.
    #[inline]
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len() + usize::from(self.bth.pad_count & 3) + ICRC_LEN
    }

    /// Writes the headers, zero pad and a zero ICRC into `buffer` (exactly [`buffer_len`] bytes
    /// long) and leaves the payload bytes alone, so the caller can copy payload in place
    /// (e.g. straight from a memory region).
    ///
    /// [`buffer_len`]: PacketRepr::buffer_len
    pub fn emit_header(&self, buffer: &mut [u8]) {
        let hl = self.header_len();
        let (hdr, rest) = buffer.split_at_mut(hl);
        let (bth_bytes, ext) = hdr.split_at_mut(bth::HEADER_LEN);
        self.bth.emit(&mut BthPacket::new_unchecked(bth_bytes));
        self.ext.emit(ext);
        rest[self.payload.len()..].fill(0);
    }

    /// Writes the whole packet into `buffer` (exactly [`buffer_len`] bytes long), with zero pad
    /// and a zero ICRC; fill the ICRC with [`crate::IcrcContext::fill`].
    ///
    /// [`buffer_len`]: PacketRepr::buffer_len
    pub fn emit(&self, buffer: &mut [u8]) {
        self.emit_header(buffer);
        let hl = self.header_len();
        buffer[hl..hl + self.payload.len()].copy_from_slice(self.payload);
    }

    /// The opcode's table name.
    pub fn opcode_name(&self) -> &'static str {
        self.bth.opcode.name()
    }
}

impl core::fmt::Display for PacketRepr<'_> {
    /// One line in the spirit of tshark's summary: opcode, QP, PSN, flags, extension header
    /// fields and payload length.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let b = &self.bth;
        write!(
            f,
            "{} qp={:#08x} psn={} ack_req={}",
            b.opcode,
            b.dest_qp,
            b.psn,
            u8::from(b.ack_req)
        )?;
        if b.se {
            f.write_str(" se=1")?;
        }
        if b.pkey != crate::DEFAULT_PKEY {
            write!(f, " pkey={:#06x}", b.pkey)?;
        }
        let e = &self.ext;
        if let Some(d) = e.deth {
            write!(f, " deth(qkey={:#010x} src_qp={:#08x})", d.qkey, d.src_qp)?;
        }
        if let Some(x) = e.xrceth {
            write!(f, " xrceth(srq={:#08x})", x.xrcsrq)?;
        }
        if let Some(x) = e.feth {
            write!(f, " feth({:#010x})", x.bits)?;
        }
        if let Some(r) = e.reth {
            write!(
                f,
                " reth(va={:#x} rkey={:#x} len={})",
                r.va, r.rkey, r.dma_len
            )?;
        }
        if let Some(a) = e.atomic_eth {
            write!(
                f,
                " atomic_eth(va={:#x} rkey={:#x} swap_add={:#x} compare={:#x})",
                a.va, a.rkey, a.swap_add, a.compare
            )?;
        }
        if let Some(a) = e.aeth {
            write!(
                f,
                " aeth(syndrome={:#04x} {} msn={})",
                a.syndrome,
                a.ack_type(),
                a.msn
            )?;
        }
        if let Some(a) = e.atomic_ack_eth {
            write!(f, " atomic_ack_eth(orig={:#x})", a.orig)?;
        }
        if let Some(i) = e.immdt {
            write!(f, " imm={:#010x}", i.imm)?;
        }
        if let Some(i) = e.ieth {
            write!(f, " ieth(rkey={:#x})", i.rkey)?;
        }
        write!(f, " payload={}", self.payload.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AckType, Credits, Opcode, Psn};
    use proptest::prelude::*;

    /// An rxe ATOMIC_ACK UDP payload (ib_atomic_bw capture), ICRC included.
    const ATOMIC_ACK: [u8; 28] = [
        0x12, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x17, 0x00, 0x96, 0xe0, 0xa4, 0x1f, 0x00, 0x00,
        0x01, 0xc6, 0x9e, 0xe1, 0xa5, 0x19, 0xcc, 0xe9, 0xa8, 0xe8, 0xec, 0x7e, 0xba,
    ];

    #[test]
    fn parse_atomic_ack() {
        let r = PacketRepr::parse(&ATOMIC_ACK).unwrap();
        assert_eq!(r.bth.opcode, Opcode::RC_ATOMIC_ACKNOWLEDGE);
        assert_eq!(r.bth.dest_qp, 0x17);
        assert_eq!(r.bth.psn, Psn::new(0x96e0a4));
        assert!(!r.bth.ack_req);
        let aeth = r.ext.aeth.unwrap();
        assert_eq!(aeth.ack_type(), AckType::Ack(Credits::UNLIMITED));
        assert_eq!(aeth.msn, 1);
        assert_eq!(r.ext.atomic_ack_eth.unwrap().orig, 0xc69e_e1a5_19cc_e9a8);
        assert!(r.payload.is_empty());
        assert!(r.is_consistent());
        let p = Packet::new_checked(&ATOMIC_ACK[..]).unwrap();
        assert_eq!(p.icrc(), u32::from_le_bytes([0xe8, 0xec, 0x7e, 0xba]));
        assert_eq!(p.icrc_covered().len(), 24);
    }

    /// An XRC SEND Only to SRQ 0x000102 of QP 0x11 at PSN 5, asking for an ACK, 4 bytes of
    /// payload (ICRC left zero).
    const XRC_SEND: [u8; 28] = [
        0xA4, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x05, 0x00, 0x00, 0x01,
        0x02, b'p', b'i', b'n', b'g', 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    #[test]
    fn xrc_send_has_its_xrceth_behind_the_bth() {
        let buf = &XRC_SEND[..24];
        let p = PacketRepr::parse(buf).unwrap();
        assert_eq!(p.bth.opcode, Opcode::XRC_SEND_ONLY);
        assert_eq!(p.ext.xrceth, Some(XrcEthRepr { xrcsrq: 0x102 }));
        assert_eq!(p.payload, b"ping");
        assert!(p.is_consistent());
        let mut out = [0u8; 24];
        p.emit(&mut out);
        assert_eq!(out, *buf);
        assert_eq!(
            format!("{p}"),
            "XRC_SEND_ONLY qp=0x000011 psn=0x000005 ack_req=1 xrceth(srq=0x000102) payload=4"
        );
        // An XRC request too short for its XRCETH is refused.
        assert_eq!(
            PacketRepr::parse(&XRC_SEND[..15]).unwrap_err(),
            Error::Truncated
        );
    }

    #[test]
    fn display_line() {
        let r = PacketRepr::parse(&ATOMIC_ACK).unwrap();
        assert_eq!(
            r.to_string(),
            "RC_ATOMIC_ACKNOWLEDGE qp=0x000017 psn=0x96e0a4 ack_req=0 aeth(syndrome=0x1f ACK msn=1) \
             atomic_ack_eth(orig=0xc69ee1a519cce9a8) payload=0"
        );
    }

    #[test]
    fn emit_atomic_ack_byte_identical_but_icrc() {
        let r = PacketRepr::parse(&ATOMIC_ACK).unwrap();
        let mut out = [0xa5u8; 28];
        assert_eq!(r.buffer_len(), 28);
        r.emit(&mut out);
        assert_eq!(out[..24], ATOMIC_ACK[..24]);
        assert_eq!(out[24..], [0; 4]);
    }

    #[test]
    fn send_with_pad() {
        let repr = PacketRepr {
            bth: BthRepr::new(Opcode::RC_SEND_ONLY_WITH_IMMEDIATE, 0x11, Psn::new(5)),
            ext: ExtHeaders {
                immdt: Some(ImmDtRepr { imm: 0x0102_0304 }),
                ..Default::default()
            },
            payload: b"abcde",
        }
        .with_pad();
        assert_eq!(repr.bth.pad_count, 3);
        assert_eq!(repr.buffer_len(), 12 + 4 + 5 + 3 + 4);
        let mut buf = [0xa5u8; 28];
        repr.emit(&mut buf);
        assert_eq!(&buf[16..21], b"abcde");
        assert_eq!(&buf[21..28], &[0; 7]);
        let back = PacketRepr::parse(&buf).unwrap();
        assert_eq!(back, repr);
        let mut p = Packet::new_checked(&mut buf[..]).unwrap();
        p.payload_mut().copy_from_slice(b"ABCDE");
        p.set_icrc(0xdead_beef);
        assert_eq!(p.icrc(), 0xdead_beef);
        assert_eq!(PacketRepr::parse(&buf).unwrap().payload, b"ABCDE");
    }

    #[test]
    fn structural_errors() {
        assert_eq!(PacketRepr::parse(&[0u8; 15][..]), Err(Error::Truncated));
        // Unknown opcode.
        let mut b = [0u8; 16];
        b[0] = 0x15;
        assert_eq!(PacketRepr::parse(&b[..]), Err(Error::UnknownOpcode(0x15)));
        // TVer 1.
        b[0] = 0x04;
        b[1] = 0x01;
        assert_eq!(PacketRepr::parse(&b[..]), Err(Error::BadVersion));
        // A RETH that does not fit.
        let mut w = [0u8; 20];
        w[0] = 0x0A;
        assert_eq!(PacketRepr::parse(&w[..]), Err(Error::Truncated));
        // Pad larger than what follows the headers.
        let mut s = [0u8; 17];
        s[0] = 0x04;
        s[1] = 0x20;
        assert_eq!(PacketRepr::parse(&s[..]), Err(Error::BadLength));
        // An ACK with payload.
        let mut a = [0u8; 24];
        a[0] = 0x11;
        assert_eq!(PacketRepr::parse(&a[..]), Err(Error::BadLength));
        // ATOMIC WRITE must carry exactly 8 bytes.
        let mut aw = [0u8; 12 + 16 + 8 + 4];
        aw[0] = 0x1D;
        assert!(PacketRepr::parse(&aw[..]).is_ok());
        assert_eq!(
            PacketRepr::parse(&aw[..aw.len() - 4]),
            Err(Error::BadLength)
        );
    }

    fn arb_ext(op: Opcode) -> impl Strategy<Value = ExtHeaders> {
        let h = op.info().map_or(HeaderSet::NONE, |i| i.headers);
        (
            any::<[u64; 4]>(),
            any::<[u32; 4]>(),
            any::<u8>(),
            any::<[u8; 16]>(),
        )
            .prop_map(move |(q, d, s, r)| ExtHeaders {
                deth: h.contains(HeaderSet::DETH).then_some(DethRepr {
                    qkey: d[0],
                    src_qp: d[1] & 0xFF_FFFF,
                }),
                xrceth: h.contains(HeaderSet::XRCETH).then_some(XrcEthRepr {
                    xrcsrq: d[0] & 0xFF_FFFF,
                }),
                feth: h
                    .contains(HeaderSet::FETH)
                    .then_some(FethRepr { bits: d[2] }),
                reth: h.contains(HeaderSet::RETH).then_some(RethRepr {
                    va: q[0],
                    rkey: d[1],
                    dma_len: d[2],
                }),
                atomic_eth: h.contains(HeaderSet::ATOMIC_ETH).then_some(AtomicEthRepr {
                    va: q[0],
                    rkey: d[3],
                    swap_add: q[1],
                    compare: q[2],
                }),
                aeth: h.contains(HeaderSet::AETH).then_some(AethRepr {
                    syndrome: s,
                    msn: d[0] & 0xFF_FFFF,
                }),
                atomic_ack_eth: h
                    .contains(HeaderSet::ATOMIC_ACK_ETH)
                    .then_some(AtomicAckEthRepr { orig: q[3] }),
                immdt: h
                    .contains(HeaderSet::IMMDT)
                    .then_some(ImmDtRepr { imm: d[3] }),
                ieth: h
                    .contains(HeaderSet::IETH)
                    .then_some(IethRepr { rkey: d[2] }),
                cnp: h
                    .contains(HeaderSet::CNP)
                    .then_some(CnpRepr { reserved: r }),
            })
    }

    fn arb_packet() -> impl Strategy<Value = (BthRepr, ExtHeaders, Vec<u8>)> {
        (
            proptest::sample::select(Opcode::ALL),
            crate::bth::tests::arb_repr(),
            proptest::collection::vec(any::<u8>(), 0..300),
        )
            .prop_flat_map(|(op, mut bth, mut payload)| {
                bth.opcode = op;
                let info = op.info().unwrap();
                if info.operation == crate::Operation::AtomicWrite {
                    payload.resize(8, 0);
                } else if !info.has_payload {
                    payload.clear();
                }
                (Just(bth), arb_ext(op), Just(payload))
            })
    }

    proptest! {
        #[test]
        fn roundtrip((bth, ext, payload) in arb_packet()) {
            let repr = PacketRepr { bth, ext, payload: &payload };
            prop_assert!(repr.is_consistent());
            let mut buf = vec![0xa5u8; repr.buffer_len()];
            repr.emit(&mut buf);
            prop_assert_eq!(PacketRepr::parse(&buf), Ok(repr));
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(r) = PacketRepr::parse(&b) {
                let mut out = vec![0u8; r.buffer_len()];
                prop_assert_eq!(out.len(), b.len());
                r.emit(&mut out);
                // Reserved bits and pad are emitted as zeros, so compare what they mean.
                prop_assert_eq!(PacketRepr::parse(&out), Ok(r));
            }
        }
    }
}
