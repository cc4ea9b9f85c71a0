//! The UDP backend: one socket bound to the device's address and port, `sendmmsg` and
//! `recvmmsg` in batches; with trains on, runs of equal packets leave as `UDP_SEGMENT` trains
//! and coalesced trains are read with `UDP_GRO` (see [`crate::mmsg`]).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use super::{DatapathStats, Deliver, MAX_PACKET, Receiver, Transmitter};
use crate::mmsg::{self, GRO_SLOT, RecvBatch, Segmentation, SendBatch};
use crate::sys;
use ferroce_transport::Ecn;

/// Datagrams per `recvmmsg` (each slot a whole GRO read with trains on).
pub(crate) const BATCH: usize = 32;
/// Datagrams per `sendmmsg`: as many as one train may hold ([`mmsg::MAX_SEGMENTS`]), so a
/// deep queue of small messages leaves in trains of up to 128.
pub(crate) const SEND_BATCH: usize = mmsg::MAX_SEGMENTS;

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
) -> crate::Result<(UdpTransmitter, UdpReceiver, Arc<socket2::Socket>)> {
    let domain = if local.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    let socket = crate::sys::udp_socket(domain)?;
    socket.set_nonblocking(true)?;
    let _ = socket.set_recv_buffer_size(8 << 20);
    let _ = socket.set_send_buffer_size(8 << 20);
    let fd = socket.as_raw_fd();
    sys::set_dont_fragment(fd, local.is_ipv6())?;
    if local.is_ipv6() {
        socket.set_only_v6(true)?;
        let _ = sys::set_no_check6_rx(fd);
        let _ = socket.set_multicast_hops_v6(64);
    } else {
        // UD sends to a multicast group leave with the hop limit rdma_cm's join gives (64,
        // as rxe sends them), not the socket's default of 1.
        let _ = socket.set_multicast_ttl_v4(64);
    }
    // Every ferroce process of this user on this address joins one group (see `crate::host`).
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
    let mut send = SendBatch::new(SEND_BATCH, MAX_PACKET);
    if trains {
        send.set_segmentation(Segmentation::RoceV2);
    }
    send.set_own_address(local.ip());
    let socket = Arc::new(socket);
    Ok((
        UdpTransmitter {
            socket: socket.clone(),
            batch: send,
            stats: stats.clone(),
        },
        UdpReceiver {
            socket: socket.clone(),
            batch: RecvBatch::new(BATCH, if gro { GRO_SLOT } else { MAX_PACKET }),
            received: 0,
            polled_empty: false,
            local,
            stats: stats.clone(),
        },
        socket,
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
        let (calls, trains, too_long) = self.batch.take_counts();
        DatapathStats::add(&self.stats.send_calls, calls);
        DatapathStats::add(&self.stats.trains, trains);
        DatapathStats::add(&self.stats.send_too_long, too_long);
    }
}

/// Receives from the device's socket, a `recvmmsg` per call.
pub(crate) struct UdpReceiver {
    socket: Arc<socket2::Socket>,
    batch: RecvBatch,
    /// Datagrams of the last `receive` not yet delivered.
    received: usize,
    /// Whether the last [`Receiver::receive_polled`] found nothing (the next reads one).
    polled_empty: bool,
    local: SocketAddr,
    stats: Arc<DatapathStats>,
}

impl UdpReceiver {
    /// One `recvmmsg` into at most `slots` slots, counted.
    fn receive_upto(&mut self, slots: usize) -> usize {
        let n = match self.batch.recv_upto(self.socket.as_raw_fd(), slots) {
            Ok(n) => n,
            Err(e) => {
                log::warn!("recvmmsg on {}: {e}", self.local);
                0
            }
        };
        self.received = n;
        DatapathStats::add(&self.stats.recv_calls, 1);
        if n == 0 {
            DatapathStats::add(&self.stats.empty_recvs, 1);
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
        n
    }
}

impl Receiver for UdpReceiver {
    fn receive(&mut self, _now: ferroce_transport::Instant) -> usize {
        self.receive_upto(BATCH)
    }

    fn receive_polled(&mut self, _now: ferroce_transport::Instant) -> usize {
        let slots = if self.polled_empty { 1 } else { BATCH };
        let n = self.receive_upto(slots);
        self.polled_empty = n == 0;
        n
    }

    fn deliver(&mut self, deliver: Deliver<'_>) {
        for i in 0..std::mem::take(&mut self.received) {
            // A coalesced train's segments share one IP header's ECN field (GRO merges only
            // datagrams whose TOS bytes are equal).
            let ecn = self.batch.tos(i).map_or(Ecn::NotEct, Ecn::from_tos);
            // A peer's answer with the ACK it held for it: the ACK first (`acks_at`).
            let acks = self.batch.acks_at(i);
            let segments = self.batch.segments(i);
            for (from, bytes, ident) in segments.clone().skip(acks).chain(segments.take(acks)) {
                deliver(from, bytes, ident, ecn);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::poll_fds;
    use ferroce_transport::Instant;
    use std::net::UdpSocket;
    use std::time::Duration;

    /// Bytes the socket's receive queue holds (`SO_MEMINFO`'s receive allocation): the
    /// datagrams that have arrived, whether or not a read has looked.
    fn queued(fd: RawFd) -> u32 {
        let mut info = [0u32; 9];
        let mut len = size_of_val(&info) as libc::socklen_t;
        // SAFETY: `info` is `len` bytes long, as the kernel is told, and lives for the call.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_MEMINFO,
                info.as_mut_ptr().cast(),
                &raw mut len,
            )
        };
        assert_eq!(r, 0, "SO_MEMINFO: {}", std::io::Error::last_os_error());
        info[0]
    }

    /// Sends `n` datagrams of 24 bytes from `peer` to `to`.
    fn send(peer: &UdpSocket, to: SocketAddr, n: usize) {
        for _ in 0..n {
            peer.send_to(&[7; 24], to).unwrap();
        }
    }

    /// Returns once the queue of socket `fd` holds at least `bytes` (what the datagrams sent
    /// to it take there): a read then finds all of them, however the kernel scheduled their
    /// delivery.
    fn wait_queued(fd: RawFd, bytes: u32) {
        assert!(
            poll_fds(&[fd], libc::POLLIN, Some(Duration::from_secs(10))).unwrap(),
            "nothing arrived"
        );
        let mut spins = 0u64;
        while queued(fd) < bytes {
            spins += 1;
            assert!(spins < 100_000_000, "the datagrams never all arrived");
            std::thread::yield_now();
        }
    }

    /// A poller's receive after one that found nothing reads one datagram (no attempt on an
    /// empty second slot); after one that found something, a whole batch; the progress
    /// thread's receive always a whole batch.
    #[test]
    fn a_poll_after_an_empty_one_reads_one_datagram() {
        let stats = Arc::new(DatapathStats::default());
        let (_tx, mut rx, socket) =
            open("127.0.0.1:0".parse().unwrap(), false, false, &stats).unwrap();
        let to = socket.local_addr().unwrap().as_socket().unwrap();
        let fd = socket.as_raw_fd();
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let now = Instant::from_nanos(0);
        // One datagram tells what one takes in the queue.
        send(&peer, to, 1);
        wait_queued(fd, 1);
        let one = queued(fd);
        assert_eq!(rx.receive_polled(now), 1);
        rx.deliver(&mut |_, _, _, _| {});

        assert_eq!(rx.receive_polled(now), 0, "nothing waits");
        assert_eq!(queued(fd), 0, "an empty queue holds nothing");
        send(&peer, to, 3);
        wait_queued(fd, 3 * one);
        assert_eq!(rx.receive_polled(now), 1, "after an empty poll: one slot");
        let mut got = 0;
        rx.deliver(&mut |_, b, _, _| got += b.len());
        assert_eq!(got, 24);
        assert_eq!(rx.receive_polled(now), 2, "after a full one: the batch");
        rx.deliver(&mut |_, _, _, _| {});
        assert_eq!(rx.receive_polled(now), 0);

        // The progress thread's receive takes the batch even after an empty poll.
        send(&peer, to, 3);
        wait_queued(fd, 3 * one);
        assert_eq!(rx.receive(now), 3);
        rx.deliver(&mut |_, _, _, _| {});
    }
}
