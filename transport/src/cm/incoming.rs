//! Received MADs: each message matched to its connection by comm ID (REQ and SIDR_REQ to a
//! listener by ServiceID), duplicates and stale connections answered as kernel `ib_cm` does.

use std::net::IpAddr;
use std::time::Duration;

use ferroce_wire::cm::{self as wire_cm, Message, dreq, mra, rej, rej_reason, req, sidr_rep};

use super::conn::{Conn, Role, addr_of};
use super::param::Path;
use super::{CmEngine, CmEvent, ReplyInfo, RequestInfo, State};
use crate::time::Instant;
use crate::verbs::Mtu;

impl CmEngine {
    /// Handles a MAD that arrived on QP1 from `src` (any bytes: what is not a CM message this
    /// engine expects is counted and dropped, with the reason at debug level).
    pub fn handle_mad(&mut self, now: Instant, src: IpAddr, mad: &[u8]) {
        self.handle_mad_from(now, src, 1, mad);
    }

    /// As [`CmEngine::handle_mad`], for a MAD from QP `src_qpn` of `src` (a UD receive's
    /// source QP). A Get or Set of any class is answered as the kernel's MAD layer answers a
    /// request no agent serves (the CM's agent takes only Send): the MAD returned to its
    /// sender's QP as a GetResp with status 0x000C, unsupported method/attribute
    /// combination — what tells a prober (`ferroce doctor`) a RoCE stack is there.
    pub fn handle_mad_from(&mut self, now: Instant, src: IpAddr, src_qpn: u32, mad: &[u8]) {
        self.counters.received += 1;
        // Every MAD is 256 bytes (IBTA 13.4.2): a shorter one lost its tail, whose fields
        // (private data, paths) would otherwise be taken as zeros.
        if mad.len() != ferroce_wire::mad::MAD_LEN {
            self.counters.dropped += 1;
            log::debug!(
                "CM: a MAD of {} bytes from {src} dropped: MADs are {} bytes",
                mad.len(),
                ferroce_wire::mad::MAD_LEN
            );
            return;
        }
        if let Some(resp) = unmatched_response(mad) {
            self.counters.sent += 1;
            log::debug!(
                "CM: a Get/Set of class {:#04x} from {src} QP {src_qpn:#x}: answered \
                 unsupported (status 0x000c), as the kernel's MAD layer does",
                mad[1]
            );
            self.out.push_back(super::Outgoing {
                dest: src,
                dest_qpn: src_qpn,
                mad: resp,
            });
            return;
        }
        self.dispatch(now, src, mad);
    }

    /// Takes one whole MAD (received, or a held REQ run again).
    pub(crate) fn dispatch(&mut self, now: Instant, src: IpAddr, mad: &[u8]) {
        let (hdr, msg) = match Message::parse(mad) {
            Ok(m) => m,
            Err(e) => {
                self.counters.dropped += 1;
                log::debug!("CM: a MAD from {src} dropped: {e}");
                return;
            }
        };
        let tid = hdr.transaction_id;
        match msg {
            Message::Req(r, pd) => self.on_req(now, src, tid, &r, pd, mad),
            Message::Rep(r, pd) => self.on_rep(r.remote_comm_id, &r, pd),
            Message::Rtu(r, _) => self.on_rtu(r.remote_comm_id, r.local_comm_id),
            Message::Rej(r, _, pd) => self.on_rej(now, &r, pd),
            Message::Mra(r, _) => self.on_mra(now, &r),
            Message::Dreq(r, _) => self.on_dreq(now, src, tid, &r),
            Message::Drep(r, _) => self.on_drep(now, r.remote_comm_id),
            Message::SidrReq(r, pd) => self.on_sidr_req(src, tid, &r, pd),
            Message::SidrRep(r, _, pd) => self.on_sidr_rep(&r, pd),
            Message::Other(a) => {
                self.counters.dropped += 1;
                log::debug!("CM: attribute {a:#06x} from {src} is not used on RoCE: dropped");
            }
        }
    }

    fn drop_msg(&mut self, what: &str, id: u32, state: Option<State>) {
        self.counters.dropped += 1;
        log::debug!("CM: {what} for {id:#010x} dropped (state {state:?})");
    }

