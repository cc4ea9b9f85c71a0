//! The bytes of librdmacm's rsocket protocol (stream rsockets over an RC QP), as rdma-core's
//! rsockets put them on the wire, so that ferroce's rsockets and rdma-core's talk to each other:
//!
//! - the connection data in the REQ's and REP's private data ([`ConnData`], 40 bytes):
//!   version 1, flags, the receive credits (the receive queue's size), the target SGL buffer
//!   the peer writes receive-buffer grants into, and the first half of the receive buffer;
//! - each data transfer an RDMA WRITE WITH IMMEDIATE into the peer's current target SGE, its
//!   immediate data a [`Msg`]: 3 bits of operation, 29 of argument (the byte count);
//! - a grant of a receive-buffer half: an [`Sge`] RDMA-written into the peer's target SGL
//!   (in the writer's byte order), with the immediate data `SGL | (rseq_no + rq_size)`;
//! - control messages (disconnect, shutdown, keepalive) as zero-byte writes with immediate.

/// The protocol version in [`ConnData::version`].
pub const VERSION: u8 = 1;
/// [`ConnData::flags`]: the sender's host is big-endian (its SGL entries need swapping).
pub const CONN_FLAG_NET: u8 = 1 << 0;
/// [`ConnData::flags`]: the sender offers an iomap area behind its target SGL.
pub const CONN_FLAG_IOMAP: u8 = 1 << 1;
/// Entries of the target SGL each side offers.
pub const SGL_SIZE: u32 = 2;
/// Send-queue entries kept for control messages.
pub const QP_CTRL_SIZE: u32 = 4;
/// A send below this much room waits (and the smallest receive-buffer step).
pub const SNDLOWAT: u32 = 2048;
/// The largest single transfer.
pub const MAX_TRANSFER: u32 = 65536;
/// The first transfer size; each later one of a send doubles up to [`MAX_TRANSFER`].
pub const OLAP_START_SIZE: u32 = 2048;
/// Default send and receive queue sizes.
pub const DEFAULT_QP_SIZE: u32 = 384;
/// Default receive and send buffer sizes.
pub const DEFAULT_BUF: u32 = 1 << 17;
/// Default inline data of the QP.
pub const DEFAULT_INLINE: u32 = 64;
/// The length of [`ConnData`] on the wire.
pub const CONN_DATA_LEN: usize = 40;
/// The length of an [`Sge`] on the wire.
pub const SGE_LEN: usize = 16;
/// The length of an [`Iomap`] on the wire.
pub const IOMAP_LEN: usize = 24;

/// The operation of a message's immediate data (its top 3 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Data written into the target SGE; the argument is its length.
    Data,
    /// Reserved ("more data"), not sent.
    RsvdDataMore,
    /// A write into an iomap (local bookkeeping only; never carried as immediate data).
    Write,
    /// Reserved, not sent.
    RsvdDraMore,
    /// A receive-buffer grant written into the target SGL; the argument is the new credit
    /// limit (`rseq_no + rq_size`, 16 bits used).
    Sgl,
    /// Reserved.
    Rsvd,
    /// An iomap entry written; the argument is its index.
    IomapSgl,
    /// A control message; the argument is a [`Ctrl`].
    Ctrl,
}

/// A control message's argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ctrl {
    /// Both directions closed.
    Disconnect,
    /// Keepalive.
    Keepalive,
    /// The sender closed its sending side.
    Shutdown,
}

impl Ctrl {
    /// The argument value.
    pub const fn value(self) -> u32 {
        match self {
            Ctrl::Disconnect => 0,
            Ctrl::Keepalive => 1,
            Ctrl::Shutdown => 2,
        }
    }

    /// The control message of an argument, if known.
    pub const fn from_value(v: u32) -> Option<Ctrl> {
        match v {
            0 => Some(Ctrl::Disconnect),
            1 => Some(Ctrl::Keepalive),
            2 => Some(Ctrl::Shutdown),
            _ => None,
        }
    }
}

