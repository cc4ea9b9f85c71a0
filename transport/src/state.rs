//! The QP state machine's rules: which transitions exist and which attributes each requires or
//! allows, per QP type (the kernel's `qp_state_table` / `ib_modify_qp_is_ok`, IBTA §10.3.1),
//! and the range checks on attribute values.

use core::fmt;

use crate::verbs::{Mtu, QpAttr, QpAttrMask, QpState, QpType};

/// The service a QP's transitions are checked against: the QP type, with QP1 (GSI) apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// The General Services QP, QP1 (UD with its own table column).
    Gsi,
    /// An XRC send QP (the kernel's XRC_INI column).
    XrcSend,
    /// An XRC receive QP (the kernel's XRC_TGT column).
    XrcRecv,
}

impl Service {
    /// The service of a QP of type `t` and number `qpn`.
    pub const fn of(t: QpType, qpn: u32) -> Service {
        match t {
            QpType::Rc => Service::Rc,
            QpType::Uc => Service::Uc,
            QpType::Ud if qpn == 1 => Service::Gsi,
            QpType::Ud => Service::Ud,
            QpType::XrcSend => Service::XrcSend,
            QpType::XrcRecv => Service::XrcRecv,
        }
    }
}

/// Why a modify was refused (verbs returns EINVAL for all of them); each names the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModifyQpError {
    /// There is no such transition for this QP type.
    InvalidTransition {
        /// The QP's service.
        service: Service,
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
    },
    /// Attributes the transition requires are missing from the mask.
    MissingAttr {
        /// The QP's service.
        service: Service,
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// The required bits not in the mask.
        missing: QpAttrMask,
    },
    /// The mask has attributes this transition does not accept.
    AttrNotAllowed {
        /// The QP's service.
        service: Service,
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// The bits it does not accept.
        extra: QpAttrMask,
    },
    /// An attribute value is out of range.
    InvalidAttr {
        /// The attribute at fault.
        attr: QpAttrMask,
        /// Why.
        reason: &'static str,
        /// The value given and the largest allowed, where the rule is a bound.
        values: Option<(u64, u64)>,
    },
}

/// `IBV_QP_A | IBV_QP_B`, or `none`.
struct MaskNames(QpAttrMask);

impl fmt::Display for MaskNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        for n in self.0.names() {
            write!(f, "{sep}IBV_QP_{n}")?;
            sep = " | ";
        }
        if sep.is_empty() {
            f.write_str("none")?;
        }
        Ok(())
    }
}

impl Service {
    fn name(self) -> &'static str {
        match self {
            Service::Rc => "RC",
            Service::Uc => "UC",
            Service::Ud => "UD",
            Service::Gsi => "QP1 (GSI)",
            Service::XrcSend => "XRC_SEND",
            Service::XrcRecv => "XRC_RECV",
        }
    }
}

fn state_name(s: QpState) -> String {
    format!("{s:?}").to_uppercase()
}

