//! The datagram path under the driver: a [`Transmitter`] the driver hands built datagrams to
//! and a [`Receiver`] it takes received ones from. The UDP socket ([`udp`]) is one backend, and
//! only a socket; the address's sharing by many processes ([`crate::host`]), fault injection
//! ([`inject`]) and pcap recording ([`record`]) wrap any backend's receiver, so the driver
//! never knows which it runs on.

pub(crate) mod inject;
pub(crate) mod memory;
pub(crate) mod record;
pub(crate) mod udp;

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use ferroce_transport::Ecn;

/// Room for the largest RoCEv2 packet (4 KiB payload plus headers): every backend's buffers.
pub(crate) const MAX_PACKET: usize = 4096 + 128;
const _: () = assert!(MAX_PACKET >= ferroce_transport::MIN_TRANSMIT_BUF);

/// The sending half of a backend. It lives under the engine lock: the engine builds each
/// datagram straight into [`Transmitter::buffer`].
pub(crate) trait Transmitter: Send {
    /// The buffer the next datagram is built in, at least [`MAX_PACKET`] bytes long.
    fn buffer(&mut self) -> &mut [u8];
    /// Queues the first `len` bytes of [`Transmitter::buffer`] for `dst`. A backend may send
    /// right away or batch until [`Transmitter::flush`].
    fn commit(&mut self, len: usize, dst: SocketAddr);
    /// Sends everything queued. Datagrams the network refuses are dropped and counted, as a
    /// NIC drops on a full queue; the transport recovers them.
    fn flush(&mut self);
}

/// What a [`Receiver`] hands each datagram to: its source, its UDP payload, the IPv4 ID a
/// ferroce sender gave it, and the ECN field of its IP header.
pub(crate) type Deliver<'a> = &'a mut dyn FnMut(SocketAddr, &[u8], u16, Ecn);

