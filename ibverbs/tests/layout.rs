//! The Rust mirrors of libibverbs' structures have the layout of the real header: a C program
//! compiled against `<infiniband/verbs.h>` prints every size and offset, and each must equal
//! the Rust one.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::HashMap;
use std::mem::{offset_of, size_of};

use ferroce_ibverbs::abi::*;

mod common;

fn c_layout() -> HashMap<String, usize> {
    common::c_layout("layout.c", "ferroce-ibverbs-layout", "<infiniband/verbs.h>")
}

#[test]
fn structures_match_verbs_h() {
    if !common::have_verbs_h() {
        return;
    }
    let c = c_layout();
    let mut checked = 0;
    let mut bad = Vec::new();
    let mut check = |name: &str, rust: usize| {
        match c.get(name) {
            Some(&v) if v == rust => {}
            Some(&v) => bad.push(format!("{name}: C {v}, Rust {rust}")),
            None => bad.push(format!("{name}: not printed by layout.c")),
        }
        checked += 1;
    };
    macro_rules! s {
        ($t:ident) => {
            check(stringify!($t), size_of::<$t>())
        };
    }
    macro_rules! o {
        ($t:ident, $f:ident) => {
            check(
                concat!(stringify!($t), ".", stringify!($f)),
                offset_of!($t, $f),
            )
        };
        ($t:ident, $f:ident, $name:literal) => {
            check(concat!(stringify!($t), ".", $name), offset_of!($t, $f))
        };
    }
    check(
        "ibv_device_attr_ex.phys_port_cnt_ex",
        ferroce_ibverbs::abi::DEVICE_ATTR_EX_PHYS_PORT_CNT_EX,
    );
    check(
        "ibv_device_attr_ex.completion_timestamp_mask",
        ferroce_ibverbs::abi::DEVICE_ATTR_EX_COMPLETION_TIMESTAMP_MASK,
    );
    check(
        "ibv_device_attr_ex.hca_core_clock",
        ferroce_ibverbs::abi::DEVICE_ATTR_EX_HCA_CORE_CLOCK,
    );
    check(
        "ibv_device_attr_ex.device_cap_flags_ex",
        ferroce_ibverbs::abi::DEVICE_ATTR_EX_DEVICE_CAP_FLAGS_EX,
    );
    o!(verbs_context, query_rt_values);
    o!(verbs_context, advise_mr);
    o!(verbs_context, modify_cq);
    s!(ibv_modify_cq_attr);
    o!(ibv_modify_cq_attr, cq_count, "moderate");
    check(
        "ibv_device_attr_ex.cq_mod_caps",
        ferroce_ibverbs::abi::DEVICE_ATTR_EX_CQ_MOD_CAPS,
    );
    s!(ibv_mw);
    o!(ibv_mw, type_, "type");
    s!(ibv_mw_bind);
    o!(ibv_mw_bind, bind_info);
    s!(ibv_mw_bind_info);
    o!(ibv_mw_bind_info, mw_access_flags);
    o!(ibv_send_wr, bind_mw);
    check(
        "ibv_send_wr.bind_mw.bind_info",
        offset_of!(ibv_send_wr, bind_mw) + offset_of!(send_wr_bind_mw, bind_info),
    );
    check(
        "ibv_device_attr_ex.odp_caps",
        ferroce_ibverbs::abi::DEVICE_ATTR_EX_ODP_CAPS,
    );
    s!(ibv_values_ex);
    o!(ibv_values_ex, raw_clock);
    s!(ibv_device);
    o!(ibv_device, node_type);
    o!(ibv_device, name);
    o!(ibv_device, ibdev_path);
    s!(ibv_context_ops);
    o!(ibv_context_ops, alloc_mw);
    o!(ibv_context_ops, poll_cq);
    o!(ibv_context_ops, req_notify_cq);
    o!(ibv_context_ops, post_srq_recv);
    o!(ibv_context_ops, post_send);
    o!(ibv_context_ops, post_recv);
    s!(ibv_context);
    o!(ibv_context, ops);
    o!(ibv_context, cmd_fd);
    o!(ibv_context, async_fd);
    o!(ibv_context, num_comp_vectors);
    o!(ibv_context, mutex);
    o!(ibv_context, abi_compat);
    s!(verbs_context);
    o!(verbs_context, query_port);
    o!(verbs_context, priv_, "priv");
    o!(verbs_context, query_device_ex);
    o!(verbs_context, create_qp_ex);
    o!(verbs_context, open_qp);
    o!(verbs_context, get_srq_num);
    o!(verbs_context, create_srq_ex);
    o!(verbs_context, open_xrcd);
    o!(verbs_context, close_xrcd);
    check(
        "ibv_device_attr_ex.xrc_odp_caps",
        ferroce_ibverbs::abi::DEVICE_ATTR_EX_XRC_ODP_CAPS,
    );
    s!(ibv_srq_init_attr_ex);
    o!(ibv_srq_init_attr_ex, comp_mask);
    o!(ibv_srq_init_attr_ex, srq_type);
    o!(ibv_srq_init_attr_ex, pd);
    o!(ibv_srq_init_attr_ex, xrcd);
    o!(ibv_srq_init_attr_ex, cq);
    o!(ibv_srq_init_attr_ex, tm_cap);
    s!(ibv_xrcd);
    s!(ibv_xrcd_init_attr);
    o!(ibv_xrcd_init_attr, fd);
    o!(ibv_xrcd_init_attr, oflags);
    s!(ibv_qp_open_attr);
    o!(ibv_qp_open_attr, qp_num);
    o!(ibv_qp_open_attr, xrcd);
    o!(ibv_qp_open_attr, qp_context);
    o!(ibv_qp_open_attr, qp_type);
    o!(ibv_qp_init_attr_ex, xrcd);
    o!(verbs_context, sz);
    o!(verbs_context, context);
    s!(ibv_device_attr);
    o!(ibv_device_attr, node_guid);
    o!(ibv_device_attr, max_qp);
    o!(ibv_device_attr, atomic_cap);
    o!(ibv_device_attr, max_pkeys);
    o!(ibv_device_attr, phys_port_cnt);
    s!(ibv_port_attr);
    o!(ibv_port_attr, pkey_tbl_len);
    o!(ibv_port_attr, link_layer);
    o!(ibv_port_attr, port_cap_flags2);
    s!(ibv_async_event);
    o!(ibv_async_event, event_type);
    s!(ibv_wc);
    o!(ibv_wc, status);
    o!(ibv_wc, imm_data);
    o!(ibv_wc, wc_flags);
    o!(ibv_wc, sl);
    s!(ibv_pd);
    s!(ibv_mr);
    o!(ibv_mr, length);
    o!(ibv_mr, lkey);
    o!(ibv_mr, rkey);
    s!(ibv_global_route);
    s!(ibv_grh);
    s!(ibv_ah_attr);
    o!(ibv_ah_attr, dlid);
    o!(ibv_ah_attr, is_global);
    o!(ibv_ah_attr, port_num);
    s!(ibv_srq_attr);
    s!(ibv_srq_init_attr);
    s!(ibv_qp_cap);
    s!(ibv_qp_init_attr);
    o!(ibv_qp_init_attr, cap);
    o!(ibv_qp_init_attr, qp_type);
    o!(ibv_qp_init_attr, sq_sig_all);
    s!(ibv_qp_init_attr_ex);
    o!(ibv_qp_init_attr_ex, comp_mask);
    o!(ibv_qp_init_attr_ex, pd);
    o!(ibv_qp_init_attr_ex, create_flags);
    o!(ibv_qp_init_attr_ex, rx_hash_function, "rx_hash_conf");
    o!(ibv_qp_init_attr_ex, source_qpn);
    o!(ibv_qp_init_attr_ex, send_ops_flags);
    s!(ibv_qp_attr);
    o!(ibv_qp_attr, qp_access_flags);
    o!(ibv_qp_attr, cap);
    o!(ibv_qp_attr, ah_attr);
    o!(ibv_qp_attr, alt_ah_attr);
    o!(ibv_qp_attr, pkey_index);
    o!(ibv_qp_attr, max_rd_atomic);
    o!(ibv_qp_attr, timeout);
    o!(ibv_qp_attr, rnr_retry);
    o!(ibv_qp_attr, rate_limit);
    s!(ibv_sge);
    s!(ibv_send_wr);
    o!(ibv_send_wr, num_sge);
    o!(ibv_send_wr, send_flags);
    o!(ibv_send_wr, imm_data);
    o!(ibv_send_wr, wr);
    check(
        "ibv_send_wr.wr.atomic.swap",
        offset_of!(ibv_send_wr, wr) + offset_of!(wr_atomic, swap),
    );
    check(
        "ibv_send_wr.wr.atomic.rkey",
        offset_of!(ibv_send_wr, wr) + offset_of!(wr_atomic, rkey),
    );
    check(
        "ibv_send_wr.wr.ud.remote_qkey",
        offset_of!(ibv_send_wr, wr) + offset_of!(wr_ud, remote_qkey),
    );
    o!(ibv_send_wr, remote_srqn, "qp_type");
    s!(ibv_recv_wr);
    o!(ibv_recv_wr, num_sge);
    s!(ibv_srq);
    o!(ibv_srq, handle);
    o!(ibv_srq, mutex);
    o!(ibv_srq, cond);
    o!(ibv_srq, events_completed);
    s!(ibv_qp);
    o!(ibv_qp, qp_num);
    o!(ibv_qp, state);
    o!(ibv_qp, qp_type);
    o!(ibv_qp, mutex);
    o!(ibv_qp, events_completed);
    // rdma-core 45 appended `wr_flush` after `wr_atomic_write`: the library's struct is the
    // newer one, one pointer longer than an rdma-core 44 header's, which ends before it.
    check("ibv_qp_ex", offset_of!(ibv_qp_ex, wr_flush));
    assert_eq!(
        offset_of!(ibv_qp_ex, wr_flush),
        offset_of!(ibv_qp_ex, wr_atomic_write) + size_of::<usize>()
    );
    assert_eq!(
        size_of::<ibv_qp_ex>(),
        offset_of!(ibv_qp_ex, wr_flush) + size_of::<usize>()
    );
    o!(ibv_qp_ex, comp_mask);
    o!(ibv_qp_ex, wr_flags);
    o!(ibv_qp_ex, wr_atomic_cmp_swp);
    o!(ibv_qp_ex, wr_rdma_write);
    o!(ibv_qp_ex, wr_set_ud_addr);
    o!(ibv_qp_ex, wr_set_sge);
    o!(ibv_qp_ex, wr_start);
    o!(ibv_qp_ex, wr_complete);
    o!(ibv_qp_ex, wr_abort);
    o!(ibv_qp_ex, wr_atomic_write);
    s!(ibv_data_buf);
    s!(ibv_comp_channel);
    o!(ibv_comp_channel, fd);
    s!(ibv_cq);
    o!(ibv_cq, cqe);
    o!(ibv_cq, mutex);
    o!(ibv_cq, comp_events_completed);
    o!(ibv_cq, async_events_completed);
    s!(ibv_cq_ex);
    o!(ibv_cq_ex, comp_mask);
    o!(ibv_cq_ex, status);
    o!(ibv_cq_ex, wr_id);
    o!(ibv_cq_ex, start_poll);
    o!(ibv_cq_ex, read_opcode);
    o!(ibv_cq_ex, read_completion_wallclock_ns);
    s!(ibv_cq_init_attr_ex);
    o!(ibv_cq_init_attr_ex, wc_flags);
    o!(ibv_cq_init_attr_ex, parent_domain);
    o!(verbs_context, create_cq_ex);
    s!(ibv_ah);
    o!(ibv_ah, handle);
    s!(ibv_gid_entry);
    o!(ibv_gid_entry, gid_type);
    assert!(bad.is_empty(), "layout differences:\n{}", bad.join("\n"));
    assert_eq!(checked, c.len(), "every line of layout.c is checked");
}