/// One message's immediate data: operation and 29-bit argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Msg {
    /// The operation.
    pub op: Op,
    /// Its argument (29 bits).
    pub data: u32,
}

impl Msg {
    /// A message.
    pub const fn new(op: Op, data: u32) -> Msg {
        Msg {
            op,
            data: data & 0x1FFF_FFFF,
        }
    }

    /// The immediate data (host order; verbs puts it on the wire big-endian).
    pub const fn imm(self) -> u32 {
        (self.op as u32) << 29 | self.data
    }

    /// The message of an immediate value.
    pub const fn from_imm(imm: u32) -> Msg {
        let op = match imm >> 29 {
            0 => Op::Data,
            1 => Op::RsvdDataMore,
            2 => Op::Write,
            3 => Op::RsvdDraMore,
            4 => Op::Sgl,
            5 => Op::Rsvd,
            6 => Op::IomapSgl,
            _ => Op::Ctrl,
        };
        Msg {
            op,
            data: imm & 0x1FFF_FFFF,
        }
    }
}

/// `struct rs_sge`: a buffer the peer may write: address, rkey, length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Its address in the owner's memory.
    pub addr: u64,
    /// The rkey that reaches it.
    pub key: u32,
    /// Bytes.
    pub length: u32,
}

impl Sge {
    /// The 16 bytes in big-endian order (connection data).
    pub fn to_be_bytes(self) -> [u8; SGE_LEN] {
        let mut b = [0u8; SGE_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.key.to_be_bytes());
        b[12..].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// From 16 big-endian bytes.
    pub fn from_be_bytes(b: &[u8; SGE_LEN]) -> Sge {
        let (a, k, l) = split(b);
        Sge {
            addr: u64::from_be_bytes(a),
            key: u32::from_be_bytes(k),
            length: u32::from_be_bytes(l),
        }
    }

    /// The 16 bytes as a little-endian host writes them into a peer's target SGL.
    pub fn to_le_bytes(self) -> [u8; SGE_LEN] {
        let mut b = [0u8; SGE_LEN];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.key.to_le_bytes());
        b[12..].copy_from_slice(&self.length.to_le_bytes());
        b
    }

    /// From 16 bytes a little-endian host wrote.
    pub fn from_le_bytes(b: &[u8; SGE_LEN]) -> Sge {
        let (a, k, l) = split(b);
        Sge {
            addr: u64::from_le_bytes(a),
            key: u32::from_le_bytes(k),
            length: u32::from_le_bytes(l),
        }
    }
}

/// `struct rs_iomap`: a region the peer mapped with `riomap` and this side may `riowrite`:
/// the offset the peer gave it, and where it lies in the peer's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Iomap {
    /// The first offset `riowrite` reaches it by.
    pub offset: u64,
    /// Its address, rkey and length in the peer's memory.
    pub sge: Sge,
}

impl Iomap {
    /// The 24 bytes as written into the peer's iomap area: in this (little-endian) host's
    /// order, or swapped when the peer is big-endian (`swap`), as rdma-core writes them.
    pub fn to_bytes(self, swap: bool) -> [u8; IOMAP_LEN] {
        let mut b = [0u8; IOMAP_LEN];
        if swap {
            b[..8].copy_from_slice(&self.offset.to_be_bytes());
            b[8..].copy_from_slice(&self.sge.to_be_bytes());
        } else {
            b[..8].copy_from_slice(&self.offset.to_le_bytes());
            b[8..].copy_from_slice(&self.sge.to_le_bytes());
        }
        b
    }

    /// From 24 bytes of this host's iomap area (a little-endian peer's, or a big-endian
    /// peer's that swapped them for this host).
    pub fn from_le_bytes(b: &[u8; IOMAP_LEN]) -> Iomap {
        let mut o = [0u8; 8];
        o.copy_from_slice(&b[..8]);
        let mut s = [0u8; SGE_LEN];
        s.copy_from_slice(&b[8..]);
        Iomap {
            offset: u64::from_le_bytes(o),
            sge: Sge::from_le_bytes(&s),
        }
    }
}

