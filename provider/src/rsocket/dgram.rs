//! A datagram rsocket (`SOCK_DGRAM`), as rdma-core's: a plain UDP socket gives it its address
//! and carries the first datagrams to a peer whose QPN it does not know yet (each behind a
//! [`UdpHeader`]); a UD QP on the source address carries the rest as UD SENDs, each behind a
//! [`DsHeader`] naming the sender. A service thread reads the UDP socket: it answers a peer's
//! first DATA datagram with a CTRL one carrying this side's QPN, learns the peer's QPN, and
//! queues the data as if it had come over the QP. Datagrams are unreliable, as UDP's.

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use ferroce_transport::{
    AccessFlags, AhAttr, InlineData, QpCap, QpType, RecvWr, SendFlags, SendWr, UdDest, WcOpcode,
    WcStatus, WrOpcode,
};

use super::dgram_proto::{DS_V6_LEN, DsHeader, OP_CTRL, OP_DATA, UDP_V6_LEN, UdpHeader};
use super::stream::Sizes;
use crate::cm::{CmId, EventChannel, PortSpace, RDMA_UDP_QKEY};
use crate::{
    CompletionQueue, Error, MemoryRegion, ProtectionDomain, QpInitAttr, QueuePair, Result,
};

/// A slot of the send and receive buffers (rdma-core's `RS_SNDLOWAT`).
const SLOT: usize = 2048;
/// The GRH in front of each UD receive.
const GRH: usize = 40;
/// How long a blocking receive polls before it sleeps between polls.
const SPIN: Duration = Duration::from_micros(200);
/// A receive work request's wr_id bit (the rest is its slot).
const RECV: u64 = 1 << 63;

/// A peer by its UDP address: its UD QPN once learned.
#[derive(Debug, Clone, Copy)]
struct Dest {
    qpn: Option<u32>,
}

/// The UD QP on the source address, its CQ and its buffers.
struct UdEp {
    _ch: EventChannel,
    _id: CmId,
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    /// This side's UDP address (the header of every UD datagram).
    local: SocketAddr,
    sbuf: MemoryRegion,
    rbuf: MemoryRegion,
    free: Vec<u32>,
    max_inline: u32,
    mtu: u32,
}

struct State {
    ud: Option<UdEp>,
    dests: HashMap<SocketAddr, Dest>,
    received: VecDeque<(SocketAddr, Vec<u8>)>,
    connected: Option<SocketAddr>,
    rq_size: u32,
    sq_size: u32,
    sq_inline: u32,
}

struct Shared {
    udp: UdpSocket,
    st: Mutex<State>,
    stop: AtomicBool,
    bound: AtomicBool,
}

/// A datagram rsocket.
pub struct Datagram {
    sh: Arc<Shared>,
    svc: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Datagram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "datagram rsocket {:?}", self.sh.udp.local_addr().ok())
    }
}

fn io(e: i32) -> Error {
    Error::Io(std::io::Error::from_raw_os_error(e))
}

impl Datagram {
    /// `rsocket(AF_INET or AF_INET6, SOCK_DGRAM)`: its UDP socket (bound by `rbind`, or at the
    /// first send or connect) and the service thread that reads it.
    ///
    /// # Errors
    /// What `socket(2)` refuses.
    pub fn new(v6: bool, sizes: Sizes) -> Result<Datagram> {
        let domain = if v6 {
            socket2::Domain::IPV6
        } else {
            socket2::Domain::IPV4
        };
        let s = crate::sys::udp_socket(domain).map_err(Error::Io)?;
        let udp: UdpSocket = s.into();
        udp.set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(Error::Io)?;
        // rdma-core's ds_set_qp_size: no more slots than the buffers hold.
        let rq_size = sizes.rq_size.min(sizes.rbuf_size / SLOT as u32).max(2);
        let sq_size = sizes.sq_size.min(sizes.sbuf_size / SLOT as u32).max(2);
        let sh = Arc::new(Shared {
            udp,
            st: Mutex::new(State {
                ud: None,
                dests: HashMap::new(),
                received: VecDeque::new(),
                connected: None,
                rq_size,
                sq_size,
                sq_inline: sizes.sq_inline,
            }),
            stop: AtomicBool::new(false),
            bound: AtomicBool::new(false),
        });
        let s2 = sh.clone();
        let svc = std::thread::Builder::new()
            .name("ferroce-rsocket-udp".into())
            .spawn(move || service(&s2))
            .map_err(Error::Io)?;
        Ok(Datagram { sh, svc: Some(svc) })
    }

