//! The Rust mirrors of librdmacm's structures have the layout of the real header: a C program
//! compiled against `<rdma/rdma_cma.h>` prints every size and offset, and each must equal the
//! Rust one.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::HashMap;
use std::mem::{offset_of, size_of};

use ferroce_ibverbs::rdmacm::abi::*;

mod common;

fn c_layout() -> HashMap<String, usize> {
    common::c_layout(
        "rdmacm_layout.c",
        "ferroce-rdmacm-layout",
        "<rdma/rdma_cma.h>",
    )
}

#[test]
fn structures_match_rdma_cma_h() {
    let found = std::path::Path::new("/usr/include/rdma/rdma_cma.h").exists();
    if !common::installed("<rdma/rdma_cma.h>", found, "librdmacm-dev") {
        return;
    }
    let c = c_layout();
    let mut bad = Vec::new();
    let mut checked = 0;
    let mut check = |name: &str, rust: usize| {
        match c.get(name) {
            Some(&v) if v == rust => {}
            Some(&v) => bad.push(format!("{name}: C {v}, Rust {rust}")),
            None => bad.push(format!("{name}: not printed")),
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
        ($t:ident, $f:ident => $rf:ident) => {
            check(
                concat!(stringify!($t), ".", stringify!($f)),
                offset_of!($t, $rf),
            )
        };
    }
    s!(rdma_event_channel);
    o!(rdma_event_channel, fd);
    s!(rdma_cm_id);
    for (f, v) in [
        ("verbs", offset_of!(rdma_cm_id, verbs)),
        ("channel", offset_of!(rdma_cm_id, channel)),
        ("context", offset_of!(rdma_cm_id, context)),
        ("qp", offset_of!(rdma_cm_id, qp)),
        ("route", offset_of!(rdma_cm_id, route)),
        ("ps", offset_of!(rdma_cm_id, ps)),
        ("port_num", offset_of!(rdma_cm_id, port_num)),
        ("event", offset_of!(rdma_cm_id, event)),
        ("send_cq_channel", offset_of!(rdma_cm_id, send_cq_channel)),
        ("send_cq", offset_of!(rdma_cm_id, send_cq)),
        ("recv_cq_channel", offset_of!(rdma_cm_id, recv_cq_channel)),
        ("recv_cq", offset_of!(rdma_cm_id, recv_cq)),
        ("srq", offset_of!(rdma_cm_id, srq)),
        ("pd", offset_of!(rdma_cm_id, pd)),
        ("qp_type", offset_of!(rdma_cm_id, qp_type)),
    ] {
        check(&format!("rdma_cm_id.{f}"), v);
    }
    s!(rdma_route);
    o!(rdma_route, addr);
    o!(rdma_route, path_rec);
    o!(rdma_route, num_paths);
    s!(rdma_addr);
    o!(rdma_addr, src_addr);
    o!(rdma_addr, dst_addr);
    o!(rdma_addr, addr => ibaddr);
    s!(rdma_ib_addr);
    o!(rdma_ib_addr, sgid);
    o!(rdma_ib_addr, dgid);
    o!(rdma_ib_addr, pkey);
    s!(rdma_conn_param);
    o!(rdma_conn_param, private_data);
    o!(rdma_conn_param, private_data_len);
    o!(rdma_conn_param, responder_resources);
    o!(rdma_conn_param, initiator_depth);
    o!(rdma_conn_param, flow_control);
    o!(rdma_conn_param, retry_count);
    o!(rdma_conn_param, rnr_retry_count);
    o!(rdma_conn_param, srq);
    o!(rdma_conn_param, qp_num);
    s!(rdma_ud_param);
    o!(rdma_ud_param, private_data);
    o!(rdma_ud_param, private_data_len);
    o!(rdma_ud_param, ah_attr);
    o!(rdma_ud_param, qp_num);
    o!(rdma_ud_param, qkey);
    s!(rdma_cm_event);
    o!(rdma_cm_event, id);
    o!(rdma_cm_event, listen_id);
    o!(rdma_cm_event, event);
    o!(rdma_cm_event, status);
    o!(rdma_cm_event, param);
    s!(rdma_addrinfo);
    o!(rdma_addrinfo, ai_flags);
    o!(rdma_addrinfo, ai_family);
    o!(rdma_addrinfo, ai_qp_type);
    o!(rdma_addrinfo, ai_port_space);
    o!(rdma_addrinfo, ai_src_len);
    o!(rdma_addrinfo, ai_dst_len);
    o!(rdma_addrinfo, ai_src_addr);
    o!(rdma_addrinfo, ai_dst_addr);
    o!(rdma_addrinfo, ai_src_canonname);
    o!(rdma_addrinfo, ai_dst_canonname);
    o!(rdma_addrinfo, ai_route_len);
    o!(rdma_addrinfo, ai_route);
    o!(rdma_addrinfo, ai_connect_len);
    o!(rdma_addrinfo, ai_connect);
    o!(rdma_addrinfo, ai_next);
    assert!(bad.is_empty(), "layouts differ:\n{}", bad.join("\n"));
    assert_eq!(checked, c.len(), "every item layout.c prints is checked");
}
