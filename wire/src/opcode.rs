//! The BTH opcode table for RC, UC, UD, XRC and CNP (IBTA Table 38, rxe `rxe_opcode[]`).
//!
//! An [`Opcode`] is any byte; [`Opcode::info`] says what the known ones mean: their name, the
//! extension headers that follow the BTH (in wire order), whether they carry payload and where
//! they sit in a message. An unknown opcode is just an `Opcode` whose `info()` is `None`.

use core::fmt;

/// A BTH opcode byte.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

/// The transport service of an opcode: its top three bits (IBTA Table 38).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected (0x00–0x1F).
    Rc,
    /// Unreliable Connected (0x20–0x3F).
    Uc,
    /// Reliable Datagram (0x40–0x5F); not supported by rxe or ferroce.
    Rd,
    /// Unreliable Datagram (0x60–0x7F).
    Ud,
    /// Congestion notification (0x80–0x9F); 0x81 is the RoCEv2 CNP.
    Cnp,
    /// Extended Reliable Connected (0xA0–0xBF): RC's operations between an XRC send QP and
    /// an XRC target QP, requests carrying an XRCETH.
    Xrc,
    /// Manufacturer specific (0xC0–0xFF).
    Vendor,
}

/// The operation an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (with or without immediate or invalidate).
    Send,
    /// RDMA WRITE (with or without immediate).
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response.
    ReadResponse,
    /// Acknowledge (ACK or NAK).
    Acknowledge,
    /// ATOMIC acknowledge.
    AtomicAcknowledge,
    /// CmpSwap.
    CompareSwap,
    /// FetchAdd.
    FetchAdd,
    /// FLUSH (IBTA 1.5).
    Flush,
    /// ATOMIC WRITE (IBTA 1.5).
    AtomicWrite,
    /// Congestion Notification Packet.
    Cnp,
}

/// Where a packet sits in a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Middle packet.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The only packet of a message.
    Only,
}

/// A set of extension headers (one bit each).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HeaderSet(u16);

impl HeaderSet {
    /// No extension header.
    pub const NONE: HeaderSet = HeaderSet(0);
    /// DETH (UD).
    pub const DETH: HeaderSet = HeaderSet(1 << 0);
    /// FETH (FLUSH).
    pub const FETH: HeaderSet = HeaderSet(1 << 1);
    /// RETH.
    pub const RETH: HeaderSet = HeaderSet(1 << 2);
    /// AtomicETH.
    pub const ATOMIC_ETH: HeaderSet = HeaderSet(1 << 3);
    /// AETH.
    pub const AETH: HeaderSet = HeaderSet(1 << 4);
    /// AtomicAckETH.
    pub const ATOMIC_ACK_ETH: HeaderSet = HeaderSet(1 << 5);
    /// ImmDt.
    pub const IMMDT: HeaderSet = HeaderSet(1 << 6);
    /// IETH.
    pub const IETH: HeaderSet = HeaderSet(1 << 7);
    /// The 16 reserved bytes of a CNP.
    pub const CNP: HeaderSet = HeaderSet(1 << 8);
    /// XRCETH (XRC requests).
    pub const XRCETH: HeaderSet = HeaderSet(1 << 9);

    /// The union of two sets.
    #[inline]
    pub const fn union(self, other: HeaderSet) -> HeaderSet {
        HeaderSet(self.0 | other.0)
    }

    /// Whether every header of `other` is in `self`.
    #[inline]
    pub const fn contains(self, other: HeaderSet) -> bool {
        self.0 & other.0 == other.0
    }

    /// The total length of the headers in the set.
    #[inline]
    pub const fn len(self) -> usize {
        let mut n = 0;
        if self.contains(Self::DETH) {
            n += crate::deth::HEADER_LEN;
        }
        if self.contains(Self::FETH) {
            n += crate::feth::HEADER_LEN;
        }
        if self.contains(Self::RETH) {
            n += crate::reth::HEADER_LEN;
        }
        if self.contains(Self::ATOMIC_ETH) {
            n += crate::atomic_eth::HEADER_LEN;
        }
        if self.contains(Self::AETH) {
            n += crate::aeth::HEADER_LEN;
        }
        if self.contains(Self::ATOMIC_ACK_ETH) {
            n += crate::atomic_ack_eth::HEADER_LEN;
        }
        if self.contains(Self::IMMDT) {
            n += crate::immdt::HEADER_LEN;
        }
        if self.contains(Self::IETH) {
            n += crate::ieth::HEADER_LEN;
        }
        if self.contains(Self::CNP) {
            n += crate::cnp::HEADER_LEN;
        }
        if self.contains(Self::XRCETH) {
            n += crate::xrceth::HEADER_LEN;
        }
        n
    }

