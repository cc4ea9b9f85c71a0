//! The UDP backend: one socket bound to the device's address and port, `sendmmsg` and
//! `recvmmsg` in batches; with trains on, runs of equal packets leave as `UDP_SEGMENT` trains
//! and coalesced trains are read with `UDP_GRO` (see [`crate::mmsg`]).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use super::group::{Membership, PROBE_LEN, Registry};
use super::gsi;
use super::{DatapathStats, Deliver, MAX_PACKET, Receiver, Transmitter};
use crate::mmsg::{self, GRO_SLOT, RecvBatch, Segmentation, SendBatch};
use crate::sys;
use ferroce_transport::Ecn;

/// Datagrams per `recvmmsg`/`sendmmsg`.
pub(crate) const BATCH: usize = 32;

/// Opens the socket of a device at `local`: DF set, 8 MiB buffers, IPv6 only for IPv6
/// (accepting UDP checksum 0, as rxe sends), non-blocking; `UDP_GRO` and trains if `trains`;
/// ECN-capable (ECT(0)) with each datagram's ECN field read back if `ecn`.
///
/// # Errors
/// [`crate::Error::AddressInUse`] if the address and port are taken, [`crate::Error::NoDevice`]
/// if the address is not this host's, [`crate::Error::Io`] otherwise.
pub(crate) fn open(
    local: SocketAddr,
    trains: bool,
    ecn: bool,
    stats: &Arc<DatapathStats>,
) -> crate::Result<(UdpTransmitter, UdpReceiver, Membership)> {
    let domain = if local.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    let socket = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
    socket.set_nonblocking(true)?;
    let _ = socket.set_recv_buffer_size(8 << 20);
    let _ = socket.set_send_buffer_size(8 << 20);
    let fd = socket.as_raw_fd();
    sys::set_dont_fragment(fd, local.is_ipv6())?;
    if local.is_ipv6() {
        socket.set_only_v6(true)?;
        let _ = sys::set_no_check6_rx(fd);
    }
    // Every ferroce process of this user on this address joins one group (see `group`).
    socket.set_reuse_port(true)?;
    socket.bind(&local.into()).map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            log::debug!(
                "{local}: in use by a program that is not a ferroce process of this user (a \
                 reuseport group is one user's); use an address of your own"
            );
            crate::Error::AddressInUse(local)
        }
        std::io::ErrorKind::AddrNotAvailable => crate::Error::NoDevice(local.ip().to_string()),
        _ => crate::Error::Io(e),
    })?;
    if ecn {
        mmsg::enable_ecn(fd, local.is_ipv6())
            .map_err(|e| {
                log::debug!("{local}: no ECN ({e}): packets leave not ECN-capable, CE unseen")
            })
            .ok();
    }
    let gro = trains
        && mmsg::enable_gro(fd)
            .map_err(|e| log::debug!("{local}: no UDP_GRO ({e}): one datagram per read"))
            .is_ok();
    let mut send = SendBatch::new(BATCH, MAX_PACKET);
    if trains {
        send.set_segmentation(Segmentation::RoceV2);
    }
    // The forwarding socket: the device's address and a port of its own, outside the group, where
    // other members send what the group's steering handed them for this process.
    let fwd = std::net::UdpSocket::bind(SocketAddr::new(local.ip(), 0))?;
    fwd.set_nonblocking(true)?;
    let fwd_port = fwd.local_addr()?.port();
    let socket = Arc::new(socket);
    let membership = Membership::join(local, socket.clone())?;
    membership
        .registry
        .set_forward_port(membership.slot, fwd_port);
    let probes = (membership.registry.clone(), membership.slot);
    Ok((
        UdpTransmitter {
            socket: socket.clone(),
            batch: send,
            stats: stats.clone(),
        },
        UdpReceiver {
            socket,
            batch: RecvBatch::new(BATCH, if gro { GRO_SLOT } else { MAX_PACKET }),
            received: 0,
            local,
            stats: stats.clone(),
            probes,
            fwd,
            fwd_batch: RecvBatch::new(FWD_BATCH, MAX_PACKET),
            fwd_received: 0,
            fwd_read_at: std::time::Instant::now(),
        },
        membership,
    ))
}

