//! Entry points ferroce does not implement, present so that the dynamic loader accepts every
//! program and library linked against Debian's libibverbs.so.1 (perftest binaries load
//! libmlx5, libefa and librdmacm, which import the private IBVERBS_PRIVATE_34 interface; all of
//! them are linked with BIND_NOW, so a missing symbol stops the program before `main`).
//!
//! Each fails the way libibverbs reports "not supported": functions returning an errno return
//! EOPNOTSUPP, functions returning a pointer return NULL with errno EOPNOTSUPP, and `void` ones
//! do nothing. The provider-driver interface (`verbs_register_driver_34`, `ibv_cmd_*`, ...) is
//! only ever called by an rdma-core provider library for its own devices, and no ferroce device
//! is one of theirs (see `device::Dev::verbs_ops`); libmlx5's load-time constructor does call
//! `verbs_register_driver_34`, which accepts and ignores the registration.
//!
//! The stubs take no parameters: in the C calling conventions of the platforms ferroce builds
//! for (x86-64 and AArch64 System V), arguments are passed in registers or a caller-cleaned
//! stack, so a callee that ignores them is called correctly with any argument list.

use core::ffi::{c_int, c_uint, c_void};

use crate::set_errno;

macro_rules! errno_stubs {
    ($($(#[$m:meta])* $name:ident),* $(,)?) => {$(
        $(#[$m])*
        #[doc = concat!("`", stringify!($name), "`: not supported (returns EOPNOTSUPP).")]
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> c_int {
            set_errno(libc::EOPNOTSUPP);
            libc::EOPNOTSUPP
        }
    )*};
}

macro_rules! null_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: not supported (NULL, errno EOPNOTSUPP).")]
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> *mut c_void {
            set_errno(libc::EOPNOTSUPP);
            core::ptr::null_mut()
        }
    )*};
}

macro_rules! void_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: nothing to do here.")]
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() {}
    )*};
}

// Public libibverbs API without a ferroce equivalent.
errno_stubs!(ibv_resolve_eth_l2_from_gid, ibv_query_ece, ibv_set_ece,);
null_stubs!(
    ibv_import_device,
    ibv_import_pd,
    ibv_import_mr,
    ibv_import_dm,
    ibv_reg_dmabuf_mr,
);
void_stubs!(
    ibv_copy_path_rec_from_kern,
    ibv_copy_path_rec_to_kern,
    ibv_copy_qp_attr_from_kern,
    ibv_copy_ah_attr_from_kern,
    ibv_unimport_pd,
    ibv_unimport_mr,
    ibv_unimport_dm,
    // rdma-core's deprecated provider registration (IBVERBS_1.1); ferroce is the provider.
    ibv_register_driver,
);

/// `ibv_query_qp_data_in_order`: 0, no in-order placement promise beyond what IBTA gives.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_qp_data_in_order() -> c_int {
    0
}

// The private provider interface (IBVERBS_PRIVATE_34).
errno_stubs!(
    execute_ioctl,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    // rdma-core 45-56's additions the provider libraries of newer userlands import
    // (libmlx5 of rdma-core 56 links ibv_cmd_create_cq_ex2): they resolve, and fail.
    ibv_cmd_create_cq_ex2,
    ibv_cmd_query_device,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_poll_cq,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_req_notify_cq,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
);
null_stubs!(_verbs_init_and_alloc_context, verbs_open_device);
void_stubs!(
    __verbs_log,
    verbs_register_driver_34,
    verbs_set_ops,
    verbs_uninit_context,
    verbs_init_cq,
);

/// `__ioctl_final_num_attrs`: 0 (no ioctl is ever built).
#[unsafe(no_mangle)]
pub extern "C" fn __ioctl_final_num_attrs() -> c_uint {
    0
}

/// `ibv_read_ibdev_sysfs_file`: ferroce devices have no sysfs (-1, ENOENT).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_read_ibdev_sysfs_file() -> c_int {
    set_errno(libc::ENOENT);
    -1
}

/// `verbs_allow_disassociate_destroy`: a flag providers read; false.
#[unsafe(no_mangle)]
pub static mut verbs_allow_disassociate_destroy: bool = false;