    /// Whether the set is empty.
    #[inline]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl core::ops::BitOr for HeaderSet {
    type Output = HeaderSet;
    fn bitor(self, rhs: HeaderSet) -> HeaderSet {
        self.union(rhs)
    }
}

impl fmt::Debug for HeaderSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(HeaderSet, &str); 10] = [
            (HeaderSet::DETH, "DETH"),
            (HeaderSet::XRCETH, "XRCETH"),
            (HeaderSet::FETH, "FETH"),
            (HeaderSet::RETH, "RETH"),
            (HeaderSet::ATOMIC_ETH, "AtomicETH"),
            (HeaderSet::AETH, "AETH"),
            (HeaderSet::ATOMIC_ACK_ETH, "AtomicAckETH"),
            (HeaderSet::IMMDT, "ImmDt"),
            (HeaderSet::IETH, "IETH"),
            (HeaderSet::CNP, "CNP"),
        ];
        let mut l = f.debug_set();
        for (h, n) in NAMES {
            if self.contains(h) {
                l.entry(&format_args!("{n}"));
            }
        }
        l.finish()
    }
}

/// What the opcode table says about one opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// Name as in IBTA/rxe, e.g. `RC_SEND_FIRST`.
    pub name: &'static str,
    /// Transport service.
    pub transport: Transport,
    /// Operation.
    pub operation: Operation,
    /// Position within the message.
    pub position: Position,
    /// Extension headers that follow the BTH, in wire order.
    pub headers: HeaderSet,
    /// Whether the packet carries payload (may still be zero bytes for SEND/WRITE).
    pub has_payload: bool,
    /// Whether the packet carries immediate data (ImmDt).
    pub has_imm: bool,
}

