//! Classic pcap files (the libpcap format, `tcpdump -w`): a reader that never panics on bad
//! input and a writer, for `ferroce pcap` and for recording traffic (`FERROCE_PCAP`), and the
//! Ethernet framing recordings put around each datagram ([`encapsulate`]).

pub use crate::encap::encapsulate;

use std::fmt;
use std::io::{self, Read, Write};
use std::time::Duration;

/// Link type 1: Ethernet.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Link type 101: raw IPv4/IPv6 with no link header.
pub const LINKTYPE_RAW: u32 = 101;
/// Link type 113: Linux "cooked" capture (SLL, `tcpdump -i any`).
pub const LINKTYPE_LINUX_SLL: u32 = 113;

/// The largest record ferroce accepts; anything bigger is a corrupt file, not a packet.
const MAX_RECORD: u32 = 256 * 1024;

/// Why a pcap file could not be read.
#[derive(Debug)]
#[non_exhaustive]
pub enum PcapError {
    /// Reading the file failed.
    Io(io::Error),
    /// The file does not start with a pcap magic number.
    BadMagic(u32),
    /// The file is pcapng, which ferroce does not read.
    Pcapng,
    /// The file ends inside the global header or a record.
    Truncated {
        /// 1-based record number (0 for the global header).
        record: u64,
    },
    /// A record claims an impossible length.
    BadRecordLength {
        /// 1-based record number.
        record: u64,
        /// The captured length it claims.
        len: u32,
    },
}

impl fmt::Display for PcapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PcapError::Io(e) => write!(f, "read error: {e}"),
            PcapError::BadMagic(m) => write!(f, "not a pcap file (magic {m:#010x})"),
            PcapError::Pcapng => {
                f.write_str("pcapng is not supported; convert it with: editcap -F pcap IN OUT")
            }
            PcapError::Truncated { record: 0 } => f.write_str("truncated pcap global header"),
            PcapError::Truncated { record } => write!(f, "file ends inside record {record}"),
            PcapError::BadRecordLength { record, len } => {
                write!(
                    f,
                    "record {record} claims an impossible length of {len} bytes"
                )
            }
        }
    }
}

impl std::error::Error for PcapError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PcapError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// One captured packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Capture time since the Unix epoch.
    pub timestamp: Duration,
    /// Length of the packet on the wire (may exceed `data.len()` if the capture was cut).
    pub orig_len: u32,
    /// The captured bytes, starting with the link-layer header.
    pub data: Vec<u8>,
}

/// A reader of classic pcap files, microsecond or nanosecond, either byte order.
#[derive(Debug)]
pub struct Reader<R: Read> {
    inner: R,
    big_endian: bool,
    nanos: bool,
    link_type: u32,
    record: u64,
}

impl<R: Read> Reader<R> {
    /// Reads the global header.
    ///
    /// # Errors
    /// [`PcapError`] for a file that is not classic pcap or ends early.
    pub fn new(mut inner: R) -> Result<Self, PcapError> {
        let mut h = [0u8; 24];
        if !read_full(&mut inner, &mut h)? {
            return Err(PcapError::Truncated { record: 0 });
        }
        let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let (big_endian, nanos) = match magic {
            0xA1B2_C3D4 => (false, false),
            0xA1B2_3C4D => (false, true),
            0xD4C3_B2A1 => (true, false),
            0x4D3C_B2A1 => (true, true),
            0x0A0D_0D0A => return Err(PcapError::Pcapng),
            m => return Err(PcapError::BadMagic(m)),
        };
        let word = |b: &[u8]| {
            let a = [b[0], b[1], b[2], b[3]];
            if big_endian {
                u32::from_be_bytes(a)
            } else {
                u32::from_le_bytes(a)
            }
        };
        Ok(Reader {
            big_endian,
            nanos,
            link_type: word(&h[20..24]) & 0x0FFF_FFFF,
            inner,
            record: 0,
        })
    }

    /// The link type of every record (see the `LINKTYPE_*` constants).
    pub fn link_type(&self) -> u32 {
        self.link_type
    }

    /// Reads the next record; `Ok(None)` at a clean end of file.
    ///
    /// # Errors
    /// [`PcapError`] for a record that ends early or claims an impossible length.
    pub fn next_record(&mut self) -> Result<Option<Record>, PcapError> {
        let mut h = [0u8; 16];
        self.record += 1;
        let record = self.record;
        match read_exact_or_eof(&mut self.inner, &mut h)? {
            Fill::Empty => return Ok(None),
            Fill::Partial => return Err(PcapError::Truncated { record }),
            Fill::Full => {}
        }
        let w = |i: usize| {
            let a = [h[i], h[i + 1], h[i + 2], h[i + 3]];
            if self.big_endian {
                u32::from_be_bytes(a)
            } else {
                u32::from_le_bytes(a)
            }
        };
        let (sec, frac, incl, orig) = (w(0), w(4), w(8), w(12));
        if incl > MAX_RECORD {
            return Err(PcapError::BadRecordLength { record, len: incl });
        }
        let mut data = vec![0u8; incl as usize];
        if !read_full(&mut self.inner, &mut data)? {
            return Err(PcapError::Truncated { record });
        }
        let nanos = if self.nanos {
            frac
        } else {
            frac.saturating_mul(1000)
        };
        Ok(Some(Record {
            timestamp: Duration::new(u64::from(sec), 0) + Duration::from_nanos(u64::from(nanos)),
            orig_len: orig,
            data,
        }))
    }
}