/// The receiving half of a backend. One thread at a time uses it (the driver's receive lock).
pub(crate) trait Receiver: Send {
    /// Takes what is waiting, at most one batch, without blocking; returns how many datagrams
    /// were taken from the network. `now` is engine time, read by the caller (for a receiver's
    /// periodic work: it reads no clock of its own). Called without the engine lock.
    fn receive(&mut self, now: ferroce_transport::Instant) -> usize;
    /// [`Receiver::receive`] for a program that busy-polls its CQ: the UDP backend reads one
    /// datagram (one train) after a poll that found nothing — what a poller waits for is
    /// usually a lone answer, and a batch's empty second slot would cost a failed attempt
    /// on the socket's queue — and a whole batch after one that found something.
    fn receive_polled(&mut self, now: ferroce_transport::Instant) -> usize {
        self.receive(now)
    }
    /// Hands each datagram of the last [`Receiver::receive`] (source, UDP payload, the IPv4 ID
    /// a ferroce sender gave it: its index in a coalesced train, else 0, and the ECN field of
    /// its IP header) to `deliver`, in arrival order. Called with the engine lock held.
    fn deliver(&mut self, deliver: Deliver<'_>);
    /// The most datagrams one [`Receiver::receive`] takes: a full batch means more may wait.
    fn batch(&self) -> usize;
    /// A descriptor that polls readable while datagrams wait; it stays valid as long as the
    /// receiver lives.
    fn ready_fd(&self) -> RawFd;
    /// A second descriptor to poll beside [`Receiver::ready_fd`], if the receiver reads two
    /// sockets (the UDP backend's forwarding socket); it stays valid as long as the receiver.
    fn side_fd(&self) -> Option<RawFd> {
        None
    }
    /// Bytes of datagrams the network buffers for this receiver before it drops (the
    /// socket's receive buffer); what the engine's in-flight budget is sized to.
    fn capacity(&self) -> usize {
        1 << 20
    }
}

impl<T: Transmitter + ?Sized> Transmitter for Box<T> {
    fn buffer(&mut self) -> &mut [u8] {
        (**self).buffer()
    }
    fn commit(&mut self, len: usize, dst: SocketAddr) {
        (**self).commit(len, dst);
    }
    fn flush(&mut self) {
        (**self).flush();
    }
}

impl<R: Receiver + ?Sized> Receiver for Box<R> {
    fn receive(&mut self, now: ferroce_transport::Instant) -> usize {
        (**self).receive(now)
    }
    fn receive_polled(&mut self, now: ferroce_transport::Instant) -> usize {
        (**self).receive_polled(now)
    }
    fn deliver(&mut self, deliver: Deliver<'_>) {
        (**self).deliver(deliver);
    }
    fn batch(&self) -> usize {
        (**self).batch()
    }
    fn ready_fd(&self) -> RawFd {
        (**self).ready_fd()
    }
    fn side_fd(&self) -> Option<RawFd> {
        (**self).side_fd()
    }
    fn capacity(&self) -> usize {
        (**self).capacity()
    }
}

/// Counters every backend layer adds to (relaxed atomics: read for reporting only).
#[derive(Debug, Default)]
pub(crate) struct DatapathStats {
    /// Datagrams handed to the network.
    pub(crate) sent: AtomicU64,
    /// Datagrams taken from the network.
    pub(crate) rcvd: AtomicU64,
    /// Datagrams the network refused to send.
    pub(crate) send_errors: AtomicU64,
    /// Of those, datagrams longer than the interface's MTU (EMSGSIZE).
    pub(crate) send_too_long: AtomicU64,
    /// Datagrams fault injection dropped.
    pub(crate) injected_losses: AtomicU64,
    /// Datagrams fault injection marked CE.
    pub(crate) injected_ce: AtomicU64,
    /// `sendmmsg` calls.
    pub(crate) send_calls: AtomicU64,
    /// `recvmmsg` calls, those that found nothing included.
    pub(crate) recv_calls: AtomicU64,
    /// `recvmmsg` calls that found nothing (a busy poll of an empty socket).
    pub(crate) empty_recvs: AtomicU64,
    /// `UDP_SEGMENT` trains sent (each one message of several datagrams).
    pub(crate) trains: AtomicU64,
    /// Times the progress thread woke from a sleep.
    pub(crate) wakeups: AtomicU64,
    /// `recvmmsg` calls with datagrams made by programs asleep on a completion channel.
    pub(crate) sleeper_recvs: AtomicU64,
    /// Datagrams the address's group steered to this member for another one, sent on to it.
    pub(crate) forwarded: AtomicU64,
}

impl DatapathStats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// An opened backend: its two halves and this process's membership of the address's group
/// (none for the in-memory backend, which no other process shares).
pub(crate) type Opened = (
    Box<dyn Transmitter>,
    Box<dyn Receiver>,
    Option<crate::host::group::Membership>,
);

/// Opens the backend a device's runtime is configured for: the UDP socket (or the in-memory
/// network of [`memory`]), with pcap recording and fault injection around it when asked. Sent datagrams are recorded before
/// faults strike (a lost one is in the recording, as a sender's capture would show it),
/// received ones as they arrived, before injected loss or corruption.
///
/// # Errors
/// As [`udp::open`], or [`crate::Error::Io`] if the recording cannot be created.
pub(crate) fn open(
    cfg: &crate::driver::RuntimeConfig,
    shard: usize,
    stats: &std::sync::Arc<DatapathStats>,
) -> crate::Result<Opened> {
    let (tx, rx, membership): (Box<dyn Transmitter>, Box<dyn Receiver>, _) = if cfg.memory {
        let (tx, rx) = memory::open(cfg.local, stats)?;
        (Box::new(tx), Box::new(rx), None)
    } else {
        let (tx, rx, socket) = udp::open(cfg.local, cfg.trains, cfg.ecn, stats)?;
        // The address's group routes what the socket receives before the engine sees it.
        let (rx, membership) = crate::host::join(cfg.local, socket, rx, stats)?;
        (Box::new(tx), Box::new(rx), Some(membership))
    };
    let writer = cfg.pcap_path.as_deref().map(record::create).transpose()?;
    let faults = cfg.faults.map(|f| {
        // Each shard's faults from a stream of their own.
        let seed = f.seed.unwrap_or_else(crate::faults::seed_from_clock)
            ^ (shard as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
        // The two directions draw from different streams of the same seed.
        (
            crate::faults::Faults::new(f, seed),
            crate::faults::Faults::receiving(
                f,
                seed ^ 0x9E37_79B9_7F4A_7C15,
                cfg.dropped_rx.clone(),
            ),
        )
    });
    let tx: Box<dyn Transmitter> = match (&writer, faults.as_ref().map(|f| f.0.clone())) {
        (Some(w), Some(f)) => Box::new(record::RecordingTransmitter::new(
            inject::FaultyTransmitter::new(tx, f, stats),
            w.clone(),
            cfg.local,
        )),
        (Some(w), None) => Box::new(record::RecordingTransmitter::new(tx, w.clone(), cfg.local)),
        (None, Some(f)) => Box::new(inject::FaultyTransmitter::new(tx, f, stats)),
        (None, None) => Box::new(tx),
    };
    let rx: Box<dyn Receiver> = match (writer, faults.map(|f| f.1)) {
        (Some(w), Some(f)) => Box::new(inject::FaultyReceiver::new(
            record::RecordingReceiver::new(rx, w, cfg.local),
            f,
            stats,
        )),
        (Some(w), None) => Box::new(record::RecordingReceiver::new(rx, w, cfg.local)),
        (None, Some(f)) => Box::new(inject::FaultyReceiver::new(rx, f, stats)),
        (None, None) => Box::new(rx),
    };
    Ok((tx, rx, membership))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::{FaultConfig, Faults};
    use std::sync::Arc;

    /// An in-memory backend: what is committed is kept, in order.
    #[derive(Default)]
    struct Memory {
        buf: Vec<u8>,
        sent: Vec<(SocketAddr, Vec<u8>)>,
        queued: Vec<(SocketAddr, Vec<u8>)>,
    }

    impl Transmitter for Memory {
        fn buffer(&mut self) -> &mut [u8] {
            self.buf.resize(MAX_PACKET, 0);
            &mut self.buf
        }
        fn commit(&mut self, len: usize, dst: SocketAddr) {
            self.queued.push((dst, self.buf[..len].to_vec()));
        }
        fn flush(&mut self) {
            self.sent.append(&mut self.queued);
        }
    }

    fn send_all(tx: &mut dyn Transmitter, n: u8) {
        let dst: SocketAddr = "10.0.0.2:4791".parse().unwrap();
        for i in 0..n {
            tx.buffer()[..3].copy_from_slice(&[i, i, i]);
            tx.commit(3, dst);
        }
        tx.flush();
    }

    fn faults(cfg: FaultConfig) -> Faults {
        Faults::new(cfg, 11)
    }

    #[test]
    fn fault_injection_wraps_any_transmitter() {
        let stats = Arc::new(DatapathStats::default());
        let cfg = |loss, dup, reorder| FaultConfig {
            loss,
            dup,
            reorder,
            ..FaultConfig::default()
        };
        let mut lossy =
            inject::FaultyTransmitter::new(Memory::default(), faults(cfg(1.0, 0.0, 0.0)), &stats);
        send_all(&mut lossy, 5);
        assert!(lossy.inner_ref().sent.is_empty());
        assert_eq!(DatapathStats::get(&stats.injected_losses), 5);

        let mut dup =
            inject::FaultyTransmitter::new(Memory::default(), faults(cfg(0.0, 1.0, 0.0)), &stats);
        send_all(&mut dup, 2);
        let firsts: Vec<u8> = dup.inner_ref().sent.iter().map(|d| d.1[0]).collect();
        assert_eq!(firsts, [0, 0, 1, 1]);

        // Every other datagram is held back and goes out after the next one.
        let mut reorder =
            inject::FaultyTransmitter::new(Memory::default(), faults(cfg(0.0, 0.0, 1.0)), &stats);
        send_all(&mut reorder, 4);
        let firsts: Vec<u8> = reorder.inner_ref().sent.iter().map(|d| d.1[0]).collect();
        assert_eq!(firsts, [1, 0, 3, 2]);
    }

    #[test]
    fn recording_wraps_any_transmitter() {
        let dir = std::env::temp_dir().join(format!("ferroce-rec-{}", std::process::id()));
        let writer = record::create(&dir).unwrap();
        let local: SocketAddr = "10.0.0.1:4791".parse().unwrap();
        let mut rec = record::RecordingTransmitter::new(Memory::default(), writer, local);
        send_all(&mut rec, 3);
        assert_eq!(rec.inner_ref().sent.len(), 3);
        let mut r = crate::pcap::Reader::new(std::fs::File::open(&dir).unwrap()).unwrap();
        let mut n = 0;
        while let Some(rec) = r.next_record().unwrap() {
            // Ethernet + IPv4 + UDP headers, then the datagram.
            assert_eq!(&rec.data[42..], &[n, n, n]);
            n += 1;
        }
        assert_eq!(n, 3);
        let _ = std::fs::remove_file(&dir);
    }
}
