//! Batched UDP send and receive: `sendmmsg` of datagrams and of `UDP_SEGMENT` trains, and
//! `recvmmsg` with `UDP_GRO`.
//!
//! # Trains
//! With segmentation on, [`SendBatch::flush`] sends each run of consecutive datagrams of one
//! length to one destination (a shorter last one allowed) as one message whose `UDP_SEGMENT`
//! control message tells the kernel where to cut it: one trip through the stack instead of
//! one per datagram. From an unconnected socket with DF set, Linux numbers segment `k` of
//! every message with IPv4 ID `k`; for RoCEv2 the ICRC covers that ID, so segment `k`'s ICRC,
//! computed by the engine for ID 0, is corrected for ID `k` (linear in the ID: no CRC is
//! recomputed, see [`ferroce_wire::icrc::Ipv4IdentDelta`]). A kernel or device that refuses
//! trains turns them off for the batch, and the datagrams go plain.
//!
//! # An ACK behind the answer
//! A ping-pong's answer leaves with the bare ACK held for it (`shard`). Queued in that order
//! they are two datagrams, each a trip through the stack, and over loopback the second costs
//! the whole round trip as much again (a UDP ping-pong of two datagrams a way: 5.4 µs one way
//! against 3.0 for one and 3.25 for a train of two, this host). To one QP on a loopback
//! address the ACKs go behind the requests instead, as one train, which the peer's `UDP_GRO`
//! socket reads whole; its receiver hands the ACKs on first ([`RecvBatch::acks_at`]), so the
//! peer's send completes before its receive of the answer, as when a NIC ACKs before the
//! program answers. Elsewhere a network may deliver a train's segments apart, so nothing moves.
//!
//! # Coalesced reads
//! With `UDP_GRO` on the socket, one read may return a train: `gso_size`-byte segments back to
//! back (the last may be shorter). [`RecvBatch::segments`] yields them with their index, the
//! IPv4 ID a ferroce sender's segment `j` carries.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::time::Duration;

use ferroce_wire::Opcode;
use ferroce_wire::icrc::Ipv4IdentDelta;

use crate::sys::{poll_fds, setsockopt_int, sockaddr_from, sockaddr_into};

/// `UDP_SEGMENT` (linux/udp.h): the segment size of a send.
const UDP_SEGMENT: i32 = 103;
/// `UDP_GRO` (linux/udp.h): coalesced receive, and the control message giving the segment size.
const UDP_GRO: i32 = 104;
/// Segments per train tried first: `UDP_MAX_SEGMENTS` is 128 on recent kernels (6.18 here;
/// small messages move 2–6× faster in 128-segment trains than in 16–32, perf-facts §2).
pub const MAX_SEGMENTS: usize = 128;
/// Segments per train where a kernel refuses [`MAX_SEGMENTS`]: `UDP_MAX_SEGMENTS` was 64
/// before (Debian 12's 6.1), and 64 holds everywhere.
pub const FALLBACK_SEGMENTS: usize = 64;
/// Bytes per train: the largest IPv4 UDP payload.
pub const MAX_TRAIN_BYTES: usize = 65_507;
/// Bytes queued from which a [`SendBatch`] counts as full: two whole trains of 4 KiB packets
/// (15 each, the most [`MAX_TRAIN_BYTES`] takes, of 4112 bytes or, with a RETH, 4128). At 32
/// packets, as before, every batch of a WRITE stream ended in a train of two.
pub const FULL_BYTES: usize = 30 * 4112;
/// A receive slot that holds a whole coalesced read.
pub const GRO_SLOT: usize = 65_536;

/// What [`SendBatch::flush`] does with runs of equal datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segmentation {
    /// Every datagram its own message.
    Off,
    /// Runs go as `UDP_SEGMENT` trains; the bytes are sent as they are.
    Udp,
    /// Runs go as trains of RoCEv2 packets: over IPv4, segment `k`'s ICRC is corrected for the
    /// IPv4 ID `k` the kernel gives it.
    RoceV2,
}

/// Turns `UDP_GRO` on for a socket.
///
/// # Errors
/// As `setsockopt` (a kernel before 5.0 has no `UDP_GRO`).
pub fn enable_gro(fd: RawFd) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_UDP, UDP_GRO, 1)
}

/// Marks every datagram the socket sends ECN-capable, ECT(0) (`IP_TOS`/`IPV6_TCLASS` = 2),
/// and asks for each received datagram's TOS or traffic class (`IP_RECVTOS`/
/// `IPV6_RECVTCLASS`), whose ECN bits say whether a queue on the path marked it CE.
///
/// # Errors
/// As `setsockopt`.
pub fn enable_ecn(fd: RawFd, v6: bool) -> io::Result<()> {
    if v6 {
        setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_TCLASS, 2)?;
    } else {
        setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_TOS, 2)?;
    }
    enable_recv_tos(fd, v6)
}

/// Asks for each received datagram's TOS (`IP_RECVTOS`) or traffic class
/// (`IPV6_RECVTCLASS`): [`RecvBatch::tos`].
///
/// # Errors
/// As `setsockopt`.
pub fn enable_recv_tos(fd: RawFd, v6: bool) -> io::Result<()> {
    if v6 {
        setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)
    } else {
        setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)
    }
}

/// One control message carrying a `u16` (`UDP_SEGMENT`) or an `i32` (`UDP_GRO`), laid out as
/// `CMSG_SPACE(4)`: the header, then the data at `CMSG_DATA`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Cmsg {
    hdr: libc::cmsghdr,
    data: [u8; 8],
}

const _: () = assert!(size_of::<libc::cmsghdr>() % size_of::<usize>() == 0);

impl Cmsg {
    fn empty() -> Cmsg {
        // SAFETY: all-zero is a valid cmsghdr (plain integers) and byte array.
        unsafe { zeroed() }
    }