impl<R: Read> Iterator for Reader<R> {
    type Item = Result<Record, PcapError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

enum Fill {
    Empty,
    Partial,
    Full,
}

fn read_exact_or_eof<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<Fill, PcapError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(PcapError::Io(e)),
        }
    }
    Ok(match got {
        0 => Fill::Empty,
        n if n == buf.len() => Fill::Full,
        _ => Fill::Partial,
    })
}

fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<bool, PcapError> {
    Ok(buf.is_empty() || matches!(read_exact_or_eof(r, buf)?, Fill::Full))
}

/// A writer of classic little-endian, nanosecond-resolution pcap files.
#[derive(Debug)]
pub struct Writer<W: Write> {
    inner: W,
}

impl<W: Write> Writer<W> {
    /// Writes the global header for the given link type.
    ///
    /// # Errors
    /// The underlying writer's error.
    pub fn new(mut inner: W, link_type: u32) -> io::Result<Self> {
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xA1B2_3C4Du32.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&MAX_RECORD.to_le_bytes());
        h.extend_from_slice(&link_type.to_le_bytes());
        inner.write_all(&h)?;
        Ok(Writer { inner })
    }

    /// Appends one record.
    ///
    /// # Errors
    /// `InvalidInput` for a record over 256 KiB, or the underlying writer's error.
    pub fn write_record(&mut self, timestamp: Duration, data: &[u8]) -> io::Result<()> {
        let len = u32::try_from(data.len())
            .ok()
            .filter(|&l| l <= MAX_RECORD)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pcap record too large"))?;
        let sec = u32::try_from(timestamp.as_secs()).unwrap_or(u32::MAX);
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&sec.to_le_bytes());
        h[4..8].copy_from_slice(&timestamp.subsec_nanos().to_le_bytes());
        h[8..12].copy_from_slice(&len.to_le_bytes());
        h[12..16].copy_from_slice(&len.to_le_bytes());
        self.inner.write_all(&h)?;
        self.inner.write_all(data)
    }

    /// The underlying writer.
    pub fn inner_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// Flushes and returns the underlying writer.
    ///
    /// # Errors
    /// The underlying writer's error.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.inner.flush()?;
        Ok(self.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read() {
        let mut w = Writer::new(Vec::new(), LINKTYPE_ETHERNET).unwrap();
        w.write_record(Duration::new(5, 123_456_789), &[1, 2, 3])
            .unwrap();
        w.write_record(Duration::new(6, 0), &[]).unwrap();
        let bytes = w.into_inner().unwrap();
        let mut r = Reader::new(&bytes[..]).unwrap();
        assert_eq!(r.link_type(), LINKTYPE_ETHERNET);
        let a = r.next_record().unwrap().unwrap();
        assert_eq!(a.timestamp, Duration::new(5, 123_456_789));
        assert_eq!(a.data, vec![1, 2, 3]);
        assert_eq!(r.next_record().unwrap().unwrap().data, Vec::<u8>::new());
        assert!(r.next_record().unwrap().is_none());
    }

    #[test]
    fn microsecond_big_endian() {
        let mut f = vec![0xA1, 0xB2, 0xC3, 0xD4, 0, 2, 0, 4];
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&65535u32.to_be_bytes());
        f.extend_from_slice(&1u32.to_be_bytes());
        f.extend_from_slice(&7u32.to_be_bytes());
        f.extend_from_slice(&250_000u32.to_be_bytes());
        f.extend_from_slice(&2u32.to_be_bytes());
        f.extend_from_slice(&60u32.to_be_bytes());
        f.extend_from_slice(&[9, 9]);
        let recs: Vec<_> = Reader::new(&f[..])
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].timestamp, Duration::from_millis(7250));
        assert_eq!(recs[0].orig_len, 60);
    }

    #[test]
    fn bad_files_are_errors_not_panics() {
        assert!(matches!(
            Reader::new(&[][..]),
            Err(PcapError::Truncated { record: 0 })
        ));
        assert!(matches!(
            Reader::new(&[0u8; 24][..]),
            Err(PcapError::BadMagic(0))
        ));
        let ng = [
            0x0A, 0x0D, 0x0D, 0x0A, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert!(matches!(Reader::new(&ng[..]), Err(PcapError::Pcapng)));
        let mut w = Writer::new(Vec::new(), LINKTYPE_ETHERNET).unwrap();
        w.write_record(Duration::ZERO, &[1, 2, 3, 4]).unwrap();
        let good = w.into_inner().unwrap();
        // Cut inside the record header and inside the data.
        for cut in [good.len() - 4, 24 + 10] {
            let mut r = Reader::new(&good[..cut]).unwrap();
            assert!(
                matches!(r.next_record(), Err(PcapError::Truncated { record: 1 })),
                "cut {cut}"
            );
        }
        let mut huge = good.clone();
        huge[24 + 8..24 + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut r = Reader::new(&huge[..]).unwrap();
        assert!(matches!(
            r.next_record(),
            Err(PcapError::BadRecordLength { record: 1, .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
            if let Ok(r) = Reader::new(&b[..]) {
                for rec in r.take(100) {
                    if rec.is_err() {
                        break;
                    }
                }
            }
        }
    }
}
