//! Big-endian field accessors and the macro that builds fixed-size header views.
//!
//! Every accessor takes a slice that starts at the field; callers guarantee the length
//! (views do so through `check_len`), so the fixed-size copies below cannot fail.

/// A big-endian integer field of a fixed width.
pub(crate) trait Field {
    /// The Rust type the field is read as.
    type Value: Copy;
    /// Reads the field from the first `LEN` bytes of `b`.
    fn get(b: &[u8]) -> Self::Value;
    /// Writes the field into the first `LEN` bytes of `b` (24-bit values are masked).
    fn set(b: &mut [u8], v: Self::Value);
}

macro_rules! be_field {
    ($name:ident, $ty:ty, $len:expr) => {
        /// Big-endian field marker.
        pub(crate) enum $name {}
        impl Field for $name {
            type Value = $ty;
            #[inline]
            fn get(b: &[u8]) -> $ty {
                let mut a = [0u8; $len];
                a.copy_from_slice(&b[..$len]);
                <$ty>::from_be_bytes(a)
            }
            #[inline]
            fn set(b: &mut [u8], v: $ty) {
                b[..$len].copy_from_slice(&v.to_be_bytes());
            }
        }
    };
}

be_field!(U8, u8, 1);
be_field!(U16, u16, 2);
be_field!(U32, u32, 4);
be_field!(U64, u64, 8);

/// A 24-bit big-endian field (QPN, PSN, MSN), read into the low bits of a `u32`.
pub(crate) enum U24 {}
impl Field for U24 {
    type Value = u32;
    #[inline]
    fn get(b: &[u8]) -> u32 {
        u32::from_be_bytes([0, b[0], b[1], b[2]])
    }
    #[inline]
    fn set(b: &mut [u8], v: u32) {
        let a = v.to_be_bytes();
        b[..3].copy_from_slice(&a[1..]);
    }
}

/// Bits `HI..=LO` of one byte (b7 is the most significant), read into the low bits of a `u8`;
/// setting it keeps the byte's other bits.
pub(crate) enum Bits8<const HI: u8, const LO: u8> {}
impl<const HI: u8, const LO: u8> Field for Bits8<HI, LO> {
    type Value = u8;
    #[inline]
    fn get(b: &[u8]) -> u8 {
        (b[0] >> LO) & (0xFF >> (7 - (HI - LO)))
    }
    #[inline]
    fn set(b: &mut [u8], v: u8) {
        let mask = (0xFFu8 >> (7 - (HI - LO))) << LO;
        b[0] = (b[0] & !mask) | ((v << LO) & mask);
    }
}

/// Bits `HI..=LO` of a big-endian 32-bit word (b31 most significant), read into the low bits
/// of a `u32`; setting it keeps the word's other bits.
pub(crate) enum Bits32<const HI: u8, const LO: u8> {}
impl<const HI: u8, const LO: u8> Field for Bits32<HI, LO> {
    type Value = u32;
    #[inline]
    fn get(b: &[u8]) -> u32 {
        (U32::get(b) >> LO) & (u32::MAX >> (31 - (HI - LO)))
    }
    #[inline]
    fn set(b: &mut [u8], v: u32) {
        let mask = (u32::MAX >> (31 - (HI - LO))) << LO;
        U32::set(b, (U32::get(b) & !mask) | ((v << LO) & mask));
    }
}

/// `N` raw bytes (a GID, an address), as an array.
pub(crate) enum Bytes<const N: usize> {}
impl<const N: usize> Field for Bytes<N> {
    type Value = [u8; N];
    #[inline]
    fn get(b: &[u8]) -> [u8; N] {
        let mut a = [0u8; N];
        a.copy_from_slice(&b[..N]);
        a
    }
    #[inline]
    fn set(b: &mut [u8], v: [u8; N]) {
        b[..N].copy_from_slice(&v);
    }
}

/// One field's value, as [`Repr::fields`](crate::bth::Repr) hands it to a decoder or a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValue<'a> {
    /// An integer field (or bit range).
    Int(u64),
    /// A byte-array field (a GID, an address).
    Bytes(&'a [u8]),
}

/// A value a header field holds, seen as a [`FieldValue`].
pub trait AsFieldValue {
    /// The value.
    fn as_field_value(&self) -> FieldValue<'_>;
}