impl fmt::Display for ModifyQpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ModifyQpError::InvalidTransition { service, from, to } => write!(
                f,
                "{} QP: no transition {} -> {} (a QP goes RESET -> INIT -> RTR -> RTS, RTS \
                 <-> SQD, SQE -> RTS, and to RESET or ERR from any state)",
                service.name(),
                state_name(from),
                state_name(to)
            ),
            ModifyQpError::MissingAttr {
                service,
                from,
                to,
                missing,
            } => {
                let (req, _) = transition(service, from, to).unwrap_or_default();
                write!(
                    f,
                    "{} QP {} -> {} requires {} in attr_mask; missing {}",
                    service.name(),
                    state_name(from),
                    state_name(to),
                    MaskNames(req | QpAttrMask::STATE),
                    MaskNames(missing)
                )
            }
            ModifyQpError::AttrNotAllowed {
                service,
                from,
                to,
                extra,
            } => {
                let (req, opt) = transition(service, from, to).unwrap_or_default();
                write!(
                    f,
                    "{} QP {} -> {} does not take {} (it takes {}",
                    service.name(),
                    state_name(from),
                    state_name(to),
                    MaskNames(extra),
                    MaskNames(req | QpAttrMask::STATE),
                )?;
                if !opt.is_empty() {
                    write!(f, ", and optionally {}", MaskNames(opt))?;
                }
                if extra.contains(QpAttrMask::CUR_STATE) {
                    f.write_str("; IBV_QP_CUR_STATE only from RTR, RTS, SQD or SQE")?;
                }
                f.write_str(")")
            }
            ModifyQpError::InvalidAttr {
                attr,
                reason,
                values,
            } => {
                write!(f, "invalid {}: {reason}", MaskNames(attr))?;
                if let Some((given, max)) = values {
                    write!(f, " (given {given}, at most {max})")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ModifyQpError {}

type M = QpAttrMask;

const fn m(bits: u32) -> M {
    QpAttrMask(bits)
}

const PKEY: u32 = M::PKEY_INDEX.0;
const PORT: u32 = M::PORT.0;
const QKEY: u32 = M::QKEY.0;
const ACCESS: u32 = M::ACCESS_FLAGS.0;
const CUR: u32 = M::CUR_STATE.0;
const ALT: u32 = M::ALT_PATH.0;
const MIG: u32 = M::PATH_MIG_STATE.0;
const RNR_T: u32 = M::MIN_RNR_TIMER.0;

/// `(required, optional)` attributes of the transition `from → to` for `service`, or `None`
/// if the transition does not exist.
pub const fn transition(service: Service, from: QpState, to: QpState) -> Option<(M, M)> {
    use QpState::*;
    use Service::*;
    let none = m(0);
    Some(match (from, to) {
        (Reset, Reset) => (none, none),
        (Reset, Init) => match service {
            Rc | Uc | XrcSend | XrcRecv => (m(PKEY | PORT | ACCESS), none),
            Ud => (m(PKEY | PORT | QKEY), none),
            Gsi => (m(PKEY | QKEY), none),
        },
        (Init, Init) => match service {
            Rc | Uc | XrcSend | XrcRecv => (none, m(PKEY | PORT | ACCESS)),
            Ud => (none, m(PKEY | PORT | QKEY)),
            Gsi => (none, m(PKEY | QKEY)),
        },
        (Init, Rtr) => match service {
            Rc | XrcRecv => (
                m(M::AV.0
                    | M::PATH_MTU.0
                    | M::DEST_QPN.0
                    | M::RQ_PSN.0
                    | M::MAX_DEST_RD_ATOMIC.0
                    | RNR_T),
                m(ALT | ACCESS | PKEY),
            ),
            Uc | XrcSend => (
                m(M::AV.0 | M::PATH_MTU.0 | M::DEST_QPN.0 | M::RQ_PSN.0),
                m(ALT | ACCESS | PKEY),
            ),
            Ud | Gsi => (none, m(PKEY | QKEY)),
        },
        (Rtr, Rts) => match service {
            Rc => (
                m(M::TIMEOUT.0
                    | M::RETRY_CNT.0
                    | M::RNR_RETRY.0
                    | M::SQ_PSN.0
                    | M::MAX_QP_RD_ATOMIC.0),
                m(CUR | ALT | ACCESS | RNR_T | MIG),
            ),
            XrcSend => (
                m(M::TIMEOUT.0
                    | M::RETRY_CNT.0
                    | M::RNR_RETRY.0
                    | M::SQ_PSN.0
                    | M::MAX_QP_RD_ATOMIC.0),
                m(CUR | ALT | ACCESS | MIG),
            ),
            XrcRecv => (
                m(M::TIMEOUT.0 | M::SQ_PSN.0),
                m(CUR | ALT | ACCESS | RNR_T | MIG),
            ),
            Uc => (M::SQ_PSN, m(CUR | ALT | ACCESS | MIG)),
            Ud | Gsi => (M::SQ_PSN, m(CUR | QKEY)),
        },
        (Rts, Rts) | (Sqd, Rts) => match service {
            Rc | XrcRecv => (none, m(CUR | ACCESS | ALT | MIG | RNR_T)),
            Uc | XrcSend => (none, m(CUR | ACCESS | ALT | MIG)),
            Ud | Gsi => (none, m(CUR | QKEY)),
        },
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match service {
            Rc => (
                none,
                m(PORT
                    | M::AV.0
                    | M::TIMEOUT.0
                    | M::RETRY_CNT.0
                    | M::RNR_RETRY.0
                    | M::MAX_QP_RD_ATOMIC.0
                    | M::MAX_DEST_RD_ATOMIC.0
                    | ALT
                    | ACCESS
                    | PKEY
                    | RNR_T
                    | MIG),
            ),
            Uc => (none, m(M::AV.0 | ALT | ACCESS | PKEY | MIG)),
            XrcSend => (
                none,
                m(PORT
                    | M::AV.0
                    | M::TIMEOUT.0
                    | M::RETRY_CNT.0
                    | M::RNR_RETRY.0
                    | M::MAX_QP_RD_ATOMIC.0
                    | ALT
                    | ACCESS
                    | PKEY
                    | MIG),
            ),
            XrcRecv => (
                none,
                m(PORT
                    | M::AV.0
                    | M::TIMEOUT.0
                    | M::MAX_DEST_RD_ATOMIC.0
                    | ALT
                    | ACCESS
                    | PKEY
                    | RNR_T
                    | MIG),
            ),
            Ud | Gsi => (none, m(PKEY | QKEY)),
        },
        (Sqe, Rts) => match service {
            Rc | XrcSend | XrcRecv => (none, none),
            Uc => (none, m(CUR | ACCESS)),
            Ud | Gsi => (none, m(CUR | QKEY)),
        },
        (Init | Rtr | Rts | Sqd | Sqe | Err, Reset) => (none, none),
        (Init | Rtr | Rts | Sqd | Sqe | Err, Err) => (none, none),
        _ => return None,
    })
}

/// What bringing a connected (or UD) QP up needs: the attributes of `ibv_modify_qp`'s three
/// classic steps, RESET → INIT → RTR → RTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BringUp {
    /// The peer (RC/UC; ignored on UD).
    pub peer: std::net::IpAddr,
    /// The peer's QP number (RC/UC).
    pub dest_qp_num: u32,
    /// Path MTU (RC/UC).
    pub path_mtu: crate::verbs::Mtu,
    /// First PSN this QP sends.
    pub sq_psn: u32,
    /// First PSN this QP expects.
    pub rq_psn: u32,
    /// What the peer may do (RC/UC).
    pub qp_access_flags: crate::verbs::AccessFlags,
    /// Q_Key (UD).
    pub qkey: u32,
    /// `timeout`.
    pub timeout: u8,
    /// `retry_cnt`.
    pub retry_cnt: u8,
    /// `rnr_retry`.
    pub rnr_retry: u8,
    /// `min_rnr_timer`.
    pub min_rnr_timer: u8,
    /// `max_rd_atomic`.
    pub max_rd_atomic: u8,
    /// `max_dest_rd_atomic`.
    pub max_dest_rd_atomic: u8,
}

impl BringUp {
    /// `(attributes, mask)` for INIT, RTR and RTS, each mask exactly the transition's required
    /// attributes (from the table) and STATE, for a QP of `service`.
    pub fn steps(&self, service: Service) -> [(QpAttr, QpAttrMask); 3] {
        let base = QpAttr {
            port_num: 1,
            qp_access_flags: self.qp_access_flags,
            qkey: self.qkey,
            path_mtu: self.path_mtu,
            dest_qp_num: self.dest_qp_num,
            rq_psn: self.rq_psn,
            sq_psn: self.sq_psn,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            max_rd_atomic: self.max_rd_atomic,
            min_rnr_timer: self.min_rnr_timer,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            ah_attr: Some(crate::verbs::AhAttr::new(self.peer)),
            ..QpAttr::default()
        };
        let step = |from: QpState, to: QpState| {
            // Every step of the bring-up exists in the table for every service.
            let (req, _) =
                transition(service, from, to).unwrap_or((QpAttrMask::EMPTY, QpAttrMask::EMPTY));
            (
                QpAttr {
                    qp_state: to,
                    ..base
                },
                req | QpAttrMask::STATE,
            )
        };
        [
            step(QpState::Reset, QpState::Init),
            step(QpState::Init, QpState::Rtr),
            step(QpState::Rtr, QpState::Rts),
        ]
    }
}

/// Device limits a modify is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModifyLimits {
    /// The port's active MTU: `path_mtu` may not exceed it.
    pub active_mtu: Mtu,
    /// `max_qp_init_rd_atom`: the largest `max_rd_atomic`.
    pub max_qp_init_rd_atom: u8,
    /// `max_qp_rd_atom`: the largest `max_dest_rd_atomic`.
    pub max_qp_rd_atom: u8,
    /// Whether RESET → ERR is accepted (older kernels allowed it; mainline does not).
    pub allow_reset_to_err: bool,
}

