//! Conversions between the C structs of verbs and ferroce's Rust types.

use core::ffi::c_int;
use std::net::{IpAddr, Ipv6Addr};

use ferroce::transport::{AccessFlags, AhAttr, Mtu, QpAttr, QpAttrMask, QpCap, QpState, QpType};

use crate::abi::*;

pub(crate) fn qp_type_of(t: c_int) -> Option<QpType> {
    QpType::from_raw(t as u32)
}

/// The IP address a GID stands for (`::ffff:a.b.c.d` is IPv4).
pub fn gid_addr(g: &ibv_gid) -> IpAddr {
    let v6 = Ipv6Addr::from(g.raw);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// `ibv_ah_attr` → ferroce's AH attributes; RoCE needs the GRH (is_global).
pub fn ah_attr_from(a: &ibv_ah_attr) -> Result<AhAttr, c_int> {
    if a.is_global == 0 {
        log::debug!(
            "address vector without a GRH (is_global 0): RoCE addresses by GID; set \
             is_global, grh.dgid and grh.sgid_index (EINVAL)"
        );
        return Err(libc::EINVAL);
    }
    Ok(AhAttr {
        dest: gid_addr(&a.grh.dgid),
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label,
        sgid_index: a.grh.sgid_index,
    })
}

pub(crate) fn ah_attr_to(a: &AhAttr) -> ibv_ah_attr {
    let raw = match a.dest {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    };
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        is_global: 1,
        port_num: 1,
        ..ibv_ah_attr::default()
    }
}

pub(crate) fn qp_attr_from(a: &ibv_qp_attr, mask: QpAttrMask) -> Result<QpAttr, c_int> {
    let state = |v: c_int, what: &str| {
        QpState::from_raw(v as u32).ok_or_else(|| {
            log::debug!("modify_qp: {what} {v} is no QP state (EINVAL)");
            libc::EINVAL
        })
    };
    let mut q = QpAttr::default();
    if mask.contains(QpAttrMask::STATE) {
        q.qp_state = state(a.qp_state, "qp_state")?;
    }
    if mask.contains(QpAttrMask::CUR_STATE) {
        q.cur_qp_state = state(a.cur_qp_state, "cur_qp_state")?;
    }
    if mask.contains(QpAttrMask::PATH_MTU) {
        q.path_mtu = Mtu::from_raw(a.path_mtu as u32).ok_or_else(|| {
            log::debug!("modify_qp: path_mtu {} is no IB MTU (EINVAL)", a.path_mtu);
            libc::EINVAL
        })?;
    }
    if mask.contains(QpAttrMask::AV) {
        q.ah_attr = Some(ah_attr_from(&a.ah_attr)?);
    }
    q.qkey = a.qkey;
    q.rq_psn = a.rq_psn;
    q.sq_psn = a.sq_psn;
    q.dest_qp_num = a.dest_qp_num;
    q.qp_access_flags = AccessFlags(a.qp_access_flags);
    q.cap = QpCap {
        max_send_wr: a.cap.max_send_wr,
        max_recv_wr: a.cap.max_recv_wr,
        max_send_sge: a.cap.max_send_sge,
        max_recv_sge: a.cap.max_recv_sge,
        max_inline_data: a.cap.max_inline_data,
    };
    q.pkey_index = a.pkey_index;
    q.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    q.max_rd_atomic = a.max_rd_atomic;
    q.max_dest_rd_atomic = a.max_dest_rd_atomic;
    q.min_rnr_timer = a.min_rnr_timer;
    q.port_num = a.port_num;
    q.timeout = a.timeout;
    q.retry_cnt = a.retry_cnt;
    q.rnr_retry = a.rnr_retry;
    Ok(q)
}

/// The source of a UD receive, from the 40-byte GRH area verbs puts first in the buffer: for
/// RoCEv2 over IPv4 its last 20 bytes are the IPv4 header, otherwise it is an IPv6 header
/// (the same layout as a GRH).
pub(crate) fn ah_attr_from_grh(grh: &[u8; 40]) -> Result<ibv_ah_attr, c_int> {
    let p = ferroce::wire::GrhPacket::new_checked(&grh[..]).map_err(|e| {
        log::debug!("ibv_init_ah_from_wc: the GRH area holds no IP header: {e}");
        libc::EINVAL
    })?;
    let src = match p.src() {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    };
    let (tclass, hop) = (p.traffic_class(), p.hop_limit());
    Ok(ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: src },
            flow_label: 0,
            sgid_index: 1,
            hop_limit: hop,
            traffic_class: tclass,
        },
        is_global: 1,
        port_num: 1,
        ..ibv_ah_attr::default()
    })
}