/// Sends through the device's socket, a `sendmmsg` per full batch or flush.
pub(crate) struct UdpTransmitter {
    socket: Arc<socket2::Socket>,
    batch: SendBatch,
    stats: Arc<DatapathStats>,
}

impl Transmitter for UdpTransmitter {
    fn buffer(&mut self) -> &mut [u8] {
        self.batch.next_buf()
    }

    fn commit(&mut self, len: usize, dst: SocketAddr) {
        self.batch.commit(len, dst);
        if self.batch.is_full() {
            self.flush();
        }
    }

    fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        DatapathStats::add(&self.stats.sent, self.batch.len() as u64);
        match self.batch.flush(self.socket.as_raw_fd()) {
            Ok(failed) => DatapathStats::add(&self.stats.send_errors, failed as u64),
            Err(e) => log::warn!("sendmmsg: {e}"),
        }
        let (calls, trains) = self.batch.take_counts();
        DatapathStats::add(&self.stats.send_calls, calls);
        DatapathStats::add(&self.stats.trains, trains);
    }
}

/// Receives from the device's socket, a `recvmmsg` per call.
pub(crate) struct UdpReceiver {
    socket: Arc<socket2::Socket>,
    batch: RecvBatch,
    /// Datagrams of the last `receive` not yet delivered.
    received: usize,
    local: SocketAddr,
    stats: Arc<DatapathStats>,
    /// Where this process answers the group's probes (its registry and slot).
    probes: (Arc<Registry>, u8),
    /// The forwarding socket, and what its last read took.
    fwd: std::net::UdpSocket,
    fwd_batch: RecvBatch,
    fwd_received: usize,
    /// When the forwarding socket was last read.
    fwd_read_at: std::time::Instant,
}

/// How often the forwarding socket is read at most.
const FWD_PERIOD: std::time::Duration = std::time::Duration::from_millis(1);

/// Datagrams per read of the forwarding socket (forwards are rare: MADs, and data packets
/// while the group's table changes).
const FWD_BATCH: usize = 8;

impl Receiver for UdpReceiver {
    fn receive(&mut self) -> usize {
        let n = match self.batch.recv(self.socket.as_raw_fd()) {
            Ok(n) => n,
            Err(e) => {
                log::warn!("recvmmsg on {}: {e}", self.local);
                0
            }
        };
        self.received = n;
        // The forwarding socket at most once a millisecond (forwards are rare; a read per
        // receive would double the system calls of the data path): a forward waits 1 ms at most.
        let now = std::time::Instant::now();
        if now.duration_since(self.fwd_read_at) >= FWD_PERIOD {
            self.fwd_read_at = now;
            self.fwd_received = self.fwd_batch.recv(self.fwd.as_raw_fd()).unwrap_or(0);
        }
        let segments: usize = (0..n)
            .map(|i| {
                self.batch
                    .segment_size(i)
                    .zip(self.batch.get(i))
                    .map_or(1, |(size, (_, b))| b.len().div_ceil(size))
            })
            .sum();
        DatapathStats::add(&self.stats.rcvd, segments as u64);
        n + self.fwd_received
    }

    fn deliver(&mut self, deliver: Deliver<'_>) {
        let (registry, slot) = (&self.probes.0, self.probes.1);
        for i in 0..std::mem::take(&mut self.received) {
            // A coalesced train's segments share one IP header's ECN field (GRO merges only
            // datagrams whose TOS bytes are equal).
            let ecn = self.batch.tos(i).map_or(Ecn::NotEct, Ecn::from_tos);
            for (from, bytes, ident) in self.batch.segments(i) {
                if bytes.len() == PROBE_LEN && registry.answer(slot, bytes) {
                    continue;
                }
                match route(bytes, registry, slot, self.local, from) {
                    Fate::Here => deliver(from, bytes, ident, ecn),
                    Fate::Unwrapped(from, ident, inner) => deliver(from, inner, ident, Ecn::NotEct),
                    Fate::Forward(to) => {
                        forward(&self.socket, registry, to, (from, ident), bytes, self.local)
                    }
                    Fate::Reforward(to) => reforward(&self.socket, registry, to, bytes, self.local),
                    Fate::Drop => {}
                }
            }
        }
        // The forwarding socket takes forwards only: anything else there is nobody's.
        for i in 0..std::mem::take(&mut self.fwd_received) {
            let Some((from, bytes)) = self.fwd_batch.get(i) else {
                continue;
            };
            if bytes.first() != Some(&gsi::FORWARD_OPCODE) {
                log::debug!(
                    "{}: a datagram from {from} on the forwarding socket that is no forward: \
                     dropped",
                    self.local
                );
                continue;
            }
            match route(bytes, registry, slot, self.local, from) {
                Fate::Unwrapped(from, ident, inner) => deliver(from, inner, ident, Ecn::NotEct),
                Fate::Reforward(to) => reforward(&self.socket, registry, to, bytes, self.local),
                Fate::Here | Fate::Forward(_) | Fate::Drop => {}
            }
        }
    }

