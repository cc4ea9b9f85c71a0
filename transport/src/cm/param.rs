//! `struct rdma_conn_param` and what it becomes: librdmacm's preprocessing (the 255 sentinel,
//! the device caps, the clamp of retry counts to 7), and the QP attributes kernel rdma_cm
//! programs at INIT, RTR and RTS on each side of a connection (cm-facts §3).

use core::fmt;
use std::net::IpAddr;

use crate::verbs::{AccessFlags, AhAttr, Mtu, QpAttr, QpAttrMask, QpState};

/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH`: "as many as the device allows".
pub const DEPTH_MAX: u8 = 0xFF;

/// The QP `timeout` rdma_cm programs on RoCE (`cm_ack_timeout(15, 18)` = 19, ≈2.1 s) unless
/// `RDMA_OPTION_ID_ACK_TIMEOUT` says otherwise.
pub const DEFAULT_ACK_TIMEOUT: u8 = 19;

/// The packet life time rdma_cm assumes on RoCE (`CMA_IBOE_PACKET_LIFETIME`).
pub const PACKET_LIFE_TIME: u8 = 18;

/// The CM response timeout rdma_cm advertises (`CMA_CM_RESPONSE_TIMEOUT`).
pub const CM_RESPONSE_TIMEOUT: u8 = 20;

/// How often a CM message is retried (`CMA_MAX_CM_RETRIES`): 16 sends in all.
pub const MAX_CM_RETRIES: u8 = 15;

/// The Service Timeout of rdma_cm's MRAs (`CMA_CM_MRA_SETTING` without its delay flag).
pub const MRA_SERVICE_TIMEOUT: u8 = 24;

/// `struct rdma_conn_param`: what one side asks for when connecting or accepting.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnParam {
    /// `private_data` (REQ ≤ 56 bytes after the rdma_cm header, REP ≤ 196, REJ ≤ 148).
    pub private_data: Vec<u8>,
    /// `responder_resources`: READs/atomics the peer may have outstanding here (255: the
    /// device's `max_qp_rd_atom`).
    pub responder_resources: u8,
    /// `initiator_depth`: READs/atomics this side may have outstanding at the peer (255: the
    /// device's `max_qp_init_rd_atom`).
    pub initiator_depth: u8,
    /// `flow_control` (exchanged, never programmed).
    pub flow_control: u8,
    /// `retry_count`: the transport retries of both QPs (the active side's counts; ≤ 7).
    pub retry_count: u8,
    /// `rnr_retry_count`: how often the *peer* retries after this side's RNR NAK (7:
    /// infinite; ≤ 7).
    pub rnr_retry_count: u8,
    /// `srq`: the local QP receives from an SRQ.
    pub srq: bool,
    /// `qp_num`: the local QP (when the caller owns it).
    pub qp_num: u32,
}

/// The device limits the depths are checked against (`ibv_device_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DepthCaps {
    /// `max_qp_rd_atom`: the responder side's limit.
    pub max_qp_rd_atom: u8,
    /// `max_qp_init_rd_atom`: the initiator side's limit.
    pub max_qp_init_rd_atom: u8,
}

/// A `ConnParam` the device cannot honour: which field, what was asked, and the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DepthError {
    /// The field (`responder_resources` or `initiator_depth`).
    pub field: &'static str,
    /// The value asked for.
    pub value: u8,
    /// The device cap it exceeds (`max_qp_rd_atom` or `max_qp_init_rd_atom`).
    pub cap_name: &'static str,
    /// That cap's value.
    pub cap: u8,
}

impl fmt::Display for DepthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} exceeds the device's {} ({})",
            self.field, self.value, self.cap_name, self.cap
        )
    }
}

impl std::error::Error for DepthError {}

impl ConnParam {
    /// The values `rdma_connect` sends (librdmacm's `ucma_valid_param` + kernel clamps):
    /// 255 means the device cap, anything above a cap is an error naming it, retry counts
    /// are clamped to 7.
    ///
    /// # Errors
    /// [`DepthError`] for a depth above the device's cap.
    pub fn for_connect(&self, caps: DepthCaps) -> Result<ConnParam, DepthError> {
        Ok(ConnParam {
            responder_resources: depth(
                "responder_resources",
                self.responder_resources,
                "max_qp_rd_atom",
                caps.max_qp_rd_atom,
                None,
            )?,
            initiator_depth: depth(
                "initiator_depth",
                self.initiator_depth,
                "max_qp_init_rd_atom",
                caps.max_qp_init_rd_atom,
                None,
            )?,
            retry_count: self.retry_count.min(7),
            rnr_retry_count: self.rnr_retry_count.min(7),
            ..self.clone()
        })
    }

