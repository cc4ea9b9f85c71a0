//! A receiver of a member of an address's group: it wraps the backend's receiver and, before
//! the engine sees a datagram, answers the group's probes, routes QP1 MADs and mis-steered
//! packets to their processes (see [`super::route`]) and takes in what other members forward
//! to this process on its forwarding socket.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use ferroce_transport::Ecn;

use super::group::{PROBE_LEN, Registry};
use super::gsi;
use super::route::{Fate, forward, reforward, route};
use crate::backend::{DatapathStats, Deliver, MAX_PACKET, Receiver};
use crate::mmsg::RecvBatch;

/// How often the forwarding socket is read at most (forwards are rare; a read per receive
/// would double the system calls of the data path): a forward waits 1 ms at most.
const FWD_PERIOD: Duration = Duration::from_millis(1);

/// Datagrams per read of the forwarding socket (forwards are rare: MADs, and data packets
/// while the group's table changes).
const FWD_BATCH: usize = 8;

/// A member's receiver around the backend's `inner` one.
pub(crate) struct MemberReceiver<R> {
    inner: R,
    /// The group's socket, which forwards leave from.
    socket: Arc<socket2::Socket>,
    local: SocketAddr,
    registry: Arc<Registry>,
    slot: u8,
    /// The forwarding socket, and what its last read took.
    fwd: std::net::UdpSocket,
    fwd_batch: RecvBatch,
    fwd_received: usize,
    /// When the forwarding socket was last read.
    fwd_read_at: u64,
    stats: Arc<DatapathStats>,
}

impl<R: Receiver> MemberReceiver<R> {
    /// Wraps `inner`, the receiver of `socket`, for the member in `slot` of `registry`'s
    /// group; `fwd` is its forwarding socket (the address's IP, a port outside the group).
    pub(crate) fn new(
        inner: R,
        socket: Arc<socket2::Socket>,
        (registry, slot): (Arc<Registry>, u8),
        fwd: std::net::UdpSocket,
        local: SocketAddr,
        stats: &Arc<DatapathStats>,
    ) -> Self {
        MemberReceiver {
            inner,
            socket,
            local,
            registry,
            slot,
            fwd,
            fwd_batch: RecvBatch::new(FWD_BATCH, MAX_PACKET),
            fwd_received: 0,
            fwd_read_at: 0,
            stats: stats.clone(),
        }
    }

    /// Reads the forwarding socket if [`FWD_PERIOD`] has passed since the last look; returns
    /// the datagrams the last look took (delivered after the inner receiver's).
    fn receive_forwarded(&mut self, now: ferroce_transport::Instant) -> usize {
        let now = now.as_nanos();
        if now.saturating_sub(self.fwd_read_at) >= FWD_PERIOD.as_nanos() as u64 {
            self.fwd_read_at = now;
            self.fwd_received = self.fwd_batch.recv(self.fwd.as_raw_fd()).unwrap_or(0);
            DatapathStats::add(&self.stats.recv_calls, 1);
            if self.fwd_received == 0 {
                DatapathStats::add(&self.stats.empty_recvs, 1);
            }
        }
        self.fwd_received
    }
}

impl<R: Receiver> Receiver for MemberReceiver<R> {
    fn receive(&mut self, now: ferroce_transport::Instant) -> usize {
        let n = self.inner.receive(now);
        n + self.receive_forwarded(now)
    }

    fn receive_polled(&mut self, now: ferroce_transport::Instant) -> usize {
        let n = self.inner.receive_polled(now);
        n + self.receive_forwarded(now)
    }

    fn deliver(&mut self, deliver: Deliver<'_>) {
        let (registry, slot, local, socket, stats) = (
            &*self.registry,
            self.slot,
            self.local,
            &self.socket,
            &self.stats,
        );
        self.inner.deliver(&mut |from, bytes, ident, ecn| {
            if bytes.len() == PROBE_LEN && registry.answer(slot, bytes) {
                return;
            }
            match route(bytes, registry, slot, local, from) {
                Fate::Here => deliver(from, bytes, ident, ecn),
                Fate::Unwrapped(from, ident, inner) => deliver(from, inner, ident, Ecn::NotEct),
                Fate::Forward(to) => {
                    DatapathStats::add(&stats.forwarded, 1);
                    forward(socket, registry, to, (from, ident), bytes, local)
                }
                Fate::Reforward(to) => reforward(socket, registry, to, bytes, local),
                Fate::Drop => {}
            }
        });
        // The forwarding socket takes forwards only: anything else there is nobody's.
        for i in 0..std::mem::take(&mut self.fwd_received) {
            let Some((from, bytes)) = self.fwd_batch.get(i) else {
                continue;
            };
            if bytes.first() != Some(&gsi::FORWARD_OPCODE) {
                log::debug!(
                    "{local}: a datagram from {from} on the forwarding socket that is no \
                     forward: dropped"
                );
                continue;
            }
            match route(bytes, registry, slot, local, from) {
                Fate::Unwrapped(from, ident, inner) => deliver(from, inner, ident, Ecn::NotEct),
                Fate::Reforward(to) => reforward(socket, registry, to, bytes, local),
                Fate::Here | Fate::Forward(_) | Fate::Drop => {}
            }
        }
    }

    fn side_fd(&self) -> Option<RawFd> {
        Some(self.fwd.as_raw_fd())
    }

    fn batch(&self) -> usize {
        self.inner.batch()
    }

    fn ready_fd(&self) -> RawFd {
        self.inner.ready_fd()
    }

    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
}