fn split(b: &[u8; SGE_LEN]) -> ([u8; 8], [u8; 4], [u8; 4]) {
    let mut a = [0u8; 8];
    let mut k = [0u8; 4];
    let mut l = [0u8; 4];
    a.copy_from_slice(&b[..8]);
    k.copy_from_slice(&b[8..12]);
    l.copy_from_slice(&b[12..]);
    (a, k, l)
}

/// `struct rs_conn_data`: what each side offers in its REQ or REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnData {
    /// [`VERSION`].
    pub version: u8,
    /// [`CONN_FLAG_NET`], [`CONN_FLAG_IOMAP`].
    pub flags: u8,
    /// The receive credits: the sender's receive queue size.
    pub credits: u16,
    /// The iomap area's size, as a scale (0: none).
    pub target_iomap_size: u8,
    /// The sender's target SGL ([`SGL_SIZE`] entries; `length` is the entry count).
    pub target_sgl: Sge,
    /// The first grant: half the sender's receive buffer.
    pub data_buf: Sge,
}

/// Why connection data was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnDataError {
    /// Fewer than [`CONN_DATA_LEN`] bytes.
    Short(usize),
    /// Another protocol version.
    Version(u8),
}

impl core::fmt::Display for ConnDataError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ConnDataError::Short(n) => write!(
                f,
                "rsocket connection data of {n} bytes, {CONN_DATA_LEN} needed"
            ),
            ConnDataError::Version(v) => {
                write!(f, "rsocket protocol version {v}, only {VERSION} is known")
            }
        }
    }
}

impl ConnData {
    /// The 40 bytes of the private data.
    pub fn to_bytes(&self) -> [u8; CONN_DATA_LEN] {
        let mut b = [0u8; CONN_DATA_LEN];
        b[0] = self.version;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        b[7] = self.target_iomap_size;
        b[8..24].copy_from_slice(&self.target_sgl.to_be_bytes());
        b[24..40].copy_from_slice(&self.data_buf.to_be_bytes());
        b
    }

    /// Parses the private data of a REQ or REP (longer data is the CM's padding).
    ///
    /// # Errors
    /// [`ConnDataError`] for short data or another version.
    pub fn parse(b: &[u8]) -> Result<ConnData, ConnDataError> {
        let Some(b) = b.get(..CONN_DATA_LEN) else {
            return Err(ConnDataError::Short(b.len()));
        };
        if b[0] != VERSION {
            return Err(ConnDataError::Version(b[0]));
        }
        let sge = |at: usize| {
            let mut s = [0u8; SGE_LEN];
            s.copy_from_slice(&b[at..at + SGE_LEN]);
            Sge::from_be_bytes(&s)
        };
        Ok(ConnData {
            version: b[0],
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_iomap_size: b[7],
            target_sgl: sge(8),
            data_buf: sge(24),
        })
    }
}

/// rsockets' "scale" of a size in `bits` bits (what `target_iomap_size` carries): the value
/// itself up to `2^(bits-1)`, above it the top bit set and the value shifted down by `bits`.
pub const fn value_to_scale(value: u32, bits: u32) -> u32 {
    if value <= 1 << (bits - 1) {
        value
    } else {
        (1 << (bits - 1)) | (value >> bits)
    }
}

