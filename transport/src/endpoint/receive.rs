//! Received datagrams: the ICRC and P_Key checks, the demultiplexer (a QP, QP1's stand-in,
//! multicast, CNPs) and the ECN notification point.

use std::net::{IpAddr, SocketAddr};

use ferroce_wire::{Opcode, PacketRepr, Transport};

use super::Endpoint;
use crate::congestion::Ecn;
use crate::memory::Memory;
use crate::time::Instant;
use crate::verbs::QpType;

/// One received datagram as the engine takes it in: the UDP payload and what its IP and UDP
/// headers said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// The sender's address and UDP source port.
    pub src: SocketAddr,
    /// The address it was sent to: ours, or a multicast group's.
    pub dst: IpAddr,
    /// The UDP payload (BTH onwards, ICRC last).
    pub bytes: &'a [u8],
    /// The IPv4 Identification the sender is expected to have used: segment `ident` of a
    /// coalesced (`UDP_GRO`) read of a ferroce sender's `UDP_SEGMENT` train, whose ICRC
    /// covers that ID, or 0 for a lone datagram. All 32 ICRC bits are checked for this ID
    /// (and for 0); other senders' IDs (kernel rxe, which a UDP socket cannot see) are
    /// solved when [`crate::EndpointConfig::solve_unknown_ident`] allows it.
    pub ident: u16,
    /// The ECN field of the IP header: a packet marked [`Ecn::Ce`] for a connected QP is
    /// answered with a CNP to the sender's QP (at most one per QP per
    /// [`crate::CongestionConfig::cnp_interval`]) when the notification point is on.
    pub ecn: Ecn,
}

impl<'a> Datagram<'a> {
    /// A datagram from `src` to `dst` with IPv4 ID 0 and no ECN marking.
    pub fn new(src: SocketAddr, dst: IpAddr, bytes: &'a [u8]) -> Datagram<'a> {
        Datagram {
            src,
            dst,
            bytes,
            ident: 0,
            ecn: Ecn::NotEct,
        }
    }

    /// The same datagram, expected to carry IPv4 ID `ident` (see [`Datagram::ident`]).
    pub fn with_ident(self, ident: u16) -> Datagram<'a> {
        Datagram { ident, ..self }
    }

    /// The same datagram with the ECN field `ecn`.
    pub fn with_ecn(self, ecn: Ecn) -> Datagram<'a> {
        Datagram { ecn, ..self }
    }
}

impl Endpoint {
    /// Takes one received datagram (a UDP payload with what its IP and UDP headers said). Bad
    /// packets are dropped, counted and, at debug, explained; nothing a peer sends is an error
    /// here. The one way packets enter the engine, as a NIC's receive queue is the one way
    /// packets reach an HCA's transport.
    pub fn receive<M: Memory + ?Sized>(&mut self, now: Instant, dg: Datagram<'_>, mem: &M) {
        let Datagram {
            src,
            dst,
            bytes: datagram,
            ident,
            ecn,
        } = dg;
        if !self.icrc_ok(src, dst, datagram, ident) {
            self.counters.icrc_errors += 1;
            log::debug!(
                "{} bytes from {src} dropped: the ICRC is wrong for IPv4 ID 0, {ident} and any \
                 ID this peer's numbering allows (damaged, or not RoCEv2)",
                datagram.len()
            );
            return;
        }
        let pkt = match PacketRepr::parse(datagram) {
            Ok(pkt) => pkt,
            Err(e) => {
                self.counters.malformed += 1;
                log::debug!(
                    "{} bytes from {src} dropped: malformed: {e}",
                    datagram.len()
                );
                return;
            }
        };
        // P_Key: only the default partition exists (low 15 bits all ones; rxe checks the same).
        if pkt.bth.pkey & 0x7FFF != 0x7FFF {
            self.counters.pkey_violations += 1;
            log::debug!(
                "packet from {src} for QP {:#x} dropped: P_Key {:#06x} is not the default \
                 partition's (0xffff), the only one here",
                pkt.bth.dest_qp,
                pkt.bth.pkey
            );
            return;
        }
        let qpn = pkt.bth.dest_qp;
        if pkt.bth.opcode == Opcode::CNP {
            self.handle_cnp(now, src, qpn);
            return;
        }
        if qpn == crate::mcast::MULTICAST_QPN {
            self.handle_multicast(now, src, dst, &pkt, mem);
            return;
        }
        let Some(qp) = self.qps.get_mut(&qpn) else {
            if qpn == 1 && self.answer_unserved_mad(src.ip(), &pkt) {
                return;
            }
            self.counters.no_qp += 1;
            log::debug!(
                "{} PSN {:#x} from {src} for QP {qpn:#x} dropped: no such QP here",
                pkt.bth.opcode,
                pkt.bth.psn.value()
            );
            return;
        };
        let transport_ok = matches!(
            (pkt.bth.opcode.transport(), qp.qp_type),
            (Transport::Rc, QpType::Rc)
                | (Transport::Uc, QpType::Uc)
                | (Transport::Ud, QpType::Ud)
                | (Transport::Xrc, QpType::XrcSend | QpType::XrcRecv)
        );
        // Connected QPs only talk to their peer.
        let peer_ok = qp.qp_type == QpType::Ud || qp.peer() == Some(src.ip());
        if !transport_ok || !peer_ok {
            self.counters.no_qp += 1;
            return;
        }
        self.counters.rcvd_pkts += 1;
        if qp.qp_type == QpType::Rc && src.port() == self.cfg.dst_port {
            // Another ferroce: it sends from the RoCE port it is bound to, where rxe and NICs
            // send from ports of their own. Long WRITEs to it go split (`SendWqe::split`) and
            // the send window is wider (`Qp::send_window`).
            qp.peer_ferroce = true;
        }
        if ecn == Ecn::Ce {
            self.counters.ecn_marked_pkts += 1;
            if self.cfg.congestion.np
                && qp.qp_type != QpType::Ud
                && qp.on_ce(now, &self.cfg.congestion)
            {
                log::trace!("QP {qpn:#x}: CE-marked packet from {src}: a CNP is due");
            }
        }
        // XRC runs RC's rules: requests (with an XRCETH) go to a receive QP, responses to a
        // send QP, each as the RC opcode of the same operation.
        let mut pkt = pkt;
        if let Some(rc) = pkt.bth.opcode.xrc_as_rc() {
            if pkt.bth.opcode.has_xrceth() != (qp.qp_type == QpType::XrcRecv) {
                self.counters.no_qp += 1;
                log::debug!(
                    "{} from {src} for XRC QP {qpn:#x} dropped: an XRC {} QP takes only {}",
                    pkt.bth.opcode,
                    if qp.qp_type == QpType::XrcRecv {
                        "receive"
                    } else {
                        "send"
                    },
                    if qp.qp_type == QpType::XrcRecv {
                        "requests"
                    } else {
                        "responses"
                    },
                );
                return;
            }
            pkt.bth.opcode = rc;
        }
        let srq = match (qp.qp_type, qp.srq) {
            (QpType::XrcRecv, _) => {
                // The SRQ the XRCETH names, if it is an XRC SRQ of this QP's domain: its PD
                // checks the request's memory and its CQ takes the receive completion.
                let named = pkt.ext.xrceth.map(|x| x.xrcsrq);
                let srq = named
                    .and_then(|n| self.srqs.get_mut(&n))
                    .filter(|s| s.xrc.is_some_and(|x| Some(x.xrcd) == qp.xrcd));
                qp.xrc_srq_ok = srq.is_some();
                if let Some(x) = srq.as_ref().and_then(|s| s.xrc) {
                    qp.pd = x.pd;
                    qp.cqs.1 = x.cq;
                }
                srq
            }
            (_, Some(s)) => self.srqs.get_mut(&s),
            (_, None) => None,
        };
        let mut ctx = ctx!(self, mem, now, srq);
        if pkt.bth.opcode.is_request() {
            qp.handle_request(&mut ctx, &pkt, src.ip(), dst);
        } else {
            qp.handle_response(&mut ctx, &pkt);
        }
        self.schedule(qpn);
    }