    fn segment(size: u16) -> Cmsg {
        let mut c = Cmsg::empty();
        c.hdr.cmsg_level = libc::SOL_UDP;
        c.hdr.cmsg_type = UDP_SEGMENT;
        // CMSG_LEN(2): the header (already aligned) and the data.
        c.hdr.cmsg_len = (size_of::<libc::cmsghdr>() + size_of::<u16>()) as _;
        c.data[..2].copy_from_slice(&size.to_ne_bytes());
        c
    }

    /// `CMSG_SPACE(2)`: what `msg_controllen` covers for one [`Cmsg::segment`].
    const SEGMENT_SPACE: usize = size_of::<libc::cmsghdr>() + size_of::<usize>();
}

/// The control area of one receive slot: room for `UDP_GRO`'s segment size and the IP
/// header's TOS (`IP_RECVTOS`) or traffic class (`IPV6_RECVTCLASS`), each `CMSG_SPACE(4)`
/// or less, aligned as `cmsghdr` is.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct RecvCtrl([u8; 64]);

/// Buffers for batched receive: `n` slots of `size` bytes.
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    addrs: Vec<libc::sockaddr_storage>,
    ctrl: Vec<RecvCtrl>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers inside the headers point into the batch's own vectors and are only used by the thread that owns the batch.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    /// `n` receive slots of `size` bytes each ([`GRO_SLOT`] for a socket with `UDP_GRO`).
    pub fn new(n: usize, size: usize) -> RecvBatch {
        let mut b = RecvBatch {
            bufs: (0..n).map(|_| vec![0u8; size]).collect(),
            // SAFETY: all-zero is a valid sockaddr_storage.
            addrs: (0..n).map(|_| unsafe { zeroed() }).collect(),
            ctrl: vec![RecvCtrl([0; 64]); n],
            iovs: Vec::with_capacity(n),
            hdrs: Vec::with_capacity(n),
        };
        // The headers and iovecs are laid out once: they point into the heap buffers of the
        // vectors above, which never grow or move (a move of the batch moves only the
        // vectors' handles). Each `recv` resets only what the kernel writes back.
        for buf in &mut b.bufs {
            b.iovs.push(libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            });
        }
        for i in 0..n {
            // SAFETY: all-zero is a valid mmsghdr; the fields set next point at live buffers.
            let mut h: libc::mmsghdr = unsafe { zeroed() };
            h.msg_hdr.msg_name = (&raw mut b.addrs[i]).cast();
            h.msg_hdr.msg_iov = &raw mut b.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = (&raw mut b.ctrl[i]).cast();
            b.hdrs.push(h);
        }
        b
    }

    /// `recvmmsg` without blocking; returns how many reads arrived (0 if none). A read is a
    /// datagram, or a train with `UDP_GRO`.
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        self.recv_upto(fd, self.bufs.len())
    }

    /// As [`RecvBatch::recv`], into the first `max` slots at most (at least one). After the
    /// first read the kernel tries each further slot on the socket's queue, an attempt that
    /// costs about as much as reading when the queue is empty: one slot takes a lone
    /// datagram (or a lone train) without it.
    pub fn recv_upto(&mut self, fd: RawFd, max: usize) -> io::Result<usize> {
        let n = max.clamp(1, self.bufs.len());
        for h in &mut self.hdrs[..n] {
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = size_of::<RecvCtrl>() as _;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        // The system call itself, not glibc's wrapper: the wrapper makes it a cancellation
        // point (two calls into the thread library per receive) and Rust never cancels threads.
        // SAFETY: `hdrs` holds `n` headers whose name, iovec and control pointers point into the heap buffers of `self.addrs`, `self.iovs`, `self.bufs` and `self.ctrl` (set up in `new`, never reallocated), all alive and unaliased for the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_recvmmsg,
                fd,
                self.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock {
                Ok(0)
            } else {
                Err(e)
            };
        }
        Ok(r as usize)
    }

    /// Read `i` of the last `recv` whole: its source and bytes (a train's segments back to
    /// back).
    pub fn get(&self, i: usize) -> Option<(SocketAddr, &[u8])> {
        let len = self.hdrs.get(i)?.msg_len as usize;
        let from = sockaddr_from(&self.addrs[i])?;
        Some((from, &self.bufs[i][..len]))
    }

    /// The control messages of read `i`: (level, type, data), walked as `CMSG_NXTHDR` does
    /// over the bytes the kernel wrote (none if it truncated them).
    fn cmsgs(&self, i: usize) -> impl Iterator<Item = (i32, i32, &[u8])> {
        const HDR: usize = size_of::<libc::cmsghdr>();
        let (len, area) = match self.hdrs.get(i) {
            Some(h) if h.msg_hdr.msg_flags & libc::MSG_CTRUNC == 0 => {
                (h.msg_hdr.msg_controllen as _, &self.ctrl[i].0[..])
            }
            _ => (0, &self.ctrl[0].0[..0]),
        };
        let area = &area[..len.min(area.len())];
        let mut at = 0usize;
        std::iter::from_fn(move || {
            let hdr = area.get(at..at + HDR)?;
            let clen = usize::from_ne_bytes(hdr[..size_of::<usize>()].try_into().ok()?);
            let level = i32::from_ne_bytes(hdr[HDR - 8..HDR - 4].try_into().ok()?);
            let kind = i32::from_ne_bytes(hdr[HDR - 4..HDR].try_into().ok()?);
            let data = area.get(at + HDR..at + clen.max(HDR))?;
            // CMSG_ALIGN: the next header starts at the next multiple of the word size.
            at += clen.max(HDR).next_multiple_of(size_of::<usize>());
            Some((level, kind, data))
        })
    }

    /// The segment size of read `i` if the kernel coalesced it (`UDP_GRO`), else `None`.
    pub fn segment_size(&self, i: usize) -> Option<usize> {
        self.cmsgs(i)
            .find(|&(level, kind, _)| level == libc::SOL_UDP && kind == UDP_GRO)
            .and_then(|(_, _, d)| Some(i32::from_ne_bytes(d.get(..4)?.try_into().ok()?)))
            .and_then(|v| usize::try_from(v).ok())
            .filter(|&s| s > 0)
    }

    /// The IPv4 TOS or IPv6 traffic class byte of read `i` (its low two bits are the ECN
    /// field), if the socket asked for it ([`enable_recv_tos`]).
    pub fn tos(&self, i: usize) -> Option<u8> {
        self.cmsgs(i)
            .find_map(|(level, kind, d)| match (level, kind) {
                // IP_TOS arrives as one byte.
                (libc::IPPROTO_IP, libc::IP_TOS) => d.first().copied(),
                // IPV6_TCLASS as an int.
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                    Some(i32::from_ne_bytes(d.get(..4)?.try_into().ok()?) as u8)
                }
                _ => None,
            })
    }

    /// Where read `i`'s bare ACKs start when it is a train of requests followed by bare ACKs
    /// (a ferroce peer's answer with the ACK it held for it, which [`SendBatch::flush`] puts
    /// behind it to loopback): the index of its first ACK, which the receiver
    /// hands on first. 0 for any other read, whose segments go in order. The two kinds
    /// acknowledge and carry PSNs of the two directions of the QP, so neither's order among
    /// its own kind changes.
    pub fn acks_at(&self, i: usize) -> usize {
        let (Some(size), Some((_, bytes))) = (self.segment_size(i), self.get(i)) else {
            return 0;
        };
        // Most trains carry no ACK at their end: one look at the last segment tells.
        let last = bytes.len().saturating_sub(1) / size.max(1) * size;
        if bytes.len() <= size || !bytes.get(last).is_some_and(|&op| is_bare_ack(op)) {
            return 0;
        }
        let mut first_ack = None;
        for (k, seg) in bytes.chunks(size).enumerate() {
            let op = seg[0];
            if is_bare_ack(op) {
                first_ack.get_or_insert(k);
            } else if first_ack.is_some() || !Opcode(op).is_request() {
                return 0;
            }
        }
        first_ack.unwrap_or(0)
    }

    /// The datagrams of read `i`: each segment with its index in the train (0 for a plain
    /// datagram).
    pub fn segments(&self, i: usize) -> Segments<'_> {
        let (from, bytes) = match self.get(i) {
            Some(got) => got,
            None => (SocketAddr::from(([0, 0, 0, 0], 0)), &[][..]),
        };
        let size = self.segment_size(i).unwrap_or(bytes.len().max(1));
        Segments {
            from,
            rest: bytes,
            size,
            index: 0,
        }
    }
}

