//! Base Transport Header (IBTA Vol. 1 §9.2, rxe `struct rxe_bth`): the 12 bytes every RoCEv2
//! packet starts with.
//!
//! ```text
//! byte 0      opcode
//! byte 1      SE(0x80) M(0x40) PadCnt(0x30) TVer(0x0F)
//! bytes 2-3   P_Key
//! byte 4      FECN(0x80) BECN(0x40) reserved(0x3F)
//! bytes 5-7   DestQP
//! byte 8      AckReq(0x80) reserved(0x7F)
//! bytes 9-11  PSN
//! ```

use crate::field::{Field, U16, U24};
use crate::{Error, Opcode, Psn, Result};

mod field {
    pub(super) const OPCODE: usize = 0;
    pub(super) const FLAGS: usize = 1;
    pub(super) const PKEY: usize = 2;
    pub(super) const BECN_FECN: usize = 4;
    pub(super) const DEST_QP: usize = 5;
    pub(super) const ACK_REQ: usize = 8;
    pub(super) const PSN: usize = 9;
}

/// Length in bytes of the BTH.
pub const HEADER_LEN: usize = 12;

const SE: u8 = 0x80;
const MIG: u8 = 0x40;
const PAD_MASK: u8 = 0x30;
const TVER_MASK: u8 = 0x0F;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQ: u8 = 0x80;

/// A read/write view of a BTH at the start of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length (for emitting into a sized buffer).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps an untrusted buffer, checking that 12 bytes are there.
    ///
    /// # Errors
    /// [`Error::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the buffer holds the whole BTH; after this no getter panics.
    ///
    /// # Errors
    /// [`Error::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Returns the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn byte(&self, i: usize) -> u8 {
        self.buffer.as_ref()[i]
    }

    /// OpCode (byte 0): transport in the top 3 bits, operation in the low 5.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.byte(field::OPCODE))
    }

    /// SE, Solicited Event: the responder raises a solicited completion event.
    pub fn se(&self) -> bool {
        self.byte(field::FLAGS) & SE != 0
    }

    /// M, MigReq: path-migration state (rxe sends 0, ConnectX 1; receivers ignore it).
    pub fn mig_req(&self) -> bool {
        self.byte(field::FLAGS) & MIG != 0
    }

    /// PadCnt: bytes (0–3) of pad after the payload that align it to 4 bytes.
    pub fn pad_count(&self) -> u8 {
        (self.byte(field::FLAGS) & PAD_MASK) >> 4
    }

    /// TVer, the transport header version; only 0 is defined.
    pub fn tver(&self) -> u8 {
        self.byte(field::FLAGS) & TVER_MASK
    }

    /// P_Key, the partition key (0xFFFF by default).
    pub fn pkey(&self) -> u16 {
        U16::get(&self.buffer.as_ref()[field::PKEY..])
    }

    /// FECN, forward explicit congestion notification (not used by RoCEv2, which marks IP ECN).
    pub fn fecn(&self) -> bool {
        self.byte(field::BECN_FECN) & FECN != 0
    }

    /// BECN, backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.byte(field::BECN_FECN) & BECN != 0
    }

    /// DestQP, the 24-bit destination queue pair number.
    pub fn dest_qp(&self) -> u32 {
        U24::get(&self.buffer.as_ref()[field::DEST_QP..])
    }

    /// AckReq: the requester asks the responder to acknowledge this packet.
    pub fn ack_req(&self) -> bool {
        self.byte(field::ACK_REQ) & ACK_REQ != 0
    }

    /// PSN, the 24-bit packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(U24::get(&self.buffer.as_ref()[field::PSN..]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_bit(&mut self, i: usize, mask: u8, on: bool) {
        let b = &mut self.buffer.as_mut()[i];
        if on {
            *b |= mask;
        } else {
            *b &= !mask;
        }
    }

    /// Sets the OpCode.
    pub fn set_opcode(&mut self, value: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = value.0;
    }

    /// Sets SE.
    pub fn set_se(&mut self, value: bool) {
        self.set_bit(field::FLAGS, SE, value);
    }

    /// Sets M (MigReq).
    pub fn set_mig_req(&mut self, value: bool) {
        self.set_bit(field::FLAGS, MIG, value);
    }

    /// Sets PadCnt (only the low 2 bits of `value` are used).
    pub fn set_pad_count(&mut self, value: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !PAD_MASK) | ((value & 3) << 4);
    }

    /// Sets TVer (only the low 4 bits of `value` are used).
    pub fn set_tver(&mut self, value: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !TVER_MASK) | (value & TVER_MASK);
    }

    /// Sets the P_Key.
    pub fn set_pkey(&mut self, value: u16) {
        U16::set(&mut self.buffer.as_mut()[field::PKEY..], value);
    }

    /// Sets FECN.
    pub fn set_fecn(&mut self, value: bool) {
        self.set_bit(field::BECN_FECN, FECN, value);
    }

    /// Sets BECN.
    pub fn set_becn(&mut self, value: bool) {
        self.set_bit(field::BECN_FECN, BECN, value);
    }

    /// Sets DestQP (masked to 24 bits).
    pub fn set_dest_qp(&mut self, value: u32) {
        U24::set(&mut self.buffer.as_mut()[field::DEST_QP..], value);
    }

    /// Sets AckReq.
    pub fn set_ack_req(&mut self, value: bool) {
        self.set_bit(field::ACK_REQ, ACK_REQ, value);
    }

    /// Sets the PSN.
    pub fn set_psn(&mut self, value: Psn) {
        U24::set(&mut self.buffer.as_mut()[field::PSN..], value.value());
    }
}

