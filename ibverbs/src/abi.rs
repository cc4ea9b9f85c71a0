//! The C structures of `<infiniband/verbs.h>` (rdma-core 44) that cross the ABI, field for
//! field. `tests/layout.rs` compiles a C program against the real header and checks every size
//! and offset used here.

#![allow(non_camel_case_types, missing_docs)]

use core::ffi::{c_char, c_int, c_uint, c_void};

use libc::{pthread_cond_t, pthread_mutex_t};

/// A C function pointer slot this library leaves empty (NULL).
pub type Slot = Option<unsafe extern "C" fn()>;

/// `union ibv_gid`: 16 raw bytes (network order), 8-byte aligned like the union's
/// `global { __be64 subnet_prefix, interface_id }` member.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_gid_entry`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct _ibv_device_ops` (obsolete, always NULL).
#[repr(C)]
pub struct _ibv_device_ops {
    pub _dummy1: Slot,
    pub _dummy2: Slot,
}

/// `struct ibv_device`.
#[repr(C)]
pub struct ibv_device {
    pub _ops: _ibv_device_ops,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

/// `struct ibv_context_ops`: the data path of `ibv_post_send`, `ibv_poll_cq`, ... (inline
/// functions in verbs.h call through it); the `_compat_*` slots stay NULL.
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: Slot,
    pub _compat_query_port: Slot,
    pub _compat_alloc_pd: Slot,
    pub _compat_dealloc_pd: Slot,
    pub _compat_reg_mr: Slot,
    pub _compat_rereg_mr: Slot,
    pub _compat_dereg_mr: Slot,
    pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, c_int) -> *mut ibv_mw>,
    pub bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int>,
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut ibv_mw) -> c_int>,
    pub _compat_create_cq: Slot,
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    pub _compat_cq_event: Slot,
    pub _compat_resize_cq: Slot,
    pub _compat_destroy_cq: Slot,
    pub _compat_create_srq: Slot,
    pub _compat_modify_srq: Slot,
    pub _compat_query_srq: Slot,
    pub _compat_destroy_srq: Slot,
    pub post_srq_recv: Option<
        unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
    >,
    pub _compat_create_qp: Slot,
    pub _compat_query_qp: Slot,
    pub _compat_modify_qp: Slot,
    pub _compat_destroy_qp: Slot,
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub _compat_create_ah: Slot,
    pub _compat_destroy_ah: Slot,
    pub _compat_attach_mcast: Slot,
    pub _compat_detach_mcast: Slot,
    pub _compat_async_event: Slot,
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `__VERBS_ABI_IS_EXTENDED`: `abi_compat` of a context embedded in a `verbs_context`.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// `struct verbs_context`: the extended ops the `_ex` inline functions of verbs.h reach by
/// `container_of` from the `ibv_context`. Slots this library does not fill are NULL, which
/// the inline functions treat as "not supported" (or fall back to the plain verb).
#[repr(C)]
pub struct verbs_context {
    pub query_port:
        Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int>,
    pub advise_mr:
        Option<unsafe extern "C" fn(*mut ibv_pd, c_uint, u32, *mut ibv_sge, u32) -> c_int>,
    /// alloc_null_mr … alloc_td (15 slots).
    pub _unused_a: [Slot; 15],
    pub modify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, *mut ibv_modify_cq_attr) -> c_int>,
    /// post_srq_ops … create_wq (6 slots).
    pub _unused_a2: [Slot; 6],
    pub query_rt_values:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_values_ex) -> c_int>,
    pub create_cq_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex>,
    pub priv_: *mut c_void,
    pub query_device_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *const c_void, *mut c_void, usize) -> c_int>,
    /// ibv_destroy_flow, ABI_placeholder2, ibv_create_flow, ABI_placeholder1.
    pub _unused_b: [Slot; 4],
    pub open_qp:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_open_attr) -> *mut ibv_qp>,
    pub create_qp_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp>,
    pub get_srq_num: Option<unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int>,
    pub create_srq_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq>,
    pub open_xrcd:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd>,
    pub close_xrcd: Option<unsafe extern "C" fn(*mut ibv_xrcd) -> c_int>,
    pub _abi_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `struct ibv_async_event`.
