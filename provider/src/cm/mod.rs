//! The RDMA connection manager in the spirit of librdmacm: [`CmId`]s resolve an address and a
//! route, listen, connect, accept, reject and disconnect; what happens arrives as owned
//! [`CmEvent`]s on an [`EventChannel`] (whose fd can be polled). The wire and state machine
//! are kernel rdma_cm's (IB CM MADs on QP1, an rdma_cm header in the REQ), so a ferroce
//! program connects to a kernel rdma_cm program and back.
//!
//! ```no_run
//! # fn main() -> ferroce::Result<()> {
//! use ferroce::cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};
//! let ch = EventChannel::new()?;
//! let server = CmId::new(&ch, PortSpace::Tcp)?;
//! server.bind_addr("127.0.0.1:7471".parse().unwrap())?;
//! server.listen(8)?;
//! let req = ch.get_event();
//! assert_eq!(req.event, CmEventType::ConnectRequest);
//! let conn = req.id;
//! let pd = conn.context().expect("a device").alloc_pd();
//! conn.create_qp(&pd, None)?;
//! conn.accept(&ConnParam::defaults())?;
//! # Ok(()) }
//! ```
//!
//! Under each device the process keeps one CM agent: a QP1 of its own (the host's QP1
//! forwards each CM MAD to the process it is for, see [`crate::gsi`]), the sans-IO
//! [`ferroce_transport::cm::CmEngine`], and a thread that runs its timers and delivers MADs.

mod agent;
mod channel;
mod id;
mod route;

pub(crate) use agent::forget_agents;
pub use agent::shutdown;
pub use channel::EventChannel;
pub use ferroce_transport::cm::{ConnParam, DepthCaps, Path, QpPlan};
pub use id::{CmId, MAX_BACKLOG, RDMA_UDP_QKEY, REQ_USER_DATA};
pub use route::{PORT_RANGE, service_port, set_listed_devices_only};

use ferroce_transport::AhAttr;

/// `enum rdma_port_space`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum PortSpace {
    /// `RDMA_PS_IPOIB`.
    Ipoib = 0x0002,
    /// `RDMA_PS_TCP`: reliable connections (RC, UC).
    Tcp = 0x0106,
    /// `RDMA_PS_UDP`: datagrams (UD), resolved with SIDR.
    Udp = 0x0111,
    /// `RDMA_PS_IB`: any QP type.
    Ib = 0x013F,
}

impl PortSpace {
    /// The port space of its C value.
    pub const fn from_raw(v: u32) -> Option<PortSpace> {
        match v {
            0x0002 => Some(PortSpace::Ipoib),
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            0x013F => Some(PortSpace::Ib),
            _ => None,
        }
    }

    /// The ServiceID of `port` in this space.
    pub const fn service_id(self, port: u16) -> u64 {
        ferroce_wire::cm::service_id(self as u16, port)
    }
}

/// `enum rdma_cm_mc_join_flags`: how an ID joins a multicast group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum McJoinFlag {
    /// `RDMA_MC_JOIN_FLAG_FULLMEMBER`: send and receive (the ID's QP is attached).
    #[default]
    Fullmember = 0,
    /// `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`: send only (no QP attached, no IGMP join).
    SendonlyFullmember = 1,
}

impl McJoinFlag {
    /// The flag of its C value.
    pub const fn from_raw(v: u32) -> Option<McJoinFlag> {
        match v {
            0 => Some(McJoinFlag::Fullmember),
            1 => Some(McJoinFlag::SendonlyFullmember),
            _ => None,
        }
    }
}

/// `enum rdma_cm_event_type`, with the C values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CmEventType {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`.
    AddrResolved = 0,
    /// `RDMA_CM_EVENT_ADDR_ERROR` (status −ENODEV: no ferroce device for the address).
    AddrError = 1,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
    RouteResolved = 2,
    /// `RDMA_CM_EVENT_ROUTE_ERROR`.
    RouteError = 3,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`: `id` is the new connection's ID, `listen_id` the
    /// listener's.
    ConnectRequest = 4,
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`: the REP, on an ID without a QP of its own (program
    /// the QP with [`CmId::init_qp_attr`], then [`CmId::establish`]).
    ConnectResponse = 5,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`: the QP could not be brought up.
    ConnectError = 6,
    /// `RDMA_CM_EVENT_UNREACHABLE`: no answer after every retry (status −ETIMEDOUT), or a
    /// SIDR status.
    Unreachable = 7,
    /// `RDMA_CM_EVENT_REJECTED`: status is the REJ reason (8: nobody listens, 28: refused).
    Rejected = 8,
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    Established = 9,
    /// `RDMA_CM_EVENT_DISCONNECTED`.
    Disconnected = 10,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`.
    DeviceRemoval = 11,
    /// `RDMA_CM_EVENT_MULTICAST_JOIN`.
    MulticastJoin = 12,
    /// `RDMA_CM_EVENT_MULTICAST_ERROR`.
    MulticastError = 13,
    /// `RDMA_CM_EVENT_ADDR_CHANGE`.
    AddrChange = 14,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`.
    TimewaitExit = 15,
}

impl CmEventType {
    /// `rdma_event_str`.
    pub const fn as_str(self) -> &'static str {
        match self {
            CmEventType::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            CmEventType::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            CmEventType::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            CmEventType::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            CmEventType::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            CmEventType::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            CmEventType::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            CmEventType::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            CmEventType::Rejected => "RDMA_CM_EVENT_REJECTED",
            CmEventType::Established => "RDMA_CM_EVENT_ESTABLISHED",
            CmEventType::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            CmEventType::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            CmEventType::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            CmEventType::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            CmEventType::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            CmEventType::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
}

/// `struct rdma_ud_param`: where a UD peer's datagrams go (SIDR's answer, or a SIDR
/// request's sender).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdParam {
    /// The address vector to the peer.
    pub ah_attr: AhAttr,
    /// The peer's QP.
    pub qp_num: u32,
    /// Its Q_Key.
    pub qkey: u32,
}

/// `struct rdma_cm_event`, with the private data owned (valid as long as the event is).
#[derive(Debug, Clone)]
pub struct CmEvent {
    /// The event.
    pub event: CmEventType,
    /// The ID it is for (for [`CmEventType::ConnectRequest`], the new connection's).
    pub id: CmId,
    /// The listening ID a request came through.
    pub listen_id: Option<CmId>,
    /// rdma_cm's status: 0, a negative errno (−ETIMEDOUT, −ENODEV, ...), or for
    /// [`CmEventType::Rejected`] the positive REJ reason.
    pub status: i32,
    /// `param.conn`: the peer's values as this side sees them, and the private data area
    /// (REQ 56 bytes after the rdma_cm header, REP 196, REJ 148).
    pub param: ConnParam,
    /// `param.ud`, for UD port spaces.
    pub ud: Option<UdParam>,
    /// For [`CmEventType::MulticastJoin`] and [`CmEventType::MulticastError`]: the context
    /// given to [`CmId::join_multicast`] (librdmacm's `param.ud.private_data`).
    pub mc_context: usize,
}
