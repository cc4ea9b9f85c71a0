//! ACK Extended Transport Header (IBTA §9.3.5, rxe `struct rxe_aeth`): the syndrome and MSN
//! carried by ACKs, NAKs, READ responses and atomic ACKs (4 bytes).
//!
//! The syndrome's top 3 bits give its type (IBTA Table 44): `000` ACK with a credit count,
//! `001` RNR NAK with a timer index, `011` NAK with a code, `010`/`1xx` reserved.

fixed_header! {
    name: "AETH";
    len: 4;
    fields: {
        /// Syndrome byte; decode it with [`Syndrome`].
        syndrome, set_syndrome: U8 as u8 @ 0,
        /// MSN, the 24-bit message sequence number of the last completed message.
        msn, set_msn: U24 as u32 @ 1,
    }
}

impl Repr {
    /// The decoded syndrome.
    pub const fn ack_type(&self) -> AckType {
        Syndrome(self.syndrome).ack_type()
    }
}

/// An AETH syndrome byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Syndrome(pub u8);

impl Syndrome {
    /// An ACK with the credit field "invalid" (0x1F): no end-to-end flow control, what rxe sends.
    pub const ACK_UNLIMITED: Syndrome = Syndrome(0x1F);

    /// An ACK carrying a 5-bit encoded credit count.
    pub const fn ack(credits: Credits) -> Syndrome {
        Syndrome(credits.0 & 0x1F)
    }

    /// An RNR NAK asking the requester to wait the time of RNR timer index `timer` (0–31).
    pub const fn rnr_nak(timer: u8) -> Syndrome {
        Syndrome(0x20 | (timer & 0x1F))
    }

    /// A NAK with the given code.
    pub const fn nak(code: NakCode) -> Syndrome {
        Syndrome(0x60 | (code.value() & 0x1F))
    }

    /// Decodes the syndrome.
    pub const fn ack_type(self) -> AckType {
        let low = self.0 & 0x1F;
        match self.0 >> 5 {
            0b000 => AckType::Ack(Credits(low)),
            0b001 => AckType::RnrNak { timer: low },
            0b011 => AckType::Nak(NakCode::from_value(low)),
            _ => AckType::Reserved(self.0),
        }
    }
}

/// What an AETH syndrome says (IBTA Table 44).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AckType {
    /// ACK, with an encoded end-to-end credit count.
    Ack(Credits),
    /// Receiver Not Ready NAK; `timer` is the RNR timer index (see [`crate::timer::rnr_timer`]).
    RnrNak {
        /// RNR timer index, 0–31.
        timer: u8,
    },
    /// NAK with a code.
    Nak(NakCode),
    /// A reserved syndrome type; the whole byte is kept.
    Reserved(u8),
}

/// The 5-bit encoded end-to-end credit count of an ACK (IBTA Table 45).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Credits(pub u8);

impl Credits {
    /// The "invalid" credit count (0x1F): the responder does not do end-to-end flow control.
    pub const UNLIMITED: Credits = Credits(0x1F);

    /// The number of receive WQEs the code stands for, or `None` for [`Credits::UNLIMITED`].
    pub const fn count(self) -> Option<u32> {
        let c = self.0 & 0x1F;
        match c {
            0x1F => None,
            0..=4 => Some(c as u32),
            // From 5 on, the counts go 6, 8, 12, 16, 24, ... : alternately 1.5x and 2x.
            _ => {
                let k = (c - 5) as u32;
                let base = 4u32 << (k / 2);
                Some(if k % 2 == 0 {
                    base + base / 2
                } else {
                    base * 2
                })
            }
        }
    }
}

/// The code of a NAK (IBTA Table 44, rxe `enum aeth_syndrome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error; the AETH's PSN is the one the responder expects.
    PsnSeqError,
    /// 1: invalid request (bad opcode sequence, unsupported operation, length error).
    InvalidRequest,
    /// 2: remote access error (R_Key, bounds or access rights).
    RemoteAccessError,
    /// 3: remote operational error.
    RemoteOperationalError,
    /// 4: invalid RD request.
    InvalidRdRequest,
    /// A reserved code.
    Unknown(u8),
}

impl NakCode {
    /// Decodes the low 5 bits of a NAK syndrome.
    pub const fn from_value(v: u8) -> NakCode {
        match v {
            0 => NakCode::PsnSeqError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            v => NakCode::Unknown(v),
        }
    }