#[repr(C)]
pub struct ibv_async_event {
    /// `element`: the CQ, QP or SRQ pointer, or the port number.
    pub element: *mut c_void,
    pub event_type: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network order) / `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_grh` (the 40 bytes before a UD receive's payload).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_grh {
    pub version_tclass_flow: u32,
    pub paylen: u16,
    pub next_hdr: u8,
    pub hop_limit: u8,
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct ibv_srq_init_attr_ex`.
#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
    pub comp_mask: u32,
    /// `enum ibv_srq_type`: `IBV_SRQT_BASIC` 0, `IBV_SRQT_XRC` 1, `IBV_SRQT_TM` 2.
    pub srq_type: c_int,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut ibv_xrcd,
    pub cq: *mut ibv_cq,
    /// `struct ibv_tm_cap`: `max_num_tags`, `max_ops`.
    pub tm_cap: [u32; 2],
}

/// `IBV_SRQ_INIT_ATTR_TYPE`.
pub const IBV_SRQ_INIT_ATTR_TYPE: u32 = 1 << 0;
/// `IBV_SRQ_INIT_ATTR_PD`.
pub const IBV_SRQ_INIT_ATTR_PD: u32 = 1 << 1;
/// `IBV_SRQ_INIT_ATTR_XRCD`.
pub const IBV_SRQ_INIT_ATTR_XRCD: u32 = 1 << 2;
/// `IBV_SRQ_INIT_ATTR_CQ`.
pub const IBV_SRQ_INIT_ATTR_CQ: u32 = 1 << 3;

/// `struct ibv_xrcd`.
#[repr(C)]
pub struct ibv_xrcd {
    pub context: *mut ibv_context,
}

/// `struct ibv_xrcd_init_attr`.
#[repr(C)]
pub struct ibv_xrcd_init_attr {
    pub comp_mask: u32,
    pub fd: c_int,
    pub oflags: c_int,
}

/// `IBV_XRCD_INIT_ATTR_FD`.
pub const IBV_XRCD_INIT_ATTR_FD: u32 = 1 << 0;
/// `IBV_XRCD_INIT_ATTR_OFLAGS`.
pub const IBV_XRCD_INIT_ATTR_OFLAGS: u32 = 1 << 1;

/// `struct ibv_qp_open_attr` (`ibv_open_qp`).
#[repr(C)]
pub struct ibv_qp_open_attr {
    pub comp_mask: u32,
    pub qp_num: u32,
    pub xrcd: *mut ibv_xrcd,
    pub qp_context: *mut c_void,
    pub qp_type: c_int,
}

/// `IBV_QP_OPEN_ATTR_NUM`, `_XRCD`, `_CONTEXT`, `_TYPE`: all of them.
pub const IBV_QP_OPEN_ATTR_ALL: u32 = 0xF;

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

/// `struct ibv_qp_init_attr_ex` (the fields up to `send_ops_flags`).
#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut ibv_xrcd,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    /// `struct ibv_rx_hash_conf`: function, key length, key pointer, fields mask.
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

/// `IBV_QP_INIT_ATTR_PD`.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
/// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB` (`ibv_qp_init_attr_ex.create_flags`).
pub const IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: u32 = 1 << 1;
/// `IBV_QP_INIT_ATTR_XRCD`.
pub const IBV_QP_INIT_ATTR_XRCD: u32 = 1 << 1;
/// `IBV_QP_INIT_ATTR_CREATE_FLAGS`.
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `wr.ud` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union send_wr_wr {
    pub rdma: wr_rdma,
    pub atomic: wr_atomic,
    pub ud: wr_ud,
}

/// `struct ibv_send_wr`.
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_uint,
    /// `imm_data` (network order) / `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: send_wr_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub remote_srqn: u32,
    /// The `bind_mw` member of the `bind_mw` / `tso` union (48 bytes).
    pub bind_mw: send_wr_bind_mw,
}

/// `wr->bind_mw` of `struct ibv_send_wr` (`IBV_WR_BIND_MW`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct send_wr_bind_mw {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_mw`.
#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    pub type_: c_int,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind` (`ibv_bind_mw`).
#[repr(C)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_data_buf`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: usize,
}

/// A `wr_*` slot of `ibv_qp_ex` that this library implements only by failing the batch: its
/// first argument is the QP (the others are ignored).
pub type WrFail = Option<unsafe extern "C" fn(*mut ibv_qp_ex)>;

