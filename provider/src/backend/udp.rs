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
    let socket = Arc::new(socket);
    let membership = Membership::join(local, socket.clone())?;
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
}

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
        let segments: usize = (0..n)
            .map(|i| {
                self.batch
                    .segment_size(i)
                    .zip(self.batch.get(i))
                    .map_or(1, |(size, (_, b))| b.len().div_ceil(size))
            })
            .sum();
        DatapathStats::add(&self.stats.rcvd, segments as u64);
        n
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
                match bytes.first() {
                    Some(&gsi::FORWARD_OPCODE) => match gsi::unwrap(bytes, registry.nonce()) {
                        Ok((to, from, ident, inner)) if to == slot => {
                            deliver(from, inner, ident, Ecn::NotEct)
                        }
                        Ok((to, ..)) => log::debug!(
                            "{}: a forwarded packet for slot {to} reached slot {slot}: dropped \
                             (the steering table is changing)",
                            self.local
                        ),
                        Err(why) => log::debug!("{}: {why} from {from}: dropped", self.local),
                    },
                    _ if gsi::is_gsi(bytes) => match gsi::route(bytes, &**registry) {
                        gsi::Route::Slot(to) if to != slot && registry.is_live(to, slot) => {
                            forward(
                                &self.socket,
                                registry,
                                slot,
                                to,
                                (from, ident),
                                bytes,
                                self.local,
                            );
                        }
                        gsi::Route::Slot(to) if to != slot => {
                            // Its owner is gone: like anything without an owner, the MAD goes
                            // to this role holder's QP1, whose CM answers for the address as
                            // the kernel's outlives a process (a DREQ for a dead process's
                            // connection gets its DREP).
                            log::debug!(
                                "{}: a MAD from {from} for slot {to}, which no live process \
                                 holds: to this role holder's QP1",
                                self.local
                            );
                            deliver(from, bytes, ident, ecn);
                        }
                        _ => deliver(from, bytes, ident, ecn),
                    },
                    // A data packet for another process's QP (DestQP's high byte is its slot)
                    // that the kernel's steering sent here, while the group's table changes:
                    // on to its owner, not lost to a retransmission.
                    _ => match bytes.get(5) {
                        Some(&to) if to != slot && registry.is_live(to, slot) => {
                            forward(
                                &self.socket,
                                registry,
                                slot,
                                to,
                                (from, ident),
                                bytes,
                                self.local,
                            );
                        }
                        _ => deliver(from, bytes, ident, ecn),
                    },
                }
            }
        }
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

/// Sends a datagram (from `from`, expected to carry IPv4 ID `ident`) on to the process in
/// slot `to`: a QP1 MAD (the routing point, see `gsi`) or a data packet steered to the wrong
/// member.
fn forward(
    socket: &socket2::Socket,
    registry: &Registry,
    mine: u8,
    to: u8,
    (from, ident): (SocketAddr, u16),
    bytes: &[u8],
    local: SocketAddr,
) {
    if !registry.is_live(to, mine) {
        log::debug!(
            "{local}: a MAD from {from} for slot {to}, which no live process holds: dropped"
        );
        return;
    }
    let mut out = vec![0u8; gsi::ENVELOPE_LEN + bytes.len()];
    let Some(n) = gsi::wrap(&mut out, to, registry.nonce(), from, ident, bytes) else {
        return;
    };
    match socket.send_to(&out[..n], &local.into()) {
        Ok(_) => log::trace!("{local}: a datagram from {from} forwarded to slot {to}"),
        Err(e) => log::debug!("{local}: forwarding a datagram to slot {to}: {e}"),
    }
}
