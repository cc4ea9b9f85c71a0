//! The one error type of the wire crate.

use core::fmt;

/// Why bytes could not be read as a RoCEv2 packet or header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Error {
    /// The buffer is shorter than the header(s) it must hold.
    Truncated,
    /// A length field or the pad count does not fit the buffer, or an opcode that carries no
    /// payload has some (IBTA C9-92 ... C9-95 length rules).
    BadLength,
    /// BTH TVer is not 0 (IBTA 9.2.1: packets with another transport version are dropped).
    BadVersion,
    /// The BTH opcode is not one of RC, UC, UD or CNP that this crate knows; the value is kept.
    UnknownOpcode(u8),
    /// The invariant CRC does not match (IBTA 7.8.1, Annex A17.3.3).
    BadIcrc,
    /// An IP header the ICRC cannot be computed over (IPv4 options, wrong version).
    BadIpHeader,
    /// A MAD whose common header is not what the reader takes: another base or class
    /// version, class or method (a CM MAD is version 1, class 0x07, ClassVersion 2, Send).
    BadMadHeader,
}

/// `core::result::Result` with the wire [`Error`].
pub type Result<T> = core::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated => f.write_str("truncated packet"),
            Error::BadLength => f.write_str("length or pad count inconsistent with the packet"),
            Error::BadVersion => f.write_str("BTH transport version is not 0"),
            Error::UnknownOpcode(op) => write!(f, "unknown BTH opcode {op:#04x}"),
            Error::BadIcrc => f.write_str("invariant CRC mismatch"),
            Error::BadIpHeader => f.write_str("IP header not usable for the ICRC"),
            Error::BadMadHeader => {
                f.write_str("MAD header is not a CM message's (base/class version, class, method)")
            }
        }
    }
}

impl core::error::Error for Error {}
