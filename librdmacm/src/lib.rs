//! ferroce's `librdmacm.so.1`: every function of rdma-core 44's librdmacm under its version
//! node. The connection manager itself is in ferroce's `libibverbs.so.1` (its `ferroce_rdma_*`
//! functions, over the provider's [`ferroce::cm`](../ferroce/cm/index.html)): a process has
//! one ferroce provider, and the `ibv_context` of an `rdma_cm_id` is one the program's
//! `ibv_*` calls reach. This library forwards each `rdma_*` call there.
//!
//! ECE is accepted and not carried on the wire. Stream rsockets are ferroce's
//! (`ferroce_rdma_r*` in libibverbs.so.1); `rsendmsg`/`rrecvmsg` and the iomap functions fail
//! with ENOSYS.

#![allow(clippy::missing_safety_doc)]

use core::ffi::{c_char, c_int, c_void};

/// Declares the implementation in libibverbs.so.1 and exports a forwarding function for each.
macro_rules! forward {
    ($( $(#[$doc:meta])* fn $name:ident => $target:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty; )*) => {
        unsafe extern "C" {
            $( fn $target($($arg: $ty),*) -> $ret; )*
        }
        $(
            $(#[$doc])*
            ///
            /// # Safety
            /// librdmacm's contract for this function (the implementation checks what it can).
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                // SAFETY: the same arguments under the same contract, to the function this one stands for.
                unsafe { $target($($arg),*) }
            }
        )*
    };
}

type P = *mut c_void;

forward! {
    /// `rdma_create_event_channel`.
    fn rdma_create_event_channel => ferroce_rdma_create_event_channel() -> P;
    /// `rdma_destroy_event_channel`.
    fn rdma_destroy_event_channel => ferroce_rdma_destroy_event_channel(ch: P) -> ();
    /// `rdma_create_id`.
    fn rdma_create_id => ferroce_rdma_create_id(ch: P, id: *mut P, context: P, ps: u32) -> c_int;
    /// `rdma_destroy_id`.
    fn rdma_destroy_id => ferroce_rdma_destroy_id(id: P) -> c_int;
    /// `rdma_bind_addr`.
    fn rdma_bind_addr => ferroce_rdma_bind_addr(id: P, addr: P) -> c_int;
    /// `rdma_resolve_addr`.
    fn rdma_resolve_addr => ferroce_rdma_resolve_addr(id: P, src: P, dst: P, timeout_ms: c_int) -> c_int;
    /// `rdma_join_multicast`.
    fn rdma_join_multicast => ferroce_rdma_join_multicast(id: P, addr: P, context: P) -> c_int;
    /// `rdma_join_multicast_ex`.
    fn rdma_join_multicast_ex => ferroce_rdma_join_multicast_ex(id: P, attr: P, context: P) -> c_int;
    /// `rdma_leave_multicast`.
    fn rdma_leave_multicast => ferroce_rdma_leave_multicast(id: P, addr: P) -> c_int;
    /// `rdma_resolve_route`.
    fn rdma_resolve_route => ferroce_rdma_resolve_route(id: P, timeout_ms: c_int) -> c_int;
    /// `rdma_create_qp`.
    fn rdma_create_qp => ferroce_rdma_create_qp(id: P, pd: P, attr: P) -> c_int;
    /// `rdma_create_qp_ex`.
    fn rdma_create_qp_ex => ferroce_rdma_create_qp_ex(id: P, attr: P) -> c_int;
    /// `rdma_destroy_qp`.
    fn rdma_destroy_qp => ferroce_rdma_destroy_qp(id: P) -> ();
    /// `rdma_connect`.
    fn rdma_connect => ferroce_rdma_connect(id: P, param: P) -> c_int;
    /// `rdma_listen`.
    fn rdma_listen => ferroce_rdma_listen(id: P, backlog: c_int) -> c_int;
    /// `rdma_accept`.
    fn rdma_accept => ferroce_rdma_accept(id: P, param: P) -> c_int;
    /// `rdma_reject`.
    fn rdma_reject => ferroce_rdma_reject(id: P, data: *const c_void, len: u8) -> c_int;
    /// `rdma_notify`.
    fn rdma_notify => ferroce_rdma_notify(id: P, event: c_int) -> c_int;
    /// `rdma_disconnect`.
    fn rdma_disconnect => ferroce_rdma_disconnect(id: P) -> c_int;
    /// `rdma_establish`.
    fn rdma_establish => ferroce_rdma_establish(id: P) -> c_int;
    /// `rdma_init_qp_attr`.
    fn rdma_init_qp_attr => ferroce_rdma_init_qp_attr(id: P, attr: P, mask: *mut c_int) -> c_int;
    /// `rdma_get_cm_event`.
    fn rdma_get_cm_event => ferroce_rdma_get_cm_event(ch: P, event: *mut P) -> c_int;
    /// `rdma_ack_cm_event`.
    fn rdma_ack_cm_event => ferroce_rdma_ack_cm_event(event: P) -> c_int;
    /// `rdma_event_str`.
    fn rdma_event_str => ferroce_rdma_event_str(event: u32) -> *const c_char;
    /// `rdma_set_option`.
    fn rdma_set_option => ferroce_rdma_set_option(id: P, level: c_int, optname: c_int, optval: P, optlen: usize) -> c_int;
    /// `rdma_migrate_id`.
    fn rdma_migrate_id => ferroce_rdma_migrate_id(id: P, ch: P) -> c_int;
    /// `rdma_set_local_ece` (accepted; ferroce's CM carries no ECE).
    fn rdma_set_local_ece => ferroce_rdma_set_local_ece(id: P, ece: P) -> c_int;
    /// `rdma_get_remote_ece` (vendor 0: none received).
    fn rdma_get_remote_ece => ferroce_rdma_get_remote_ece(id: P, ece: P) -> c_int;
    /// `rdma_get_src_port`.
    fn rdma_get_src_port => ferroce_rdma_get_src_port(id: P) -> u16;
    /// `rdma_get_dst_port`.
    fn rdma_get_dst_port => ferroce_rdma_get_dst_port(id: P) -> u16;
    /// `rdma_get_devices`.
    fn rdma_get_devices => ferroce_rdma_get_devices(num: *mut c_int) -> *mut P;
    /// `rdma_free_devices`.
    fn rdma_free_devices => ferroce_rdma_free_devices(list: *mut P) -> ();
    /// `rdma_get_request`.
    fn rdma_get_request => ferroce_rdma_get_request(listen: P, id: *mut P) -> c_int;
    /// `rdma_create_ep`.
    fn rdma_create_ep => ferroce_rdma_create_ep(id: *mut P, res: P, pd: P, attr: P) -> c_int;
    /// `rdma_destroy_ep`.
    fn rdma_destroy_ep => ferroce_rdma_destroy_ep(id: P) -> ();
    /// `rdma_create_srq`.
    fn rdma_create_srq => ferroce_rdma_create_srq(id: P, pd: P, attr: P) -> c_int;
    /// `rdma_destroy_srq`.
    fn rdma_destroy_srq => ferroce_rdma_destroy_srq(id: P) -> ();
    /// `rdma_getaddrinfo`.
    fn rdma_getaddrinfo => ferroce_rdma_getaddrinfo(node: *const c_char, service: *const c_char, hints: P, res: *mut P) -> c_int;
    /// `rdma_freeaddrinfo`.
    fn rdma_freeaddrinfo => ferroce_rdma_freeaddrinfo(res: P) -> ();
}

fn enosys() -> c_int {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

/// `rdma_create_srq_ex`: the base attributes (SRQ type basic), as `rdma_create_srq`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_srq_ex(id: P, attr: P) -> c_int {
    if attr.is_null() {
        return enosys();
    }
    // `struct ibv_srq_init_attr_ex` starts with the fields of `ibv_srq_init_attr`; its PD is at
    // offset 24 (after srq_context, attr and comp_mask), used when comp_mask has IBV_SRQ_INIT_ATTR_PD.
    // SAFETY: `attr` is the caller's valid ibv_srq_init_attr_ex (rdma_create_srq_ex's contract).
    let (mask, pd) = unsafe {
        (
            *(attr.byte_add(16).cast::<u32>()),
            *(attr.byte_add(24).cast::<P>()),
        )
    };
    let pd = if mask & 2 != 0 {
        pd
    } else {
        core::ptr::null_mut()
    };
    // SAFETY: the leading ibv_srq_init_attr of the caller's struct, and its PD or NULL.
    unsafe { rdma_create_srq(id, pd, attr) }
}

/// `rdma_reject_ece`: as `rdma_reject` (ferroce has no ECE options to refuse).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_reject_ece(id: P, data: *const c_void, len: u8) -> c_int {
    // SAFETY: rdma_reject's contract is rdma_reject_ece's.
    unsafe { rdma_reject(id, data, len) }
}

type S = libc::socklen_t;
type A = *mut libc::sockaddr;

forward! {
    /// `rsocket`: a stream rsocket.
    fn rsocket => ferroce_rdma_rsocket(domain: c_int, kind: c_int, protocol: c_int) -> c_int;
    /// `rbind`.
    fn rbind => ferroce_rdma_rbind(s: c_int, a: A, l: S) -> c_int;
    /// `rlisten`.
    fn rlisten => ferroce_rdma_rlisten(s: c_int, backlog: c_int) -> c_int;
    /// `raccept`.
    fn raccept => ferroce_rdma_raccept(s: c_int, a: A, l: *mut S) -> c_int;
    /// `rconnect`.
    fn rconnect => ferroce_rdma_rconnect(s: c_int, a: A, l: S) -> c_int;
    /// `rshutdown`.
    fn rshutdown => ferroce_rdma_rshutdown(s: c_int, how: c_int) -> c_int;
    /// `rclose`.
    fn rclose => ferroce_rdma_rclose(s: c_int) -> c_int;
    /// `rrecv`.
    fn rrecv => ferroce_rdma_rrecv(s: c_int, b: P, n: usize, f: c_int) -> isize;
    /// `rsendto`.
    fn rsendto => ferroce_rdma_rsendto(s: c_int, b: P, n: usize, f: c_int, a: P, l: S) -> isize;
    /// `rrecvfrom`.
    fn rrecvfrom => ferroce_rdma_rrecvfrom(s: c_int, b: P, n: usize, f: c_int, a: A, l: *mut S) -> isize;
    /// `rsendmsg`.
    fn rsendmsg => ferroce_rdma_rsendmsg(s: c_int, m: P, f: c_int) -> isize;
    /// `rrecvmsg`.
    fn rrecvmsg => ferroce_rdma_rrecvmsg(s: c_int, m: P, f: c_int) -> isize;
    /// `riomap`.
    fn riomap => ferroce_rdma_riomap(s: c_int, b: P, n: usize, prot: c_int, f: c_int, off: i64) -> i64;
    /// `riounmap`.
    fn riounmap => ferroce_rdma_riounmap(s: c_int, b: P, n: usize) -> c_int;
    /// `riowrite`.
    fn riowrite => ferroce_rdma_riowrite(s: c_int, b: P, n: usize, off: i64, f: c_int) -> usize;
    /// `rsend`.
    fn rsend => ferroce_rdma_rsend(s: c_int, b: P, n: usize, f: c_int) -> isize;
    /// `rreadv`.
    fn rreadv => ferroce_rdma_rreadv(s: c_int, v: *const libc::iovec, n: c_int) -> isize;
    /// `rwritev`.
    fn rwritev => ferroce_rdma_rwritev(s: c_int, v: *const libc::iovec, n: c_int) -> isize;
    /// `rgetpeername`.
    fn rgetpeername => ferroce_rdma_rgetpeername(s: c_int, a: A, l: *mut S) -> c_int;
    /// `rgetsockname`.
    fn rgetsockname => ferroce_rdma_rgetsockname(s: c_int, a: A, l: *mut S) -> c_int;
    /// `rsetsockopt`.
    fn rsetsockopt => ferroce_rdma_rsetsockopt(s: c_int, lv: c_int, o: c_int, v: P, l: S) -> c_int;
    /// `rgetsockopt`.
    fn rgetsockopt => ferroce_rdma_rgetsockopt(s: c_int, lv: c_int, o: c_int, v: P, l: *mut S) -> c_int;
    /// `rfcntl` (F_GETFL, F_SETFL).
    fn rfcntl => ferroce_rdma_rfcntl(s: c_int, cmd: c_int, arg: usize) -> c_int;
    /// `rselect`: `select(2)` with rsockets among the descriptors.
    fn rselect => ferroce_rdma_rselect(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, t: *mut libc::timeval) -> c_int;
    /// `rpoll`: rsockets by their state, other descriptors by `poll(2)`.
    fn rpoll => ferroce_rdma_rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int;
}

/// `rread`: `rrecv` without flags.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rread(s: c_int, b: P, n: usize) -> isize {
    // SAFETY: rrecv's contract is rread's.
    unsafe { rrecv(s, b, n, 0) }
}

/// `rwrite`: `rsend` without flags.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rwrite(s: c_int, b: P, n: usize) -> isize {
    // SAFETY: rsend's contract is rwrite's.
    unsafe { rsend(s, b, n, 0) }
}
