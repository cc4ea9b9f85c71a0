//! Addresses between C and Rust (`struct sockaddr` ↔ [`SocketAddr`]), GIDs, QP attributes,
//! and `rdma_getaddrinfo`.

use core::ffi::{c_char, c_int};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ferroce::transport::QpAttr;

use super::abi::*;
use crate::abi::{ibv_ah_attr, ibv_gid, ibv_qp_attr, ibv_qp_cap};

/// The address a C sockaddr holds (AF_INET or AF_INET6), or None.
///
/// # Safety
/// `a` is NULL or points to a sockaddr of its family's size.
pub(crate) unsafe fn sockaddr_of(a: *const libc::sockaddr) -> Option<SocketAddr> {
    if a.is_null() {
        return None;
    }
    // SAFETY: a non-NULL sockaddr starts with its family (the caller's contract).
    match c_int::from(unsafe { (*a).sa_family }) {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in (read unaligned: any byte buffer).
            let s = unsafe { a.cast::<libc::sockaddr_in>().read_unaligned() };
            Some(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr))),
                u16::from_be(s.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
            let s = unsafe { a.cast::<libc::sockaddr_in6>().read_unaligned() };
            Some(SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(s.sin6_addr.s6_addr)),
                u16::from_be(s.sin6_port),
            ))
        }
        _ => None,
    }
}

/// Writes `a` as a sockaddr_in or sockaddr_in6 into a 128-byte address area.
///
/// # Safety
/// `dst` is valid for writing 128 bytes.
pub(crate) unsafe fn write_sockaddr(dst: *mut sockaddr_any, a: SocketAddr) {
    let mut b = sockaddr_any { bytes: [0; 128] };
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: all-zero bytes are a valid sockaddr_in.
            let mut s: libc::sockaddr_in = unsafe { core::mem::zeroed() };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = v4.port().to_be();
            s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            // SAFETY: a sockaddr_in fits the 128-byte area.
            unsafe {
                b.bytes
                    .as_mut_ptr()
                    .cast::<libc::sockaddr_in>()
                    .write_unaligned(s)
            };
        }
        SocketAddr::V6(v6) => {
            // SAFETY: all-zero bytes are a valid sockaddr_in6.
            let mut s: libc::sockaddr_in6 = unsafe { core::mem::zeroed() };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = v6.port().to_be();
            s.sin6_addr.s6_addr = v6.ip().octets();
            s.sin6_scope_id = v6.scope_id();
            // SAFETY: a sockaddr_in6 fits the 128-byte area.
            unsafe {
                b.bytes
                    .as_mut_ptr()
                    .cast::<libc::sockaddr_in6>()
                    .write_unaligned(s)
            };
        }
    }
    // SAFETY: the caller's contract.
    unsafe { dst.write(b) };
}

/// The RoCE v2 GID of an address (IPv4-mapped for IPv4).
pub(crate) fn gid(a: IpAddr) -> ibv_gid {
    let raw = match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    ibv_gid { raw }
}

/// A provider QP attribute set as `struct ibv_qp_attr`.
pub(crate) fn qp_attr_to_c(a: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: a.qp_state as c_int,
        cur_qp_state: a.cur_qp_state as c_int,
        path_mtu: a.path_mtu as c_int,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags.0,
        cap: ibv_qp_cap::default(),
        ah_attr: a
            .ah_attr
            .as_ref()
            .map(crate::convert::ah_attr_to)
            .unwrap_or_default(),
        alt_ah_attr: ibv_ah_attr::default(),
        pkey_index: a.pkey_index,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        ..ibv_qp_attr::default()
    }
}

/// A malloc'd copy of the `len` bytes of address `a` (NULL for none or no memory).
///
/// # Safety
/// `a` is NULL or holds `len` bytes.
unsafe fn copy_addr(a: *const libc::sockaddr, len: libc::socklen_t) -> *mut libc::sockaddr {
    if a.is_null() || len == 0 {
        return core::ptr::null_mut();
    }
    // SAFETY: malloc of `len` bytes; the copy reads `len` bytes of `a` (the caller's promise).
    unsafe {
        let c = libc::malloc(len as usize).cast::<libc::sockaddr>();
        if !c.is_null() {
            core::ptr::copy_nonoverlapping(a.cast::<u8>(), c.cast::<u8>(), len as usize);
        }
        c
    }
}