    /// A packet for QPN 0xFFFFFF: a UD send to the multicast group `dst`, delivered to each
    /// UD QP attached to it (each takes a receive WQE of its own). Not to a group, not UD, or
    /// to a group with no QP here: counted as `no_qp`.
    pub(super) fn handle_multicast<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        src: SocketAddr,
        dst: IpAddr,
        pkt: &PacketRepr<'_>,
        mem: &M,
    ) {
        let members = self.mcast.members(dst);
        if pkt.bth.opcode.transport() != Transport::Ud || members.is_empty() {
            self.counters.no_qp += 1;
            log::debug!(
                "packet for the multicast QPN from {src} to {dst} dropped: {}",
                if pkt.bth.opcode.transport() != Transport::Ud {
                    "only UD sends go to groups"
                } else {
                    "no QP of this device is attached to that group"
                }
            );
            return;
        }
        self.counters.rcvd_pkts += 1;
        // Few QPs per group (at most MAX_MCAST_QP_ATTACH): copied so each can be borrowed.
        let members = crate::SmallVec::<u32, 8>::from_slice(members);
        let own = src.ip() == self.cfg.local;
        for &qpn in members.iter() {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            if own && qp.block_self_mcast_lb && pkt.ext.deth.is_some_and(|d| d.src_qp == qpn) {
                log::trace!(
                    "QP {qpn:#x}: its own datagram to {dst} not delivered to it \
                     (IBV_QP_CREATE_BLOCK_SELF_MCAST_LB)"
                );
                continue;
            }
            let srq = match qp.srq {
                Some(s) => self.srqs.get_mut(&s),
                None => None,
            };
            let mut ctx = ctx!(self, mem, now, srq);
            qp.handle_request(&mut ctx, pkt, src.ip(), dst);
        }
    }

    /// A CNP (BTH opcode 0x81) for `qpn` from `src`: the reaction point cuts the QP's rate.
    /// CNPs for UD QPs, unknown QPs, another peer's QPs or with the reaction point off are
    /// counted and ignored.
    pub(super) fn handle_cnp(&mut self, now: Instant, src: SocketAddr, qpn: u32) {
        let cfg = self.cfg.congestion;
        let qp = self
            .qps
            .get_mut(&qpn)
            .filter(|qp| qp.qp_type != QpType::Ud && qp.peer() == Some(src.ip()));
        match qp {
            Some(qp) if cfg.rp => {
                self.counters.cnp_handled += 1;
                qp.on_cnp(now, &cfg);
            }
            _ => {
                self.counters.cnp_ignored += 1;
                log::debug!(
                    "CNP from {src} for QP {qpn:#x} ignored ({})",
                    if cfg.rp {
                        "no connected QP of that number with that peer"
                    } else {
                        "the reaction point is off"
                    }
                );
            }
        }
    }
}
