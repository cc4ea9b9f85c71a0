//! One connection's CM state: what each side advertised, the message being retried, the
//! timers; and the REQ and REP built from it.

use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use ferroce_wire::cm::{self as wire_cm, rep, req};
use ferroce_wire::mad::MAD_LEN;

use super::CommId;
use super::deadlines::Deadlines;
use super::param::{self, ConnParam, Negotiated, Path};
use crate::time::Instant;
use crate::verbs::Mtu;

/// The IB CM states a connection goes through (IBTA Figure 160 / kernel `ib_cm_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Active: the REQ is out, waiting for the REP.
    ReqSent,
    /// Passive: the REQ was delivered to the application, which has not answered.
    ReqRcvd,
    /// Passive: as `ReqRcvd`, and an MRA answered a duplicate REQ.
    MraReqSent,
    /// Passive: the REP is out, waiting for the RTU.
    RepSent,
    /// Active: the REP arrived; the QP is being brought up before the RTU.
    RepRcvd,
    /// Active: as `RepRcvd`, and an MRA answered a duplicate REP.
    MraRepSent,
    /// Connected.
    Established,
    /// This side's DREQ is out, waiting for the DREP.
    DreqSent,
    /// The peer's DREQ arrived; the DREP waits for this side's disconnect (or destroy).
    DreqRcvd,
    /// Closed; stray messages are still answered until the timewait ends.
    Timewait,
    /// Active SIDR: the SIDR_REQ is out.
    SidrReqSent,
    /// Passive SIDR: the SIDR_REQ was delivered to the application.
    SidrReqRcvd,
}

/// Which side of the connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Sent the REQ.
    Active,
    /// Received it.
    Passive,
}

/// A connection.
#[derive(Debug, Clone)]
pub(super) struct Conn {
    pub(super) role: Role,
    pub(super) state: State,
    pub(super) local_id: CommId,
    pub(super) remote_id: u32,
    pub(super) peer: IpAddr,
    pub(super) service_id: u64,
    /// The TID of the REQ (REP, RTU, MRA, REJ carry it).
    pub(super) tid: u64,
    /// The TID of the DREQ being answered or sent.
    pub(super) dreq_tid: u64,
    pub(super) path: Path,
    pub(super) local_qpn: u32,
    pub(super) remote_qpn: u32,
    /// The PSN this side advertised (its rq_psn).
    pub(super) local_psn: u32,
    /// The PSN the peer advertised (this side's sq_psn).
    pub(super) remote_psn: u32,
    /// This side's parameters (connect or accept).
    pub(super) param: ConnParam,
    pub(super) ack_timeout: u8,
    pub(super) transport_service_type: u8,
    pub(super) remote_guid: u64,
    pub(super) remote_responder_resources: u8,
    pub(super) remote_initiator_depth: u8,
    pub(super) remote_retry_count: u8,
    pub(super) remote_rnr_retry_count: u8,
    pub(super) remote_cm_response_timeout: u8,
    pub(super) remote_max_cm_retries: u8,
    pub(super) remote_srq: bool,
    pub(super) remote_flow_control: u8,
    /// The next timer (a retransmission or the end of timewait).
    pub(super) timer: Option<Instant>,
    pub(super) timeout: Duration,
    pub(super) retries_left: u8,
    /// The message the timer resends.
    pub(super) last_sent: Option<[u8; MAD_LEN]>,
    /// The application destroyed it; it lives on only to finish closing.
    pub(super) destroyed: bool,
}

impl Conn {
    pub(super) fn new(role: Role, id: CommId, peer: IpAddr, service_id: u64) -> Conn {
        Conn {
            role,
            state: State::ReqSent,
            local_id: id,
            remote_id: 0,
            peer,
            service_id,
            tid: 0,
            dreq_tid: 0,
            path: Path {
                local: peer,
                remote: peer,
                mtu: Mtu::Mtu1024,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
            },
            local_qpn: 0,
            remote_qpn: 0,
            local_psn: 0,
            remote_psn: 0,
            param: ConnParam::default(),
            ack_timeout: param::DEFAULT_ACK_TIMEOUT,
            transport_service_type: 0,
            remote_guid: 0,
            remote_responder_resources: 0,
            remote_initiator_depth: 0,
            remote_retry_count: 0,
            remote_rnr_retry_count: 0,
            remote_cm_response_timeout: param::CM_RESPONSE_TIMEOUT,
            remote_max_cm_retries: param::MAX_CM_RETRIES,
            remote_srq: false,
            remote_flow_control: 0,
            timer: None,
            timeout: Duration::ZERO,
            retries_left: 0,
            last_sent: None,
            destroyed: false,
        }
    }