/// Whether `op` is a bare acknowledgement: an RC or XRC ACKNOWLEDGE (an ACK or a NAK).
pub(crate) fn is_bare_ack(op: u8) -> bool {
    op == Opcode::RC_ACKNOWLEDGE.0 || op == Opcode::XRC_ACKNOWLEDGE.0
}

/// A packet's BTH DestQP (bytes 5..8), if it is long enough to have one.
fn dest_qp(packet: &[u8]) -> Option<&[u8]> {
    packet.get(5..8)
}

/// The segments of one read, in order: (source, bytes, index in the train).
#[derive(Clone)]
pub struct Segments<'a> {
    from: SocketAddr,
    rest: &'a [u8],
    size: usize,
    index: u16,
}

impl<'a> Iterator for Segments<'a> {
    type Item = (SocketAddr, &'a [u8], u16);

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let (seg, rest) = self.rest.split_at(self.size.min(self.rest.len()));
        self.rest = rest;
        let index = self.index;
        self.index = self.index.wrapping_add(1);
        Some((self.from, seg, index))
    }
}

/// One message of a flush: datagrams `first..first + count` of the batch.
#[derive(Clone, Copy)]
struct Run {
    first: usize,
    count: usize,
    /// The ICRCs of segments 1.. were corrected for their IPv4 IDs.
    rewritten: bool,
}

/// Datagrams queued for one `sendmmsg`. Every buffer, address and header is allocated once,
/// here: sending allocates nothing.
pub struct SendBatch {
    pub(crate) bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    dests: Vec<SocketAddr>,
    count: usize,
    segmentation: Segmentation,
    /// The ICRC deltas of the last train length (trains are mostly one length).
    deltas: Option<(usize, Ipv4IdentDelta)>,
    addrs: Vec<libc::sockaddr_storage>,
    ctrl: Vec<Cmsg>,
    runs: Vec<Run>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// `sendmmsg` calls made and trains sent, since the last [`SendBatch::take_counts`].
    counts: (u64, u64, u64),
    /// Bytes of the datagrams queued.
    bytes: usize,
    /// Segments per train: [`MAX_SEGMENTS`] until the kernel refuses a train longer than
    /// [`FALLBACK_SEGMENTS`], then that.
    max_segments: usize,
    /// The address the batch's socket is bound to, if it is not a loopback one
    /// ([`SendBatch::set_own_address`]).
    own: Option<IpAddr>,
}

// SAFETY: the raw pointers inside `iovs` and `hdrs` point into the batch's own vectors, are rebuilt before every use and are only used by the thread that owns the batch.
unsafe impl Send for SendBatch {}

impl SendBatch {
    /// Room for `n` datagrams of up to `size` bytes, segmentation off.
    pub fn new(n: usize, size: usize) -> SendBatch {
        SendBatch {
            bufs: (0..n).map(|_| vec![0u8; size]).collect(),
            lens: vec![0; n],
            dests: Vec::with_capacity(n),
            count: 0,
            segmentation: Segmentation::Off,
            deltas: None,
            // SAFETY: all-zero is a valid sockaddr_storage.
            addrs: (0..n).map(|_| unsafe { zeroed() }).collect(),
            ctrl: vec![Cmsg::empty(); n],
            runs: Vec::with_capacity(n),
            iovs: Vec::with_capacity(n),
            hdrs: Vec::with_capacity(n),
            counts: (0, 0, 0),
            max_segments: MAX_SEGMENTS,
            bytes: 0,
            own: None,
        }
    }