    fn side_fd(&self) -> Option<RawFd> {
        Some(self.fwd.as_raw_fd())
    }

    fn batch(&self) -> usize {
        BATCH
    }

    fn ready_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    fn capacity(&self) -> usize {
        self.socket.recv_buffer_size().unwrap_or(1 << 20)
    }
}

/// What becomes of a datagram that reached this member's socket.
enum Fate<'a> {
    /// This process's engine takes it as it came.
    Here,
    /// A forward for this process: its engine takes the original (source, IPv4 ID, bytes).
    Unwrapped(SocketAddr, u16, &'a [u8]),
    /// On to the live process in this slot, wrapped in a forward.
    Forward(u8),
    /// A forward for another live slot: sent on once more.
    Reforward(u8),
    /// Nobody can take it (the reason is logged).
    Drop,
}

/// Where a datagram received by the member in `slot` goes: a forward to its target; a QP1 MAD
/// to the process its routing rules name (see `gsi`); a data packet to the process whose slot
/// is its DestQP's high byte, which the kernel's steering hands another member while the
/// group's table changes.
fn route<'a>(
    bytes: &'a [u8],
    registry: &Registry,
    slot: u8,
    local: SocketAddr,
    from: SocketAddr,
) -> Fate<'a> {
    match bytes.first() {
        Some(&gsi::FORWARD_OPCODE) => match gsi::unwrap(bytes, registry.nonce()) {
            Ok((to, from, ident, inner)) if to == slot => Fate::Unwrapped(from, ident, inner),
            Ok((to, ..))
                if registry.is_live(to, slot)
                    && bytes.get(gsi::HOPS_AT).is_some_and(|&h| h < gsi::MAX_HOPS) =>
            {
                log::trace!(
                    "{local}: a forwarded packet for slot {to} reached slot {slot}: sent on"
                );
                Fate::Reforward(to)
            }
            Ok((to, ..)) => {
                log::debug!(
                    "{local}: a forwarded packet for slot {to} reached slot {slot}: dropped \
                     (no live process holds slot {to}, or it was sent on {} times)",
                    gsi::MAX_HOPS
                );
                Fate::Drop
            }
            Err(why) => {
                log::debug!("{local}: {why} from {from}: dropped");
                Fate::Drop
            }
        },
        _ if gsi::is_gsi(bytes) => match gsi::route(bytes, registry) {
            gsi::Route::Slot(to) if to != slot && registry.is_live(to, slot) => Fate::Forward(to),
            gsi::Route::Slot(to) if to != slot => {
                // Its owner is gone: like anything without an owner, the MAD goes to this role
                // holder's QP1, whose CM answers for the address as the kernel's outlives a
                // process (a DREQ for a dead process's connection gets its DREP).
                log::debug!(
                    "{local}: a MAD from {from} for slot {to}, which no live process holds: to \
                     this role holder's QP1"
                );
                Fate::Here
            }
            _ => Fate::Here,
        },
        // A data packet for another process's QP (DestQP's high byte is its slot) that the
        // kernel's steering sent here, while the group's table changes: on to its owner, not
        // lost to a retransmission.
        _ => match bytes.get(5) {
            Some(&to) if to != slot && registry.is_live(to, slot) => Fate::Forward(to),
            _ => Fate::Here,
        },
    }
}