impl Default for ModifyLimits {
    fn default() -> ModifyLimits {
        ModifyLimits {
            active_mtu: Mtu::Mtu4096,
            max_qp_init_rd_atom: 128,
            max_qp_rd_atom: 128,
            allow_reset_to_err: false,
        }
    }
}

impl Service {
    /// The bits of `mask` this service ignores, taken off before the rules are checked, as
    /// the kernel's verbs layer does for user-space modifies (`modify_qp_mask`): an XRC send
    /// QP has no responder resources (`max_dest_rd_atomic`, `min_rnr_timer`), an XRC receive
    /// QP no requester ones (`max_rd_atomic`, `retry_cnt`, `rnr_retry`). Programs written for
    /// RC (perftest's `-c XRC`) pass RC's masks.
    pub const fn effective_mask(self, mask: QpAttrMask) -> QpAttrMask {
        match self {
            Service::XrcSend => {
                QpAttrMask(mask.0 & !(M::MAX_DEST_RD_ATOMIC.0 | M::MIN_RNR_TIMER.0))
            }
            Service::XrcRecv => {
                QpAttrMask(mask.0 & !(M::MAX_QP_RD_ATOMIC.0 | M::RETRY_CNT.0 | M::RNR_RETRY.0))
            }
            _ => mask,
        }
    }
}