/// `struct ibv_qp_ex`: the QP with the `ibv_wr_*` send API (verbs.h inlines `ibv_wr_start`,
/// `ibv_wr_rdma_write`, ... as calls through these slots).
#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    pub wr_bind_mw:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_tso: WrFail,
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
    pub wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
    pub wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
    /// rdma-core 45 and later; a program built against older headers never reads it.
    pub wr_flush: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, usize, u8, u8)>,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_poll_cq_attr`.
#[repr(C)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

/// `struct ibv_cq_ex`: `struct ibv_cq`'s fields (its `comp_mask` follows
/// `async_events_completed` without padding, so `ibv_cq` is not nested) and the polling API
/// that verbs.h's `ibv_start_poll`, `ibv_next_poll`, `ibv_wc_read_*` call.
#[repr(C)]
pub struct ibv_cq_ex {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
    pub comp_mask: u32,
    pub status: c_int,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    pub next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    pub read_opcode: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    pub read_vendor_err: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_byte_len: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_imm_data: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_qp_num: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_src_qp: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_wc_flags: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_uint>,
    pub read_slid: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    pub read_completion_ts: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
    pub read_cvlan: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u16>,
    pub read_flow_tag: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut c_void)>,
    pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

/// `struct ibv_ah`.
#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

/// A fresh `pthread_mutex_t` (PTHREAD_MUTEX_INITIALIZER).
pub fn mutex_init() -> pthread_mutex_t {
    libc::PTHREAD_MUTEX_INITIALIZER
}

/// A fresh `pthread_cond_t` (PTHREAD_COND_INITIALIZER).
pub fn cond_init() -> pthread_cond_t {
    libc::PTHREAD_COND_INITIALIZER
}

/// Offset of `phys_port_cnt_ex` in `struct ibv_device_attr_ex` (rdma-core 44; checked against
/// verbs.h by tests/layout.rs).
pub const DEVICE_ATTR_EX_PHYS_PORT_CNT_EX: usize = 396;

/// Offsets of `completion_timestamp_mask` and `hca_core_clock` in `struct ibv_device_attr_ex`.
pub const DEVICE_ATTR_EX_COMPLETION_TIMESTAMP_MASK: usize = 264;
/// See [`DEVICE_ATTR_EX_COMPLETION_TIMESTAMP_MASK`].
pub const DEVICE_ATTR_EX_HCA_CORE_CLOCK: usize = 272;

/// Offset of `device_cap_flags_ex` (u64: the kernel's `ib_uverbs_device_cap_flags`, whose low
/// 32 bits are `device_cap_flags`) in `struct ibv_device_attr_ex`.
pub const DEVICE_ATTR_EX_DEVICE_CAP_FLAGS_EX: usize = 280;

/// `IB_UVERBS_DEVICE_FLUSH_GLOBAL`: RDMA FLUSH with the global-visibility placement type.
pub const IB_UVERBS_DEVICE_FLUSH_GLOBAL: u64 = 1 << 38;
/// `IB_UVERBS_DEVICE_ATOMIC_WRITE`: ATOMIC WRITE (librpma checks it before using it).
pub const IB_UVERBS_DEVICE_ATOMIC_WRITE: u64 = 1 << 40;

/// `struct ibv_values_ex` (`ibv_query_rt_values_ex`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_values_ex {
    pub comp_mask: u32,
    pub raw_clock: libc::timespec,
}

/// `IBV_VALUES_MASK_RAW_CLOCK`.
pub const IBV_VALUES_MASK_RAW_CLOCK: u32 = 1 << 0;

/// Offset of `xrc_odp_caps` (u32) in `struct ibv_device_attr_ex`.
pub const DEVICE_ATTR_EX_XRC_ODP_CAPS: usize = 392;

/// Offset of `odp_caps` (`general_caps` u64, then the RC, UC and UD capability words) in
/// `struct ibv_device_attr_ex`.
pub const DEVICE_ATTR_EX_ODP_CAPS: usize = 240;

/// `struct ibv_modify_cq_attr` (`ibv_modify_cq`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_modify_cq_attr {
    pub attr_mask: u32,
    /// `moderate.cq_count`.
    pub cq_count: u16,
    /// `moderate.cq_period` (µs).
    pub cq_period: u16,
}

/// `IBV_CQ_ATTR_MODERATE`.
pub const IBV_CQ_ATTR_MODERATE: u32 = 1 << 0;

/// Offset of `cq_mod_caps` (`max_cq_count`, `max_cq_period`, two u16) in
/// `struct ibv_device_attr_ex`.
pub const DEVICE_ATTR_EX_CQ_MOD_CAPS: usize = 368;