    fn on_req(
        &mut self,
        now: Instant,
        src: IpAddr,
        tid: u64,
        r: &req::Repr,
        pd: &[u8],
        mad: &[u8],
    ) {
        // A duplicate: the active side resent its REQ.
        if let Some(&id) = self.by_remote.get(&(r.local_comm_id, r.local_ca_guid)) {
            self.counters.duplicates += 1;
            let Some(c) = self.conns.get(&id) else { return };
            match c.state {
                State::ReqRcvd | State::MraReqSent => {
                    // rdma_cm's delayed MRA: the application is slow, tell the peer to wait.
                    let c = c.clone();
                    self.send_mra(&c, mra_msg::REQ);
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.state = State::MraReqSent;
                    }
                }
                State::Timewait => {
                    let (peer, t, remote) = (c.peer, c.tid, c.remote_id);
                    self.send_rej(
                        peer,
                        t,
                        id,
                        remote,
                        rej::rejected::REQ,
                        rej_reason::STALE_CONN,
                        &[],
                    );
                }
                // The REP (or the connection) is there; the REP retries on its own timer.
                _ => {}
            }
            return;
        }
        // A stale connection: that QP of that CA is connected here already.
        let stale = self
            .conns
            .iter()
            .find(|(_, c)| {
                c.state == State::Established
                    && c.remote_qpn == r.local_qpn
                    && c.remote_guid == r.local_ca_guid
            })
            .map(|(id, _)| *id);
        if let Some(old) = stale {
            log::debug!(
                "CM: REQ from {src} for QP {:#x} of a CA already connected here ({old:#010x}): \
                 REJ stale connection, DREQ the old one",
                r.local_qpn
            );
            self.send_rej(
                src,
                tid,
                0,
                r.local_comm_id,
                rej::rejected::REQ,
                rej_reason::STALE_CONN,
                &[],
            );
            let _ = self.disconnect(now, old);
            return;
        }
        if !self.listeners.contains_key(&r.service_id) {
            if self.hold_req(now, src, r.service_id, mad) {
                return;
            }
            log::debug!(
                "CM: REQ from {src} for ServiceID {:#x}: nobody listens, REJ invalid service ID",
                r.service_id
            );
            self.send_rej(
                src,
                tid,
                0,
                r.local_comm_id,
                rej::rejected::REQ,
                rej_reason::INVALID_SERVICE_ID,
                &[],
            );
            return;
        }
        if r.transport_service_type > 1 {
            log::debug!(
                "CM: REQ from {src} for transport type {}: REJ",
                r.transport_service_type
            );
            self.send_rej(
                src,
                tid,
                0,
                r.local_comm_id,
                rej::rejected::REQ,
                rej_reason::INVALID_TRANSPORT_TYPE,
                &[],
            );
            return;
        }
        let Some(mtu) = Mtu::from_raw(u32::from(r.path_mtu)) else {
            log::debug!(
                "CM: REQ from {src} with path MTU code {}: REJ invalid MTU",
                r.path_mtu
            );
            self.send_rej(
                src,
                tid,
                0,
                r.local_comm_id,
                rej::rejected::REQ,
                rej_reason::INVALID_MTU,
                &[],
            );
            return;
        };
        let id = match self.new_comm_id() {
            Ok(id) => id,
            Err(_) => {
                self.send_rej(
                    src,
                    tid,
                    0,
                    r.local_comm_id,
                    rej::rejected::REQ,
                    rej_reason::NO_RESOURCES,
                    &[],
                );
                return;
            }
        };
        let peer = addr_of(r.primary_local_gid);
        let path = Path {
            local: addr_of(r.primary_remote_gid),
            remote: peer,
            mtu,
            hop_limit: r.primary_hop_limit.max(1),
            traffic_class: r.primary_traffic_class,
            flow_label: r.primary_flow_label,
        };
        let mut c = Conn::new(Role::Passive, id, peer, r.service_id);
        c.state = State::ReqRcvd;
        c.remote_id = r.local_comm_id;
        c.tid = tid;
        c.path = path;
        c.remote_qpn = r.local_qpn;
        c.remote_psn = r.starting_psn;
        c.remote_guid = r.local_ca_guid;
        c.remote_responder_resources = r.responder_resources;
        c.remote_initiator_depth = r.initiator_depth;
        c.remote_retry_count = r.retry_count;
        c.remote_rnr_retry_count = r.rnr_retry_count;
        c.remote_cm_response_timeout = r.local_cm_response_timeout;
        c.remote_max_cm_retries = r.max_cm_retries;
        c.remote_srq = r.srq != 0;
        c.remote_flow_control = r.end_to_end_flow_control;
        c.transport_service_type = r.transport_service_type;
        c.ack_timeout = r.primary_local_ack_timeout;
        // The PSN this side will advertise, and until the accept the request's depths: a
        // program that brings its own QP up reads RTR and RTS before accepting
        // (`rdma_init_qp_attr`), as the kernel's CM answers from the REQ.
        c.local_psn = self.next_psn();
        c.param.responder_resources = r.initiator_depth;
        c.param.initiator_depth = r.responder_resources;
        let info = RequestInfo {
            service_id: r.service_id,
            remote_qpn: r.local_qpn,
            remote_ca_guid: r.local_ca_guid,
            responder_resources: r.initiator_depth,
            initiator_depth: r.responder_resources,
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq != 0,
            flow_control: r.end_to_end_flow_control,
            transport_service_type: r.transport_service_type,
            path,
        };
        log::info!(
            "CM {id:#010x}: REQ from {peer} qpn {:#x} for ServiceID {:#x}: the peer offers \
             responder_resources {} and asks initiator_depth {}, retry_count {}, \
             rnr_retry_count {}",
            r.local_qpn,
            r.service_id,
            r.responder_resources,
            r.initiator_depth,
            r.retry_count,
            r.rnr_retry_count
        );
        self.by_remote
            .insert((r.local_comm_id, r.local_ca_guid), id);
        self.conns.insert(id, c);
        self.events.push_back(CmEvent::ConnectRequest {
            id,
            peer,
            info,
            private_data: pd.to_vec(),
        });
    }

    fn on_rep(&mut self, id: u32, r: &ferroce_wire::cm::rep::Repr, pd: &[u8]) {
        let state = self.state(id);
        match state {
            Some(State::ReqSent) => {
                let Some(c) = self.conns.get_mut(&id) else {
                    return;
                };
                c.remote_id = r.local_comm_id;
                c.remote_qpn = r.local_qpn;
                c.remote_psn = r.starting_psn;
                c.remote_guid = r.local_ca_guid;
                c.remote_responder_resources = r.responder_resources;
                c.remote_initiator_depth = r.initiator_depth;
                c.remote_rnr_retry_count = r.rnr_retry_count;
                c.remote_srq = r.srq != 0;
                c.remote_flow_control = r.end_to_end_flow_control;
                c.state = State::RepRcvd;
                c.cancel_timer();
                if c.param.initiator_depth < r.responder_resources
                    || c.param.responder_resources < r.initiator_depth
                {
                    log::debug!(
                        "CM {id:#010x}: the REP's depths (responder_resources {}, \
                         initiator_depth {}) replace this side's ({}, {})",
                        r.responder_resources,
                        r.initiator_depth,
                        c.param.responder_resources,
                        c.param.initiator_depth
                    );
                }
                let info = ReplyInfo {
                    remote_qpn: r.local_qpn,
                    remote_ca_guid: r.local_ca_guid,
                    initiator_depth: r.responder_resources,
                    responder_resources: r.initiator_depth,
                    rnr_retry_count: r.rnr_retry_count,
                    srq: r.srq != 0,
                    flow_control: r.end_to_end_flow_control,
                };
                self.events.push_back(CmEvent::ConnectResponse {
                    id,
                    info,
                    private_data: pd.to_vec(),
                });
            }
            Some(State::RepRcvd | State::MraRepSent) => {
                self.counters.duplicates += 1;
                if let Some(c) = self.conns.get(&id).cloned() {
                    self.send_mra(&c, mra_msg::REP);
                }
                if let Some(c) = self.conns.get_mut(&id) {
                    c.state = State::MraRepSent;
                }
            }
            Some(State::Established) => {
                // The RTU was lost: the passive side resent its REP.
                self.counters.duplicates += 1;
                if let Some(c) = self.conns.get(&id) {
                    let msg = ferroce_wire::cm::rtu::Repr {
                        local_comm_id: c.local_id,
                        remote_comm_id: c.remote_id,
                    };
                    let (peer, tid) = (c.peer, c.tid);
                    self.send_once(peer, &Message::Rtu(msg, &[]), tid);
                }
            }
            s => self.drop_msg("REP", id, s),
        }
    }

    fn on_rtu(&mut self, id: u32, remote: u32) {
        match self.conns.get_mut(&id) {
            Some(c) if c.state == State::RepSent && c.remote_id == remote => {
                c.state = State::Established;
                c.cancel_timer();
                self.events.push_back(CmEvent::Established { id });
            }
            Some(c) if c.state == State::Established => self.counters.duplicates += 1,
            c => {
                let s = c.map(|c| c.state);
                self.drop_msg("RTU", id, s);
            }
        }
    }

    fn on_rej(&mut self, now: Instant, r: &rej::Repr, pd: &[u8]) {
        let id = r.remote_comm_id;
        let Some(c) = self.conns.get_mut(&id) else {
            self.drop_msg("REJ", id, None);
            return;
        };
        let event = CmEvent::Rejected {
            id,
            reason: r.reason,
            private_data: pd.to_vec(),
        };
        log::debug!(
            "CM {id:#010x}: REJ {} ({}) in {:?}",
            r.reason,
            wire_cm::rej_reason_str(r.reason),
            c.state
        );
        match c.state {
            State::ReqSent => {
                self.events.push_back(event);
                self.remove(id);
            }
            State::RepSent | State::RepRcvd | State::MraRepSent | State::Established => {
                self.events.push_back(event);
                c.enter_timewait(now, &mut self.deadlines);
            }
            s => self.drop_msg("REJ", id, Some(s)),
        }
    }

    fn on_mra(&mut self, now: Instant, r: &mra::Repr) {
        let id = r.remote_comm_id;
        let Some(c) = self.conns.get_mut(&id) else {
            self.drop_msg("MRA", id, None);
            return;
        };
        let ok = matches!(
            (c.state, r.message_mraed),
            (State::ReqSent, mra_msg::REQ) | (State::RepSent, mra_msg::REP)
        );
        if !ok {
            let s = c.state;
            self.drop_msg("MRA", id, Some(s));
            return;
        }
        // The peer needs its Service Timeout: wait that long plus a packet's life before the
        // next retry (the retries left stay).
        let wait = Duration::from_millis(
            wire_cm::timeout_ms(r.service_timeout)
                + wire_cm::timeout_ms(super::param::DEFAULT_ACK_TIMEOUT),
        );
        log::debug!("CM {id:#010x}: MRA: the peer needs {wait:?}");
        c.timeout = wait;
        self.deadlines.arm(c, now + wait);
    }

    fn on_dreq(&mut self, now: Instant, src: IpAddr, tid: u64, r: &dreq::Repr) {
        let id = r.remote_comm_id;
        let Some(c) = self.conns.get_mut(&id) else {
            // A DREQ for nothing here: the DREP it expects, built from it.
            log::debug!("CM: DREQ from {src} for unknown {id:#010x}: DREP");
            self.send_once(src, &Message::Drep(drep_answering(r), &[]), tid);
            return;
        };
        if r.remote_qpn != c.local_qpn {
            let s = c.state;
            log::debug!(
                "CM {id:#010x}: DREQ names QP {:#x}, this connection's is {:#x}",
                r.remote_qpn,
                c.local_qpn
            );
            self.drop_msg("DREQ", id, Some(s));
            return;
        }
        match c.state {
            State::Established | State::RepSent | State::RepRcvd | State::MraRepSent => {
                c.cancel_timer();
                c.state = State::DreqRcvd;
                c.dreq_tid = tid;
                let destroyed = c.destroyed;
                self.events.push_back(CmEvent::Disconnected {
                    id,
                    timed_out: false,
                });
                if destroyed {
                    let _ = self.disconnect(now, id);
                }
            }
            State::DreqSent => {
                // Both closed at once: answer, and this side's DREQ counts as answered.
                let (peer, local, remote) = (c.peer, c.local_id, c.remote_id);
                c.enter_timewait(now, &mut self.deadlines);
                self.send_drep(peer, tid, local, remote);
                self.events.push_back(CmEvent::Disconnected {
                    id,
                    timed_out: false,
                });
            }
            State::DreqRcvd => self.counters.duplicates += 1,
            State::Timewait => {
                let (peer, local, remote) = (c.peer, c.local_id, c.remote_id);
                self.send_drep(peer, tid, local, remote);
            }
            s => self.drop_msg("DREQ", id, Some(s)),
        }
    }

    fn on_drep(&mut self, now: Instant, id: u32) {
        match self.conns.get_mut(&id) {
            Some(c) if c.state == State::DreqSent => {
                c.enter_timewait(now, &mut self.deadlines);
                self.events.push_back(CmEvent::Disconnected {
                    id,
                    timed_out: false,
                });
            }
            c => {
                let s = c.map(|c| c.state);
                self.drop_msg("DREP", id, s);
            }
        }
    }

    fn on_sidr_req(
        &mut self,
        src: IpAddr,
        tid: u64,
        r: &ferroce_wire::cm::sidr_req::Repr,
        pd: &[u8],
    ) {
        let key = (r.request_id, sidr_key(src));
        if self.by_remote.contains_key(&key) {
            self.counters.duplicates += 1;
            return;
        }
        if !self.listeners.contains_key(&r.service_id) {
            log::debug!(
                "CM: SIDR_REQ from {src} for ServiceID {:#x}: nobody listens, SIDR_REP unsupported",
                r.service_id
            );
            let msg = sidr_rep::Repr {
                request_id: r.request_id,
                status: sidr_rep::status::UNSUPPORTED,
                service_id: r.service_id,
                ..sidr_rep::Repr::default()
            };
            self.send_once(src, &Message::SidrRep(msg, &[], &[]), tid);
            return;
        }
        let Ok(id) = self.new_comm_id() else {
            return;
        };
        let mut c = Conn::new(Role::Passive, id, src, r.service_id);
        c.state = State::SidrReqRcvd;
        c.remote_id = r.request_id;
        c.remote_guid = sidr_key(src);
        c.tid = tid;
        self.by_remote.insert(key, id);
        self.conns.insert(id, c);
        self.events.push_back(CmEvent::SidrRequest {
            id,
            peer: src,
            service_id: r.service_id,
            private_data: pd.to_vec(),
        });
    }

    fn on_sidr_rep(&mut self, r: &sidr_rep::Repr, pd: &[u8]) {
        let id = r.request_id;
        if self.state(id) != Some(State::SidrReqSent) {
            let s = self.state(id);
            self.drop_msg("SIDR_REP", id, s);
            return;
        }
        self.remove(id);
        self.events.push_back(CmEvent::SidrResponse {
            id,
            status: r.status,
            qpn: r.qpn,
            qkey: r.qkey,
            private_data: pd.to_vec(),
        });
    }
}

