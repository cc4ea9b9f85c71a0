//! The C structures of `<rdma/rdma_cma.h>` (rdma-core 44, x86_64 layouts checked by
//! `tests/layout.rs`).

#![allow(non_camel_case_types, missing_docs)]

use core::ffi::{c_char, c_int, c_void};

use crate::abi::{
    ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, ibv_qp, ibv_srq,
};

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// A `sockaddr_storage`-sized address (the union of sockaddr, _in, _in6, _ib, _storage).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct sockaddr_any {
    pub bytes: [u8; 128],
}

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    pub pkey: u16,
}

/// `struct rdma_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    pub src_addr: sockaddr_any,
    pub dst_addr: sockaddr_any,
    pub ibaddr: rdma_ib_addr,
}

/// `struct rdma_route`.
#[repr(C)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut c_void,
    pub num_paths: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: u32,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: c_int,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// `union { rdma_conn_param conn; rdma_ud_param ud; }`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: u32,
    pub status: c_int,
    pub param: rdma_event_param,
}

/// `struct rdma_addrinfo`.
#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: libc::socklen_t,
    pub ai_dst_len: libc::socklen_t,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

pub const RAI_PASSIVE: c_int = 1;
pub const RAI_NUMERICHOST: c_int = 2;
pub const RAI_FAMILY: c_int = 8;
