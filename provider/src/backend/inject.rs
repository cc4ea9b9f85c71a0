//! Fault injection around any backend (`FERROCE_FAULTS`): loss, duplication and reordering
//! on send, loss and corruption on receive. The probabilities are [`crate::faults`]'.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;

use ferroce_transport::Ecn;

use super::{DatapathStats, Deliver, Receiver, Transmitter};
use crate::faults::Faults;

/// A transmitter that loses, duplicates and reorders what it is given.
pub(crate) struct FaultyTransmitter<T> {
    inner: T,
    faults: Faults,
    /// A datagram held back to go out after the next one.
    held: Option<(SocketAddr, Vec<u8>)>,
    stats: Arc<DatapathStats>,
}

impl<T: Transmitter> FaultyTransmitter<T> {
    /// The wrapped transmitter.
    #[cfg(test)]
    pub(crate) fn inner_ref(&self) -> &T {
        &self.inner
    }

    pub(crate) fn new(inner: T, faults: Faults, stats: &Arc<DatapathStats>) -> Self {
        FaultyTransmitter {
            inner,
            faults,
            held: None,
            stats: stats.clone(),
        }
    }

    fn push_copy(&mut self, dst: SocketAddr, bytes: &[u8]) {
        self.inner.buffer()[..bytes.len()].copy_from_slice(bytes);
        self.inner.commit(bytes.len(), dst);
    }
}

impl<T: Transmitter> Transmitter for FaultyTransmitter<T> {
    fn buffer(&mut self) -> &mut [u8] {
        self.inner.buffer()
    }

    fn commit(&mut self, len: usize, dst: SocketAddr) {
        if self.faults.lose() {
            DatapathStats::add(&self.stats.injected_losses, 1);
            return;
        }
        if self.held.is_none() && self.faults.reorder() {
            self.held = Some((dst, self.inner.buffer()[..len].to_vec()));
            return;
        }
        let copy = self
            .faults
            .duplicate()
            .then(|| self.inner.buffer()[..len].to_vec());
        self.inner.commit(len, dst);
        if let Some(bytes) = copy {
            self.push_copy(dst, &bytes);
        }
        if let Some((dst, bytes)) = self.held.take() {
            self.push_copy(dst, &bytes);
        }
    }

    fn flush(&mut self) {
        self.inner.flush();
    }
}

/// A receiver that loses and corrupts what arrives.
pub(crate) struct FaultyReceiver<R> {
    inner: R,
    faults: Faults,
    scratch: Vec<u8>,
    stats: Arc<DatapathStats>,
}

impl<R: Receiver> FaultyReceiver<R> {
    pub(crate) fn new(inner: R, faults: Faults, stats: &Arc<DatapathStats>) -> Self {
        FaultyReceiver {
            inner,
            faults,
            scratch: Vec::new(),
            stats: stats.clone(),
        }
    }
}

impl<R: Receiver> Receiver for FaultyReceiver<R> {
    fn receive(&mut self, now: ferroce_transport::Instant) -> usize {
        self.inner.receive(now)
    }

    fn receive_polled(&mut self, now: ferroce_transport::Instant) -> usize {
        self.inner.receive_polled(now)
    }

    fn deliver(&mut self, deliver: Deliver<'_>) {
        let FaultyReceiver {
            inner,
            faults,
            scratch,
            stats,
        } = self;
        inner.deliver(&mut |from, bytes, ident, ecn| {
            if faults.lose() || faults.drop_rx(bytes) {
                DatapathStats::add(&stats.injected_losses, 1);
                return;
            }
            scratch.clear();
            scratch.extend_from_slice(bytes);
            faults.corrupt(scratch);
            // A marking queue before this host: CE on an ECN-capable datagram.
            let ecn = if ecn != Ecn::NotEct && faults.mark_ce() {
                DatapathStats::add(&stats.injected_ce, 1);
                Ecn::Ce
            } else {
                ecn
            };
            deliver(from, scratch, ident, ecn);
        });
    }

    fn batch(&self) -> usize {
        self.inner.batch()
    }

    fn ready_fd(&self) -> RawFd {
        self.inner.ready_fd()
    }

    fn side_fd(&self) -> Option<RawFd> {
        self.inner.side_fd()
    }

    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
}