    /// `rbind`: the UDP socket's address (the UD QP takes its IP address when made).
    ///
    /// # Errors
    /// What `bind(2)` refuses (EADDRINUSE, EADDRNOTAVAIL, EINVAL when bound already).
    pub fn bind(&self, addr: SocketAddr) -> Result<()> {
        socket2::SockRef::from(&self.sh.udp)
            .bind(&addr.into())
            .map_err(Error::Io)?;
        self.sh.bound.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// `rconnect`: the default destination of `rsend` (the UDP socket is connected too, as
    /// rdma-core's, which binds it if it was not).
    ///
    /// # Errors
    /// What `connect(2)` refuses; what making the UD QP refuses.
    pub fn connect(&self, dst: SocketAddr) -> Result<()> {
        self.sh.udp.connect(dst).map_err(Error::Io)?;
        self.sh.bound.store(true, Ordering::SeqCst);
        let mut st = self.sh.st.lock();
        self.sh.ensure_ep(&mut st, dst)?;
        st.dests.entry(dst).or_insert(Dest { qpn: None });
        st.connected = Some(dst);
        Ok(())
    }

    /// The queue and inline sizes (`rsetsockopt`), taken until the UD QP is made.
    pub fn set_sizes(&self, sizes: Sizes) {
        let mut st = self.sh.st.lock();
        if st.ud.is_none() {
            st.rq_size = sizes.rq_size.min(sizes.rbuf_size / SLOT as u32).max(2);
            st.sq_size = sizes.sq_size.min(sizes.sbuf_size / SLOT as u32).max(2);
            st.sq_inline = sizes.sq_inline;
        }
    }

    /// The connected destination.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.sh.st.lock().connected
    }