    /// The values `rdma_accept` sends for a request whose event reported `requested`
    /// (`responder_resources`, `initiator_depth`, already swapped to this side's view): 255
    /// means `min(requested, cap)`; any other value is used as given if within the caps.
    ///
    /// # Errors
    /// [`DepthError`] for a depth above the device's cap.
    pub fn for_accept(
        &self,
        caps: DepthCaps,
        requested: (u8, u8),
    ) -> Result<ConnParam, DepthError> {
        Ok(ConnParam {
            responder_resources: depth(
                "responder_resources",
                self.responder_resources,
                "max_qp_rd_atom",
                caps.max_qp_rd_atom,
                Some(requested.0),
            )?,
            initiator_depth: depth(
                "initiator_depth",
                self.initiator_depth,
                "max_qp_init_rd_atom",
                caps.max_qp_init_rd_atom,
                Some(requested.1),
            )?,
            retry_count: self.retry_count.min(7),
            rnr_retry_count: self.rnr_retry_count.min(7),
            ..self.clone()
        })
    }

    /// librdmacm's parameters for a NULL `conn_param`: depths "as the device/request
    /// allows", retry and RNR retry 7.
    pub fn defaults() -> ConnParam {
        ConnParam {
            responder_resources: DEPTH_MAX,
            initiator_depth: DEPTH_MAX,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        }
    }
}

fn depth(
    field: &'static str,
    value: u8,
    cap_name: &'static str,
    cap: u8,
    requested: Option<u8>,
) -> Result<u8, DepthError> {
    if value == DEPTH_MAX {
        return Ok(requested.map_or(cap, |r| r.min(cap)));
    }
    if value > cap {
        return Err(DepthError {
            field,
            value,
            cap_name,
            cap,
        });
    }
    Ok(value)
}

/// Where a connection's packets go: what rdma_cm's route resolution (active side) or the
/// REQ (passive side) gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    /// This side's address (its GID).
    pub local: IpAddr,
    /// The peer's address.
    pub remote: IpAddr,
    /// The path MTU.
    pub mtu: Mtu,
    /// Hop limit (IP TTL).
    pub hop_limit: u8,
    /// Traffic class (IP TOS).
    pub traffic_class: u8,
    /// Flow label (rdma_cm: `(sport * 31 + dport) & 0xFFFFF`).
    pub flow_label: u32,
}

/// rdma_cm's flow label for a connection between rdma_cm ports `sport` and `dport`
/// (`cma_get_roce_udp_flow_label`); rxe turns it into the RC QP's UDP source port.
pub const fn flow_label(sport: u16, dport: u16) -> u32 {
    ((sport as u32).wrapping_mul(31).wrapping_add(dport as u32)) & 0xF_FFFF
}

/// What one side's QP is programmed with once both sides' values are known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// The path.
    pub path: Path,
    /// The peer's QP.
    pub dest_qp_num: u32,
    /// The PSN this side expects first (the one it advertised).
    pub rq_psn: u32,
    /// The PSN this side sends first (the one the peer advertised).
    pub sq_psn: u32,
    /// READs/atomics the peer may have outstanding here (`max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// READs/atomics this side may have outstanding (`max_rd_atomic`).
    pub initiator_depth: u8,
    /// `retry_cnt` (the active side's count, on both sides).
    pub retry_cnt: u8,
    /// `rnr_retry` (the count the peer advertised).
    pub rnr_retry: u8,
    /// `timeout`.
    pub ack_timeout: u8,
}

/// The three modifications that bring a QP created by rdma_cm (already in INIT with no
/// remote access) up: INIT→INIT with the remote access, RTR, RTS.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QpPlan {
    /// INIT→INIT: `qp_access_flags` REMOTE_WRITE, plus READ and ATOMIC if the peer may
    /// issue any (`responder_resources` > 0).
    pub init: (QpAttr, QpAttrMask),
    /// RTR: AV, path MTU, dest QPN, rq PSN, max_dest_rd_atomic, min_rnr_timer 0.
    pub rtr: (QpAttr, QpAttrMask),
    /// RTS: sq PSN, timeout, retry counts, max_rd_atomic.
    pub rts: (QpAttr, QpAttrMask),
}