/// The size a scale stands for.
pub const fn scale_to_value(value: u32, bits: u32) -> u32 {
    if value <= 1 << (bits - 1) {
        value
    } else {
        (value & !(1 << (bits - 1))) << bits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediate_data_is_op_and_argument() {
        let m = Msg::new(Op::Data, 4096);
        assert_eq!(m.imm(), 4096);
        assert_eq!(Msg::new(Op::Sgl, 0x1_0180).imm(), 0x8001_0180);
        assert_eq!(
            Msg::new(Op::Ctrl, Ctrl::Shutdown.value()).imm(),
            0xE000_0002
        );
        for imm in [0u32, 1, 0x1FFF_FFFF, 0x2000_0000, 0x8000_0005, 0xFFFF_FFFF] {
            assert_eq!(Msg::from_imm(imm).imm(), imm);
        }
        assert_eq!(Msg::from_imm(0xE000_0000).op, Op::Ctrl);
        assert_eq!(Ctrl::from_value(0), Some(Ctrl::Disconnect));
        assert_eq!(Ctrl::from_value(9), None);
    }

    #[test]
    fn connection_data_bytes() {
        let c = ConnData {
            version: VERSION,
            flags: CONN_FLAG_IOMAP,
            credits: 384,
            target_iomap_size: 0,
            target_sgl: Sge {
                addr: 0x7f00_1122_3344,
                key: 0xabcd_0001,
                length: SGL_SIZE,
            },
            data_buf: Sge {
                addr: 0x7f00_5566_7788,
                key: 0xabcd_0002,
                length: 65536,
            },
        };
        let b = c.to_bytes();
        assert_eq!(
            b,
            [
                1, 2, 0x01, 0x80, 0, 0, 0, 0, // version, flags, credits, reserved, iomap size
                0, 0, 0x7f, 0, 0x11, 0x22, 0x33, 0x44, 0xab, 0xcd, 0, 1, 0, 0, 0,
                2, // target SGL
                0, 0, 0x7f, 0, 0x55, 0x66, 0x77, 0x88, 0xab, 0xcd, 0, 2, 0, 1, 0,
                0, // data buffer
            ]
        );
        assert_eq!(ConnData::parse(&b), Ok(c));
        // The CM pads private data: longer is fine, shorter and other versions are not.
        let mut long = b.to_vec();
        long.extend_from_slice(&[0; 16]);
        assert_eq!(ConnData::parse(&long), Ok(c));
        assert_eq!(ConnData::parse(&b[..39]), Err(ConnDataError::Short(39)));
        let mut v2 = b;
        v2[0] = 2;
        assert_eq!(ConnData::parse(&v2), Err(ConnDataError::Version(2)));
    }

    #[test]
    fn sges_both_byte_orders() {
        let s = Sge {
            addr: 0x0102_0304_0506_0708,
            key: 0x1112_1314,
            length: 0x2122_2324,
        };
        assert_eq!(Sge::from_le_bytes(&s.to_le_bytes()), s);
        assert_eq!(Sge::from_be_bytes(&s.to_be_bytes()), s);
        assert_eq!(s.to_le_bytes()[0], 0x08);
        assert_eq!(s.to_be_bytes()[0], 0x01);
    }

    #[test]
    fn iomap_entry_bytes() {
        let m = Iomap {
            offset: 0x1000,
            sge: Sge {
                addr: 0x7f00_0000_2000,
                key: 0x1234,
                length: 64,
            },
        };
        let le = m.to_bytes(false);
        assert_eq!(
            le,
            [
                0x00, 0x10, 0, 0, 0, 0, 0, 0, // offset
                0x00, 0x20, 0, 0, 0x00, 0x7f, 0, 0, // addr
                0x34, 0x12, 0, 0, // key
                64, 0, 0, 0, // length
            ]
        );
        assert_eq!(Iomap::from_le_bytes(&le), m);
        assert_eq!(m.to_bytes(true)[..8], [0, 0, 0, 0, 0, 0, 0x10, 0]);
    }

    #[test]
    fn scales() {
        for v in [0u32, 1, 127, 128] {
            assert_eq!(value_to_scale(v, 8), v);
            assert_eq!(scale_to_value(v, 8), v);
        }
        // Above 128: the top bit and the value / 256.
        assert_eq!(value_to_scale(4096, 8), 0x80 | 16);
        assert_eq!(scale_to_value(0x80 | 16, 8), 4096);
    }
}