    /// The UDP socket's address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.sh.udp.local_addr().ok()
    }

    /// `rsendto` (`dst` `None`: `rsend` to the connected peer): one datagram, through the UD
    /// QP once the peer's QPN is known, through the UDP socket before. Returns `buf.len()`.
    ///
    /// # Errors
    /// EDESTADDRREQ without a destination; EMSGSIZE for a datagram over one packet of the
    /// path MTU (less the header) or over a buffer slot; EAGAIN when nonblocking and the send
    /// queue is full; what `sendto(2)` refuses.
    pub fn send_to(&self, buf: &[u8], dst: Option<SocketAddr>, nonblock: bool) -> Result<usize> {
        let mut st = self.sh.st.lock();
        let Some(dst) = dst.or(st.connected) else {
            log::debug!("rsend on an unconnected datagram rsocket: no destination");
            return Err(io(libc::EDESTADDRREQ));
        };
        if !self.sh.bound.swap(true, Ordering::SeqCst) {
            // As sendto(2) on an unbound socket: a port of its own, which the datagrams'
            // headers name, so the peer's answers come back to it.
            let any: SocketAddr = if dst.is_ipv4() {
                "0.0.0.0:0".parse().map_err(|_| io(libc::EINVAL))?
            } else {
                "[::]:0".parse().map_err(|_| io(libc::EINVAL))?
            };
            socket2::SockRef::from(&self.sh.udp)
                .bind(&any.into())
                .map_err(Error::Io)?;
        }
        self.sh.ensure_ep(&mut st, dst)?;
        let qpn = st.dests.entry(dst).or_insert(Dest { qpn: None }).qpn;
        drop(st);
        let Some(qpn) = qpn else {
            return self.sh.send_udp(buf, dst, OP_DATA).map(|_| buf.len());
        };
        loop {
            let mut guard = self.sh.st.lock();
            let st = &mut *guard;
            let Some(ep) = st.ud.as_mut() else {
                return Err(io(libc::ENOTCONN));
            };
            let hdr = DsHeader { src: ep.local };
            let mut h = [0u8; DS_V6_LEN];
            let hl = hdr.write(&mut h);
            let room = (SLOT as u32).min(ep.mtu) as usize - hl;
            if buf.len() > room {
                log::debug!(
                    "rsendto: {} bytes: a datagram rsocket carries at most {room} (one packet)",
                    buf.len()
                );
                return Err(io(libc::EMSGSIZE));
            }
            poll_ep(ep, &mut st.received);
            let Some(slot) = ep.free.pop() else {
                if nonblock {
                    return Err(io(libc::EAGAIN));
                }
                drop(guard);
                std::thread::yield_now();
                continue;
            };
            let mut wr = SendWr::new(u64::from(slot), WrOpcode::Send);
            wr.ud = Some(UdDest {
                ah: AhAttr::new(dst.ip()),
                remote_qpn: qpn,
                remote_qkey: RDMA_UDP_QKEY,
            });
            let total = hl + buf.len();
            if total as u32 <= ep.max_inline {
                let mut m = h[..hl].to_vec();
                m.extend_from_slice(buf);
                wr.send_flags = SendFlags::INLINE;
                wr.inline_data = Some(InlineData::from_slice(&m));
            } else {
                let off = slot as usize * SLOT;
                ep.sbuf.write(off, &h[..hl])?;
                ep.sbuf.write(off + hl, buf)?;
                wr.sg_list = vec![ep.sbuf.sge(off, total as u32)].into();
            }
            if let Err(e) = ep.qp.post_send(&wr) {
                ep.free.push(slot);
                return Err(e);
            }
            return Ok(buf.len());
        }
    }

    /// `rrecvfrom` (`rrecv`): the next datagram into `buf` (truncated to it, the rest
    /// dropped, as UDP's), and its sender. `peek` leaves it queued.
    ///
    /// # Errors
    /// EAGAIN when nonblocking and none waits.
    pub fn recv_from(
        &self,
        buf: &mut [u8],
        nonblock: bool,
        peek: bool,
    ) -> Result<(usize, SocketAddr)> {
        let start = std::time::Instant::now();
        loop {
            {
                let mut st = self.sh.st.lock();
                let st = &mut *st;
                if let Some(ep) = st.ud.as_mut() {
                    poll_ep(ep, &mut st.received);
                }
                let front = if peek {
                    st.received.front().cloned()
                } else {
                    st.received.pop_front()
                };
                if let Some((from, data)) = front {
                    let n = data.len().min(buf.len());
                    buf[..n].copy_from_slice(&data[..n]);
                    return Ok((n, from));
                }
            }
            if nonblock {
                return Err(io(libc::EAGAIN));
            }
            // Polls a while, then sleeps in short steps (a long wait leaves the CPU to the
            // sender and the progress threads).
            if start.elapsed() < SPIN {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Whether `rrecvfrom` would return at once.
    pub fn readable(&self) -> bool {
        let mut st = self.sh.st.lock();
        let st = &mut *st;
        if let Some(ep) = st.ud.as_mut() {
            poll_ep(ep, &mut st.received);
        }
        !st.received.is_empty()
    }

    /// Whether `rsendto` would take a datagram at once.
    pub fn writable(&self) -> bool {
        let mut st = self.sh.st.lock();
        let st = &mut *st;
        match st.ud.as_mut() {
            Some(ep) => {
                poll_ep(ep, &mut st.received);
                !ep.free.is_empty()
            }
            None => true,
        }
    }
}

impl Drop for Datagram {
    fn drop(&mut self) {
        self.sh.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.svc.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    /// Makes the UD QP on the address the UDP socket sends to `dst` from, if not yet made
    /// (rdma-core's ds_get_qp: its source address is the UDP socket's, or the route's when
    /// that is a wildcard).
    fn ensure_ep(&self, st: &mut State, dst: SocketAddr) -> Result<()> {
        if st.ud.is_some() {
            return Ok(());
        }
        let mut local = self.udp.local_addr().map_err(Error::Io)?;
        if local.ip().is_unspecified() {
            let probe = crate::sys::bind_udp(SocketAddr::new(local.ip(), 0)).map_err(Error::Io)?;
            probe.connect(dst).map_err(Error::Io)?;
            local.set_ip(probe.local_addr().map_err(Error::Io)?.ip());
        }
        let ch = EventChannel::new()?;
        let id = CmId::new(&ch, PortSpace::Udp)?;
        id.bind_addr(SocketAddr::new(local.ip(), 0))?;
        let ctx = id
            .context()
            .ok_or(Error::InvalidArgument("no device for the address"))?;
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(st.sq_size + st.rq_size, None)?;
        let qp = id.create_qp(
            &pd,
            Some(&QpInitAttr {
                qp_type: QpType::Ud,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: st.sq_size,
                    max_recv_wr: st.rq_size,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: st.sq_inline,
                },
                sq_sig_all: true,
            }),
        )?;
        let sbuf = pd.reg_mr(st.sq_size as usize * SLOT, AccessFlags::LOCAL_WRITE)?;
        let rbuf = pd.reg_mr(st.rq_size as usize * (GRH + SLOT), AccessFlags::LOCAL_WRITE)?;
        for i in 0..st.rq_size {
            post_recv(&qp, &rbuf, i)?;
        }
        let mtu = ctx.query_port().active_mtu.bytes();
        log::debug!(
            "datagram rsocket {local}: UD QP {:#x}, MTU {mtu}",
            qp.qp_num()
        );
        st.ud = Some(UdEp {
            _ch: ch,
            _id: id,
            _pd: pd,
            cq,
            local,
            max_inline: st.sq_inline,
            free: (0..st.sq_size).collect(),
            qp,
            sbuf,
            rbuf,
            mtu,
        });
        Ok(())
    }

    /// One datagram through the UDP socket, behind a [`UdpHeader`] with this side's QPN.
    fn send_udp(&self, buf: &[u8], dst: SocketAddr, op: u8) -> Result<()> {
        let (qpn, ip) = {
            let st = self.st.lock();
            let Some(ep) = st.ud.as_ref() else {
                return Err(io(libc::ENOTCONN));
            };
            (ep.qp.qp_num(), ep.local.ip())
        };
        let mut h = [0u8; UDP_V6_LEN];
        let hl = UdpHeader { op, qpn, addr: ip }.write(&mut h);
        let mut m = h[..hl].to_vec();
        m.extend_from_slice(buf);
        self.udp.send_to(&m, dst).map_err(Error::Io)?;
        Ok(())
    }
}

fn post_recv(qp: &QueuePair, rbuf: &MemoryRegion, slot: u32) -> Result<()> {
    qp.post_recv(&RecvWr::new(
        RECV | u64::from(slot),
        rbuf.sge(slot as usize * (GRH + SLOT), (GRH + SLOT) as u32),
    ))
}

/// Takes the UD QP's completions: received datagrams (behind their GRH and header) queued
/// with their senders and their slots posted again, sent ones' slots freed.
fn poll_ep(ep: &mut UdEp, received: &mut VecDeque<(SocketAddr, Vec<u8>)>) {
    while let Some(wc) = ep.cq.poll_one() {
        if wc.wr_id & RECV == 0 {
            ep.free.push(wc.wr_id as u32);
            if wc.status != WcStatus::Success {
                log::debug!("datagram rsocket: a send failed: {:?}", wc.status);
            }
            continue;
        }
        let slot = (wc.wr_id & !RECV) as u32;
        if wc.status == WcStatus::Success && wc.opcode == WcOpcode::Recv {
            let len = (wc.byte_len as usize).min(GRH + SLOT);
            let mut b = vec![0u8; len];
            let got = ep.rbuf.read(slot as usize * (GRH + SLOT), &mut b);
            match got
                .ok()
                .and_then(|()| b.get(GRH..))
                .and_then(DsHeader::parse)
            {
                Some((h, hl)) => received.push_back((h.src, b[GRH + hl..].to_vec())),
                None => log::debug!(
                    "datagram rsocket: a {}-byte datagram without a valid header dropped",
                    wc.byte_len
                ),
            }
        }
        if let Err(e) = post_recv(&ep.qp, &ep.rbuf, slot) {
            log::debug!("datagram rsocket: a receive not posted again: {e}");
        }
    }
}

/// The service thread: the UDP socket's datagrams. A DATA one is answered with this side's
/// QPN (CTRL) and its data queued; either kind tells the sender's QPN.
fn service(sh: &Shared) {
    let mut buf = vec![0u8; 65536];
    while !sh.stop.load(Ordering::SeqCst) {
        if !sh.bound.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let Ok((n, from)) = sh.udp.recv_from(&mut buf) else {
            continue;
        };
        let Some((h, hl)) = UdpHeader::parse(&buf[..n], &from) else {
            log::debug!(
                "datagram rsocket: a {n}-byte UDP datagram from {from} without a valid header dropped"
            );
            continue;
        };
        let mut st = sh.st.lock();
        if let Err(e) = sh.ensure_ep(&mut st, from) {
            log::debug!("datagram rsocket: no UD QP to answer {from}: {e}");
            continue;
        }
        st.dests.insert(from, Dest { qpn: Some(h.qpn) });
        if h.op == OP_DATA {
            st.received.push_back((from, buf[hl..n].to_vec()));
            drop(st);
            if let Err(e) = sh.send_udp(&[], from, OP_CTRL) {
                log::debug!("datagram rsocket: the answer to {from} not sent: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two datagram rsockets: the first datagrams go through UDP (the QPNs unknown), the rest
    /// as UD SENDs; each side sees the other's UDP address; an oversized datagram is EMSGSIZE.
    #[test]
    fn datagrams_both_ways_first_by_udp_then_ud() {
        let a = Datagram::new(false, Sizes::default()).unwrap();
        a.bind("127.0.235.1:7800".parse().unwrap()).unwrap();
        let b = Datagram::new(false, Sizes::default()).unwrap();
        b.connect("127.0.235.1:7800".parse().unwrap()).unwrap();
        let b_addr = b.local_addr().unwrap();
        let mut buf = [0u8; 2048];
        for i in 0..50u32 {
            let msg = format!("ping {i}");
            b.send_to(msg.as_bytes(), None, false).unwrap();
            let (n, from) = a.recv_from(&mut buf, false, false).unwrap();
            assert_eq!(&buf[..n], msg.as_bytes());
            assert_eq!(from, b_addr);
            let big = vec![i as u8; 900];
            a.send_to(&big, Some(from), false).unwrap();
            let (n, from) = b.recv_from(&mut buf, false, false).unwrap();
            assert_eq!(&buf[..n], &big[..]);
            assert_eq!(from, "127.0.235.1:7800".parse().unwrap());
        }
        // By now both know each other's QPN: the datagrams went over the UD QPs.
        assert!(a.sh.st.lock().dests.values().all(|d| d.qpn.is_some()));
        assert_eq!(
            a.send_to(&[0u8; 4000], Some(b_addr), false)
                .unwrap_err()
                .errno(),
            libc::EMSGSIZE
        );
        assert_eq!(
            a.recv_from(&mut buf, true, false).unwrap_err().errno(),
            libc::EAGAIN
        );
    }
}