/// The parsed fields of a BTH (reserved bits are ignored on parse and zero on emit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// OpCode.
    pub opcode: Opcode,
    /// SE, Solicited Event.
    pub se: bool,
    /// M, MigReq.
    pub mig_req: bool,
    /// PadCnt, 0–3.
    pub pad_count: u8,
    /// P_Key.
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// DestQP, 24 bits.
    pub dest_qp: u32,
    /// AckReq.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl Repr {
    /// A BTH with the given opcode, destination QP and PSN, the default P_Key and every flag
    /// clear, as rxe builds it.
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: Psn) -> Repr {
        Repr {
            opcode,
            se: false,
            mig_req: false,
            pad_count: 0,
            pkey: crate::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: dest_qp & 0xFF_FFFF,
            ack_req: false,
            psn,
        }
    }

    /// The same header with AckReq set as given.
    #[must_use]
    pub const fn with_ack_req(mut self, ack_req: bool) -> Repr {
        self.ack_req = ack_req;
        self
    }

    /// The pad count that aligns a payload of `payload_len` bytes to 4 bytes (IBTA 9.2.1.4).
    pub const fn pad_for(payload_len: usize) -> u8 {
        (payload_len.wrapping_neg() & 3) as u8
    }

    /// Reads a BTH from a view.
    ///
    /// # Errors
    /// [`Error::Truncated`] if shorter than 12 bytes, [`Error::BadVersion`] if TVer ≠ 0.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        if packet.tver() != 0 {
            return Err(Error::BadVersion);
        }
        Ok(Repr {
            opcode: packet.opcode(),
            se: packet.se(),
            mig_req: packet.mig_req(),
            pad_count: packet.pad_count(),
            pkey: packet.pkey(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qp: packet.dest_qp(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    /// The number of bytes [`Repr::emit`] writes: 12.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the BTH into a buffer of at least 12 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.buffer.as_mut()[..HEADER_LEN].fill(0);
        packet.set_opcode(self.opcode);
        packet.set_se(self.se);
        packet.set_mig_req(self.mig_req);
        packet.set_pad_count(self.pad_count);
        packet.set_pkey(self.pkey);
        packet.set_fecn(self.fecn);
        packet.set_becn(self.becn);
        packet.set_dest_qp(self.dest_qp);
        packet.set_ack_req(self.ack_req);
        packet.set_psn(self.psn);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The BTH of an RC SEND_LAST from rxe (ib_send_bw capture): QP 0x16, PSN 0x35c1c6, AckReq.
    static BYTES: [u8; 12] = [
        0x02, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x16, 0x80, 0x35, 0xc1, 0xc6,
    ];

    fn repr() -> Repr {
        Repr::new(Opcode::RC_SEND_LAST, 0x16, Psn::new(0x35c1c6)).with_ack_req(true)
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::RC_SEND_LAST);
        assert!(!p.se() && !p.mig_req() && !p.fecn() && !p.becn());
        assert_eq!(p.pad_count(), 0);
        assert_eq!(p.tver(), 0);
        assert_eq!(p.pkey(), 0xffff);
        assert_eq!(p.dest_qp(), 0x16);
        assert!(p.ack_req());
        assert_eq!(p.psn(), Psn::new(0x35c1c6));
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 12];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        repr().emit(&mut p);
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn parse_and_emit() {
        assert_eq!(Repr::parse(&Packet::new_unchecked(&BYTES[..])), Ok(repr()));
        let mut buf = [0u8; 12];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn flags_and_pad_bits() {
        let mut buf = [0u8; 12];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        p.set_se(true);
        p.set_mig_req(true);
        p.set_pad_count(3);
        p.set_fecn(true);
        p.set_becn(true);
        assert_eq!(buf[1], 0xF0);
        assert_eq!(buf[4], 0xC0);
        // DestQP and PSN are masked to 24 bits and do not touch the neighbouring bytes.
        let mut p = Packet::new_unchecked(&mut buf[..]);
        p.set_dest_qp(0xAB12_3456);
        p.set_psn(Psn::new(0xFF_FFFF));
        assert_eq!(
            &buf[4..12],
            &[0xC0, 0x12, 0x34, 0x56, 0x00, 0xFF, 0xFF, 0xFF]
        );
    }

    #[test]
    fn pad_for_aligns() {
        assert_eq!(Repr::pad_for(0), 0);
        assert_eq!(Repr::pad_for(1), 3);
        assert_eq!(Repr::pad_for(2), 2);
        assert_eq!(Repr::pad_for(3), 1);
        assert_eq!(Repr::pad_for(4096), 0);
    }

    #[test]
    fn truncated_and_bad_version() {
        assert_eq!(Packet::new_checked(&BYTES[..11]), Err(Error::Truncated));
        let mut b = BYTES;
        b[1] |= 0x01;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&b[..])),
            Err(Error::BadVersion)
        );
    }

    pub(crate) fn arb_repr() -> impl Strategy<Value = Repr> {
        (
            any::<u8>(),
            any::<[bool; 6]>(),
            0u8..4,
            any::<u16>(),
            0u32..1 << 24,
            0u32..1 << 24,
        )
            .prop_map(|(op, f, pad, pkey, qp, psn)| Repr {
                opcode: Opcode(op),
                se: f[0],
                mig_req: f[1],
                pad_count: pad,
                pkey,
                fecn: f[2],
                becn: f[3],
                dest_qp: qp,
                ack_req: f[4],
                psn: Psn::new(psn),
            })
    }

    proptest! {
        #[test]
        fn roundtrip(r in arb_repr()) {
            let mut buf = [0u8; HEADER_LEN];
            r.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(Repr::parse(&Packet::new_unchecked(&buf[..])), Ok(r));
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..32)) {
            if let Ok(p) = Packet::new_checked(&b[..]) {
                let _ = Repr::parse(&p);
            }
        }
    }
}