/// Checks a modify of a QP in state `cur` and returns the state it moves to.
///
/// # Errors
/// The first rule the request breaks, as a [`ModifyQpError`].
pub fn check_modify(
    service: Service,
    cur: QpState,
    attr: &QpAttr,
    mask: QpAttrMask,
    limits: &ModifyLimits,
) -> Result<QpState, ModifyQpError> {
    let next = if mask.contains(M::STATE) {
        attr.qp_state
    } else {
        cur
    };
    if mask.contains(M::CUR_STATE)
        && !matches!(
            cur,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    {
        return Err(ModifyQpError::AttrNotAllowed {
            service,
            from: cur,
            to: next,
            extra: M::CUR_STATE,
        });
    }
    let (req, opt) = if cur == QpState::Reset && next == QpState::Err && limits.allow_reset_to_err {
        (m(0), m(0))
    } else {
        transition(service, cur, next).ok_or(ModifyQpError::InvalidTransition {
            service,
            from: cur,
            to: next,
        })?
    };
    let missing = req.difference(mask);
    if !missing.is_empty() {
        return Err(ModifyQpError::MissingAttr {
            service,
            from: cur,
            to: next,
            missing,
        });
    }
    let extra = mask.difference(req | opt | M::STATE);
    if !extra.is_empty() {
        return Err(ModifyQpError::AttrNotAllowed {
            service,
            from: cur,
            to: next,
            extra,
        });
    }
    if mask.contains(M::CUR_STATE) && attr.cur_qp_state != cur {
        return Err(ModifyQpError::InvalidAttr {
            attr: M::CUR_STATE,
            reason: "cur_qp_state is not the QP's current state",
            values: None,
        });
    }
    if mask.contains(M::ALT_PATH) {
        // The kernel bans alternate paths in RoCE mode (`_ib_modify_qp`).
        return Err(ModifyQpError::InvalidAttr {
            attr: M::ALT_PATH,
            reason: "alternate paths are not supported on RoCE",
            values: None,
        });
    }
    check_values(attr, mask, limits)?;
    Ok(next)
}

fn check_values(
    attr: &QpAttr,
    mask: QpAttrMask,
    limits: &ModifyLimits,
) -> Result<(), ModifyQpError> {
    // A bound: `value` of `attr` may be at most `max`.
    let bound = |attr: M, value: u64, max: u64, reason: &'static str| {
        if value > max {
            Err(ModifyQpError::InvalidAttr {
                attr,
                reason,
                values: Some((value, max)),
            })
        } else {
            Ok(())
        }
    };
    let bad = |attr: M, reason: &'static str| {
        Err(ModifyQpError::InvalidAttr {
            attr,
            reason,
            values: None,
        })
    };
    let checks: [(M, u64, u64, &'static str); 10] = [
        (
            M::TIMEOUT,
            attr.timeout.into(),
            31,
            "timeout is a 5-bit exponent",
        ),
        (
            M::RETRY_CNT,
            attr.retry_cnt.into(),
            7,
            "retry_cnt is 3 bits",
        ),
        (
            M::RNR_RETRY,
            attr.rnr_retry.into(),
            7,
            "rnr_retry is 3 bits (7: for ever)",
        ),
        (
            M::MIN_RNR_TIMER,
            attr.min_rnr_timer.into(),
            31,
            "min_rnr_timer is a 5-bit code",
        ),
        (
            M::SQ_PSN,
            attr.sq_psn.into(),
            0xFF_FFFF,
            "sq_psn is a 24-bit value",
        ),
        (
            M::RQ_PSN,
            attr.rq_psn.into(),
            0xFF_FFFF,
            "rq_psn is a 24-bit value",
        ),
        (
            M::DEST_QPN,
            attr.dest_qp_num.into(),
            0xFF_FFFF,
            "dest_qp_num is a 24-bit value",
        ),
        (
            M::PATH_MTU,
            attr.path_mtu.bytes().into(),
            limits.active_mtu.bytes().into(),
            "path_mtu (bytes) exceeds the port's active_mtu, which the interface's MTU sets \
             (ibv_query_port)",
        ),
        (
            M::MAX_QP_RD_ATOMIC,
            attr.max_rd_atomic.into(),
            limits.max_qp_init_rd_atom.into(),
            "max_rd_atomic exceeds the device's max_qp_init_rd_atom (ibv_query_device)",
        ),
        (
            M::MAX_DEST_RD_ATOMIC,
            attr.max_dest_rd_atomic.into(),
            limits.max_qp_rd_atom.into(),
            "max_dest_rd_atomic exceeds the device's max_qp_rd_atom (ibv_query_device)",
        ),
    ];
    for (m, value, max, reason) in checks {
        if mask.contains(m) {
            bound(m, value, max, reason)?;
        }
    }
    if mask.contains(M::PORT) && attr.port_num != 1 {
        return bad(M::PORT, "the device has one port, number 1");
    }
    if mask.contains(M::PKEY_INDEX) && attr.pkey_index != 0 {
        return bad(M::PKEY_INDEX, "the P_Key table has one entry, index 0");
    }
    if mask.contains(M::AV) && attr.ah_attr.is_none() {
        return bad(M::AV, "ah_attr must name the peer");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::AhAttr;

    const ALL_STATES: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    fn full_attr(to: QpState) -> QpAttr {
        QpAttr {
            qp_state: to,
            path_mtu: Mtu::Mtu1024,
            ah_attr: Some(AhAttr::new("127.0.0.1".parse().unwrap())),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            ..QpAttr::default()
        }
    }

    /// Every transition of every service: with exactly the required bits it succeeds; without
    /// any one required bit it reports that bit; with a bit outside required ∪ optional it
    /// reports that bit.
    #[test]
    fn every_transition_valid_missing_and_extra() {
        let lim = ModifyLimits::default();
        let mut valid = 0;
        for service in [Service::Rc, Service::Uc, Service::Ud, Service::Gsi] {
            for from in ALL_STATES {
                for to in ALL_STATES {
                    let attr = full_attr(to);
                    let Some((req, opt)) = transition(service, from, to) else {
                        assert_eq!(
                            check_modify(service, from, &attr, M::STATE, &lim),
                            Err(ModifyQpError::InvalidTransition { service, from, to }),
                            "{service:?} {from:?}->{to:?}"
                        );
                        continue;
                    };
                    valid += 1;
                    let base = req | M::STATE;
                    assert_eq!(
                        check_modify(service, from, &attr, base, &lim),
                        Ok(to),
                        "{service:?} {from:?}->{to:?}"
                    );
                    for bit in 0..26 {
                        let b = QpAttrMask(1 << bit);
                        if req.contains(b) && !b.is_empty() {
                            assert_eq!(
                                check_modify(service, from, &attr, base.difference(b), &lim),
                                Err(ModifyQpError::MissingAttr {
                                    service,
                                    from,
                                    to,
                                    missing: b
                                }),
                                "{service:?} {from:?}->{to:?} without {b:?}"
                            );
                        }
                        let allowed = req | opt | M::STATE;
                        if !allowed.contains(b) {
                            assert_eq!(
                                check_modify(service, from, &attr, base | b, &lim),
                                Err(ModifyQpError::AttrNotAllowed {
                                    service,
                                    from,
                                    to,
                                    extra: b
                                }),
                                "{service:?} {from:?}->{to:?} with {b:?}"
                            );
                        }
                    }
                }
            }
        }
        // Per service: 2 RESET rows + INIT(4) + RTR(3) + RTS(4) + SQD(4) + SQE(3) + ERR(2).
        assert_eq!(valid, 4 * 22);
    }

    #[test]
    fn bring_up_steps_pass_the_table() {
        let b = BringUp {
            peer: "10.0.0.2".parse().unwrap(),
            dest_qp_num: 0x11,
            path_mtu: Mtu::Mtu1024,
            sq_psn: 1,
            rq_psn: 2,
            qp_access_flags: crate::verbs::AccessFlags::LOCAL_WRITE,
            qkey: 7,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
        };
        for service in [Service::Rc, Service::Uc, Service::Ud, Service::Gsi] {
            let mut cur = QpState::Reset;
            for (attr, mask) in b.steps(service) {
                cur = check_modify(service, cur, &attr, mask, &ModifyLimits::default()).unwrap();
            }
            assert_eq!(cur, QpState::Rts, "{service:?}");
        }
        assert!(
            b.steps(Service::Rc)[1]
                .1
                .contains(QpAttrMask::MIN_RNR_TIMER)
        );
        assert!(
            !b.steps(Service::Uc)[1]
                .1
                .contains(QpAttrMask::MIN_RNR_TIMER)
        );
    }

    #[test]
    fn rc_table_spot_checks() {
        let (req, opt) = transition(Service::Rc, QpState::Init, QpState::Rtr).unwrap();
        assert_eq!(req.0, 0x80 | 0x100 | 0x100000 | 0x1000 | 0x20000 | 0x8000);
        assert_eq!(opt.0, 0x4000 | 0x8 | 0x10);
        assert!(transition(Service::Rc, QpState::Rtr, QpState::Rtr).is_none());
        assert!(transition(Service::Rc, QpState::Reset, QpState::Err).is_none());
        assert!(transition(Service::Rc, QpState::Rts, QpState::Rtr).is_none());
        let (req, _) = transition(Service::Ud, QpState::Reset, QpState::Init).unwrap();
        assert_eq!(req, M::PKEY_INDEX | M::PORT | M::QKEY);
        let (req, _) = transition(Service::Gsi, QpState::Reset, QpState::Init).unwrap();
        assert_eq!(req, M::PKEY_INDEX | M::QKEY);
    }

    #[test]
    fn reset_to_err_behind_a_flag() {
        let attr = full_attr(QpState::Err);
        let mut lim = ModifyLimits::default();
        assert!(check_modify(Service::Rc, QpState::Reset, &attr, M::STATE, &lim).is_err());
        lim.allow_reset_to_err = true;
        assert_eq!(
            check_modify(Service::Rc, QpState::Reset, &attr, M::STATE, &lim),
            Ok(QpState::Err)
        );
    }

    #[test]
    fn cur_state_rules() {
        let lim = ModifyLimits::default();
        let mut attr = full_attr(QpState::Rts);
        attr.cur_qp_state = QpState::Rts;
        assert_eq!(
            check_modify(
                Service::Rc,
                QpState::Rts,
                &attr,
                M::STATE | M::CUR_STATE,
                &lim
            ),
            Ok(QpState::Rts)
        );
        attr.cur_qp_state = QpState::Rtr;
        assert!(matches!(
            check_modify(
                Service::Rc,
                QpState::Rts,
                &attr,
                M::STATE | M::CUR_STATE,
                &lim
            ),
            Err(ModifyQpError::InvalidAttr {
                attr: M::CUR_STATE,
                ..
            })
        ));
        let init = full_attr(QpState::Init);
        assert_eq!(
            check_modify(
                Service::Rc,
                QpState::Init,
                &init,
                M::STATE | M::CUR_STATE,
                &lim
            ),
            Err(ModifyQpError::AttrNotAllowed {
                service: Service::Rc,
                from: QpState::Init,
                to: QpState::Init,
                extra: M::CUR_STATE
            })
        );
    }

    /// Each refusal names the rule in verbs terms: the transition, the C mask bits required,
    /// missing or refused, and a bound with the value given.
    #[test]
    fn refusals_name_the_rule() {
        let lim = ModifyLimits {
            active_mtu: Mtu::Mtu1024,
            ..ModifyLimits::default()
        };
        let rtr = full_attr(QpState::Rtr);
        let e = check_modify(Service::Rc, QpState::Init, &rtr, M::STATE | M::AV, &lim)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("RC QP INIT -> RTR requires IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU")
                && e.ends_with(
                    "missing IBV_QP_PATH_MTU | IBV_QP_RQ_PSN | IBV_QP_MIN_RNR_TIMER | \
                     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_DEST_QPN"
                ),
            "{e}"
        );
        let e = check_modify(Service::Ud, QpState::Init, &rtr, M::STATE | M::SQ_PSN, &lim)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "UD QP INIT -> RTR does not take IBV_QP_SQ_PSN (it takes IBV_QP_STATE, and \
             optionally IBV_QP_PKEY_INDEX | IBV_QP_QKEY)"
        );
        let e = check_modify(Service::Rc, QpState::Reset, &rtr, M::STATE, &lim)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("RC QP: no transition RESET -> RTR"), "{e}");
        let mut a = full_attr(QpState::Rtr);
        a.path_mtu = Mtu::Mtu4096;
        let mask = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        let e = check_modify(Service::Rc, QpState::Init, &a, mask, &lim).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid IBV_QP_PATH_MTU: path_mtu (bytes) exceeds")
                && e.to_string().ends_with("(given 4096, at most 1024)"),
            "{e}"
        );
    }

    #[test]
    fn value_ranges() {
        let lim = ModifyLimits {
            active_mtu: Mtu::Mtu1024,
            ..ModifyLimits::default()
        };
        let rts_mask =
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
        type Breaker = fn(&mut QpAttr);
        let cases: [(Breaker, M); 6] = [
            (|a| a.timeout = 32, M::TIMEOUT),
            (|a| a.retry_cnt = 8, M::RETRY_CNT),
            (|a| a.rnr_retry = 8, M::RNR_RETRY),
            (|a| a.sq_psn = 1 << 24, M::SQ_PSN),
            (|a| a.max_rd_atomic = 129, M::MAX_QP_RD_ATOMIC),
            (|a| a.min_rnr_timer = 32, M::MIN_RNR_TIMER),
        ];
        for (break_it, which) in cases {
            let mut a = full_attr(QpState::Rts);
            break_it(&mut a);
            let mask = rts_mask
                | if which == M::MIN_RNR_TIMER {
                    which
                } else {
                    M::EMPTY
                };
            assert!(
                matches!(check_modify(Service::Rc, QpState::Rtr, &a, mask, &lim), Err(ModifyQpError::InvalidAttr { attr, .. }) if attr == which),
                "{which:?}"
            );
        }
        let rtr_mask = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        let mut a = full_attr(QpState::Rtr);
        a.path_mtu = Mtu::Mtu2048;
        assert!(matches!(
            check_modify(Service::Rc, QpState::Init, &a, rtr_mask, &lim),
            Err(ModifyQpError::InvalidAttr {
                attr: M::PATH_MTU,
                ..
            })
        ));
        a.path_mtu = Mtu::Mtu1024;
        a.ah_attr = None;
        assert!(matches!(
            check_modify(Service::Rc, QpState::Init, &a, rtr_mask, &lim),
            Err(ModifyQpError::InvalidAttr { attr: M::AV, .. })
        ));
        let mut a = full_attr(QpState::Rtr);
        a.dest_qp_num = 1 << 24;
        assert!(check_modify(Service::Rc, QpState::Init, &a, rtr_mask, &lim).is_err());
        let mut a = full_attr(QpState::Rtr);
        assert!(
            check_modify(Service::Rc, QpState::Init, &a, rtr_mask | M::ALT_PATH, &lim).is_err()
        );
        a.max_dest_rd_atomic = 200;
        assert!(check_modify(Service::Rc, QpState::Init, &a, rtr_mask, &lim).is_err());
        let mut init = full_attr(QpState::Init);
        init.port_num = 2;
        assert!(
            check_modify(
                Service::Rc,
                QpState::Reset,
                &init,
                M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
                &lim
            )
            .is_err()
        );
    }
}