    /// The most segments a train of this batch has (halved once if the kernel refused).
    pub fn max_segments(&self) -> usize {
        self.max_segments
    }

    /// Sets the most segments per train (tools and tests: a kernel that refuses a train
    /// longer than [`FALLBACK_SEGMENTS`] makes the next flush fall back to that).
    pub fn set_max_segments(&mut self, n: usize) {
        self.max_segments = n.max(1);
    }

    /// (`sendmmsg` calls, trains sent, datagrams refused as too long: EMSGSIZE) since the
    /// last call.
    pub fn take_counts(&mut self) -> (u64, u64, u64) {
        std::mem::take(&mut self.counts)
    }

    /// Sets what [`SendBatch::flush`] does with runs of equal datagrams.
    pub fn set_segmentation(&mut self, s: Segmentation) {
        self.segmentation = s;
    }

    /// What flushes do with runs (turned [`Segmentation::Off`] if the kernel refused a train).
    pub fn segmentation(&self) -> Segmentation {
        self.segmentation
    }

    /// Whether the batch holds `n` datagrams, or [`FULL_BYTES`] of them: a batch of large
    /// packets goes when it holds two full trains (flushing a bigger one delays the
    /// acknowledgements behind it), one of small packets when it holds a 128-segment train.
    pub fn is_full(&self) -> bool {
        self.count == self.bufs.len() || self.bytes >= FULL_BYTES
    }

    /// Whether no datagram is queued.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Datagrams queued.
    pub fn len(&self) -> usize {
        self.count
    }

    /// The last datagram committed.
    pub fn last(&self) -> &[u8] {
        let i = self.count.saturating_sub(1);
        &self.bufs[i][..self.lens[i]]
    }

    /// The buffer for the next datagram.
    pub fn next_buf(&mut self) -> &mut [u8] {
        &mut self.bufs[self.count]
    }

    /// Commits the datagram written into `next_buf`.
    pub fn commit(&mut self, len: usize, dest: SocketAddr) {
        self.lens[self.count] = len;
        self.bytes += len;
        if self.dests.len() > self.count {
            self.dests[self.count] = dest;
        } else {
            self.dests.push(dest);
        }
        self.count += 1;
    }

    /// How many datagrams from `first` on go in one message.
    fn run_len(&self, first: usize) -> usize {
        if self.segmentation == Segmentation::Off {
            return 1;
        }
        let (size, dest) = (self.lens[first], self.dests[first]);
        let (mut count, mut bytes) = (1, size);
        while first + count < self.count && count < self.max_segments {
            let (len, d) = (self.lens[first + count], self.dests[first + count]);
            if d != dest || len > size || len == 0 || bytes + len > MAX_TRAIN_BYTES {
                break;
            }
            if self.segmentation == Segmentation::RoceV2 && self.is_flush(first + count) {
                // Kernel rxe's FLUSH ICRC runs over the headers twice, so the ID correction
                // of a train's later segments would be wrong for it: a FLUSH starts a message.
                break;
            }
            count += 1;
            bytes += len;
            // Only the last segment may be shorter.
            if len < size {
                break;
            }
        }
        count
    }

    /// The address this batch's socket is bound to. Datagrams to it take the kernel's local
    /// route, through the loopback device, as datagrams to a loopback address do, so a train
    /// to it arrives whole at a `UDP_GRO` socket and a flush may put a held ACK behind the
    /// answer there too: the processes that share an interface's address, talking among
    /// themselves.
    pub fn set_own_address(&mut self, ip: IpAddr) {
        self.own = (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip);
    }

    /// Whether a train to `dest` reaches its socket in one piece: the loopback device
    /// carries it (a loopback address, or this socket's own), where no network can part its
    /// segments.
    fn arrives_whole(&self, dest: SocketAddr) -> bool {
        dest.ip().is_loopback() || Some(dest.ip()) == self.own
    }

    /// Puts the bare ACKs queued first behind the requests queued after them, where all go to
    /// one QP on an address the loopback device carries (a loopback one, or this socket's own:
    /// [`SendBatch::arrives_whole`]) and make one train that way: the peer's `UDP_GRO` socket
    /// takes the train whole, in one trip through the stack instead of two, and
    /// [`RecvBatch::acks_at`] hands it the ACKs first, so its send still completes before it
    /// receives the request (as from a NIC, which ACKs before the program answers). A
    /// ping-pong's answer and the ACK held for it ([`crate::shard`]) are the case this is for;
    /// anything else keeps its order. Returns whether it moved them.
    fn acks_behind_requests(&mut self) -> bool {
        if self.segmentation != Segmentation::RoceV2 || self.count < 2 {
            return false;
        }
        let n = self.count;
        let acks = (0..n)
            .take_while(|&i| self.lens[i] > 0 && is_bare_ack(self.bufs[i][0]))
            .count();
        if acks == 0 || acks == n || n > self.max_segments || !self.arrives_whole(self.dests[0]) {
            return false;
        }
        let (dest, size) = (self.dests[0], self.lens[acks]);
        let Some(qp) = dest_qp(&self.bufs[0][..self.lens[0]]) else {
            return false;
        };
        let mut bytes = 0;
        for i in 0..n {
            let (len, b) = (self.lens[i], &self.bufs[i][..self.lens[i]]);
            let fits = if i + 1 < acks {
                // Behind the requests, all but the last ACK as long as they are.
                len == size
            } else if i < acks {
                len <= size
            } else {
                len == size
                    && b.first().is_some_and(|&op| Opcode(op).is_request())
                    && !self.is_flush(i)
            };
            if !fits || self.dests[i] != dest || dest_qp(b) != Some(qp) {
                return false;
            }
            bytes += len;
        }
        if bytes > MAX_TRAIN_BYTES {
            return false;
        }
        self.bufs[..n].rotate_left(acks);
        self.lens[..n].rotate_left(acks);
        self.dests[..n].rotate_left(acks);
        true
    }

