//! [`QpModify`]: the attributes of one `modify_qp` call, each setter also setting its
//! [`QpAttrMask`] bit, so that the mask and the fields cannot disagree.

use crate::verbs::{AccessFlags, AhAttr, Mtu, QpAttr, QpAttrMask, QpCap, QpState};

/// `struct ibv_qp_attr` together with its `attr_mask`, built one attribute at a time:
///
/// ```
/// use ferroce_transport::{AccessFlags, QpAttrMask, QpModify, QpState};
///
/// let m = QpModify::new(QpState::Init).port_num(1).qp_access_flags(AccessFlags::REMOTE_WRITE);
/// assert_eq!(m.mask(), QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS);
/// assert_eq!(m.attr().port_num, 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpModify {
    attr: QpAttr,
    mask: QpAttrMask,
}

macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty => $bit:ident;)*) => {
        $(
            $(#[$doc])*
            #[must_use]
            pub fn $name(mut self, value: $ty) -> Self {
                self.attr.$name = value;
                self.mask |= QpAttrMask::$bit;
                self
            }
        )*
    };
}

impl QpModify {
    /// A transition to `qp_state` (`IBV_QP_STATE`).
    pub fn new(qp_state: QpState) -> QpModify {
        QpModify {
            attr: QpAttr {
                qp_state,
                ..QpAttr::default()
            },
            mask: QpAttrMask::STATE,
        }
    }

    /// No state change: only the attributes set next (e.g. `rnr_retry` in RTS).
    pub fn attributes_only() -> QpModify {
        QpModify {
            attr: QpAttr::default(),
            mask: QpAttrMask::EMPTY,
        }
    }

    setters! {
        /// `cur_qp_state` (`IBV_QP_CUR_STATE`).
        cur_qp_state: QpState => CUR_STATE;
        /// `en_sqd_async_notify` (`IBV_QP_EN_SQD_ASYNC_NOTIFY`).
        en_sqd_async_notify: bool => EN_SQD_ASYNC_NOTIFY;
        /// `qp_access_flags` (`IBV_QP_ACCESS_FLAGS`).
        qp_access_flags: AccessFlags => ACCESS_FLAGS;
        /// `pkey_index` (`IBV_QP_PKEY_INDEX`).
        pkey_index: u16 => PKEY_INDEX;
        /// `port_num` (`IBV_QP_PORT`).
        port_num: u8 => PORT;
        /// `qkey` (`IBV_QP_QKEY`).
        qkey: u32 => QKEY;
        /// `path_mtu` (`IBV_QP_PATH_MTU`).
        path_mtu: Mtu => PATH_MTU;
        /// `timeout` (`IBV_QP_TIMEOUT`).
        timeout: u8 => TIMEOUT;
        /// `retry_cnt` (`IBV_QP_RETRY_CNT`).
        retry_cnt: u8 => RETRY_CNT;
        /// `rnr_retry` (`IBV_QP_RNR_RETRY`).
        rnr_retry: u8 => RNR_RETRY;
        /// `rq_psn` (`IBV_QP_RQ_PSN`).
        rq_psn: u32 => RQ_PSN;
        /// `max_rd_atomic` (`IBV_QP_MAX_QP_RD_ATOMIC`).
        max_rd_atomic: u8 => MAX_QP_RD_ATOMIC;
        /// `min_rnr_timer` (`IBV_QP_MIN_RNR_TIMER`).
        min_rnr_timer: u8 => MIN_RNR_TIMER;
        /// `sq_psn` (`IBV_QP_SQ_PSN`).
        sq_psn: u32 => SQ_PSN;
        /// `max_dest_rd_atomic` (`IBV_QP_MAX_DEST_RD_ATOMIC`).
        max_dest_rd_atomic: u8 => MAX_DEST_RD_ATOMIC;
        /// `cap` (`IBV_QP_CAP`).
        cap: QpCap => CAP;
        /// `dest_qp_num` (`IBV_QP_DEST_QPN`).
        dest_qp_num: u32 => DEST_QPN;
    }

    /// `ah_attr`, the primary path (`IBV_QP_AV`).
    #[must_use]
    pub fn ah_attr(mut self, value: AhAttr) -> Self {
        self.attr.ah_attr = Some(value);
        self.mask |= QpAttrMask::AV;
        self
    }

    /// The attributes.
    pub fn attr(&self) -> &QpAttr {
        &self.attr
    }

    /// The mask: exactly the attributes set.
    pub fn mask(&self) -> QpAttrMask {
        self.mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_setter_sets_its_field_and_only_its_bit() {
        let base = QpModify::attributes_only();
        let cases: [(QpModify, QpAttrMask); 18] = [
            (base.cur_qp_state(QpState::Rts), QpAttrMask::CUR_STATE),
            (
                base.en_sqd_async_notify(true),
                QpAttrMask::EN_SQD_ASYNC_NOTIFY,
            ),
            (
                base.qp_access_flags(AccessFlags::REMOTE_READ),
                QpAttrMask::ACCESS_FLAGS,
            ),
            (base.pkey_index(1), QpAttrMask::PKEY_INDEX),
            (base.port_num(2), QpAttrMask::PORT),
            (base.qkey(7), QpAttrMask::QKEY),
            (base.path_mtu(Mtu::Mtu4096), QpAttrMask::PATH_MTU),
            (base.timeout(14), QpAttrMask::TIMEOUT),
            (base.retry_cnt(7), QpAttrMask::RETRY_CNT),
            (base.rnr_retry(6), QpAttrMask::RNR_RETRY),
            (base.rq_psn(5), QpAttrMask::RQ_PSN),
            (base.max_rd_atomic(4), QpAttrMask::MAX_QP_RD_ATOMIC),
            (base.min_rnr_timer(12), QpAttrMask::MIN_RNR_TIMER),
            (base.sq_psn(9), QpAttrMask::SQ_PSN),
            (base.max_dest_rd_atomic(3), QpAttrMask::MAX_DEST_RD_ATOMIC),
            (
                base.cap(QpCap {
                    max_send_wr: 2,
                    ..QpCap::default()
                }),
                QpAttrMask::CAP,
            ),
            (base.dest_qp_num(0x12), QpAttrMask::DEST_QPN),
            (
                base.ah_attr(AhAttr {
                    dest: "10.0.0.1".parse().unwrap(),
                    hop_limit: 64,
                    traffic_class: 0,
                    flow_label: 0,
                    sgid_index: 1,
                }),
                QpAttrMask::AV,
            ),
        ];
        for (m, bit) in cases {
            assert_eq!(m.mask(), bit);
            assert_ne!(*m.attr(), QpAttr::default(), "{bit:?} changed no field");
        }
        let init = QpModify::new(QpState::Init).port_num(1);
        assert_eq!(init.mask(), QpAttrMask::STATE | QpAttrMask::PORT);
        assert_eq!(init.attr().qp_state, QpState::Init);
    }
}
