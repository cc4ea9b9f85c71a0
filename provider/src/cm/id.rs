//! `struct rdma_cm_id`: one endpoint of the connection manager — bound, resolved, listening or
//! connected — and what happens to it when the engine's events arrive.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ferroce_transport::cm::{
    CmEvent as EngineEvent, CommId, ConnParam, ConnectReq, Path, QpPlan, param,
};
use ferroce_transport::{
    AccessFlags, AhAttr, QpAttr, QpAttrMask, QpCap, QpModify, QpState, QpType,
};
use ferroce_wire::cm::cma_hdr;
use parking_lot::Mutex;

use super::agent::Agent;
use super::route;
use super::{CmEvent, CmEventType, EventChannel, McJoinFlag, PortSpace, UdParam};
use crate::device::HostDevices;
use crate::{
    CompletionQueue, Context, Device, Error, GsiRoute, ProtectionDomain, QpInitAttr, QueuePair,
    Result,
};

/// The most connection requests a listener holds queued for the program (the kernel's
/// `net.rdma_ucm.max_backlog` default, and the backlog of `rdma_listen(id, 0)`).
pub const MAX_BACKLOG: u32 = 1024;

/// `RDMA_UDP_QKEY`: the Q_Key of rdma_cm's UD QPs.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// Most user private data a REQ carries after the rdma_cm header.
pub const REQ_USER_DATA: usize = 92 - cma_hdr::HEADER_LEN;

/// The ID's QP: its own (made by `create_qp`), or the caller's (not kept alive by the ID).
enum QpHold {
    Own(QueuePair),
    Callers(crate::qp::WeakQueuePair),
}

impl QpHold {
    fn get(&self) -> Option<QueuePair> {
        match self {
            QpHold::Own(q) => Some(q.clone()),
            QpHold::Callers(w) => w.upgrade(),
        }
    }
}

/// One device's part of a binding: its agent and the route of the ServiceID there.
type Binding = (Arc<Agent>, GsiRoute);

#[derive(Default)]
pub(crate) struct IdState {
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    /// The agent of the device the ID is on (none for an unbound or wildcard ID).
    agent: Option<Arc<Agent>>,
    path: Option<Path>,
    /// The connection in the engine.
    comm: Option<CommId>,
    qp: Option<QpHold>,
    /// The CQs `create_qp` made (kept with the ID).
    cqs: Vec<CompletionQueue>,
    /// The port the bind took: each device's agent and its host-wide route of the ServiceID
    /// (the kernel's bind list entry; REQs for it reach this process).
    bound: Vec<Binding>,
    /// Listening on every entry of `bound`.
    listening: bool,
    /// The listen's backlog: most requests queued and not yet taken (as the kernel's ucma).
    backlog: u32,
    /// `RDMA_OPTION_ID_AFONLY` as set (None: the kernel's default at bind).
    afonly: Option<bool>,
    /// The request's values (passive side), for accept's 255.
    requested: (u8, u8),
    /// The REP's private data (active side), carried by ESTABLISHED.
    rep_private: Vec<u8>,
    ack_timeout: Option<u8>,
    tos: u8,
    /// Set by `accept`/`connect`: the QP is this ID's to program.
    owns_qp: bool,
    /// A UD ID's peer (from SIDR).
    ud: Option<UdParam>,
    /// The multicast groups joined (`rdma_join_multicast`), in join order.
    mcast: Vec<Joined>,
    /// The caller sent the RTU itself (`rdma_establish` after CONNECT_RESPONSE): its
    /// connection event was the CONNECT_RESPONSE, no ESTABLISHED follows (as librdmacm).
    self_established: bool,
}

/// One `rdma_join_multicast` of an ID.
struct Joined {
    /// The address as given (what `rdma_leave_multicast` names).
    addr: SocketAddr,
    /// The group (IPv4-mapped forms as IPv4).
    group: IpAddr,
    /// Whether the ID's QP was attached by the join.
    attached: bool,
}

pub(crate) struct IdInner {
    /// Where its events go (`rdma_migrate_id` moves it).
    pub(crate) channel: Mutex<EventChannel>,
    pub(crate) ps: PortSpace,
    pub(crate) st: Mutex<IdState>,
    /// The C layer's `id->context` (any value the program keeps there).
    pub(crate) user_context: std::sync::atomic::AtomicUsize,
    /// A listener's CONNECT_REQUEST events queued and not yet taken by the program (what
    /// its backlog bounds).
    pub(crate) queued_requests: std::sync::atomic::AtomicU32,
    /// Requests a listener dropped because its backlog was full.
    pub(crate) backlog_drops: std::sync::atomic::AtomicU64,
}

/// `struct rdma_cm_id`: a connection manager endpoint. Clones are handles of one ID; the ID
/// is destroyed (`rdma_destroy_id`: a pending request rejected, a connection disconnected)
/// when the last goes.
#[derive(Clone)]
pub struct CmId {
    pub(crate) inner: Arc<IdInner>,
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner.st.lock();
        f.debug_struct("CmId")
            .field("ps", &self.inner.ps)
            .field("local", &st.local)
            .field("peer", &st.peer)
            .field("comm", &st.comm.map(|c| format!("{c:#010x}")))
            .finish()
    }
}

impl PartialEq for CmId {
    fn eq(&self, o: &CmId) -> bool {
        Arc::ptr_eq(&self.inner, &o.inner)
    }
}

impl Eq for CmId {}

fn event(kind: CmEventType, id: &Arc<IdInner>, status: i32) -> CmEvent {
    CmEvent {
        event: kind,
        id: CmId { inner: id.clone() },
        listen_id: None,
        status,
        param: ConnParam::default(),
        ud: None,
        mc_context: 0,
    }
}