/// `rdma_getaddrinfo` as librdmacm answers it (one result): with a node or service,
/// getaddrinfo(3) under the hints' family, flags and the socket type of their QP type / port
/// space, the address becoming the source (`RAI_PASSIVE`) or the destination; with neither,
/// the answer is built from the hints (their flags, family, QP type, port space and
/// destination). Either way a source the hints carry is kept when the answer has none. The
/// QP type and port space are the hints' or follow the socket type (RC/TCP, UD/UDP).
/// Failures: nothing to resolve (no node, service or hints) is −1 with errno EINVAL;
/// getaddrinfo's own are its EAI_* code; memory is −1 with ENOMEM.
///
/// # Safety
/// `node` and `service` NULL or C strings; `hints` NULL or valid (its addresses holding
/// their lengths); `res` valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
        log::debug!("rdma_getaddrinfo: no node, service or hints (EINVAL)");
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a non-NULL hints is the caller's valid struct.
    let h = (!hints.is_null()).then(|| unsafe { &*hints });
    let flags = h.map_or(0, |h| h.ai_flags);
    let hint_qp = h.map_or(0, |h| h.ai_qp_type);
    let hint_ps = h.map_or(0, |h| h.ai_port_space);
    let size = core::mem::size_of::<rdma_addrinfo>();
    // SAFETY: calloc of the struct's size (zeroed: every pointer NULL); filled below.
    let r = unsafe { libc::calloc(1, size) }.cast::<rdma_addrinfo>();
    if r.is_null() {
        crate::set_errno(libc::ENOMEM);
        return -1;
    }
    let fail = move |rc: c_int, errno: c_int| {
        // SAFETY: `r` and whatever was hung on it are this call's, freed once.
        unsafe { ferroce_rdma_freeaddrinfo(r) };
        if errno != 0 {
            crate::set_errno(errno);
        }
        rc
    };
    if node.is_null() && service.is_null() {
        let Some(h) = h else {
            return fail(-1, libc::EINVAL);
        };
        // SAFETY: `r` is ours to fill; the hints' destination holds ai_dst_len bytes.
        unsafe {
            (*r).ai_flags = h.ai_flags;
            (*r).ai_family = h.ai_family;
            (*r).ai_qp_type = h.ai_qp_type;
            (*r).ai_port_space = h.ai_port_space;
            if h.ai_dst_len > 0 {
                (*r).ai_dst_addr = copy_addr(h.ai_dst_addr, h.ai_dst_len);
                if (*r).ai_dst_addr.is_null() {
                    return fail(-1, libc::ENOMEM);
                }
                (*r).ai_dst_len = h.ai_dst_len;
            }
        }
    } else {
        // SAFETY: all-zero bytes are a valid addrinfo; the fields that matter are set below.
        let mut ai: libc::addrinfo = unsafe { core::mem::zeroed() };
        if flags & RAI_PASSIVE != 0 {
            ai.ai_flags |= libc::AI_PASSIVE;
        }
        if flags & RAI_NUMERICHOST != 0 {
            ai.ai_flags |= libc::AI_NUMERICHOST;
        }
        ai.ai_family = h.map_or(libc::AF_UNSPEC, |h| h.ai_family);
        ai.ai_socktype = match hint_qp {
            2 | 3 | 9 | 10 => libc::SOCK_STREAM, // RC, UC, XRC_SEND, XRC_RECV
            4 => libc::SOCK_DGRAM,               // UD
            _ => 0,
        };
        ai.ai_protocol = match hint_ps {
            0x0106 => libc::IPPROTO_TCP,
            0x0002 | 0x0111 => libc::IPPROTO_UDP,
            0x013F if ai.ai_socktype == libc::SOCK_STREAM => libc::IPPROTO_TCP,
            0x013F if ai.ai_socktype == libc::SOCK_DGRAM => libc::IPPROTO_UDP,
            _ => 0,
        };
        let mut out: *mut libc::addrinfo = core::ptr::null_mut();
        // SAFETY: C strings or NULL, a valid hints struct and out-pointer.
        let rc = unsafe { libc::getaddrinfo(node, service, &raw const ai, &raw mut out) };
        if rc != 0 {
            log::debug!("rdma_getaddrinfo: getaddrinfo says {rc}");
            return fail(rc, 0);
        }
        // SAFETY: getaddrinfo succeeded, so `out` is a valid non-empty list, freed once after its first result is copied; `r` is ours to fill.
        unsafe {
            let first = &*out;
            let a = copy_addr(first.ai_addr, first.ai_addrlen);
            let (socktype, protocol, family) =
                (first.ai_socktype, first.ai_protocol, first.ai_family);
            libc::freeaddrinfo(out);
            if a.is_null() {
                return fail(-1, libc::ENOMEM);
            }
            (*r).ai_family = family;
            (*r).ai_qp_type = if hint_qp != 0 {
                hint_qp
            } else if socktype == libc::SOCK_DGRAM {
                4
            } else {
                2
            };
            (*r).ai_port_space = if hint_ps != 0 {
                hint_ps
            } else if protocol == libc::IPPROTO_UDP {
                0x0111
            } else {
                0x0106
            };
            if flags & RAI_PASSIVE != 0 {
                (*r).ai_flags = RAI_PASSIVE;
                (*r).ai_src_addr = a;
                (*r).ai_src_len = first_len(a);
            } else {
                (*r).ai_dst_addr = a;
                (*r).ai_dst_len = first_len(a);
            }
        }
    }
    // SAFETY: `r` is ours; the hints' source holds ai_src_len bytes.
    unsafe {
        if let Some(h) = h.filter(|h| (*r).ai_src_len == 0 && h.ai_src_len > 0) {
            (*r).ai_src_addr = copy_addr(h.ai_src_addr, h.ai_src_len);
            if (*r).ai_src_addr.is_null() {
                return fail(-1, libc::ENOMEM);
            }
            (*r).ai_src_len = h.ai_src_len;
        }
        *res = r;
    }
    0
}

/// The length of a sockaddr of ours by its family.
///
/// # Safety
/// `a` points to a sockaddr.
unsafe fn first_len(a: *const libc::sockaddr) -> libc::socklen_t {
    // SAFETY: the caller's promise.
    match c_int::from(unsafe { (*a).sa_family }) {
        libc::AF_INET6 => core::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        _ => core::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
    }
}

/// `rdma_freeaddrinfo`.
///
/// # Safety
/// `res` came from `rdma_getaddrinfo` (or is NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: every node and its addresses were allocated with malloc/calloc by rdma_getaddrinfo.
        unsafe {
            let next = (*p).ai_next;
            libc::free((*p).ai_src_addr.cast());
            libc::free((*p).ai_dst_addr.cast());
            libc::free((*p).ai_src_canonname.cast());
            libc::free((*p).ai_dst_canonname.cast());
            libc::free((*p).ai_route);
            libc::free((*p).ai_connect);
            libc::free(p.cast());
            p = next;
        }
    }
}
