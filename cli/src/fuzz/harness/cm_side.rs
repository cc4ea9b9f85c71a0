//! Our side of a CM exchange, through ferroce's own sans-IO CM engine: REQs as rdma_cm builds
//! them (the rdma_cm header in the private data), what the target's CM answers, and the MADs
//! wrapped in the UD SENDs to QP1 that carry them. The harness connects through it
//! (`--via-cm`), and the `cm` campaign builds its REQs with it.

use std::net::{IpAddr, Ipv4Addr};

use ferroce::transport::Mtu;
use ferroce::transport::cm::{CmConfig, CmEngine, CmEvent, ConnParam, ConnectReq, Path};
use ferroce::transport::time::Instant;
use ferroce_wire::cm::cma_hdr;
use ferroce_wire::{BthRepr, DethRepr, ExtHeaders, IcrcContext, Opcode, PacketRepr, Psn};

use crate::fuzz::packet::PORT;

/// rdma_cm's TCP port space (`RDMA_PS_TCP`): ServiceID = 0x0106 << 16 | port.
pub const fn service_id(port: u16) -> u64 {
    0x0106 << 16 | port as u64
}

/// What came back for our connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmAnswer {
    /// A REJ with this reason.
    Rejected(u16),
    /// A REP.
    Reply,
}

/// One side of a CM exchange: our engine and its REQ, the MADs to put on the wire.
pub struct CmSide {
    engine: CmEngine,
    local: Ipv4Addr,
    target: Ipv4Addr,
    now: Instant,
    /// Our connection's ID, once the REQ is built.
    pub id: Option<u32>,
    /// Go on with a REP (RTU) instead of rejecting it, keeping its private data here.
    pub accepted: Option<Vec<u8>>,
    keep: bool,
}

impl CmSide {
    /// An engine seeded from the case.
    pub fn new(seed: u64, local: Ipv4Addr, target: Ipv4Addr) -> CmSide {
        CmSide {
            engine: CmEngine::new(CmConfig {
                ca_guid: 0x0200_5eff_fe00_0000 | seed & 0xFFFF,
                comm_id_prefix: 0xF2,
                local_ca_ack_delay: 15,
                seed,
            }),
            local,
            target,
            now: Instant::from_nanos(1),
            id: None,
            accepted: None,
            keep: false,
        }
    }

    /// Like [`CmSide::new`], for a connection that goes up: a REP is answered with an RTU.
    pub fn connecting(seed: u64, local: Ipv4Addr, target: Ipv4Addr) -> CmSide {
        CmSide {
            keep: true,
            ..CmSide::new(seed, local, target)
        }
    }

    /// After a REP: the target's QPN and the PSN our requests start from.
    pub fn negotiated(&self) -> Option<(u32, u32)> {
        let n = self.engine.negotiated(self.id?)?;
        Some((n.dest_qp_num, n.sq_psn))
    }

    /// A DREQ for the connection (the MADs to send).
    pub fn disconnect(&mut self) -> Vec<[u8; 256]> {
        if let Some(id) = self.id {
            let _ = self.engine.disconnect(self.now, id);
        }
        std::iter::from_fn(|| self.engine.poll_transmit())
            .map(|o| o.mad)
            .collect()
    }

    /// The REQ to `port` (a made-up QP and rdma_cm port), as a 256-byte MAD.
    pub fn request(&mut self, port: u16, qpn: u32) -> Option<[u8; 256]> {
        self.request_with(port, qpn, &[])
    }

