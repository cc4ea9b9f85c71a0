//! pcap recording around any backend (`FERROCE_PCAP`): every datagram sent or received,
//! framed as Ethernet/IP/UDP so Wireshark decodes it as RoCEv2.

use std::fs::File;
use std::io::BufWriter;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::{Deliver, Receiver, Transmitter};
use crate::pcap::{self, Writer};

/// The file both directions write to.
pub(crate) type SharedWriter = Arc<Mutex<Writer<BufWriter<File>>>>;

/// Opens a recording at `path`.
pub(crate) fn create(path: &std::path::Path) -> std::io::Result<SharedWriter> {
    let w = Writer::new(BufWriter::new(File::create(path)?), pcap::LINKTYPE_ETHERNET)?;
    Ok(Arc::new(Mutex::new(w)))
}

fn wall_clock() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

fn write(w: &SharedWriter, src: SocketAddr, dst: SocketAddr, ident: u16, payload: &[u8]) {
    let frame = pcap::encapsulate(src, dst, ident, payload);
    if let Err(e) = w.lock().write_record(wall_clock(), &frame) {
        log::debug!("pcap record not written: {e}");
    }
}

fn flush(w: &SharedWriter) {
    // A recording is a debugging aid: keep it complete on disk after every batch.
    let _ = std::io::Write::flush(w.lock().inner_mut());
}

/// Records every datagram committed, then passes it on.
pub(crate) struct RecordingTransmitter<T> {
    inner: T,
    writer: SharedWriter,
    local: SocketAddr,
}

impl<T: Transmitter> RecordingTransmitter<T> {
    /// The wrapped transmitter.
    #[cfg(test)]
    pub(crate) fn inner_ref(&self) -> &T {
        &self.inner
    }

    pub(crate) fn new(inner: T, writer: SharedWriter, local: SocketAddr) -> Self {
        RecordingTransmitter {
            inner,
            writer,
            local,
        }
    }
}

impl<T: Transmitter> Transmitter for RecordingTransmitter<T> {
    fn buffer(&mut self) -> &mut [u8] {
        self.inner.buffer()
    }

    fn commit(&mut self, len: usize, dst: SocketAddr) {
        // Recorded as the engine built it, for IPv4 ID 0 (a train's segment k leaves with ID k
        // and its ICRC corrected to match: the same packet on the wire), in the order it built
        // them (to loopback, a held ACK leaves behind the answer built after it: `mmsg`).
        write(
            &self.writer,
            self.local,
            dst,
            0,
            &self.inner.buffer()[..len],
        );
        self.inner.commit(len, dst);
    }

    fn flush(&mut self) {
        self.inner.flush();
        flush(&self.writer);
    }
}

/// Records every datagram received before handing it on.
pub(crate) struct RecordingReceiver<R> {
    inner: R,
    writer: SharedWriter,
    local: SocketAddr,
}

impl<R: Receiver> RecordingReceiver<R> {
    pub(crate) fn new(inner: R, writer: SharedWriter, local: SocketAddr) -> Self {
        RecordingReceiver {
            inner,
            writer,
            local,
        }
    }
}

impl<R: Receiver> Receiver for RecordingReceiver<R> {
    fn receive(&mut self, now: ferroce_transport::Instant) -> usize {
        self.inner.receive(now)
    }

    fn receive_polled(&mut self, now: ferroce_transport::Instant) -> usize {
        self.inner.receive_polled(now)
    }

    fn deliver(&mut self, deliver: Deliver<'_>) {
        let (writer, local) = (&self.writer, self.local);
        let mut any = false;
        self.inner.deliver(&mut |from, bytes, ident, ecn| {
            write(writer, from, local, ident, bytes);
            any = true;
            deliver(from, bytes, ident, ecn);
        });
        if any {
            flush(writer);
        }
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
