//! The body of a RoCEv2 Congestion Notification Packet (IBTA Annex A17.9.3): BTH opcode 0x81
//! followed by 16 reserved bytes, then the ICRC.
//!
//! A CNP's BTH carries the destination QP of the flow to slow down; rxe neither sends nor
//! accepts CNPs, ferroce decodes them.

use crate::{Error, Result};

/// Length in bytes of the reserved block after a CNP's BTH.
pub const HEADER_LEN: usize = 16;

/// A view of the 16 reserved bytes of a CNP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps an untrusted buffer, checking that the 16 bytes are there.
    ///
    /// # Errors
    /// [`Error::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the buffer holds the whole block.
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

    /// The reserved bytes (zero when sent; receivers ignore them).
    pub fn reserved(&self) -> [u8; HEADER_LEN] {
        let mut r = [0u8; HEADER_LEN];
        r.copy_from_slice(&self.buffer.as_ref()[..HEADER_LEN]);
        r
    }
}

/// The 16 reserved bytes of a CNP, kept so that a decoded CNP re-emits byte for byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// The reserved bytes as received; zero when ferroce builds a CNP.
    pub reserved: [u8; HEADER_LEN],
}

impl Repr {
    /// Reads the block.
    ///
    /// # Errors
    /// [`Error::Truncated`] if shorter than 16 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            reserved: packet.reserved(),
        })
    }

    /// The number of bytes [`Repr::emit`] writes: 16.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the block into a buffer of at least 16 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.buffer.as_mut()[..HEADER_LEN].copy_from_slice(&self.reserved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_truncation() {
        let r = Repr { reserved: [7; 16] };
        let mut buf = [0u8; 16];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()), Ok(r));
        assert_eq!(Packet::new_checked(&buf[..15]), Err(Error::Truncated));
        assert_eq!(Repr::default().reserved, [0; 16]);
    }
}