    /// [`CmSide::request`] with `user` after the rdma_cm header in the private data.
    pub fn request_with(&mut self, port: u16, qpn: u32, user: &[u8]) -> Option<[u8; 256]> {
        let mut data = vec![0u8; cma_hdr::HEADER_LEN];
        cma_hdr::Repr::new(
            IpAddr::V4(self.local),
            40000 + (qpn & 0x3FFF) as u16,
            IpAddr::V4(self.target),
        )
        .emit(&mut cma_hdr::Packet::new_unchecked(&mut data[..]));
        data.extend_from_slice(user);
        let req = ConnectReq {
            service_id: service_id(port),
            path: Path {
                local: IpAddr::V4(self.local),
                remote: IpAddr::V4(self.target),
                mtu: Mtu::Mtu1024,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
            },
            qpn,
            transport_service_type: 0,
            param: ConnParam {
                private_data: data,
                responder_resources: 1,
                initiator_depth: 1,
                flow_control: 0,
                retry_count: 7,
                rnr_retry_count: 7,
                srq: false,
                qp_num: qpn,
            },
            ack_timeout: 19,
        };
        self.id = self.engine.connect(self.now, req).ok();
        self.engine.poll_transmit().map(|o| o.mad)
    }

    /// Feeds a MAD from the target; returns what it says of our connection, and the MADs to
    /// answer with (a REJ of a REP: we never go on).
    pub fn receive(&mut self, mad: &[u8]) -> (Option<CmAnswer>, Vec<[u8; 256]>) {
        self.engine
            .handle_mad(self.now, IpAddr::V4(self.target), mad);
        let mut answer = None;
        let mut out = Vec::new();
        while let Some(e) = self.engine.poll_event() {
            match e {
                CmEvent::Rejected { id, reason, .. } if Some(id) == self.id => {
                    answer = Some(CmAnswer::Rejected(reason));
                }
                CmEvent::ConnectResponse {
                    id, private_data, ..
                } if Some(id) == self.id => {
                    answer = Some(CmAnswer::Reply);
                    if self.keep {
                        self.accepted = Some(private_data);
                        let _ = self.engine.establish(self.now, id);
                    } else {
                        let _ = self.engine.reject(id, b"ferroce fuzz");
                    }
                }
                _ => {}
            }
        }
        while let Some(o) = self.engine.poll_transmit() {
            out.push(o.mad);
        }
        (answer, out)
    }
}

/// A MAD as the UD SEND to QP1 that carries it (DETH: the GSI Q_Key, source QP 1), with its
/// ICRC for IPv4 ID 0.
pub fn wrap(mad: &[u8], local: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    let repr = PacketRepr {
        bth: BthRepr::new(Opcode::UD_SEND_ONLY, 1, Psn::new(0)),
        ext: ExtHeaders {
            deth: Some(DethRepr {
                qkey: ferroce_wire::GSI_QKEY,
                src_qp: 1,
            }),
            ..Default::default()
        },
        payload: mad,
    }
    .with_pad();
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf);
    IcrcContext::v4(local, target, 0, PORT, PORT).fill(&mut buf);
    buf
}

/// The MAD of a datagram for our QP1, if it is one.
pub fn unwrap(datagram: &[u8]) -> Option<Vec<u8>> {
    let p = PacketRepr::parse(datagram).ok()?;
    (p.bth.opcode == Opcode::UD_SEND_ONLY && p.bth.dest_qp == 1).then(|| p.payload.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_a_req_mad_for_the_port_and_wraps_for_qp1() {
        let (l, t) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let mut side = CmSide::new(3, l, t);
        let mad = side.request(7471, 0x1234).unwrap();
        // MAD header: base version 1, class 7 (CM), version 2, method Send, attribute REQ 0x10.
        assert_eq!(&mad[..4], &[1, 7, 2, 3]);
        assert_eq!(u16::from_be_bytes([mad[16], mad[17]]), 0x0010);
        // The REQ's ServiceID (bytes 8..16 of the message).
        let sid = u64::from_be_bytes(mad[24 + 8..24 + 16].try_into().unwrap());
        assert_eq!(sid, service_id(7471));
        let wire = wrap(&mad, l, t);
        assert!(IcrcContext::v4(l, t, 0, 4791, 4791).verify(&wire));
        assert_eq!(unwrap(&wire).as_deref(), Some(&mad[..]));
    }
}