macro_rules! opcodes {
    ($( $(#[$doc:meta])* $konst:ident = $val:literal, $tr:ident, $op:ident, $pos:ident, [$($h:ident),*], $payload:literal; )*) => {
        impl Opcode {
            $( $(#[$doc])* pub const $konst: Opcode = Opcode($val); )*

            /// The table entry of this opcode, or `None` for opcodes ferroce does not know.
            #[inline]
            pub const fn info(self) -> Option<&'static OpcodeInfo> {
                match self.0 {
                    $( $val => {
                        const INFO: OpcodeInfo = OpcodeInfo {
                        name: stringify!($konst),
                        transport: Transport::$tr,
                        operation: Operation::$op,
                        position: Position::$pos,
                        headers: HeaderSet::NONE $( .union(HeaderSet::$h) )*,
                        has_payload: $payload,
                        has_imm: HeaderSet::NONE $( .union(HeaderSet::$h) )*
                            .contains(HeaderSet::IMMDT),
                        };
                        Some(&INFO)
                    } )*
                    _ => None,
                }
            }

            /// Every opcode in the table, in numeric order.
            pub const ALL: &'static [Opcode] = &[ $( Opcode($val), )* ];
        }
    };
}

opcodes! {
    /// RC SEND First.
    RC_SEND_FIRST = 0x00, Rc, Send, First, [], true;
    /// RC SEND Middle.
    RC_SEND_MIDDLE = 0x01, Rc, Send, Middle, [], true;
    /// RC SEND Last.
    RC_SEND_LAST = 0x02, Rc, Send, Last, [], true;
    /// RC SEND Last with Immediate.
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03, Rc, Send, Last, [IMMDT], true;
    /// RC SEND Only.
    RC_SEND_ONLY = 0x04, Rc, Send, Only, [], true;
    /// RC SEND Only with Immediate.
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05, Rc, Send, Only, [IMMDT], true;
    /// RC RDMA WRITE First.
    RC_RDMA_WRITE_FIRST = 0x06, Rc, Write, First, [RETH], true;
    /// RC RDMA WRITE Middle.
    RC_RDMA_WRITE_MIDDLE = 0x07, Rc, Write, Middle, [], true;
    /// RC RDMA WRITE Last.
    RC_RDMA_WRITE_LAST = 0x08, Rc, Write, Last, [], true;
    /// RC RDMA WRITE Last with Immediate.
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09, Rc, Write, Last, [IMMDT], true;
    /// RC RDMA WRITE Only.
    RC_RDMA_WRITE_ONLY = 0x0A, Rc, Write, Only, [RETH], true;
    /// RC RDMA WRITE Only with Immediate.
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B, Rc, Write, Only, [RETH, IMMDT], true;
    /// RC RDMA READ Request.
    RC_RDMA_READ_REQUEST = 0x0C, Rc, ReadRequest, Only, [RETH], false;
    /// RC RDMA READ response First.
    RC_RDMA_READ_RESPONSE_FIRST = 0x0D, Rc, ReadResponse, First, [AETH], true;
    /// RC RDMA READ response Middle.
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0E, Rc, ReadResponse, Middle, [], true;
    /// RC RDMA READ response Last.
    RC_RDMA_READ_RESPONSE_LAST = 0x0F, Rc, ReadResponse, Last, [AETH], true;
    /// RC RDMA READ response Only.
    RC_RDMA_READ_RESPONSE_ONLY = 0x10, Rc, ReadResponse, Only, [AETH], true;
    /// RC Acknowledge (ACK, RNR NAK or NAK).
    RC_ACKNOWLEDGE = 0x11, Rc, Acknowledge, Only, [AETH], false;
    /// RC ATOMIC Acknowledge.
    RC_ATOMIC_ACKNOWLEDGE = 0x12, Rc, AtomicAcknowledge, Only, [AETH, ATOMIC_ACK_ETH], false;
    /// RC CmpSwap.
    RC_COMPARE_SWAP = 0x13, Rc, CompareSwap, Only, [ATOMIC_ETH], false;
    /// RC FetchAdd.
    RC_FETCH_ADD = 0x14, Rc, FetchAdd, Only, [ATOMIC_ETH], false;
    /// RC SEND Last with Invalidate.
    RC_SEND_LAST_WITH_INVALIDATE = 0x16, Rc, Send, Last, [IETH], true;
    /// RC SEND Only with Invalidate.
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17, Rc, Send, Only, [IETH], true;
    /// RC FLUSH (IBTA 1.5).
    RC_FLUSH = 0x1C, Rc, Flush, Only, [FETH, RETH], false;
    /// RC ATOMIC WRITE (IBTA 1.5): RETH and exactly 8 bytes of payload.
    RC_ATOMIC_WRITE = 0x1D, Rc, AtomicWrite, Only, [RETH], true;
    /// UC SEND First.
    UC_SEND_FIRST = 0x20, Uc, Send, First, [], true;
    /// UC SEND Middle.
    UC_SEND_MIDDLE = 0x21, Uc, Send, Middle, [], true;
    /// UC SEND Last.
    UC_SEND_LAST = 0x22, Uc, Send, Last, [], true;
    /// UC SEND Last with Immediate.
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23, Uc, Send, Last, [IMMDT], true;
    /// UC SEND Only.
    UC_SEND_ONLY = 0x24, Uc, Send, Only, [], true;
    /// UC SEND Only with Immediate.
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25, Uc, Send, Only, [IMMDT], true;
    /// UC RDMA WRITE First.
    UC_RDMA_WRITE_FIRST = 0x26, Uc, Write, First, [RETH], true;
    /// UC RDMA WRITE Middle.
    UC_RDMA_WRITE_MIDDLE = 0x27, Uc, Write, Middle, [], true;
    /// UC RDMA WRITE Last.
    UC_RDMA_WRITE_LAST = 0x28, Uc, Write, Last, [], true;
    /// UC RDMA WRITE Last with Immediate.
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29, Uc, Write, Last, [IMMDT], true;
    /// UC RDMA WRITE Only.
    UC_RDMA_WRITE_ONLY = 0x2A, Uc, Write, Only, [RETH], true;
    /// UC RDMA WRITE Only with Immediate.
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2B, Uc, Write, Only, [RETH, IMMDT], true;
    /// UD SEND Only.
    UD_SEND_ONLY = 0x64, Ud, Send, Only, [DETH], true;
    /// UD SEND Only with Immediate.
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65, Ud, Send, Only, [DETH, IMMDT], true;
    /// RoCEv2 Congestion Notification Packet.
    CNP = 0x81, Cnp, Cnp, Only, [CNP], false;
    /// XRC SEND First.
    XRC_SEND_FIRST = 0xA0, Xrc, Send, First, [XRCETH], true;
    /// XRC SEND Middle.
    XRC_SEND_MIDDLE = 0xA1, Xrc, Send, Middle, [XRCETH], true;
    /// XRC SEND Last.
    XRC_SEND_LAST = 0xA2, Xrc, Send, Last, [XRCETH], true;
    /// XRC SEND Last with Immediate.
    XRC_SEND_LAST_WITH_IMMEDIATE = 0xA3, Xrc, Send, Last, [XRCETH, IMMDT], true;
    /// XRC SEND Only.
    XRC_SEND_ONLY = 0xA4, Xrc, Send, Only, [XRCETH], true;
    /// XRC SEND Only with Immediate.
    XRC_SEND_ONLY_WITH_IMMEDIATE = 0xA5, Xrc, Send, Only, [XRCETH, IMMDT], true;
    /// XRC RDMA WRITE First.
    XRC_RDMA_WRITE_FIRST = 0xA6, Xrc, Write, First, [XRCETH, RETH], true;
    /// XRC RDMA WRITE Middle.
    XRC_RDMA_WRITE_MIDDLE = 0xA7, Xrc, Write, Middle, [XRCETH], true;
    /// XRC RDMA WRITE Last.
    XRC_RDMA_WRITE_LAST = 0xA8, Xrc, Write, Last, [XRCETH], true;
    /// XRC RDMA WRITE Last with Immediate.
    XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0xA9, Xrc, Write, Last, [XRCETH, IMMDT], true;
    /// XRC RDMA WRITE Only.
    XRC_RDMA_WRITE_ONLY = 0xAA, Xrc, Write, Only, [XRCETH, RETH], true;
    /// XRC RDMA WRITE Only with Immediate.
    XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0xAB, Xrc, Write, Only, [XRCETH, RETH, IMMDT], true;
    /// XRC RDMA READ Request.
    XRC_RDMA_READ_REQUEST = 0xAC, Xrc, ReadRequest, Only, [XRCETH, RETH], false;
    /// XRC RDMA READ response First.
    XRC_RDMA_READ_RESPONSE_FIRST = 0xAD, Xrc, ReadResponse, First, [AETH], true;
    /// XRC RDMA READ response Middle.
    XRC_RDMA_READ_RESPONSE_MIDDLE = 0xAE, Xrc, ReadResponse, Middle, [], true;
    /// XRC RDMA READ response Last.
    XRC_RDMA_READ_RESPONSE_LAST = 0xAF, Xrc, ReadResponse, Last, [AETH], true;
    /// XRC RDMA READ response Only.
    XRC_RDMA_READ_RESPONSE_ONLY = 0xB0, Xrc, ReadResponse, Only, [AETH], true;
    /// XRC Acknowledge (ACK, RNR NAK or NAK).
    XRC_ACKNOWLEDGE = 0xB1, Xrc, Acknowledge, Only, [AETH], false;
    /// XRC ATOMIC Acknowledge.
    XRC_ATOMIC_ACKNOWLEDGE = 0xB2, Xrc, AtomicAcknowledge, Only, [AETH, ATOMIC_ACK_ETH], false;
    /// XRC CmpSwap.
    XRC_COMPARE_SWAP = 0xB3, Xrc, CompareSwap, Only, [XRCETH, ATOMIC_ETH], false;
    /// XRC FetchAdd.
    XRC_FETCH_ADD = 0xB4, Xrc, FetchAdd, Only, [XRCETH, ATOMIC_ETH], false;
    /// XRC SEND Last with Invalidate.
    XRC_SEND_LAST_WITH_INVALIDATE = 0xB6, Xrc, Send, Last, [XRCETH, IETH], true;
    /// XRC SEND Only with Invalidate.
    XRC_SEND_ONLY_WITH_INVALIDATE = 0xB7, Xrc, Send, Only, [XRCETH, IETH], true;
}

impl Opcode {
    /// The transport service given by the top three bits (defined for every byte).
    #[inline]
    pub const fn transport(self) -> Transport {
        match self.0 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            5 => Transport::Xrc,
            _ => Transport::Vendor,
        }
    }

    /// The opcode's table name, or `"UNKNOWN"`.
    pub const fn name(self) -> &'static str {
        match self.info() {
            Some(i) => i.name,
            None => "UNKNOWN",
        }
    }

    /// Whether this opcode is known to the table.
    #[inline]
    pub const fn is_known(self) -> bool {
        self.info().is_some()
    }

    #[inline]
    fn has(self, h: HeaderSet) -> bool {
        self.info().is_some_and(|i| i.headers.contains(h))
    }

    /// Carries a RETH.
    #[inline]
    pub fn has_reth(self) -> bool {
        self.has(HeaderSet::RETH)
    }

    /// Carries an AETH.
    #[inline]
    pub fn has_aeth(self) -> bool {
        self.has(HeaderSet::AETH)
    }

    /// Carries an AtomicETH.
    #[inline]
    pub fn has_atomic_eth(self) -> bool {
        self.has(HeaderSet::ATOMIC_ETH)
    }

    /// Carries ImmDt.
    #[inline]
    pub fn has_immdt(self) -> bool {
        self.has(HeaderSet::IMMDT)
    }

    /// Carries a DETH.
    #[inline]
    pub fn has_deth(self) -> bool {
        self.has(HeaderSet::DETH)
    }

    /// Carries an XRCETH (an XRC request).
    #[inline]
    pub fn has_xrceth(self) -> bool {
        self.has(HeaderSet::XRCETH)
    }

    /// The RC opcode of the same operation and position as this XRC one (`0xA4` gives
    /// `0x04`): an XRC QP runs RC's rules on what it receives; `None` for non-XRC opcodes.
    #[inline]
    pub const fn xrc_as_rc(self) -> Option<Opcode> {
        match self.transport() {
            Transport::Xrc => Some(Opcode(self.0 & 0x1F)),
            _ => None,
        }
    }

    /// The XRC opcode of the same operation and position as this RC one (`0x04` gives
    /// `0xA4`), what an XRC QP sends; `None` where XRC has no such opcode (FLUSH, ATOMIC
    /// WRITE, non-RC opcodes).
    pub fn rc_as_xrc(self) -> Option<Opcode> {
        let x = Opcode(self.0 | 0xA0);
        (self.transport() == Transport::Rc && x.is_known()).then_some(x)
    }

    /// Whether this is a request sent by a requester (as opposed to a response from a responder).
    #[inline]
    pub fn is_request(self) -> bool {
        matches!(
            self.info().map(|i| i.operation),
            Some(
                Operation::Send
                    | Operation::Write
                    | Operation::ReadRequest
                    | Operation::CompareSwap
                    | Operation::FetchAdd
                    | Operation::Flush
                    | Operation::AtomicWrite
            )
        )
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Opcode({:#04x} {})", self.0, self.name())
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(i) => f.write_str(i.name),
            None => write!(f, "UNKNOWN({:#04x})", self.0),
        }
    }
}

impl From<u8> for Opcode {
    fn from(v: u8) -> Opcode {
        Opcode(v)
    }
}

impl From<Opcode> for u8 {
    fn from(o: Opcode) -> u8 {
        o.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_ibta() {
        let i = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.info().unwrap();
        assert_eq!(i.headers, HeaderSet::RETH | HeaderSet::IMMDT);
        assert_eq!(i.headers.len(), 20);
        assert!(i.has_imm && i.has_payload);
        assert_eq!(i.position, Position::Only);
        let a = Opcode::RC_ATOMIC_ACKNOWLEDGE.info().unwrap();
        assert_eq!(a.headers.len(), 12);
        assert!(!a.has_payload);
        assert_eq!(Opcode::RC_COMPARE_SWAP.info().unwrap().headers.len(), 28);
        assert_eq!(
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
                .info()
                .unwrap()
                .headers
                .len(),
            12
        );
        assert_eq!(Opcode::CNP.info().unwrap().headers.len(), 16);
        assert_eq!(Opcode::RC_FLUSH.info().unwrap().headers.len(), 20);
        assert_eq!(Opcode::RC_SEND_MIDDLE.info().unwrap().headers.len(), 0);
    }

    #[test]
    fn uc_mirrors_rc_send_and_write() {
        for op in 0x00..=0x0Bu8 {
            let rc = Opcode(op).info().unwrap();
            let uc = Opcode(op | 0x20).info().unwrap();
            assert_eq!(uc.transport, Transport::Uc);
            assert_eq!(
                (rc.operation, rc.position, rc.headers),
                (uc.operation, uc.position, uc.headers)
            );
            assert_eq!(&rc.name[3..], &uc.name[3..]);
        }
        // UC has no READ, ACK or atomics.
        for op in 0x2C..=0x3Fu8 {
            assert!(Opcode(op).info().is_none(), "{op:#x}");
        }
    }

    #[test]
    fn unknown_opcodes_are_values() {
        let known = Opcode::ALL.len();
        assert_eq!(known, 63);
        let mut n = 0;
        for b in 0..=255u8 {
            let o = Opcode(b);
            if o.is_known() {
                n += 1;
                assert!(Opcode::ALL.contains(&o));
            } else {
                assert_eq!(o.name(), "UNKNOWN");
                assert!(!o.has_reth());
                assert!(!o.is_request());
            }
        }
        assert_eq!(n, known);
        assert_eq!(format!("{}", Opcode(0x15)), "UNKNOWN(0x15)");
        assert_eq!(format!("{}", Opcode::RC_FETCH_ADD), "RC_FETCH_ADD");
        assert_eq!(Opcode(0x44).transport(), Transport::Rd);
        assert_eq!(Opcode(0xA0).transport(), Transport::Xrc);
        assert_eq!(Opcode(0xE3).transport(), Transport::Vendor);
        assert_eq!(format!("{}", Opcode(0xB5)), "UNKNOWN(0xb5)");
    }

    #[test]
    fn xrc_mirrors_rc_with_an_xrceth_on_requests() {
        for op in 0x00..=0x17u8 {
            let rc = Opcode(op);
            let Some(ri) = rc.info() else {
                assert!(Opcode(op | 0xA0).info().is_none(), "{op:#x}");
                continue;
            };
            let x = rc.rc_as_xrc().unwrap();
            let xi = x.info().unwrap();
            assert_eq!(xi.transport, Transport::Xrc);
            assert_eq!((ri.operation, ri.position), (xi.operation, xi.position));
            assert_eq!(&ri.name[3..], &xi.name[4..]);
            let want = if rc.is_request() {
                ri.headers | HeaderSet::XRCETH
            } else {
                ri.headers
            };
            assert_eq!(xi.headers, want, "{x}");
            assert_eq!(x.xrc_as_rc(), Some(rc));
            assert_eq!(x.has_xrceth(), rc.is_request());
        }
        assert_eq!(Opcode::XRC_SEND_ONLY.info().unwrap().headers.len(), 4);
        assert_eq!(Opcode::XRC_COMPARE_SWAP.info().unwrap().headers.len(), 32);
        assert_eq!(
            Opcode::XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
                .info()
                .unwrap()
                .headers
                .len(),
            24
        );
        // No XRC FLUSH or ATOMIC WRITE here, and nothing XRC for non-RC opcodes.
        assert_eq!(Opcode::RC_FLUSH.rc_as_xrc(), None);
        assert_eq!(Opcode::RC_ATOMIC_WRITE.rc_as_xrc(), None);
        assert_eq!(Opcode::UC_SEND_ONLY.rc_as_xrc(), None);
        assert_eq!(Opcode::RC_SEND_ONLY.xrc_as_rc(), None);
    }

    #[test]
    fn transport_bits_agree_with_table() {
        for o in Opcode::ALL {
            assert_eq!(o.info().unwrap().transport, o.transport(), "{o}");
        }
    }

    #[test]
    fn requests_and_responses() {
        assert!(Opcode::RC_SEND_FIRST.is_request());
        assert!(Opcode::RC_RDMA_READ_REQUEST.is_request());
        assert!(!Opcode::RC_RDMA_READ_RESPONSE_ONLY.is_request());
        assert!(!Opcode::RC_ACKNOWLEDGE.is_request());
        assert!(!Opcode::CNP.is_request());
        assert_eq!(
            format!("{:?}", HeaderSet::AETH | HeaderSet::ATOMIC_ACK_ETH),
            "{AETH, AtomicAckETH}"
        );
    }
}
