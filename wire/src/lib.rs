//! RoCEv2 wire format for ferroce.
//!
//! This crate knows the bytes of the InfiniBand transport as carried in UDP datagrams to port
//! 4791 (IBTA Vol. 1 ch. 9 and Annex A17, "RoCEv2"): the Base Transport Header, its extension
//! headers, the opcode table, 24-bit packet sequence numbers and the invariant CRC.
//! It is `no_std`, allocates nothing and contains no `unsafe` code.
//!
//! # Two layers per header
//!
//! Every header has a zero-copy *view* (`BthPacket<T>`, `RethPacket<T>`, ...) over any
//! `AsRef<[u8]>` buffer with getters named after the IBTA/rxe fields and `set_*` setters, and a
//! plain *`Repr`* struct (`BthRepr`, `RethRepr`, ...) with `parse`, `buffer_len` and `emit`.
//! [`PacketRepr`] ties them together for a whole RoCEv2 UDP payload:
//! `BTH ‖ extension headers ‖ payload ‖ pad ‖ ICRC`.
//!
//! # Panic contract
//!
//! * Untrusted bytes go through `new_checked` (or `Repr::parse`, which calls it). Once
//!   `check_len` has succeeded, no accessor of that view can panic.
//! * `new_unchecked` is for emitting into a buffer the caller sized with `buffer_len()`; an
//!   accessor on a too-short unchecked buffer panics (a programming error, never a peer's).
//! * Unknown opcodes, syndromes and codes are values (`Opcode(0x15)`, `NakCode::Unknown(9)`),
//!   never panics.
//!
//! # Example
//!
//! ```
//! use ferroce_wire::{BthRepr, ExtHeaders, Opcode, PacketRepr, Psn};
//!
//! let repr = PacketRepr {
//!     bth: BthRepr::new(Opcode::RC_SEND_ONLY, 0x11, Psn::new(7)).with_ack_req(true),
//!     ext: ExtHeaders::default(),
//!     payload: b"hello",
//! }
//! .with_pad();
//! let mut buf = [0u8; 64];
//! let len = repr.buffer_len();
//! repr.emit(&mut buf[..len]);
//! let parsed = PacketRepr::parse(&buf[..len]).unwrap();
//! assert_eq!(parsed, repr);
//! ```
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![forbid(unsafe_code)]

#[macro_use]
mod field;

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cm;
pub mod cnp;
pub mod deth;
mod error;
pub mod feth;
pub mod grh;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod psn;
pub mod reth;
pub mod timer;
pub mod xrceth;

pub use aeth::{AckType, Credits, NakCode, Packet as AethPacket, Repr as AethRepr, Syndrome};
pub use atomic_ack_eth::{Packet as AtomicAckEthPacket, Repr as AtomicAckEthRepr};
pub use atomic_eth::{Packet as AtomicEthPacket, Repr as AtomicEthRepr};
pub use bth::{Packet as BthPacket, Repr as BthRepr};
pub use cnp::{Packet as CnpPacket, Repr as CnpRepr};
pub use deth::{Packet as DethPacket, Repr as DethRepr};
pub use error::{Error, Result};
pub use feth::{Packet as FethPacket, Repr as FethRepr};
pub use field::{AsFieldValue, FieldValue};
pub use grh::{GRH_LEN, Packet as GrhPacket, Repr as GrhRepr};
pub use icrc::ICRC_LEN;
pub use icrc::{IcrcContext, IpHeaders};
pub use ieth::{Packet as IethPacket, Repr as IethRepr};
pub use immdt::{Packet as ImmDtPacket, Repr as ImmDtRepr};
pub use mad::{MAD_LEN, Packet as MadPacket, Repr as MadRepr};
pub use opcode::{HeaderSet, Opcode, OpcodeInfo, Operation, Position, Transport};
pub use packet::{ExtHeaders, Packet, PacketRepr};
pub use psn::Psn;
pub use reth::{Packet as RethPacket, Repr as RethRepr};
pub use xrceth::{Packet as XrcEthPacket, Repr as XrcEthRepr};

/// The UDP destination port of RoCEv2 (IANA "roce", IBTA Annex A17.2.1).
pub const ROCE_UDP_PORT: u16 = 4791;

/// The default partition key, full membership (IBTA 10.9.1.2); rxe sends it on every packet.
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// The well-known Q_Key of the General Services QP, QP1 (IBTA 13.5.1.3).
pub const GSI_QKEY: u32 = 0x8001_0000;