/// Sends a datagram (from `from`, expected to carry IPv4 ID `ident`) on to the process in
/// slot `to`, wrapped in a forward: a QP1 MAD (the routing point, see `gsi`) or a data packet
/// steered to the wrong member.
fn forward(
    socket: &socket2::Socket,
    registry: &Registry,
    to: u8,
    (from, ident): (SocketAddr, u16),
    bytes: &[u8],
    local: SocketAddr,
) {
    let Some(out) = envelope(registry, to, (from, ident), bytes) else {
        return;
    };
    match socket.send_to(&out, &forward_to(registry, to, local).into()) {
        Ok(_) => log::trace!("{local}: a datagram from {from} forwarded to slot {to}"),
        Err(e) => log::debug!("{local}: forwarding a datagram to slot {to}: {e}"),
    }
}

/// `bytes` (from `from`, expected to carry IPv4 ID `ident`) wrapped as a forward to slot `to`.
fn envelope(
    registry: &Registry,
    to: u8,
    (from, ident): (SocketAddr, u16),
    bytes: &[u8],
) -> Option<Vec<u8>> {
    let mut out = vec![0u8; gsi::ENVELOPE_LEN + bytes.len()];
    let n = gsi::wrap(&mut out, to, registry.nonce(), from, ident, bytes)?;
    out.truncate(n);
    Some(out)
}

/// Where a forward to slot `to` goes: its forwarding socket, or the group's address (steered
/// by the forward's slot byte) if it has none.
fn forward_to(registry: &Registry, to: u8, local: SocketAddr) -> SocketAddr {
    registry
        .forward_port(to)
        .map_or(local, |p| SocketAddr::new(local.ip(), p))
}

/// Sends a forward that reached the wrong member on to slot `to` once more, its hop count up.
fn reforward(
    socket: &socket2::Socket,
    registry: &Registry,
    to: u8,
    envelope: &[u8],
    local: SocketAddr,
) {
    let mut out = envelope.to_vec();
    if let Some(h) = out.get_mut(gsi::HOPS_AT) {
        *h = h.saturating_add(1);
    }
    if let Err(e) = socket.send_to(&out, &forward_to(registry, to, local).into()) {
        log::debug!("{local}: sending a forward on to slot {to}: {e}");
    }
}

/// A leaving member's last read before its socket closes: every datagram still queued on the
/// socket that belongs to another live process (the kernel steered it here before the group's
/// table changed), wrapped as a forward to its owner, for [`send_forwards`] once the socket is
/// closed. Bounded: at most `limit` reads.
pub(crate) fn drain(
    socket: &socket2::Socket,
    registry: &Registry,
    slot: u8,
    local: SocketAddr,
    limit: usize,
) -> Vec<Vec<u8>> {
    let mut batch = RecvBatch::new(BATCH, GRO_SLOT);
    let mut out = Vec::new();
    for _ in 0..limit {
        let n = match batch.recv(socket.as_raw_fd()) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for i in 0..n {
            for (from, bytes, ident) in batch.segments(i) {
                // This process's own packets die with its QPs; probes are for live members.
                match route(bytes, registry, slot, local, from) {
                    Fate::Forward(to) => {
                        out.extend(envelope(registry, to, (from, ident), bytes));
                    }
                    Fate::Reforward(_) => out.push(bytes.to_vec()),
                    Fate::Here | Fate::Unwrapped(..) | Fate::Drop => {}
                }
            }
        }
    }
    out
}

/// Sends forwards (each to the slot in its byte 1) to their targets' forwarding sockets from a
/// socket of its own; returns how many went.
pub(crate) fn send_forwards(local: SocketAddr, registry: &Registry, forwards: &[Vec<u8>]) -> usize {
    let any: SocketAddr = if local.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0))
    };
    let Ok(s) = std::net::UdpSocket::bind(any) else {
        return 0;
    };
    forwards
        .iter()
        .filter(|f| {
            let to = f.get(1).copied().unwrap_or(0);
            s.send_to(f, forward_to(registry, to, local)).is_ok()
        })
        .count()
}