    /// The code's value (low 5 bits of the syndrome).
    pub const fn value(self) -> u8 {
        match self {
            NakCode::PsnSeqError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Unknown(v) => v,
        }
    }

    /// The spec's name of the code.
    pub const fn name(self) -> &'static str {
        match self {
            NakCode::PsnSeqError => "PSN sequence error",
            NakCode::InvalidRequest => "invalid request",
            NakCode::RemoteAccessError => "remote access error",
            NakCode::RemoteOperationalError => "remote operational error",
            NakCode::InvalidRdRequest => "invalid RD request",
            NakCode::Unknown(_) => "reserved",
        }
    }
}

impl core::fmt::Display for AckType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AckType::Ack(c) => match c.count() {
                Some(n) => write!(f, "ACK credits={n}"),
                None => f.write_str("ACK"),
            },
            AckType::RnrNak { timer } => write!(f, "RNR-NAK timer={timer}"),
            AckType::Nak(code) => write!(f, "NAK({}: {})", code.value(), code.name()),
            AckType::Reserved(v) => write!(f, "reserved syndrome {v:#04x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // The AETH of an rxe ACK (ib_send_bw capture): credits invalid (0x1F), MSN 1.
    fixed_header_tests! {
        bytes: [0x1f, 0x00, 0x00, 0x01],
        repr: Repr { syndrome: 0x1f, msn: 1 },
        arb: (any::<u8>(), 0u32..1 << 24).prop_map(|(syndrome, msn)| Repr { syndrome, msn }),
    }

    #[test]
    fn syndromes_decode() {
        assert_eq!(Syndrome(0x1F).ack_type(), AckType::Ack(Credits::UNLIMITED));
        assert_eq!(Syndrome(0x2C).ack_type(), AckType::RnrNak { timer: 12 });
        assert_eq!(
            Syndrome(0x60).ack_type(),
            AckType::Nak(NakCode::PsnSeqError)
        );
        assert_eq!(
            Syndrome(0x61).ack_type(),
            AckType::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            Syndrome(0x62).ack_type(),
            AckType::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(
            Syndrome(0x63).ack_type(),
            AckType::Nak(NakCode::RemoteOperationalError)
        );
        assert_eq!(
            Syndrome(0x64).ack_type(),
            AckType::Nak(NakCode::InvalidRdRequest)
        );
        assert_eq!(Syndrome(0x69).ack_type(), AckType::Nak(NakCode::Unknown(9)));
        assert_eq!(Syndrome(0x40).ack_type(), AckType::Reserved(0x40));
        assert_eq!(Syndrome(0xE0).ack_type(), AckType::Reserved(0xE0));
    }

    #[test]
    fn syndromes_encode() {
        assert_eq!(Syndrome::ACK_UNLIMITED.0, 0x1F);
        assert_eq!(Syndrome::rnr_nak(12).0, 0x2C);
        assert_eq!(Syndrome::rnr_nak(0xFF).0, 0x3F);
        assert_eq!(Syndrome::nak(NakCode::RemoteAccessError).0, 0x62);
        assert_eq!(Syndrome::ack(Credits(3)).0, 0x03);
    }

    #[test]
    fn credit_table() {
        let want = [
            0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
            1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
        ];
        for (code, n) in want.iter().enumerate() {
            assert_eq!(Credits(code as u8).count(), Some(*n), "code {code}");
        }
        assert_eq!(Credits::UNLIMITED.count(), None);
    }

    #[test]
    fn display() {
        extern crate std;
        use std::string::ToString;
        assert_eq!(
            Syndrome(0x62).ack_type().to_string(),
            "NAK(2: remote access error)"
        );
        assert_eq!(Syndrome(0x1F).ack_type().to_string(), "ACK");
        assert_eq!(Syndrome(0x2C).ack_type().to_string(), "RNR-NAK timer=12");
    }

    proptest! {
        #[test]
        fn nak_codes_roundtrip(v in 0u8..32) {
            prop_assert_eq!(NakCode::from_value(v).value(), v);
            prop_assert_eq!(Syndrome::nak(NakCode::from_value(v)).ack_type(),
                AckType::Nak(NakCode::from_value(v)));
        }
    }
}