    /// Whether datagram `i` is an RC FLUSH request (its ICRC may be in kernel rxe's form).
    fn is_flush(&self, i: usize) -> bool {
        self.lens[i] > 0 && self.bufs[i][0] == Opcode::RC_FLUSH.0
    }

    /// Corrects (`to_wire`) or restores the ICRCs of a run's segments 1.. for their IPv4 IDs.
    fn rewrite_icrcs(&mut self, run: Run, to_wire: bool) {
        for k in 1..run.count {
            let i = run.first + k;
            let len = self.lens[i];
            let delta = match self.deltas {
                Some((l, d)) if l == len => d,
                _ => match Ipv4IdentDelta::new(len) {
                    Some(d) => {
                        self.deltas = Some((len, d));
                        d
                    }
                    None => continue,
                },
            };
            let id = k as u16; // k < MAX_SEGMENTS
            let (from, to) = if to_wire { (0, id) } else { (id, 0) };
            delta.rewrite(&mut self.bufs[i][..len], from, to);
        }
    }

    /// Lays out the messages for datagrams `from..` (iovecs, control messages, headers).
    fn build(&mut self, from: usize) {
        self.iovs.clear();
        self.hdrs.clear();
        self.runs.clear();
        for i in from..self.count {
            self.iovs.push(libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr().cast(),
                iov_len: self.lens[i],
            });
        }
        let mut i = from;
        while i < self.count {
            let count = self.run_len(i);
            let rewritten =
                count > 1 && self.segmentation == Segmentation::RoceV2 && self.dests[i].is_ipv4();
            let run = Run {
                first: i,
                count,
                rewritten,
            };
            if rewritten {
                self.rewrite_icrcs(run, true);
            }
            self.runs.push(run);
            i += count;
        }
        for (m, run) in self.runs.iter().enumerate() {
            // SAFETY: all-zero is a valid mmsghdr; the fields set next point at live buffers.
            let mut h: libc::mmsghdr = unsafe { zeroed() };
            h.msg_hdr.msg_namelen = sockaddr_into(self.dests[run.first], &mut self.addrs[m]);
            h.msg_hdr.msg_name = (&raw mut self.addrs[m]).cast();
            h.msg_hdr.msg_iov = &raw mut self.iovs[run.first - from];
            h.msg_hdr.msg_iovlen = run.count as _;
            if run.count > 1 {
                // lens are at most a datagram's (< 64 KiB): the cast keeps them.
                self.ctrl[m] = Cmsg::segment(self.lens[run.first] as u16);
                h.msg_hdr.msg_control = (&raw mut self.ctrl[m]).cast();
                h.msg_hdr.msg_controllen = Cmsg::SEGMENT_SPACE as _;
            }
            self.hdrs.push(h);
        }
    }

    /// Sends everything queued with `sendmmsg` (retrying on EAGAIN by polling for
    /// writability), then empties the batch; returns how many datagrams were dropped.
    /// Datagrams the kernel refuses are dropped and counted, as a NIC drops on a full queue;
    /// the transport recovers them. A refused train turns segmentation off and goes again
    /// as plain datagrams. Bare ACKs queued first go behind the requests queued after them
    /// where that makes one train to one QP on loopback (the module's documentation).
    pub fn flush(&mut self, fd: RawFd) -> io::Result<usize> {
        self.acks_behind_requests();
        let mut failures = 0;
        let mut from = 0;
        while from < self.count {
            self.build(from);
            let msgs = self.hdrs.len();
            let mut sent = 0;
            let mut again = None;
            while sent < msgs {
                // As in `recv`: the system call, not the cancellation point.
                // SAFETY: `hdrs[sent..]` are valid headers pointing at `addrs`, `iovs`, `ctrl` and `self.bufs`, which outlive the call.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_sendmmsg,
                        fd,
                        self.hdrs.as_mut_ptr().add(sent),
                        (msgs - sent) as libc::c_uint,
                        0 as libc::c_int,
                    )
                };
                self.counts.0 += 1;
                if r > 0 {
                    let done = sent + r as usize;
                    let trains = self.runs[sent..done].iter().filter(|r| r.count > 1).count();
                    self.counts.1 += trains as u64;
                    sent = done;
                    continue;
                }
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => {
                        let _ = poll_fds(&[fd], libc::POLLOUT, Some(Duration::from_millis(10)));
                    }
                    io::ErrorKind::Interrupted => {}
                    _ if self.runs[sent].count > 1 => {
                        let count = self.runs[sent].count;
                        if count > FALLBACK_SEGMENTS && self.max_segments > FALLBACK_SEGMENTS {
                            // An older kernel's UDP_MAX_SEGMENTS: shorter trains from now on.
                            log::debug!(
                                "sendmmsg of a {count}-segment train: {e}; trains of at most \
                                 {FALLBACK_SEGMENTS} segments from now on"
                            );
                            self.max_segments = FALLBACK_SEGMENTS;
                        } else {
                            log::debug!(
                                "sendmmsg of a {count}-segment train: {e}; sending plain \
                                 datagrams from now on"
                            );
                            self.segmentation = Segmentation::Off;
                        }
                        for m in sent..msgs {
                            let run = self.runs[m];
                            if run.rewritten {
                                self.rewrite_icrcs(run, false);
                            }
                        }
                        again = Some(self.runs[sent].first);
                        break;
                    }
                    _ => {
                        // This datagram cannot be sent (no route, message too long, ...): skip it.
                        failures += 1;
                        let len = self.lens[self.runs[sent].first];
                        if e.raw_os_error() == Some(libc::EMSGSIZE) {
                            self.counts.2 += 1;
                            log::debug!(
                                "sendmmsg: a datagram of {len} bytes is longer than the \
                                 interface MTU allows (EMSGSIZE): dropped; a path_mtu above \
                                 what the interface carries?"
                            );
                        } else {
                            log::debug!("sendmmsg: {e}");
                        }
                        sent += 1;
                    }
                }
            }
            match again {
                Some(first) => from = first,
                None => break,
            }
        }
        self.count = 0;
        self.bytes = 0;
        Ok(failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroce_wire::icrc::IcrcContext;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    fn receive_all(r: &mut RecvBatch, fd: RawFd, want: usize) -> Vec<(Vec<u8>, u16, usize)> {
        let mut got = Vec::new();
        for _ in 0..1000 {
            let n = r.recv(fd).unwrap();
            for i in 0..n {
                let reads = r.segment_size(i).map_or(1, |_| 2);
                for (_, bytes, index) in r.segments(i) {
                    got.push((bytes.to_vec(), index, reads));
                }
            }
            if got.len() >= want {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        got
    }

    #[test]
    fn batches_over_loopback() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut s = SendBatch::new(4, 64);
        for i in 0..3u8 {
            s.next_buf()[..3].copy_from_slice(&[i, i, i]);
            s.commit(3, b.local_addr().unwrap());
        }
        assert_eq!(s.flush(a.as_raw_fd()).unwrap(), 0);
        let mut r = RecvBatch::new(8, 64);
        let got = receive_all(&mut r, b.as_raw_fd(), 3);
        let bytes: Vec<_> = got.iter().map(|g| g.0.clone()).collect();
        assert_eq!(bytes, vec![vec![0, 0, 0], vec![1, 1, 1], vec![2, 2, 2]]);
    }

    /// The ECN field rides in the IP header: what a sender with [`enable_ecn`] sends arrives
    /// as ECT(0), what a marking queue would set (CE, here set by the sender itself) arrives as
    /// CE, each read beside a train's segment size, over IPv4 and IPv6.
    #[test]
    fn tos_and_segment_size_are_read_back_together() {
        for (any, v6) in [("127.0.0.1:0", false), ("[::1]:0", true)] {
            let Ok(b) = UdpSocket::bind(any) else {
                continue; // no IPv6 loopback here
            };
            let a = UdpSocket::bind(any).unwrap();
            let c = UdpSocket::bind(any).unwrap();
            enable_gro(b.as_raw_fd()).unwrap();
            enable_recv_tos(b.as_raw_fd(), v6).unwrap();
            enable_ecn(a.as_raw_fd(), v6).unwrap();
            // c marks CE (0b11) with DSCP 46 beside it.
            let (level, name) = if v6 {
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS)
            } else {
                (libc::IPPROTO_IP, libc::IP_TOS)
            };
            crate::sys::setsockopt_int(c.as_raw_fd(), level, name, (46 << 2) | 3).unwrap();
            let dst = b.local_addr().unwrap();
            let mut s = SendBatch::new(8, 2000);
            s.set_segmentation(Segmentation::Udp);
            for _ in 0..3 {
                s.next_buf()[..1000].fill(7);
                s.commit(1000, dst);
            }
            assert_eq!(s.flush(a.as_raw_fd()).unwrap(), 0);
            c.send_to(&[9; 100], dst).unwrap();
            let mut r = RecvBatch::new(8, GRO_SLOT);
            let mut seen = Vec::new();
            for _ in 0..1000 {
                let n = r.recv(b.as_raw_fd()).unwrap();
                for i in 0..n {
                    let (_, bytes) = r.get(i).unwrap();
                    seen.push((bytes[0], r.tos(i), r.segment_size(i)));
                }
                if seen.iter().any(|x| x.0 == 9) && seen.iter().filter(|x| x.0 == 7).count() > 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let train = seen.iter().find(|x| x.0 == 7).unwrap();
            assert_eq!(train.1, Some(2), "ECT(0) from enable_ecn ({any})");
            assert_eq!(train.2, Some(1000), "the GRO size beside it ({any})");
            let marked = seen.iter().find(|x| x.0 == 9).unwrap();
            assert_eq!(marked.1, Some((46 << 2) | 3), "CE and the DSCP ({any})");
            assert_eq!(
                ferroce_transport::Ecn::from_tos(marked.1.unwrap()),
                ferroce_transport::Ecn::Ce
            );
        }
    }

    /// Trains out, coalesced reads in: the segments arrive in order with their indexes; a
    /// shorter last one ends a train; another destination or length starts a new message.
    #[test]
    fn trains_and_coalesced_reads() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        enable_gro(b.as_raw_fd()).unwrap();
        let dst = b.local_addr().unwrap();
        let mut s = SendBatch::new(16, 2000);
        s.set_segmentation(Segmentation::Udp);
        let lens = [1000, 1000, 1000, 400, 1000, 1000, 20];
        for (i, &len) in lens.iter().enumerate() {
            s.next_buf()[..len].fill(i as u8);
            s.commit(len, dst);
        }
        assert_eq!(s.flush(a.as_raw_fd()).unwrap(), 0);
        assert_eq!(s.segmentation(), Segmentation::Udp, "lo takes trains");
        let mut r = RecvBatch::new(8, GRO_SLOT);
        let got = receive_all(&mut r, b.as_raw_fd(), lens.len());
        let seen: Vec<(usize, u8, u16)> = got.iter().map(|g| (g.0.len(), g.0[0], g.1)).collect();
        assert_eq!(
            seen,
            vec![
                (1000, 0, 0),
                (1000, 1, 1),
                (1000, 2, 2),
                (400, 3, 3),
                (1000, 4, 0),
                (1000, 5, 1),
                (20, 6, 2)
            ]
        );
    }

    /// A sender that lets the kernel fragment (so IDs advance) and a GRO receiver, on loopback.
    fn roce_sockets() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        crate::sys::set_dont_fragment(a.as_raw_fd(), false).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        enable_gro(b.as_raw_fd()).unwrap();
        (a, b)
    }

    /// The ICRC context of a datagram from `a` to `b` with IPv4 Identification `id`.
    fn icrc_ctx(a: &UdpSocket, b: &UdpSocket, id: u16) -> IcrcContext {
        let (src, dst) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        IcrcContext::v4(
            [127, 0, 0, 1].into(),
            [127, 0, 0, 1].into(),
            id,
            src.port(),
            dst.port(),
        )
    }

    /// RoCEv2 trains: each segment's ICRC is right for the ID the kernel gives it.
    #[test]
    fn roce_trains_carry_icrcs_for_their_ids() {
        let (a, b) = roce_sockets();
        let dst = b.local_addr().unwrap();
        let ctx = |id| icrc_ctx(&a, &b, id);
        let mut s = SendBatch::new(8, 600);
        s.set_segmentation(Segmentation::RoceV2);
        for i in 0..5u8 {
            let buf = &mut s.next_buf()[..516];
            buf.fill(i);
            ctx(0).fill(buf);
            s.commit(516, dst);
        }
        s.flush(a.as_raw_fd()).unwrap();
        let mut r = RecvBatch::new(8, GRO_SLOT);
        let got = receive_all(&mut r, b.as_raw_fd(), 5);
        assert_eq!(got.len(), 5);
        for (bytes, index, reads) in &got {
            assert_eq!(*reads, 2, "one coalesced read");
            assert!(ctx(*index).verify(bytes), "segment {index}");
        }
    }

    /// Waits (at most 10 s) until `fd` is readable, then reads once: how many reads arrived.
    fn read_when_ready(r: &mut RecvBatch, fd: RawFd) -> usize {
        assert!(
            poll_fds(&[fd], libc::POLLIN, Some(Duration::from_secs(10))).unwrap(),
            "nothing arrived"
        );
        r.recv(fd).unwrap()
    }

    /// A test packet: opcode, DestQP, length, the byte the rest is filled with.
    type Pkt = (Opcode, u32, usize, u8);

    /// Builds `p` into the batch's next buffer, its ICRC for ID 0.
    fn packet(s: &mut SendBatch, ctx: &IcrcContext, (op, qp, len, fill): Pkt) {
        let buf = &mut s.next_buf()[..len];
        buf.fill(fill);
        buf[0] = op.0;
        buf[5..8].copy_from_slice(&qp.to_be_bytes()[1..]);
        ctx.fill(buf);
    }

    /// A ping-pong's answer and the ACK held for it: the ACK goes behind the request in one
    /// train, which the peer reads whole and hands on ACK first, each segment's ICRC right
    /// for its ID.
    #[test]
    fn an_ack_rides_behind_the_answer_and_is_handed_on_first() {
        let (a, b) = roce_sockets();
        let dst = b.local_addr().unwrap();
        let ctx = |id| icrc_ctx(&a, &b, id);
        let mut s = SendBatch::new(8, 600);
        s.set_segmentation(Segmentation::RoceV2);
        packet(&mut s, &ctx(0), (Opcode::RC_ACKNOWLEDGE, 0x10011, 20, 1));
        s.commit(20, dst);
        packet(&mut s, &ctx(0), (Opcode::RC_SEND_ONLY, 0x10011, 24, 2));
        s.commit(24, dst);
        s.flush(a.as_raw_fd()).unwrap();
        assert_eq!(s.take_counts().1, 1, "one train");
        let mut r = RecvBatch::new(8, GRO_SLOT);
        assert_eq!(read_when_ready(&mut r, b.as_raw_fd()), 1, "one read");
        assert_eq!(r.segment_size(0), Some(24), "the answer first on the wire");
        assert_eq!(r.acks_at(0), 1, "the ACK is handed on first");
        let segs: Vec<_> = r.segments(0).collect();
        assert_eq!(segs[0].1[0], Opcode::RC_SEND_ONLY.0);
        assert_eq!(segs[1].1[0], Opcode::RC_ACKNOWLEDGE.0);
        for (_, bytes, index) in segs {
            assert!(ctx(index).verify(bytes), "segment {index}");
        }
    }

    /// What keeps its order: ACKs not queued first, to another QP or address, longer than
    /// the request, several of another length, behind a FLUSH or a response, or a batch of
    /// ACKs alone; to an address the loopback device does not carry (the socket's own is one
    /// it does).
    #[test]
    fn acks_stay_ahead_unless_they_make_one_train_to_one_qp_on_loopback() {
        let lo: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let far: SocketAddr = "192.0.2.1:4791".parse().unwrap();
        let own: SocketAddr = "192.0.2.7:4791".parse().unwrap();
        let ctx = IcrcContext::v4([127, 0, 0, 1].into(), [127, 0, 0, 1].into(), 0, 1, 2);
        let ack = |qp| (Opcode::RC_ACKNOWLEDGE, qp, 20, 0);
        let send = |qp, len| (Opcode::RC_SEND_ONLY, qp, len, 0);
        type Case<'a> = (&'a str, &'a [(Pkt, SocketAddr)], bool);
        let cases: &[Case] = &[
            ("ACK, request", &[(ack(7), lo), (send(7, 24), lo)], true),
            (
                "two ACKs as long as the request",
                &[(ack(7), lo), (ack(7), lo), (send(7, 20), lo)],
                true,
            ),
            (
                "requests only",
                &[(send(7, 24), lo), (send(7, 24), lo)],
                false,
            ),
            ("ACKs only", &[(ack(7), lo), (ack(7), lo)], false),
            (
                "request first",
                &[(send(7, 24), lo), (ack(7), lo), (send(7, 24), lo)],
                false,
            ),
            ("not loopback", &[(ack(7), far), (send(7, 24), far)], false),
            (
                "the socket's own address",
                &[(ack(7), own), (send(7, 24), own)],
                true,
            ),
            (
                "own, then another",
                &[(ack(7), own), (send(7, 24), far)],
                false,
            ),
            (
                "another address",
                &[(ack(7), lo), (send(7, 24), far)],
                false,
            ),
            ("another QP", &[(ack(8), lo), (send(7, 24), lo)], false),
            ("ACK longer", &[(ack(7), lo), (send(7, 16), lo)], false),
            (
                "two shorter ACKs",
                &[(ack(7), lo), (ack(7), lo), (send(7, 24), lo)],
                false,
            ),
            (
                "requests of two lengths",
                &[(ack(7), lo), (send(7, 24), lo), (send(7, 28), lo)],
                false,
            ),
            (
                "a FLUSH",
                &[(ack(7), lo), ((Opcode::RC_FLUSH, 7, 32, 0), lo)],
                false,
            ),
            (
                "a response",
                &[
                    (ack(7), lo),
                    ((Opcode::RC_RDMA_READ_RESPONSE_ONLY, 7, 24, 0), lo),
                ],
                false,
            ),
        ];
        for &(what, packets, moved) in cases {
            let mut s = SendBatch::new(8, 64);
            s.set_segmentation(Segmentation::RoceV2);
            s.set_own_address(own.ip());
            for &(p, dst) in packets {
                packet(&mut s, &ctx, p);
                s.commit(p.2, dst);
            }
            let before: Vec<u8> = (0..s.count).map(|i| s.bufs[i][0]).collect();
            assert_eq!(s.acks_behind_requests(), moved, "{what}");
            let after: Vec<u8> = (0..s.count).map(|i| s.bufs[i][0]).collect();
            let acks = before.iter().take_while(|&&op| is_bare_ack(op)).count();
            let mut expect = before.clone();
            if moved {
                expect.rotate_left(acks);
            }
            assert_eq!(after, expect, "{what}");
        }
        // Trains off: nothing moves.
        let mut s = SendBatch::new(8, 64);
        for p in [ack(7), send(7, 24)] {
            packet(&mut s, &ctx, p);
            s.commit(p.2, lo);
        }
        assert!(!s.acks_behind_requests(), "segmentation off");
    }

    /// A receiver hands ACKs on first only from a train of requests followed by ACKs.
    #[test]
    fn only_requests_then_acks_are_reordered_on_receipt() {
        let (a, b) = roce_sockets();
        let dst = b.local_addr().unwrap();
        let ctx = icrc_ctx(&a, &b, 0);
        let ack = (Opcode::RC_ACKNOWLEDGE, 7, 20, 0);
        let send = (Opcode::RC_SEND_ONLY, 7, 20, 0);
        let resp = (Opcode::RC_RDMA_READ_RESPONSE_ONLY, 7, 20, 0);
        let cases: &[(&str, &[Pkt], usize)] = &[
            ("requests, then ACKs", &[send, send, ack, ack], 2),
            ("ACK first", &[ack, send], 0),
            ("ACK between requests", &[send, ack, send, ack], 0),
            ("a response, then an ACK", &[resp, ack], 0),
            ("requests only", &[send, send], 0),
        ];
        for &(what, packets, want) in cases {
            // Sent as one train as they are (plain UDP trains: no reordering on send).
            let mut s = SendBatch::new(8, 64);
            s.set_segmentation(Segmentation::Udp);
            for &p in packets {
                packet(&mut s, &ctx, p);
                s.commit(p.2, dst);
            }
            s.flush(a.as_raw_fd()).unwrap();
            let mut r = RecvBatch::new(8, GRO_SLOT);
            assert_eq!(
                read_when_ready(&mut r, b.as_raw_fd()),
                1,
                "{what}: one read"
            );
            assert_eq!(r.acks_at(0), want, "{what}");
        }
    }

    /// A FLUSH in kernel rxe's ICRC form is never a later segment of a train (the ID
    /// correction assumes the IBTA form): it leaves with ID 0 and an ICRC rxe takes, also
    /// right after datagrams of its length to the same peer (an ATOMIC WRITE has its length).
    #[test]
    fn a_flush_starts_its_own_message() {
        let (a, b) = roce_sockets();
        let dst = b.local_addr().unwrap();
        let ctx = |id| icrc_ctx(&a, &b, id);
        let mut s = SendBatch::new(8, 64);
        s.set_segmentation(Segmentation::RoceV2);
        let flushes = [false, false, true, true, false];
        for (i, &flush) in flushes.iter().enumerate() {
            let buf = &mut s.next_buf()[..36];
            buf.fill(i as u8);
            if flush {
                buf[0] = Opcode::RC_FLUSH.0;
                ctx(0).fill_rxe_flush(buf);
            } else {
                buf[0] = Opcode::RC_RDMA_WRITE_ONLY.0;
                ctx(0).fill(buf);
            }
            s.commit(36, dst);
        }
        s.flush(a.as_raw_fd()).unwrap();
        let mut r = RecvBatch::new(8, GRO_SLOT);
        let got = receive_all(&mut r, b.as_raw_fd(), flushes.len());
        assert_eq!(got.len(), flushes.len());
        for (bytes, index, _) in &got {
            if bytes[0] == Opcode::RC_FLUSH.0 {
                assert_eq!(*index, 0, "a FLUSH leads its message");
                assert!(ctx(0).verify_rxe_flush(bytes), "FLUSH {}", bytes[1]);
            } else {
                assert!(ctx(*index).verify(bytes), "segment {index}");
            }
        }
    }
}