macro_rules! int_field_value {
    ($($t:ty),*) => {$(
        impl AsFieldValue for $t {
            fn as_field_value(&self) -> FieldValue<'_> {
                FieldValue::Int(u64::from(*self))
            }
        }
    )*};
}
int_field_value!(u8, u16, u32, u64);

impl<const N: usize> AsFieldValue for [u8; N] {
    fn as_field_value(&self) -> FieldValue<'_> {
        FieldValue::Bytes(self)
    }
}

/// Defines `Packet<T>` (a checked view), `HEADER_LEN` and `Repr` for a header made only of
/// big-endian fields at fixed offsets (whole integers, bit ranges, byte arrays); reserved
/// bytes and bits are written as zero.
macro_rules! fixed_header {
    (
        name: $hname:literal;
        len: $len:expr;
        fields: { $( $(#[$fdoc:meta])* $field:ident, $setter:ident : $fty:ty as $vty:tt @ $off:expr ),* $(,)? }
    ) => {
        #[allow(unused_imports)]
        use crate::field::{Bits8, Bits32, Bytes, Field, U8, U16, U24, U32, U64};
        use crate::{Error, Result};

        #[doc = concat!("Length in bytes of the ", $hname, ".")]
        pub const HEADER_LEN: usize = $len;

        #[doc = concat!("A read/write view of a ", $hname, " at the start of a buffer.")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wraps a buffer without checking its length (for emitting into a sized buffer).
            pub const fn new_unchecked(buffer: T) -> Packet<T> {
                Packet { buffer }
            }

            /// Wraps an untrusted buffer, checking that the header fits.
            ///
            /// # Errors
            /// [`Error::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
            pub fn new_checked(buffer: T) -> Result<Packet<T>> {
                let p = Self::new_unchecked(buffer);
                p.check_len()?;
                Ok(p)
            }

            /// Checks that the buffer holds the whole header; after this no getter panics.
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

            $(
                $(#[$fdoc])*
                #[inline]
                pub fn $field(&self) -> $vty {
                    <$fty as Field>::get(&self.buffer.as_ref()[$off..])
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            $(
                #[doc = concat!("Sets the `", stringify!($field), "` field.")]
                #[inline]
                pub fn $setter(&mut self, value: $vty) {
                    <$fty as Field>::set(&mut self.buffer.as_mut()[$off..], value)
                }
            )*
        }

        #[doc = concat!("The parsed fields of a ", $hname, ".")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct Repr {
            $(
                $(#[$fdoc])*
                pub $field: $vty,
            )*
        }

        impl Repr {
            /// Reads the header from a checked view.
            ///
            /// # Errors
            /// [`Error::Truncated`] if the view is too short.
            pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
                packet.check_len()?;
                Ok(Repr { $( $field: packet.$field(), )* })
            }

            /// The number of bytes [`Repr::emit`] writes.
            pub const fn buffer_len(&self) -> usize {
                HEADER_LEN
            }

            /// Hands every field, by its IBTA name and in wire order, to `f` (what a decoder
            /// prints field by field).
            pub fn fields(&self, mut f: impl FnMut(&'static str, crate::field::FieldValue<'_>)) {
                $( f(stringify!($field), crate::field::AsFieldValue::as_field_value(&self.$field)); )*
            }

            /// Writes the header (reserved bits zero) into a buffer of at least
            /// [`HEADER_LEN`] bytes.
            pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
                packet.buffer.as_mut()[..HEADER_LEN].fill(0);
                $( packet.$setter(self.$field); )*
            }
        }
    };
}

/// The standard tests of a `fixed_header!` module: parse a byte vector, emit over a dirty
/// buffer to the exact bytes, reject truncation, and proptest round trip / never panic.
#[cfg(test)]
macro_rules! fixed_header_tests {
    (bytes: $bytes:expr, repr: $repr:expr, arb: $arb:expr $(,)?) => {
        mod standard {
            use super::super::*;
            use proptest::prelude::*;

            #[test]
            fn parse_vector() {
                let bytes: &[u8] = &$bytes;
                let p = Packet::new_checked(bytes).unwrap();
                assert_eq!(Repr::parse(&p), Ok($repr));
            }

            #[test]
            fn emit_vector_over_dirty_buffer() {
                let bytes: &[u8] = &$bytes;
                let mut buf = [0xa5u8; HEADER_LEN];
                let r: Repr = $repr;
                assert_eq!(r.buffer_len(), HEADER_LEN);
                r.emit(&mut Packet::new_unchecked(&mut buf[..]));
                assert_eq!(&buf[..], bytes);
            }

            #[test]
            fn truncated() {
                let bytes: &[u8] = &$bytes;
                assert_eq!(
                    Packet::new_checked(&bytes[..HEADER_LEN - 1]),
                    Err(crate::Error::Truncated)
                );
                assert_eq!(
                    Repr::parse(&Packet::new_unchecked(&bytes[..0])),
                    Err(crate::Error::Truncated)
                );
            }

            proptest! {
                #[test]
                fn roundtrip(r in $arb) {
                    let mut buf = [0u8; HEADER_LEN];
                    r.emit(&mut Packet::new_unchecked(&mut buf[..]));
                    prop_assert_eq!(Repr::parse(&Packet::new_unchecked(&buf[..])), Ok(r));
                }

                #[test]
                fn arbitrary_bytes_never_panic(
                    b in proptest::collection::vec(any::<u8>(), 0..2 * HEADER_LEN)
                ) {
                    if let Ok(p) = Packet::new_checked(&b[..]) {
                        let r = Repr::parse(&p).unwrap();
                        let mut out = [0u8; HEADER_LEN];
                        r.emit(&mut Packet::new_unchecked(&mut out[..]));
                        prop_assert_eq!(Repr::parse(&Packet::new_unchecked(&out[..])), Ok(r));
                    }
                }
            }
        }
    };
}

/// A connection-manager message (IBTA §12.6): a `fixed_header!` of its fields, then in the
/// MAD's 232 data bytes (after any info area the module reads itself) its private data area,
/// with the AttributeID and the sizes.
macro_rules! cm_message {
    (
        name: $hname:literal;
        attribute_id: $attr:expr;
        fields_len: $len:expr;
        private_data: $pdo:expr, $pd:expr;
        fields: { $($fields:tt)* }
    ) => {
        fixed_header! {
            name: $hname;
            len: $len;
            fields: { $($fields)* }
        }

        #[doc = concat!("The MAD AttributeID of a ", $hname, ".")]
        pub const ATTRIBUTE_ID: u16 = $attr;

        #[doc = concat!("Where a ", $hname, "'s private data starts in the CM data.")]
        pub const PRIVATE_DATA_OFFSET: usize = $pdo;

        #[doc = concat!("Bytes of private data a ", $hname, " carries (the whole area is always sent).")]
        pub const PRIVATE_DATA_LEN: usize = $pd;

        #[doc = concat!("Bytes of a whole ", $hname, ": the MAD's data.")]
        pub const MESSAGE_LEN: usize = crate::cm::CM_DATA_LEN;

        const _: () = assert!(PRIVATE_DATA_OFFSET + PRIVATE_DATA_LEN == MESSAGE_LEN);
        const _: () = assert!(HEADER_LEN <= PRIVATE_DATA_OFFSET);

        impl<T: AsRef<[u8]>> Packet<T> {
            /// The private data area (as much of it as the buffer holds; all of it after
            /// [`Packet::check_message_len`]).
            pub fn private_data(&self) -> &[u8] {
                let b = self.buffer.as_ref();
                &b[PRIVATE_DATA_OFFSET.min(b.len())..MESSAGE_LEN.min(b.len())]
            }

            /// Checks that the buffer holds the whole message, private data included.
            ///
            /// # Errors
            /// [`Error::Truncated`] if the buffer is shorter than [`MESSAGE_LEN`].
            pub fn check_message_len(&self) -> Result<()> {
                if self.buffer.as_ref().len() < MESSAGE_LEN {
                    Err(Error::Truncated)
                } else {
                    Ok(())
                }
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            /// Writes `data` at the start of the private data area and zeroes the rest of it.
            ///
            /// # Errors
            /// [`Error::BadLength`] if `data` is longer than [`PRIVATE_DATA_LEN`] (nothing is
            /// written), [`Error::Truncated`] if the buffer does not hold the whole message.
            pub fn set_private_data(&mut self, data: &[u8]) -> Result<()> {
                if data.len() > PRIVATE_DATA_LEN {
                    return Err(Error::BadLength);
                }
                let b = self.buffer.as_mut();
                if b.len() < MESSAGE_LEN {
                    return Err(Error::Truncated);
                }
                let area = &mut b[PRIVATE_DATA_OFFSET..MESSAGE_LEN];
                area.fill(0);
                area[..data.len()].copy_from_slice(data);
                Ok(())
            }
        }
    };
}