impl CmId {
    /// `rdma_create_id` on `channel` in port space `ps`.
    ///
    /// # Errors
    /// None today; the signature leaves room for resource limits.
    pub fn new(channel: &EventChannel, ps: PortSpace) -> Result<CmId> {
        Ok(CmId {
            inner: Arc::new(IdInner {
                channel: Mutex::new(channel.clone()),
                ps,
                st: Mutex::new(IdState::default()),
                user_context: std::sync::atomic::AtomicUsize::new(0),
                queued_requests: std::sync::atomic::AtomicU32::new(0),
                backlog_drops: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }

    /// The port space.
    pub fn port_space(&self) -> PortSpace {
        self.inner.ps
    }

    /// The channel the ID's events go to.
    pub fn channel(&self) -> EventChannel {
        self.inner.channel.lock().clone()
    }

    /// `rdma_migrate_id`: the ID's events go to `channel`, those queued on its old channel
    /// (its own and the requests that came through it) moved along, as the kernel's
    /// `ucma_migrate_id` moves them.
    pub fn migrate(&self, channel: &EventChannel) {
        let mut ch = self.inner.channel.lock();
        if Arc::ptr_eq(&ch.inner, &channel.inner) {
            return;
        }
        let moved = ch.take_for(self);
        *ch = channel.clone();
        for e in moved {
            channel.push(e);
        }
    }

    /// `rdma_get_local_addr` (the bound or resolved source, with its port).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.st.lock().local
    }

    /// `rdma_get_peer_addr`.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.inner.st.lock().peer
    }

    /// `id->verbs`: the context of the device the ID is on (bound, resolved, or the one a
    /// request arrived on).
    pub fn context(&self) -> Option<Context> {
        self.inner.st.lock().agent.as_ref().map(|a| a.ctx.clone())
    }

    /// The device the ID is on.
    pub fn device(&self) -> Option<Device> {
        self.inner
            .st
            .lock()
            .agent
            .as_ref()
            .map(|a| a.device.clone())
    }

    /// `id->qp`.
    pub fn qp(&self) -> Option<QueuePair> {
        self.inner.st.lock().qp.as_ref().and_then(QpHold::get)
    }

    /// `id->send_cq`: the send CQ of the ID's QP (made by [`CmId::create_qp`] or given to it).
    pub fn send_cq(&self) -> Option<CompletionQueue> {
        self.inner.st.lock().cqs.first().cloned()
    }

    /// `id->recv_cq`.
    pub fn recv_cq(&self) -> Option<CompletionQueue> {
        self.inner.st.lock().cqs.get(1).cloned()
    }

    /// The route (after `resolve_route`, or from the request).
    pub fn path(&self) -> Option<Path> {
        self.inner.st.lock().path
    }

    /// The peer of a UD ID (after SIDR resolution, or of a SIDR request).
    pub fn ud_peer(&self) -> Option<UdParam> {
        self.inner.st.lock().ud
    }

    /// `rdma_set_option(RDMA_OPTION_ID_TOS)`: the traffic class of the route.
    pub fn set_tos(&self, tos: u8) {
        self.inner.st.lock().tos = tos;
    }

    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)`: the QP `timeout` both sides program
    /// (instead of 19).
    pub fn set_ack_timeout(&self, timeout: u8) {
        self.inner.st.lock().ack_timeout = Some(timeout);
    }

    /// The value the C layer keeps in `id->context`.
    pub fn user_context(&self) -> usize {
        self.inner
            .user_context
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets it.
    pub fn set_user_context(&self, v: usize) {
        self.inner
            .user_context
            .store(v, std::sync::atomic::Ordering::Relaxed);
    }

    /// `rdma_bind_addr`: the local address, its port taken at once (a free one of
    /// [`PORT_RANGE`] for port 0, as the kernel's `cma_get_port`). An unspecified address
    /// binds every ferroce device of its family, or of both for an IPv6 one without AFONLY
    /// (a listen listens on each); so does a loopback address no device is on, as in the
    /// kernel (the ID keeps it as its local address, `verbs` stays unset).
    ///
    /// # Errors
    /// [`Error::NoDevice`] (ENODEV) if no ferroce device is on the address,
    /// [`Error::Taken`] (EADDRINUSE) if another ID holds the port on the device,
    /// [`Error::AddressNotAvailable`] (EADDRNOTAVAIL) if a wildcard overlaps another ID's port,
    /// [`Error::InvalidArgument`] if the ID is bound already.
    ///
    /// [`PORT_RANGE`]: super::PORT_RANGE
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.local.is_some() {
            return Err(Error::InvalidArgument("the ID is bound already"));
        }
        let afonly = st.afonly.unwrap_or_else(|| default_afonly(addr.ip()));
        let host = HostDevices::read();
        let wildcard = route::is_any(&host, addr.ip());
        let agents = if wildcard {
            let mut v = Vec::new();
            for d in host.listed() {
                if !afonly || d.addr.is_ipv4() == addr.is_ipv4() {
                    v.push(Agent::of(d)?);
                }
            }
            v
        } else {
            vec![Agent::of(&route::bind_device(&host, addr.ip())?)?]
        };
        let (port, routes) = reserve(&agents, self.inner.ps, addr.port(), wildcard)?;
        for (a, route) in &routes {
            a.engine.lock().bind(route.service_id().unwrap_or(0));
        }
        if !wildcard {
            st.agent = agents.first().cloned();
        }
        st.local = Some(SocketAddr::new(addr.ip(), port));
        st.bound = routes;
        st.afonly = Some(afonly);
        log::debug!(
            "rdma_bind_addr {:?} (afonly {afonly}, {} devices)",
            st.local,
            agents.len()
        );
        Ok(())
    }

    /// `rdma_set_option(RDMA_OPTION_ID_AFONLY)`: whether a wildcard bind covers its own family
    /// only (default: yes for IPv4, `net.ipv6.bindv6only` for IPv6).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] once the ID listens or is resolved (the kernel takes it
    /// while the ID is idle or bound).
    pub fn set_afonly(&self, afonly: bool) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.listening || st.peer.is_some() {
            log::debug!("rdma_set_option AFONLY: the ID is neither idle nor only bound");
            return Err(Error::InvalidArgument(
                "AFONLY is set on an idle or bound ID only",
            ));
        }
        st.afonly = Some(afonly);
        Ok(())
    }

    /// `rdma_resolve_addr`: picks the source address (the bound one, `src`, or the host's
    /// route to `dst`) and its device; [`CmEventType::AddrResolved`] follows, or
    /// [`CmEventType::AddrError`] with −ENODEV when no ferroce device is on the source.
    ///
    /// # Errors
    /// Only for an unusable call (an ID already connected); resolution failures are events.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        _timeout: Duration,
    ) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.comm.is_some() {
            return Err(Error::InvalidArgument("the ID is connected already"));
        }
        let host = HostDevices::read();
        let bound = st.local.filter(|a| !route::is_any(&host, a.ip()));
        let src_ip = match bound.or(src.filter(|a| !route::is_any(&host, a.ip()))) {
            Some(a) => Ok(a.ip()),
            None => route::pick_source(&host, dst.ip()),
        };
        let port = bound
            .or(src)
            .map(|a| a.port())
            .filter(|p| *p != 0)
            .unwrap_or_else(route::random_port);
        let found = src_ip.and_then(|ip| Ok((ip, Agent::of(&route::bind_device(&host, ip)?)?)));
        let e = match found {
            Ok((ip, agent)) => {
                st.local = Some(SocketAddr::new(ip, port));
                st.peer = Some(dst);
                st.agent = Some(agent);
                event(CmEventType::AddrResolved, &self.inner, 0)
            }
            Err(e) => {
                log::debug!("rdma_resolve_addr to {dst}: {e}");
                event(CmEventType::AddrError, &self.inner, -libc::ENODEV)
            }
        };
        drop(st);
        self.inner.channel.lock().push(e);
        Ok(())
    }

    /// `rdma_resolve_route`: the RoCE path (no query on the wire); [`CmEventType::RouteResolved`]
    /// follows.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] before `resolve_addr`.
    pub fn resolve_route(&self, _timeout: Duration) -> Result<()> {
        let mut st = self.inner.st.lock();
        let (Some(local), Some(peer), Some(agent)) = (st.local, st.peer, st.agent.clone()) else {
            return Err(Error::InvalidArgument("resolve_route before resolve_addr"));
        };
        st.path = Some(route::path(&agent.device, local, peer, st.tos));
        drop(st);
        self.inner
            .channel
            .lock()
            .push(event(CmEventType::RouteResolved, &self.inner, 0));
        Ok(())
    }

    /// `rdma_create_qp`: a QP on the ID's device, in INIT (port 1, P_Key index 0, no remote
    /// access until the connection says; a UD QP goes on to RTS with Q_Key
    /// [`RDMA_UDP_QKEY`]). With `init` `None`, CQs of 128 entries are made for it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an ID on no device or with a QP already;
    /// what `create_qp` and `modify_qp` refuse.
    pub fn create_qp(
        &self,
        pd: &ProtectionDomain,
        init: Option<&QpInitAttr<'_>>,
    ) -> Result<QueuePair> {
        let qp_type = if self.inner.ps == PortSpace::Udp {
            QpType::Ud
        } else {
            QpType::Rc
        };
        let mut st = self.inner.st.lock();
        if st.qp.as_ref().and_then(QpHold::get).is_some() {
            return Err(Error::InvalidArgument("the ID has a QP already"));
        }
        let qp = match init {
            Some(i) => {
                let qp = pd.create_qp(i)?;
                st.cqs = vec![i.send_cq.clone(), i.recv_cq.clone()];
                qp
            }
            None => {
                let ctx = pd.context();
                let scq = ctx.create_cq(128, None)?;
                let rcq = ctx.create_cq(128, None)?;
                let qp = pd.create_qp(&QpInitAttr {
                    qp_type,
                    send_cq: &scq,
                    recv_cq: &rcq,
                    srq: None,
                    cap: QpCap {
                        max_send_wr: 64,
                        max_recv_wr: 64,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_all: false,
                })?;
                st.cqs = vec![scq, rcq];
                qp
            }
        };
        let init = QpModify::new(QpState::Init).pkey_index(0).port_num(1);
        if qp.qp_type() == QpType::Ud {
            qp.modify_with(&init.qkey(RDMA_UDP_QKEY))?;
            qp.modify_with(&QpModify::new(QpState::Rtr))?;
            qp.modify_with(&QpModify::new(QpState::Rts).sq_psn(0))?;
        } else {
            qp.modify_with(&init.qp_access_flags(AccessFlags::EMPTY))?;
        }
        st.qp = Some(QpHold::Own(qp.clone()));
        st.owns_qp = true;
        Ok(qp)
    }

    /// Uses a QP the caller made and owns (`rdma_create_qp` with the caller's own QP): the
    /// connection programs it as it would its own, and does not keep it alive (destroying it
    /// is the caller's, as `ibv_destroy_qp` is).
    pub fn set_qp(&self, qp: &QueuePair) {
        let mut st = self.inner.st.lock();
        st.qp = Some(QpHold::Callers(qp.downgrade()));
        st.owns_qp = true;
    }

    /// `rdma_destroy_qp`: the ID forgets its QP (the QP itself goes with its last handle).
    pub fn destroy_qp(&self) {
        let mut st = self.inner.st.lock();
        st.qp = None;
        st.owns_qp = false;
        st.cqs.clear();
    }

    /// `rdma_listen`: listens on the port the bind took, on the bound device (every device
    /// the wildcard covers); an unbound ID is bound to the IPv4 wildcard and port 0 first, as
    /// the kernel does.
    ///
    /// # Errors
    /// What [`CmId::bind_addr`] refuses for an unbound ID; [`Error::Cm`] if the engine
    /// refuses the listen.
    pub fn listen(&self, backlog: i32) -> Result<()> {
        if self.inner.st.lock().local.is_none() {
            self.bind_addr((std::net::Ipv4Addr::UNSPECIFIED, 0).into())?;
        }
        let mut st = self.inner.st.lock();
        // The kernel's ucma: a backlog outside 1..MAX_BACKLOG is MAX_BACKLOG.
        st.backlog = match u32::try_from(backlog) {
            Ok(b) if b > 0 && b < MAX_BACKLOG => b,
            _ => MAX_BACKLOG,
        };
        if st.listening {
            return Ok(());
        }
        for (a, route) in &st.bound {
            let sid = route.service_id().unwrap_or(0);
            if let Err(e) = a.engine.lock().listen(sid) {
                return Err(Error::Cm(e));
            }
            a.listeners.lock().insert(sid, Arc::downgrade(&self.inner));
        }
        st.listening = true;
        let agents: Vec<Arc<Agent>> = st.bound.iter().map(|(a, _)| a.clone()).collect();
        drop(st);
        // REQs that came between the bind and now are taken (their events follow).
        for a in agents {
            let now = a.now();
            a.engine.lock().handle_timeout(now);
            a.flush();
        }
        let st = self.inner.st.lock();
        log::debug!("rdma_listen on {:?} ({} devices)", st.local, st.bound.len());
        Ok(())
    }

    /// `rdma_connect`: sends the REQ (or, in the UDP port space, the SIDR_REQ) with `param`
    /// (librdmacm's rules: 255 for the device's caps, retry counts clamped to 7, at most 56
    /// bytes of private data after the rdma_cm header).
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the field for a depth beyond the device's cap or too much
    /// private data; [`Error::InvalidArgument`] before `resolve_route`.
    pub fn connect(&self, p: &ConnParam) -> Result<()> {
        let mut st = self.inner.st.lock();
        let (Some(local), Some(peer), Some(agent)) = (st.local, st.peer, st.agent.clone()) else {
            return Err(Error::InvalidArgument("connect before resolve_route"));
        };
        let max = if self.inner.ps == PortSpace::Udp {
            180
        } else {
            REQ_USER_DATA
        };
        if p.private_data.len() > max {
            return Err(Error::Invalid(format!(
                "{} bytes of private data: a {} carries at most {max} after the rdma_cm header",
                p.private_data.len(),
                if self.inner.ps == PortSpace::Udp {
                    "SIDR_REQ"
                } else {
                    "REQ"
                }
            )));
        }
        let mut data = vec![0u8; cma_hdr::HEADER_LEN];
        cma_hdr::Repr::new(local.ip(), local.port(), peer.ip())
            .emit(&mut cma_hdr::Packet::new_unchecked(&mut data[..]));
        data.extend_from_slice(&p.private_data);
        let sid = self.inner.ps.service_id(peer.port());
        let now = agent.now();
        let comm = if self.inner.ps == PortSpace::Udp {
            agent
                .engine
                .lock()
                .sidr_request(now, peer.ip(), sid, &data)
                .map_err(Error::Cm)?
        } else {
            let param = p
                .for_connect(agent.caps)
                .map_err(|e| Error::Invalid(e.to_string()))?;
            let path = st
                .path
                .ok_or(Error::InvalidArgument("connect before resolve_route"))?;
            let (qpn, tst) = match &st.qp.as_ref().and_then(QpHold::get) {
                Some(q) => (q.qp_num(), u8::from(q.qp_type() == QpType::Uc)),
                None => (p.qp_num, 0),
            };
            let req = ConnectReq {
                service_id: sid,
                path,
                qpn,
                transport_service_type: tst,
                param: ConnParam {
                    private_data: data,
                    ..param
                },
                ack_timeout: st.ack_timeout.unwrap_or(param::DEFAULT_ACK_TIMEOUT),
            };
            agent.engine.lock().connect(now, req).map_err(Error::Cm)?
        };
        st.comm = Some(comm);
        agent.conns.lock().insert(comm, Arc::downgrade(&self.inner));
        drop(st);
        agent.flush();
        Ok(())
    }

    /// `rdma_accept`: answers a [`CmEventType::ConnectRequest`] (255 in a depth: the request's
    /// value within the device's caps). If the ID has a QP it goes to RTS first, as
    /// librdmacm does; ESTABLISHED follows the peer's RTU.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a depth beyond the caps or more than 196 bytes of private data,
    /// [`Error::Cm`] if the request is gone, what `modify_qp` refuses (the request is then
    /// rejected).
    pub fn accept(&self, p: &ConnParam) -> Result<()> {
        let st = self.inner.st.lock();
        let (Some(agent), Some(comm)) = (st.agent.clone(), st.comm) else {
            return Err(Error::InvalidArgument("accept on an ID with no request"));
        };
        if self.inner.ps == PortSpace::Udp {
            let (qpn, qkey) = match &st.qp.as_ref().and_then(QpHold::get) {
                Some(q) => (q.qp_num(), RDMA_UDP_QKEY),
                None => (p.qp_num, RDMA_UDP_QKEY),
            };
            agent
                .engine
                .lock()
                .sidr_accept(comm, qpn, qkey, &p.private_data)
                .map_err(Error::Cm)?;
            drop(st);
            agent.flush();
            return Ok(());
        }
        if p.private_data.len() > 196 {
            return Err(Error::Invalid(format!(
                "{} bytes of private data: a REP carries at most 196",
                p.private_data.len()
            )));
        }
        let mut param = p
            .for_accept(agent.caps, st.requested)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        if let Some(q) = st.qp.as_ref().and_then(QpHold::get) {
            param.qp_num = q.qp_num();
        }
        let qp = st.qp.as_ref().and_then(QpHold::get).filter(|_| st.owns_qp);
        drop(st);
        let now = agent.now();
        {
            // The QP is programmed under the engine lock, so the REP cannot leave before it.
            let mut e = agent.engine.lock();
            let plan = e.accept(now, comm, param).map_err(Error::Cm)?;
            if let Some(qp) = qp {
                if let Err(err) = program(&qp, &plan) {
                    log::debug!("rdma_accept: QP {:#x}: {err}: REJ", qp.qp_num());
                    e.destroy(now, comm);
                    drop(e);
                    agent.flush();
                    return Err(err);
                }
            }
        }
        agent.flush();
        Ok(())
    }

    /// `rdma_reject`: REJ "consumer defined" (28) with up to 148 bytes of private data (for a
    /// UDP request, a SIDR_REP "rejected").
    ///
    /// # Errors
    /// [`Error::Cm`] if there is no pending request or the data is too long.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let st = self.inner.st.lock();
        let (Some(agent), Some(comm)) = (st.agent.clone(), st.comm) else {
            return Err(Error::InvalidArgument("reject on an ID with no request"));
        };
        drop(st);
        agent
            .engine
            .lock()
            .reject(comm, private_data)
            .map_err(Error::Cm)?;
        agent.flush();
        Ok(())
    }

    /// `rdma_establish`: for an ID whose QP the caller programs (no QP on the ID): after
    /// [`CmEventType::ConnectResponse`] and RTS, sends the RTU.
    ///
    /// # Errors
    /// [`Error::Cm`] unless a REP was received.
    pub fn establish(&self) -> Result<()> {
        let st = self.inner.st.lock();
        let (Some(agent), Some(comm)) = (st.agent.clone(), st.comm) else {
            return Err(Error::InvalidArgument(
                "establish on an ID with no connection",
            ));
        };
        drop(st);
        self.inner.st.lock().self_established = true;
        let now = agent.now();
        agent
            .engine
            .lock()
            .establish(now, comm)
            .map_err(Error::Cm)?;
        agent.flush();
        Ok(())
    }

    /// `rdma_notify` (on `IBV_EVENT_COMM_EST`): the passive side is established before the
    /// RTU came.
    ///
    /// # Errors
    /// [`Error::Cm`] unless a REP was sent.
    pub fn notify(&self) -> Result<()> {
        let st = self.inner.st.lock();
        let (Some(agent), Some(comm)) = (st.agent.clone(), st.comm) else {
            return Err(Error::InvalidArgument("notify on an ID with no connection"));
        };
        drop(st);
        agent.engine.lock().notify(comm).map_err(Error::Cm)?;
        agent.flush();
        Ok(())
    }

    /// `rdma_disconnect`: moves the QP to ERR and sends the DREQ (or the DREP answering the
    /// peer's); DISCONNECTED follows.
    ///
    /// # Errors
    /// [`Error::Cm`] if the ID is not connected.
    pub fn disconnect(&self) -> Result<()> {
        let st = self.inner.st.lock();
        let (Some(agent), Some(comm)) = (st.agent.clone(), st.comm) else {
            return Err(Error::InvalidArgument(
                "disconnect on an ID with no connection",
            ));
        };
        if let Some(qp) = st.qp.as_ref().and_then(QpHold::get).filter(|_| st.owns_qp) {
            let _ = qp.modify_with(&QpModify::new(QpState::Err));
        }
        drop(st);
        let now = agent.now();
        agent
            .engine
            .lock()
            .disconnect(now, comm)
            .map_err(Error::Cm)?;
        agent.flush();
        Ok(())
    }

    /// `rdma_init_qp_attr`: the attributes for moving the caller's own QP to `state`
    /// (INIT: port and access; RTR and RTS: the negotiated values).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] before the values are known or for another state.
    pub fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        let st = self.inner.st.lock();
        if state == QpState::Init {
            let access = match (st.agent.as_ref(), st.comm) {
                (Some(a), Some(c)) => a.engine.lock().qp_plan(c).map(|p| p.init.0.qp_access_flags),
                _ => None,
            }
            .unwrap_or(AccessFlags::EMPTY);
            let attr = QpAttr {
                qp_state: QpState::Init,
                port_num: 1,
                pkey_index: 0,
                qp_access_flags: access,
                ..QpAttr::default()
            };
            return Ok((
                attr,
                QpAttrMask::STATE
                    | QpAttrMask::PKEY_INDEX
                    | QpAttrMask::PORT
                    | QpAttrMask::ACCESS_FLAGS,
            ));
        }
        let (Some(agent), Some(comm)) = (st.agent.clone(), st.comm) else {
            return Err(Error::InvalidArgument(
                "init_qp_attr on an ID with no connection",
            ));
        };
        let plan = agent
            .engine
            .lock()
            .qp_plan(comm)
            .ok_or(Error::InvalidArgument(
                "the connection's values are not known yet",
            ))?;
        match state {
            QpState::Rtr => Ok(plan.rtr),
            QpState::Rts => Ok(plan.rts),
            _ => Err(Error::InvalidArgument(
                "init_qp_attr is for INIT, RTR and RTS",
            )),
        }
    }
}

/// INIT→INIT (remote access), RTR, RTS, as the plan says.
fn program(qp: &QueuePair, plan: &QpPlan) -> Result<()> {
    for (attr, mask) in [plan.init, plan.rtr, plan.rts] {
        qp.modify(&attr, mask)?;
    }
    Ok(())
}

impl IdInner {
    /// A request for a listened ServiceID: a new ID on the listener's channel.
    pub(crate) fn on_request(agent: &Arc<Agent>, listener: Option<Arc<IdInner>>, ev: EngineEvent) {
        let (comm, peer_ip, pd) = match &ev {
            EngineEvent::ConnectRequest {
                id,
                peer,
                private_data,
                ..
            }
            | EngineEvent::SidrRequest {
                id,
                peer,
                private_data,
                ..
            } => (*id, *peer, private_data.clone()),
            _ => return,
        };
        let Some(l) = listener else {
            log::debug!("rdma_cm: a request for a listener gone: rejected");
            let _ = agent.engine.lock().reject(comm, &[]);
            return;
        };
        // The rdma_cm header names both ends; a request without a good one is REJ 28.
        let hdr = cma_hdr::Packet::new_checked(&pd[..])
            .and_then(|p| cma_hdr::Repr::parse(&p))
            .ok()
            .and_then(|h| Some((h.src()?, h.port, h.dst()?)));
        let Some((src, sport, dst)) = hdr else {
            log::debug!("rdma_cm: a request from {peer_ip} without a valid rdma_cm header: REJ 28");
            let _ = agent.engine.lock().reject(comm, &[]);
            return;
        };
        let (lport, backlog) = {
            let st = l.st.lock();
            (st.local.map_or(0, |a| a.port()), st.backlog)
        };
        // The backlog: a request beyond it is dropped unanswered, as the kernel's ucma does
        // (its REQ retransmission comes back once the program has taken some).
        let queued = l.queued_requests.fetch_update(
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
            |q| (q < backlog).then_some(q + 1),
        );
        if queued.is_err() {
            l.backlog_drops
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            log::debug!(
                "rdma_cm: a request from {peer_ip} dropped: the listener on port {lport} has \
                 {backlog} requests queued that the program has not taken (its backlog); the \
                 peer's CM sends it again"
            );
            let _ = agent.engine.lock().drop_request(comm);
            return;
        }
        let child = Arc::new(IdInner {
            channel: Mutex::new(l.channel.lock().clone()),
            ps: l.ps,
            st: Mutex::new(IdState::default()),
            user_context: std::sync::atomic::AtomicUsize::new(0),
            queued_requests: std::sync::atomic::AtomicU32::new(0),
            backlog_drops: std::sync::atomic::AtomicU64::new(0),
        });
        let mut param = ConnParam {
            private_data: pd[cma_hdr::HEADER_LEN..].to_vec(),
            ..ConnParam::default()
        };
        let mut ud = None;
        {
            let mut st = child.st.lock();
            st.local = Some(SocketAddr::new(dst, lport));
            st.peer = Some(SocketAddr::new(src, sport));
            st.agent = Some(agent.clone());
            st.comm = Some(comm);
            if let EngineEvent::ConnectRequest { info, .. } = &ev {
                st.path = Some(info.path);
                st.requested = (info.responder_resources, info.initiator_depth);
                param.responder_resources = info.responder_resources;
                param.initiator_depth = info.initiator_depth;
                param.flow_control = info.flow_control;
                param.retry_count = info.retry_count;
                param.rnr_retry_count = info.rnr_retry_count;
                param.srq = info.srq;
                param.qp_num = info.remote_qpn;
            } else {
                ud = Some(UdParam {
                    ah_attr: AhAttr::new(peer_ip),
                    qp_num: 0,
                    qkey: RDMA_UDP_QKEY,
                });
                st.ud = ud;
            }
        }
        agent.conns.lock().insert(comm, Arc::downgrade(&child));
        let mut e = event(CmEventType::ConnectRequest, &child, 0);
        e.listen_id = Some(CmId { inner: l.clone() });
        e.param = param;
        e.ud = ud;
        l.channel.lock().push(e);
    }

    /// An engine event of this ID's connection.
    pub(crate) fn on_event(self: &Arc<Self>, agent: &Arc<Agent>, ev: EngineEvent) {
        let mut out = match ev {
            EngineEvent::ConnectResponse {
                id: comm,
                info,
                private_data,
            } => {
                let mut st = self.st.lock();
                st.rep_private = private_data.clone();
                let qp = st.qp.as_ref().and_then(QpHold::get).filter(|_| st.owns_qp);
                drop(st);
                if let Some(qp) = qp {
                    // librdmacm brings its QP up and sends the RTU; the user sees
                    // ESTABLISHED (with the REP's private data).
                    let plan = agent.engine.lock().qp_plan(comm);
                    let r = plan
                        .ok_or(Error::InvalidArgument("no plan"))
                        .and_then(|p| program(&qp, &p));
                    match r {
                        Ok(()) => {
                            let now = agent.now();
                            let _ = agent.engine.lock().establish(now, comm);
                            return;
                        }
                        Err(e) => {
                            log::debug!(
                                "rdma_cm: QP {:#x} not brought up: {e}: CONNECT_ERROR",
                                qp.qp_num()
                            );
                            let _ = agent.engine.lock().reject(comm, &[]);
                            event(CmEventType::ConnectError, self, -libc::EINVAL)
                        }
                    }
                } else {
                    let mut e = event(CmEventType::ConnectResponse, self, 0);
                    e.param = ConnParam {
                        private_data,
                        responder_resources: info.responder_resources,
                        initiator_depth: info.initiator_depth,
                        flow_control: info.flow_control,
                        rnr_retry_count: info.rnr_retry_count,
                        srq: info.srq,
                        qp_num: info.remote_qpn,
                        ..ConnParam::default()
                    };
                    e
                }
            }
            EngineEvent::Established { .. } => {
                let mut st = self.st.lock();
                if std::mem::take(&mut st.self_established) {
                    return;
                }
                let mut e = event(CmEventType::Established, self, 0);
                e.param.private_data = std::mem::take(&mut st.rep_private);
                drop(st);
                e
            }
            EngineEvent::Rejected {
                reason,
                private_data,
                ..
            } => {
                let qp = self.st.lock().qp.as_ref().and_then(QpHold::get);
                if let Some(qp) = qp {
                    let _ = qp.modify_with(&QpModify::new(QpState::Err));
                }
                let mut e = event(CmEventType::Rejected, self, i32::from(reason));
                e.param.private_data = private_data;
                e
            }
            EngineEvent::Unreachable { .. } => {
                event(CmEventType::Unreachable, self, -libc::ETIMEDOUT)
            }
            EngineEvent::Disconnected { timed_out, .. } => event(
                CmEventType::Disconnected,
                self,
                if timed_out { -libc::ETIMEDOUT } else { 0 },
            ),
            EngineEvent::TimewaitExit { id: comm } => {
                agent.conns.lock().remove(&comm);
                self.st.lock().comm = None;
                event(CmEventType::TimewaitExit, self, 0)
            }
            EngineEvent::SidrResponse {
                status,
                qpn,
                qkey,
                private_data,
                id: comm,
            } => {
                agent.conns.lock().remove(&comm);
                let peer = self.st.lock().peer.map(|p| p.ip());
                if status == 0 {
                    let ud = UdParam {
                        ah_attr: AhAttr::new(peer.unwrap_or(IpAddr::from([0, 0, 0, 0]))),
                        qp_num: qpn,
                        qkey,
                    };
                    self.st.lock().ud = Some(ud);
                    let mut e = event(CmEventType::Established, self, 0);
                    e.ud = Some(ud);
                    e.param.private_data = private_data;
                    e
                } else {
                    event(CmEventType::Unreachable, self, i32::from(status))
                }
            }
            EngineEvent::ConnectRequest { .. } | EngineEvent::SidrRequest { .. } => return,
        };
        out.listen_id = None;
        self.channel.lock().push(out);
    }
}

/// The kernel's default of AFONLY at bind: IPv4 binds are of their family only, IPv6 ones
/// as `net.ipv6.bindv6only` says (0, both families, unless the host says otherwise).
fn default_afonly(ip: IpAddr) -> bool {
    ip.is_ipv4()
        || std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only").is_ok_and(|v| v.trim() == "1")
}

/// Takes `port` of port space `ps` (a free one for 0: the same on every device) on each
/// agent's device: the routes that make the binding, and the port.
fn reserve(
    agents: &[Arc<Agent>],
    ps: PortSpace,
    port: u16,
    wildcard: bool,
) -> Result<(u16, Vec<Binding>)> {
    if agents.is_empty() {
        return Ok((
            if port == 0 {
                route::random_port()
            } else {
                port
            },
            Vec::new(),
        ));
    }
    // A port picked on the first device may be taken on another: pick again.
    for _ in 0..32 {
        let mut routes = Vec::new();
        let mut p = port;
        let mut failed = None;
        for a in agents {
            let r = if p == 0 {
                a.ctx.gsi_listen_any(ps.service_id(0), super::PORT_RANGE)
            } else {
                a.ctx.gsi_listen(ps.service_id(p))
            };
            match r {
                Ok(r) => {
                    p = r.service_id().unwrap_or(0) as u16;
                    routes.push((a.clone(), r));
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        match failed {
            None => return Ok((p, routes)),
            Some(Error::Taken(_)) if port == 0 => continue,
            Some(Error::Taken(what)) if wildcard => {
                return Err(Error::AddressNotAvailable(format!(
                    "a wildcard bind of port {port} overlaps a binding of it: {what}"
                )));
            }
            Some(e) => return Err(e),
        }
    }
    Err(Error::Busy("no port of the range is free on every device"))
}

/// Undoes what an ID holds: its listens and binding (the port is free again), its connection
/// (rejected, disconnected or dropped as `ib_destroy_cm_id` does).
fn teardown(st: &mut IdState) {
    // Its groups are left: the QP (if still alive) detached from each it was attached to.
    let qp = st.qp.as_ref().and_then(QpHold::get);
    for j in st.mcast.drain(..) {
        if let (true, Some(qp)) = (j.attached, &qp) {
            let _ = qp.detach_mcast(j.group);
        }
    }
    let listening = std::mem::take(&mut st.listening);
    for (agent, route) in st.bound.drain(..) {
        let sid = route.service_id().unwrap_or(0);
        {
            let mut e = agent.engine.lock();
            if listening {
                e.unlisten(sid);
            }
            e.unbind(sid);
        }
        if listening {
            agent.listeners.lock().remove(&sid);
        }
        // The route (the port's host-wide hold) goes here.
        drop(route);
        agent.flush();
    }
    if let (Some(agent), Some(comm)) = (st.agent.take(), st.comm.take()) {
        let now = agent.now();
        agent.engine.lock().destroy(now, comm);
        agent.conns.lock().remove(&comm);
        agent.flush();
    }
}

impl CmId {
    /// Requests this listener dropped because its backlog was full (the program had not
    /// taken the queued ones with `rdma_get_cm_event`).
    pub fn backlog_drops(&self) -> u64 {
        self.inner
            .backlog_drops
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `rdma_join_multicast_ex`: joins the IPv4 multicast group `addr` (its MGID is the
    /// IPv4-mapped address, as the kernel's rdma_cm makes it for RoCEv2). A full member's QP is
    /// attached now (as librdmacm does when the join completes), a send-only member's is not;
    /// [`CmEventType::MulticastJoin`] follows with the group's address vector (hop limit 64),
    /// QPN 0xFFFFFF and Q_Key [`RDMA_UDP_QKEY`], or [`CmEventType::MulticastError`] (status
    /// −1, as librdmacm reports a failed attach) if the QP cannot be attached. `context`
    /// comes back in the event's [`CmEvent::mc_context`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (EINVAL) for an ID that is not UDP or not bound to a device,
    /// or an address that is not an IPv4 multicast group; [`Error::NotSupported`] for an IPv6
    /// group (the kernel's rdma_cm refuses those on RoCEv2 too).
    pub fn join_multicast(&self, addr: SocketAddr, flag: McJoinFlag, context: usize) -> Result<()> {
        let mut st = self.inner.st.lock();
        if !matches!(self.inner.ps, PortSpace::Udp | PortSpace::Ipoib) {
            log::debug!("rdma_join_multicast: only UD IDs (RDMA_PS_UDP) join groups");
            return Err(Error::InvalidArgument("multicast on an ID that is not UD"));
        }
        if st.agent.is_none() {
            log::debug!(
                "rdma_join_multicast: the ID is on no device (rdma_bind_addr or                  rdma_resolve_addr first)"
            );
            return Err(Error::InvalidArgument(
                "rdma_join_multicast on an unbound ID",
            ));
        }
        let group = ferroce_transport::mcast::canonical(addr.ip());
        if group.is_ipv6() {
            log::debug!(
                "rdma_join_multicast {addr}: IPv6 groups are not joined on RoCEv2 (as the \
                 kernel's rdma_cm)"
            );
            return Err(Error::NotSupported("IPv6 multicast groups on RoCEv2"));
        }
        if !ferroce_transport::mcast::is_group(group) {
            log::debug!("rdma_join_multicast: {group} is not a multicast address");
            return Err(Error::InvalidArgument("not a multicast address"));
        }
        let qp = st.qp.as_ref().and_then(QpHold::get);
        let attach = match (&qp, flag) {
            (Some(qp), McJoinFlag::Fullmember) => Some(qp.attach_mcast(group)),
            _ => None,
        };
        let failed = matches!(attach, Some(Err(_)));
        st.mcast.push(Joined {
            addr,
            group,
            attached: matches!(attach, Some(Ok(()))),
        });
        drop(st);
        let mut e = if let Some(Err(err)) = attach {
            log::debug!("rdma_join_multicast {group}: attaching the QP: {err}");
            event(CmEventType::MulticastError, &self.inner, -1)
        } else {
            event(CmEventType::MulticastJoin, &self.inner, 0)
        };
        if !failed {
            e.ud = Some(UdParam {
                ah_attr: AhAttr::new(group),
                qp_num: ferroce_transport::MULTICAST_QPN,
                qkey: RDMA_UDP_QKEY,
            });
        }
        e.mc_context = context;
        self.inner.channel.lock().push(e);
        Ok(())
    }

    /// `rdma_leave_multicast`: leaves the group joined as `addr`, detaching the QP.
    ///
    /// # Errors
    /// [`Error::AddressNotAvailable`] (EADDRNOTAVAIL) if the ID has not joined `addr`.
    pub fn leave_multicast(&self, addr: SocketAddr) -> Result<()> {
        let mut st = self.inner.st.lock();
        let Some(i) = st.mcast.iter().position(|j| j.addr == addr) else {
            log::debug!("rdma_leave_multicast {addr}: the ID has not joined it");
            return Err(Error::AddressNotAvailable(format!("{addr} was not joined")));
        };
        let j = st.mcast.remove(i);
        let qp = st.qp.as_ref().and_then(QpHold::get);
        drop(st);
        if let (true, Some(qp)) = (j.attached, qp) {
            if let Err(e) = qp.detach_mcast(j.group) {
                log::debug!("rdma_leave_multicast {addr}: detaching the QP: {e}");
            }
        }
        Ok(())
    }

    /// `rdma_destroy_id`: the ID lets go of its port, listens and connection now — not when
    /// its last handle goes (an event not yet acknowledged, or another thread delivering one,
    /// may still hold one), so a bind of the same port right after succeeds, as with the
    /// kernel's. The handles left see an ID with nothing bound.
    pub fn destroy(&self) {
        let mut taken = std::mem::take(&mut *self.inner.st.lock());
        teardown(&mut taken);
    }
}

impl Drop for IdInner {
    fn drop(&mut self) {
        teardown(self.st.get_mut());
    }
}