    pub(super) fn cancel_timer(&mut self) {
        self.timer = None;
        self.last_sent = None;
        self.retries_left = 0;
    }

    /// Closed: stray messages are answered for `conv(ack timeout)` (2 s), then the ID goes.
    pub(super) fn enter_timewait(&mut self, now: Instant, deadlines: &mut Deadlines) {
        self.cancel_timer();
        self.state = State::Timewait;
        let end = now + Duration::from_millis(wire_cm::timeout_ms(param::DEFAULT_ACK_TIMEOUT));
        deadlines.arm(self, end);
    }

    /// The REQ of an active connection.
    pub(super) fn req(&self, ca_guid: u64) -> req::Repr {
        let p = &self.param;
        let routed = self.path.hop_limit > 1;
        let lid = if routed { 0xFFFF } else { 0 };
        req::Repr {
            local_comm_id: self.local_id,
            service_id: self.service_id,
            local_ca_guid: ca_guid,
            local_qpn: self.local_qpn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            remote_cm_response_timeout: param::CM_RESPONSE_TIMEOUT,
            transport_service_type: self.transport_service_type,
            end_to_end_flow_control: p.flow_control & 1,
            starting_psn: self.local_psn,
            local_cm_response_timeout: param::CM_RESPONSE_TIMEOUT,
            retry_count: p.retry_count.min(7),
            partition_key: ferroce_wire::DEFAULT_PKEY,
            path_mtu: self.path.mtu as u8,
            rnr_retry_count: p.rnr_retry_count.min(7),
            max_cm_retries: param::MAX_CM_RETRIES,
            srq: u8::from(p.srq),
            primary_local_lid: lid,
            primary_remote_lid: lid,
            primary_local_gid: gid_of(self.path.local),
            primary_remote_gid: gid_of(self.path.remote),
            primary_flow_label: self.path.flow_label,
            primary_traffic_class: self.path.traffic_class,
            primary_hop_limit: self.path.hop_limit,
            primary_subnet_local: u8::from(!routed),
            primary_local_ack_timeout: self.ack_timeout,
            ..req::Repr::default()
        }
    }

    /// The REP of an accepted passive connection.
    pub(super) fn rep(&self, ca_guid: u64, ack_delay: u8) -> rep::Repr {
        let p = &self.param;
        rep::Repr {
            local_comm_id: self.local_id,
            remote_comm_id: self.remote_id,
            local_qpn: self.local_qpn,
            starting_psn: self.local_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: ack_delay,
            end_to_end_flow_control: p.flow_control & 1,
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: u8::from(p.srq),
            local_ca_guid: ca_guid,
            ..rep::Repr::default()
        }
    }

    /// What this side's QP is programmed with (cm-facts §3.3).
    pub(super) fn negotiated(&self) -> Negotiated {
        match self.role {
            Role::Active => Negotiated {
                path: self.path,
                dest_qp_num: self.remote_qpn,
                rq_psn: self.local_psn,
                sq_psn: self.remote_psn,
                responder_resources: self.remote_initiator_depth,
                initiator_depth: self.remote_responder_resources,
                retry_cnt: self.param.retry_count.min(7),
                rnr_retry: self.remote_rnr_retry_count,
                ack_timeout: self.ack_timeout,
            },
            Role::Passive => Negotiated {
                path: self.path,
                dest_qp_num: self.remote_qpn,
                rq_psn: self.local_psn,
                sq_psn: self.remote_psn,
                responder_resources: self.param.responder_resources,
                initiator_depth: self.param.initiator_depth,
                retry_cnt: self.remote_retry_count,
                rnr_retry: self.remote_rnr_retry_count,
                ack_timeout: self.ack_timeout,
            },
        }
    }
}

/// The GID of an address: IPv4 as `::ffff:a.b.c.d` (RoCE v2), IPv6 as itself.
pub(super) fn gid_of(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The address of a GID (an IPv4-mapped GID is the IPv4 address).
pub(super) fn addr_of(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}
