//! The in-memory backend: devices of this process opened with [`crate::OpenOptions::memory`]
//! exchange datagrams through queues in memory, by address and port, with no socket. It lets
//! the driver (its pump, its progress thread, the verbs' way into the engine) be tested and
//! fuzzed without a network: a datagram for an address nobody opened is dropped, as on a
//! wire, and counted as a send error.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{DatapathStats, Deliver, MAX_PACKET, Receiver, Transmitter};
use crate::sys::EventFd;
use ferroce_transport::Ecn;

/// Datagrams one receive takes at most.
const BATCH: usize = 32;
/// Datagrams an inbox holds before it drops (a socket's full receive buffer).
const INBOX_LIMIT: usize = 8192;

/// What waits for one address: datagrams (source, bytes) and a descriptor readable while any do.
struct Inbox {
    queue: Mutex<VecDeque<(SocketAddr, Vec<u8>)>>,
    ready: EventFd,
}

/// The inboxes of the process's in-memory devices by address.
static NET: Mutex<Option<HashMap<SocketAddr, Arc<Inbox>>>> = Mutex::new(None);

fn inbox(at: SocketAddr) -> Option<Arc<Inbox>> {
    NET.lock().as_ref().and_then(|m| m.get(&at).cloned())
}

/// Opens the in-memory device at `local`.
///
/// # Errors
/// [`crate::Error::AddressInUse`] if an in-memory device of this process holds `local`,
/// [`crate::Error::Io`] if its descriptor cannot be made.
pub(crate) fn open(
    local: SocketAddr,
    stats: &Arc<DatapathStats>,
) -> crate::Result<(MemoryTransmitter, MemoryReceiver)> {
    let me = Arc::new(Inbox {
        queue: Mutex::new(VecDeque::new()),
        ready: EventFd::new()?,
    });
    {
        let mut net = NET.lock();
        let map = net.get_or_insert_with(HashMap::new);
        if map.contains_key(&local) {
            return Err(crate::Error::AddressInUse(local));
        }
        map.insert(local, me.clone());
    }
    Ok((
        MemoryTransmitter {
            local,
            buf: vec![0; MAX_PACKET],
            queued: Vec::new(),
            stats: stats.clone(),
        },
        MemoryReceiver {
            local,
            inbox: me,
            taken: Vec::with_capacity(BATCH),
            stats: stats.clone(),
        },
    ))
}

/// Queues datagrams and hands them to their destinations' inboxes at each flush.
pub(crate) struct MemoryTransmitter {
    local: SocketAddr,
    buf: Vec<u8>,
    queued: Vec<(SocketAddr, Vec<u8>)>,
    stats: Arc<DatapathStats>,
}

impl Transmitter for MemoryTransmitter {
    fn buffer(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    fn commit(&mut self, len: usize, dst: SocketAddr) {
        self.queued.push((dst, self.buf[..len].to_vec()));
    }

    fn flush(&mut self) {
        if self.queued.is_empty() {
            return;
        }
        DatapathStats::add(&self.stats.send_calls, 1);
        for (dst, bytes) in self.queued.drain(..) {
            let Some(to) = inbox(dst) else {
                log::debug!(
                    "{}: no in-memory device at {dst}: datagram dropped",
                    self.local
                );
                DatapathStats::add(&self.stats.send_errors, 1);
                continue;
            };
            let mut q = to.queue.lock();
            if q.len() >= INBOX_LIMIT {
                log::debug!("{}: {dst}'s inbox is full: datagram dropped", self.local);
                DatapathStats::add(&self.stats.send_errors, 1);
                continue;
            }
            q.push_back((self.local, bytes));
            DatapathStats::add(&self.stats.sent, 1);
            drop(q);
            to.ready.signal();
        }
    }
}

/// Takes datagrams from the device's inbox.
pub(crate) struct MemoryReceiver {
    local: SocketAddr,
    inbox: Arc<Inbox>,
    taken: Vec<(SocketAddr, Vec<u8>)>,
    stats: Arc<DatapathStats>,
}

impl Receiver for MemoryReceiver {
    fn receive(&mut self, _now: ferroce_transport::Instant) -> usize {
        let mut q = self.inbox.queue.lock();
        let n = q.len().min(BATCH);
        self.taken.clear();
        self.taken.extend(q.drain(..n));
        if q.is_empty() {
            // Readable again only when something new arrives.
            self.inbox.ready.drain();
        }
        drop(q);
        DatapathStats::add(&self.stats.recv_calls, 1);
        if n == 0 {
            DatapathStats::add(&self.stats.empty_recvs, 1);
        }
        DatapathStats::add(&self.stats.rcvd, n as u64);
        n
    }

    fn deliver(&mut self, deliver: Deliver<'_>) {
        for (from, bytes) in self.taken.drain(..) {
            deliver(from, &bytes, 0, Ecn::NotEct);
        }
    }

    fn batch(&self) -> usize {
        BATCH
    }

    fn ready_fd(&self) -> RawFd {
        self.inbox.ready.raw()
    }
}

impl Drop for MemoryReceiver {
    fn drop(&mut self) {
        if let Some(map) = NET.lock().as_mut() {
            map.remove(&self.local);
        }
    }
}