/// Message MRAed values.
mod mra_msg {
    pub(super) const REQ: u8 = 0;
    pub(super) const REP: u8 = 1;
}

/// Duplicate SIDR_REQs are known by request ID and source (SIDR carries no GUID).
fn sidr_key(src: IpAddr) -> u64 {
    match src {
        IpAddr::V4(v4) => u64::from(u32::from(v4)),
        IpAddr::V6(v6) => {
            let b = v6.octets();
            u64::from_be_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]])
                ^ u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
        }
    }
}

/// The DREP that answers DREQ `r`: its comm IDs swapped (the DREQ's sender is the DREP's
/// remote side). Both answers to a DREQ for a connection nobody here holds are built by it.
fn drep_answering(r: &wire_cm::dreq::Repr) -> wire_cm::drep::Repr {
    wire_cm::drep::Repr {
        local_comm_id: r.remote_comm_id,
        remote_comm_id: r.local_comm_id,
    }
}

/// The kernel CM's answer to a DREQ for a connection it does not hold (`cm_issue_drep`): the
/// DREP it waits for, with the DREQ's TransactionID and the comm IDs swapped. A process with no
/// connection manager that holds its address's QP1 role gives it for the connections of
/// processes that are gone, whose peers would otherwise resend the DREQ until every retry is
/// spent. `None` for anything but a well-formed DREQ.
pub(crate) fn unserved_dreq_answer(mad: &[u8]) -> Option<[u8; ferroce_wire::mad::MAD_LEN]> {
    let (hdr, Message::Dreq(r, _)) = Message::parse(mad).ok()? else {
        return None;
    };
    let drep = Message::Drep(drep_answering(&r), &[]);
    let mut out = [0u8; ferroce_wire::mad::MAD_LEN];
    drep.emit(hdr.transaction_id, &mut out).ok()?;
    Some(out)
}

/// The kernel's answer to a Get or Set that no agent serves (`generate_unmatched_resp`): the
/// request as it came, its method GetResp and its status "unsupported method/attribute
/// combination" (with the direction bit for a directed-route SMP); `None` for any other
/// method, or a MAD that is not 256 bytes of base version 1.
pub(crate) fn unmatched_response(mad: &[u8]) -> Option<[u8; ferroce_wire::mad::MAD_LEN]> {
    use ferroce_wire::mad;
    let mut out: [u8; mad::MAD_LEN] = mad.try_into().ok()?;
    let mut p = mad::Packet::new_checked(&mut out[..]).ok()?;
    if p.base_version() != 1 || !matches!(p.method(), mad::METHOD_GET | mad::METHOD_SET) {
        return None;
    }
    let mut status = mad::STATUS_UNSUPPORTED_METHOD_ATTRIBUTE;
    if p.mgmt_class() == mad::MGMT_CLASS_SUBN_DIRECTED_ROUTE {
        status |= mad::STATUS_DIRECTION;
    }
    p.set_method(mad::METHOD_GET_RESP);
    p.set_status(status);
    Some(out)
}