impl Negotiated {
    /// The attributes kernel rdma_cm programs (`cm_init_qp_init_attr`, `_rtr_attr`,
    /// `_rts_attr`).
    pub fn plan(&self) -> QpPlan {
        let mut access = AccessFlags::REMOTE_WRITE;
        if self.responder_resources > 0 {
            access |= AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
        }
        let init = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: access,
            ..QpAttr::default()
        };
        let ah = AhAttr {
            dest: self.path.remote,
            hop_limit: self.path.hop_limit,
            traffic_class: self.path.traffic_class,
            flow_label: self.path.flow_label,
            sgid_index: 0,
        };
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: Some(ah),
            path_mtu: self.path.mtu,
            dest_qp_num: self.dest_qp_num,
            rq_psn: self.rq_psn,
            max_dest_rd_atomic: self.responder_resources,
            min_rnr_timer: 0,
            ..QpAttr::default()
        };
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: self.sq_psn,
            timeout: self.ack_timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            max_rd_atomic: self.initiator_depth,
            ..QpAttr::default()
        };
        QpPlan {
            init: (init, QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS),
            rtr: (
                rtr,
                QpAttrMask::STATE
                    | QpAttrMask::AV
                    | QpAttrMask::PATH_MTU
                    | QpAttrMask::DEST_QPN
                    | QpAttrMask::RQ_PSN
                    | QpAttrMask::MAX_DEST_RD_ATOMIC
                    | QpAttrMask::MIN_RNR_TIMER,
            ),
            rts: (
                rts,
                QpAttrMask::STATE
                    | QpAttrMask::SQ_PSN
                    | QpAttrMask::TIMEOUT
                    | QpAttrMask::RETRY_CNT
                    | QpAttrMask::RNR_RETRY
                    | QpAttrMask::MAX_QP_RD_ATOMIC,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RXE: DepthCaps = DepthCaps {
        max_qp_rd_atom: 128,
        max_qp_init_rd_atom: 128,
    };

    #[test]
    fn connect_values_follow_librdmacm() {
        let p = ConnParam {
            responder_resources: DEPTH_MAX,
            initiator_depth: 4,
            retry_count: 200,
            rnr_retry_count: 9,
            ..ConnParam::default()
        }
        .for_connect(RXE)
        .unwrap();
        assert_eq!(
            (
                p.responder_resources,
                p.initiator_depth,
                p.retry_count,
                p.rnr_retry_count
            ),
            (128, 4, 7, 7)
        );
        let e = ConnParam {
            initiator_depth: 129,
            ..ConnParam::default()
        }
        .for_connect(RXE)
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "initiator_depth 129 exceeds the device's max_qp_init_rd_atom (128)"
        );
    }

    #[test]
    fn accept_with_255_takes_the_request_within_the_caps() {
        let a = ConnParam::defaults().for_accept(RXE, (1, 200)).unwrap();
        assert_eq!((a.responder_resources, a.initiator_depth), (1, 128));
        // A value other than 255 is used as given (no min against the request).
        let b = ConnParam {
            responder_resources: 16,
            initiator_depth: 16,
            ..ConnParam::default()
        }
        .for_accept(RXE, (1, 1))
        .unwrap();
        assert_eq!((b.responder_resources, b.initiator_depth), (16, 16));
    }

    #[test]
    fn flow_label_of_the_captures() {
        assert_eq!(flow_label(56436, 7174), 0xACE12);
        assert_eq!(flow_label(46425, 7471), 0x612F6);
    }

    #[test]
    fn the_plan_is_kernel_rdma_cms() {
        let n = Negotiated {
            path: Path {
                local: IpAddr::from([10, 0, 0, 1]),
                remote: IpAddr::from([10, 0, 0, 2]),
                mtu: Mtu::Mtu1024,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0x612F6,
            },
            dest_qp_num: 0x1a,
            rq_psn: 0x9BF04A,
            sq_psn: 0x24B9F5,
            responder_resources: 0,
            initiator_depth: 1,
            retry_cnt: 5,
            rnr_retry: 7,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
        };
        let p = n.plan();
        assert_eq!(p.init.0.qp_access_flags, AccessFlags::REMOTE_WRITE);
        assert_eq!(
            Negotiated {
                responder_resources: 1,
                ..n
            }
            .plan()
            .init
            .0
            .qp_access_flags,
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
        );
        assert_eq!(
            (p.rtr.0.rq_psn, p.rtr.0.dest_qp_num, p.rtr.0.min_rnr_timer),
            (0x9BF04A, 0x1a, 0)
        );
        assert!(p.rtr.1.contains(QpAttrMask::MIN_RNR_TIMER));
        assert_eq!(
            (
                p.rts.0.sq_psn,
                p.rts.0.timeout,
                p.rts.0.retry_cnt,
                p.rts.0.rnr_retry
            ),
            (0x24B9F5, 19, 5, 7)
        );
        assert_eq!(p.rts.0.max_rd_atomic, 1);
    }
}
