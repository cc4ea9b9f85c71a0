//! Devices and contexts: `ibv_get_device_list`, `ibv_open_device`, `ibv_query_device`,
//! `ibv_query_port`, `ibv_query_gid` and the GID-table calls.

use core::ffi::{c_char, c_int, c_void};
use std::collections::HashMap;
use std::sync::OnceLock;

use ferroce::transport::Mtu;
use parking_lot::Mutex;

use crate::abi::*;
use crate::handle::Obj;
use crate::{errno_of, set_errno};

/// A device: `struct ibv_device` as the program sees it, then what libibverbs' own
/// `struct verbs_device` keeps next (its ops pointer, NULL here, so that provider libraries
/// such as libmlx5 that check "is this one of mine?" answer no), then ferroce's data.
#[repr(C)]
pub struct Dev {
    /// What the program sees.
    pub ibv: ibv_device,
    /// `verbs_device.ops`: NULL (no rdma-core provider drives this device).
    pub verbs_ops: *const c_void,
    _verbs_rest: [u64; 6],
    /// The provider's device (its address, interface and MTU), as [`ferroce::device_list`]
    /// lists it.
    pub device: ferroce::Device,
    /// Its index in the device list (`ibv_get_device_index`).
    pub index: u32,
}

// SAFETY: a Dev's raw pointers (in `ibv` and `verbs_ops`) point at leaked, immutable data or are NULL, and nothing mutates a Dev after creation, so moving it between threads is fine.
unsafe impl Send for Dev {}
// SAFETY: a Dev is immutable after creation (no interior mutability), so shared access from several threads is only reads.
unsafe impl Sync for Dev {}

struct DevPtr(*mut Dev);
// SAFETY: the pointer is to a Dev leaked for the life of the process and never mutated, so any thread may hold it.
unsafe impl Send for DevPtr {}
// SAFETY: sharing the pointer only lets threads read the immutable, leaked Dev.
unsafe impl Sync for DevPtr {}

fn fill(dst: &mut [c_char], s: &str) {
    let n = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
}

fn all() -> &'static [DevPtr] {
    static DEVS: OnceLock<Vec<DevPtr>> = OnceLock::new();
    DEVS.get_or_init(|| {
        ferroce::device_list()
            .into_iter()
            .enumerate()
            .map(|(i, device)| {
                let mut ibv = ibv_device {
                    _ops: _ibv_device_ops {
                        _dummy1: None,
                        _dummy2: None,
                    },
                    node_type: 1,      // IBV_NODE_CA
                    transport_type: 0, // IBV_TRANSPORT_IB (RoCE is IB transport)
                    name: [0; 64],
                    dev_name: [0; 64],
                    dev_path: [0; 256],
                    ibdev_path: [0; 256],
                };
                let name = device.name.clone();
                fill(&mut ibv.name, &name);
                // The uverbs node's name, which UCX checks under /dev/infiniband (see
                // ferroce::UVERBS_NODE): one stand-in node for every ferroce device.
                fill(&mut ibv.dev_name, "ferroce");
                fill(&mut ibv.dev_path, "/sys/class/infiniband_verbs/ferroce");
                fill(
                    &mut ibv.ibdev_path,
                    &format!("/sys/class/infiniband/{name}"),
                );
                DevPtr(Box::into_raw(Box::new(Dev {
                    ibv,
                    verbs_ops: core::ptr::null(),
                    _verbs_rest: [0; 6],
                    device,
                    index: i as u32,
                })))
            })
            .collect()
    })
}

/// The device pointer of the ferroce device on `addr`, if the list has one.
pub(crate) fn device_on(addr: std::net::IpAddr) -> Option<*mut ibv_device> {
    all()
        .iter()
        // SAFETY: our devices are leaked boxes that live for the whole process.
        .find(|d| unsafe { &*d.0 }.device.addr == addr)
        .map(|d| d.0.cast::<ibv_device>())
}

/// The `Dev` behind a device pointer of ours, or None (with errno EINVAL) for anything else.
fn dev_of(device: *mut ibv_device) -> Option<&'static Dev> {
    let d = all().iter().find(|d| d.0.cast::<ibv_device>() == device);
    match d {
        // SAFETY: our devices are leaked boxes that live for the whole process.
        Some(d) => Some(unsafe { &*d.0 }),
        None => {
            set_errno(libc::EINVAL);
            None
        }
    }
}

/// `ibv_get_device_list`: a NULL-terminated array (free it with `ibv_free_device_list`).
///
/// # Safety
/// `num_devices` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    crate::init_logging();
    let devs = all();
    let mut v: Vec<*mut ibv_device> = devs.iter().map(|d| d.0.cast()).collect();
    v.push(core::ptr::null_mut());
    if !num_devices.is_null() {
        // SAFETY: the caller passes NULL or a valid int pointer.
        unsafe { *num_devices = devs.len() as c_int };
    }
    Box::into_raw(v.into_boxed_slice()).cast()
}

/// `ibv_free_device_list`.
///
/// # Safety
/// `list` comes from [`ibv_get_device_list`] and is freed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    if list.is_null() {
        return;
    }
    let n = all().len() + 1;
    // SAFETY: the list is the boxed slice of n pointers ibv_get_device_list leaked.
    drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(list, n)) });
}

/// `ibv_get_device_name`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    dev_of(device).map_or(core::ptr::null(), |d| d.ibv.name.as_ptr())
}

/// `ibv_get_device_index`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    dev_of(device).map_or(-1, |d| d.index as c_int)
}

/// `ibv_get_device_guid` (big-endian, `__be64`).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    dev_of(device).map_or(0, |d| {
        u64::from_ne_bytes(d.device.node_guid().to_be_bytes())
    })
}

/// An open device: the `verbs_context` (with the `ibv_context` the program holds at its end),
/// then [`Ctx`]. As for every object ([`crate::handle`]), the C part is reached only through
/// raw pointers and the Rust part only by projection.
type CtxBox = Obj<verbs_context, Ctx>;

/// The ferroce state of an open device: the context and the tables that map events back to C
/// objects.
pub struct Ctx {
    /// The ferroce context.
    pub ctx: ferroce::Context,
    /// The device.
    pub dev: &'static Dev,
    /// CQ handle → `*mut objects::Cq` (for completion events).
    pub cqs: Mutex<HashMap<u32, usize>>,
    /// QP number → `*mut objects::Qp` (for async events).
    pub qps: Mutex<HashMap<u32, usize>>,
    /// SRQ number → `*mut objects::Srq` (for async events).
    pub srqs: Mutex<HashMap<u32, usize>>,
    /// What `ibv_context.cmd_fd` names: on a kernel device the uverbs command file; here an
    /// eventfd that never becomes readable, so programs that poll, dup or pass it on get a
    /// real descriptor (and `ibv_import_device` on it says EOPNOTSUPP, not EBADF).
    pub cmd: std::os::fd::OwnedFd,
}

/// The `Ctx` of an `ibv_context` pointer handed out by [`ibv_open_device`].
///
/// # Safety
/// `c` must be a live context of ours (from [`ibv_open_device`], not closed).
pub unsafe fn ctx_of<'a>(c: *mut ibv_context) -> &'a Ctx {
    // SAFETY: the caller's context is the `context` field of the verbs_context of a live CtxBox, so box_of gives that box's C struct.
    unsafe { CtxBox::rust(box_of(c)) }
}

/// The `verbs_context` (the CtxBox's C struct) whose `context` is `c`: pointer arithmetic on a
/// pointer that carries the whole box's provenance, no reference formed.
fn box_of(c: *mut ibv_context) -> *mut verbs_context {
    c.wrapping_byte_sub(core::mem::offset_of!(verbs_context, context))
        .cast()
}

/// `ibv_open_device`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    let Some(dev) = dev_of(device) else {
        return core::ptr::null_mut();
    };
    let opened = dev.device.open();
    let ctx = match opened {
        Ok(c) => c,
        Err(e) => {
            log::warn!("ibv_open_device({}): {e}", dev.device.addr);
            set_errno(errno_of(&e));
            return core::ptr::null_mut();
        }
    };
    let async_fd = ctx.async_fd();
    // SAFETY: eventfd takes no pointers; a negative result is checked below.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if raw < 0 {
        let e = std::io::Error::last_os_error();
        log::warn!("ibv_open_device: the command descriptor: {e}");
        set_errno(e.raw_os_error().unwrap_or(libc::EMFILE));
        return core::ptr::null_mut();
    }
    // SAFETY: `raw` is a descriptor eventfd just opened and nothing else owns.
    let cmd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    let p = CtxBox::into_raw(
        verbs_context {
            query_port: Some(vctx_query_port),
            advise_mr: Some(crate::mr::vctx_advise_mr),
            _unused_a: [None; 15],
            modify_cq: Some(crate::cq::vctx_modify_cq),
            _unused_a2: [None; 6],
            query_rt_values: Some(vctx_query_rt_values),
            create_cq_ex: Some(crate::cq_ex::vctx_create_cq_ex),
            priv_: core::ptr::null_mut(),
            query_device_ex: Some(vctx_query_device_ex),
            _unused_b: [None; 4],
            open_qp: Some(crate::xrc::vctx_open_qp),
            create_qp_ex: Some(crate::qp::vctx_create_qp_ex),
            get_srq_num: Some(crate::xrc::vctx_get_srq_num),
            create_srq_ex: Some(crate::xrc::vctx_create_srq_ex),
            open_xrcd: Some(crate::xrc::vctx_open_xrcd),
            close_xrcd: Some(crate::xrc::vctx_close_xrcd),
            _abi_placeholder3: 0,
            sz: core::mem::size_of::<verbs_context>(),
            context: ibv_context {
                device,
                ops: crate::data::context_ops(),
                cmd_fd: raw,
                async_fd,
                num_comp_vectors: 1,
                mutex: mutex_init(),
                abi_compat: VERBS_ABI_IS_EXTENDED,
            },
        },
        Ctx {
            ctx,
            dev,
            cqs: Mutex::new(HashMap::new()),
            qps: Mutex::new(HashMap::new()),
            srqs: Mutex::new(HashMap::new()),
            cmd,
        },
    );
    // SAFETY: p is the box just leaked, valid until ibv_close_device frees it; the pointer is derived by raw projection (no reference), so it keeps the whole box's provenance, which box_of relies on to get back to it.
    unsafe { &raw mut (*p).context }
}

/// `ibv_close_device`.
///
/// # Safety
/// `context` comes from [`ibv_open_device`] and is closed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if context.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller's context is live and ours (this function's contract).
        let c = unsafe { ctx_of(context) };
        if c.ctx.in_use() {
            // verbs lets a program close a context whose resources it did not release (they
            // leak). Those objects point at the context, so it stays allocated (and its port
            // bound) for the rest of the process rather than dangling under them.
            log::warn!(
                "ibv_close_device({}): PDs, CQs or channels still live; the context stays until exit",
                c.dev.device.addr
            );
            return 0;
        }
        // SAFETY: the box was leaked by ibv_open_device (the program's context is its `vctx.context`, so box_of gives back the leaked pointer's address and provenance); no child object refers to it any more (checked above) and the program closes it once.
        unsafe { CtxBox::free(box_of(context)) };
        0
    })())
}

/// `ibv_query_device`.
///
/// # Safety
/// `context` is live; `attr` is valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if context.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `context` is an open context of ours and `attr` is valid for writing (this function's contract).
        unsafe { attr.write(device_attr(ctx_of(context))) };
        0
    })())
}

fn device_attr(c: &Ctx) -> ibv_device_attr {
    let a = c.ctx.query_device();
    let mut fw = [0 as c_char; 64];
    fill(&mut fw, a.fw_ver);
    let max_qp = a.max_qp as c_int;
    ibv_device_attr {
        fw_ver: fw,
        node_guid: u64::from_ne_bytes(a.node_guid.to_be_bytes()),
        sys_image_guid: u64::from_ne_bytes(a.sys_image_guid.to_be_bytes()),
        max_mr_size: a.max_mr_size,
        page_size_cap: 0xffff_f000,
        vendor_id: a.vendor_id,
        vendor_part_id: 0,
        hw_ver: 0,
        max_qp,
        max_qp_wr: a.max_qp_wr as c_int,
        // IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SRQ_RESIZE-less
        // ... MEM_WINDOW, MEM_MGT_EXTENSIONS, MEM_WINDOW_TYPE_2B, as rxe.
        // IBV_DEVICE_XRC (1 << 20) with the rest.
        device_cap_flags: (1 << 11) | (1 << 12) | (1 << 17) | (1 << 20) | (1 << 21) | (1 << 24),
        max_sge: a.max_sge as c_int,
        max_sge_rd: a.max_sge as c_int,
        max_cq: a.max_cq as c_int,
        max_cqe: a.max_cqe as c_int,
        max_mr: a.max_mr as c_int,
        max_pd: a.max_pd as c_int,
        max_qp_rd_atom: a.max_qp_rd_atom as c_int,
        max_ee_rd_atom: 0,
        max_res_rd_atom: (a.max_qp_rd_atom as c_int).saturating_mul(max_qp),
        max_qp_init_rd_atom: a.max_qp_init_rd_atom as c_int,
        max_ee_init_rd_atom: 0,
        atomic_cap: a.atomic_cap as c_int,
        max_ee: 0,
        max_rdd: 0,
        max_mw: 1 << 16,
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: a.max_mcast_grp as c_int,
        max_mcast_qp_attach: a.max_mcast_qp_attach as c_int,
        max_total_mcast_qp_attach: a.max_total_mcast_qp_attach as c_int,
        max_ah: max_qp,
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: a.max_srq as c_int,
        max_srq_wr: a.max_srq_wr as c_int,
        max_srq_sge: a.max_srq_sge as c_int,
        max_pkeys: a.max_pkeys,
        local_ca_ack_delay: a.local_ca_ack_delay,
        phys_port_cnt: a.phys_port_cnt,
    }
}

/// `struct ibv_device_attr_ex` up to what this library fills: `orig_attr`, the ODP (XRC too) and CQ
/// moderation caps, the completion clock, `device_cap_flags_ex` (with FLUSH_GLOBAL and
/// ATOMIC_WRITE) and `phys_port_cnt_ex` (1), the rest zeroed (no TSO, RSS, packet pacing,
/// tag matching).
unsafe extern "C" fn vctx_query_device_ex(
    context: *mut ibv_context,
    input: *const c_void,
    attr: *mut c_void,
    attr_size: usize,
) -> c_int {
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        let _ = input;
        if context.is_null()
            || attr.is_null()
            || attr_size < core::mem::size_of::<ibv_device_attr>()
        {
            return libc::EINVAL;
        }
        // SAFETY: verbs passes a live context of this library (checked non-null above).
        let orig = device_attr(unsafe { ctx_of(context) });
        let base_caps = u64::from(orig.device_cap_flags);
        // SAFETY: the caller's buffer holds attr_size bytes; orig_attr is its first field.
        unsafe {
            core::ptr::write_bytes(attr.cast::<u8>(), 0, attr_size);
            attr.cast::<ibv_device_attr>().write(orig);
        }
        if attr_size >= DEVICE_ATTR_EX_ODP_CAPS + 20 {
            // IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT; RC: SEND RECV WRITE READ ATOMIC
            // SRQ_RECV, UC: SEND RECV WRITE, UD: SEND RECV SRQ_RECV — every ferroce region is
            // on demand, and one may cover the whole address space.
            let caps: [u32; 3] = [0x3f, 0x07, 0x23];
            // SAFETY: the fields lie inside the caller's attr_size bytes (unaligned writes: any byte buffer).
            unsafe {
                attr.byte_add(DEVICE_ATTR_EX_ODP_CAPS)
                    .cast::<u64>()
                    .write_unaligned(1 | 2);
                for (i, c) in caps.iter().enumerate() {
                    attr.byte_add(DEVICE_ATTR_EX_ODP_CAPS + 8 + 4 * i)
                        .cast::<u32>()
                        .write_unaligned(*c);
                }
            }
        }
        if attr_size >= DEVICE_ATTR_EX_CQ_MOD_CAPS + 4 {
            // SAFETY: both u16 lie inside the caller's attr_size bytes (unaligned writes: any byte buffer).
            unsafe {
                attr.byte_add(DEVICE_ATTR_EX_CQ_MOD_CAPS)
                    .cast::<u16>()
                    .write_unaligned(u16::MAX);
                attr.byte_add(DEVICE_ATTR_EX_CQ_MOD_CAPS + 2)
                    .cast::<u16>()
                    .write_unaligned(u16::MAX);
            }
        }
        if attr_size >= DEVICE_ATTR_EX_HCA_CORE_CLOCK + 8 {
            // SAFETY: both u64 fields lie inside the caller's attr_size bytes (unaligned writes: any byte buffer).
            unsafe {
                // Completion timestamps count ns on CLOCK_MONOTONIC: all 64 bits, a 1 GHz clock (kHz).
                attr.byte_add(DEVICE_ATTR_EX_COMPLETION_TIMESTAMP_MASK)
                    .cast::<u64>()
                    .write_unaligned(u64::MAX);
                attr.byte_add(DEVICE_ATTR_EX_HCA_CORE_CLOCK)
                    .cast::<u64>()
                    .write_unaligned(1_000_000);
            }
        }
        if attr_size >= DEVICE_ATTR_EX_DEVICE_CAP_FLAGS_EX + 8 {
            // The base flags, and the IBTA 1.5 operations rxe 6.2+ announces the same way
            // (FLUSH to persistence is not: regions are not pmem).
            let ex = base_caps | IB_UVERBS_DEVICE_FLUSH_GLOBAL | IB_UVERBS_DEVICE_ATOMIC_WRITE;
            // SAFETY: the u64 lies inside the caller's attr_size bytes (unaligned write: any byte buffer).
            unsafe {
                attr.byte_add(DEVICE_ATTR_EX_DEVICE_CAP_FLAGS_EX)
                    .cast::<u64>()
                    .write_unaligned(ex);
            }
        }
        if attr_size >= DEVICE_ATTR_EX_XRC_ODP_CAPS + 4 {
            // XRC on demand as RC: SEND WRITE READ ATOMIC SRQ_RECV (it has no receive queue).
            // SAFETY: the buffer holds attr_size bytes, so the u32 at this offset is inside it (unaligned write: the caller's buffer may be any byte array).
            unsafe {
                attr.byte_add(DEVICE_ATTR_EX_XRC_ODP_CAPS)
                    .cast::<u32>()
                    .write_unaligned(0x3d);
            }
        }
        if attr_size >= DEVICE_ATTR_EX_PHYS_PORT_CNT_EX + 4 {
            // SAFETY: the buffer holds attr_size bytes, so the u32 at this offset is inside it (unaligned write: the caller's buffer may be any byte array).
            unsafe {
                attr.byte_add(DEVICE_ATTR_EX_PHYS_PORT_CNT_EX)
                    .cast::<u32>()
                    .write_unaligned(1);
            }
        }
        0
    })())
}

/// `verbs_context.query_rt_values` (behind verbs.h's `ibv_query_rt_values_ex`): the
/// free-running clock completion timestamps count on (`CLOCK_MONOTONIC`).
unsafe extern "C" fn vctx_query_rt_values(
    context: *mut ibv_context,
    values: *mut ibv_values_ex,
) -> c_int {
    if context.is_null() || values.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: verbs passes a valid values struct, readable and writable.
    let v = unsafe { &mut *values };
    let asked = v.comp_mask;
    v.comp_mask = 0;
    if asked & IBV_VALUES_MASK_RAW_CLOCK != 0 {
        // SAFETY: `raw_clock` is a valid timespec to write.
        if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut v.raw_clock) } != 0 {
            return libc::EINVAL;
        }
        v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
    }
    0
}

fn port_attr(c: &Ctx) -> ibv_port_attr {
    let p = c.ctx.query_port();
    ibv_port_attr {
        state: p.state as c_int,
        max_mtu: p.max_mtu as c_int,
        active_mtu: p.active_mtu as c_int,
        gid_tbl_len: p.gid_tbl_len as c_int,
        // IBV_PORT_CM_SUP: connection management is reachable (QP1 exists).
        port_cap_flags: 1 << 16,
        max_msg_sz: p.max_msg_sz as u32,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        max_vl_num: 1,
        active_width: 1,  // 1X
        active_speed: 32, // EDR, 25 Gb/s per lane: a nominal figure (UDP has no link speed)
        phys_state: 5,    // LinkUp
        link_layer: if p.link_layer_ethernet { 2 } else { 1 },
        ..ibv_port_attr::default()
    }
}

/// The `verbs_context.query_port` that verbs.h's inline `ibv_query_port` calls.
unsafe extern "C" fn vctx_query_port(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
    attr_len: usize,
) -> c_int {
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if context.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        if port_num != 1 {
            return libc::EINVAL;
        }
        // SAFETY: `context` came from this library's ibv_open_device and is not closed (verbs forbids using a closed context), so it is the context of a live Ctx.
        let a = port_attr(unsafe { ctx_of(context) });
        let n = attr_len.min(core::mem::size_of::<ibv_port_attr>());
        // SAFETY: the caller's buffer holds attr_len bytes; we copy at most that.
        unsafe {
            core::ptr::copy_nonoverlapping((&raw const a).cast::<u8>(), attr.cast::<u8>(), n);
        }
        0
    })())
}

/// `ibv_query_port` (the exported entry older binaries call).
///
/// # Safety
/// `context` is live; `attr` is valid for a `struct ibv_port_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // vctx_query_port sets errno itself.
    // SAFETY: ibv_query_port's contract (an open context of ours, `attr` writable) is vctx_query_port's.
    unsafe {
        vctx_query_port(
            context,
            port_num,
            attr,
            core::mem::size_of::<ibv_port_attr>(),
        )
    }
}

fn gid_of(c: &Ctx, index: u32) -> Option<ibv_gid> {
    c.ctx
        .query_gid(index)
        .ok()
        .map(|g| ibv_gid { raw: g.octets() })
}

/// `ibv_query_gid`: indexes 0 and 1 are both the device's address (`::ffff:a.b.c.d` for
/// IPv4; see `Context::query_gid`).
///
/// # Safety
/// `context` is live; `gid` is valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if context.is_null() || gid.is_null() || port_num != 1 || index < 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: `context` came from this library's ibv_open_device and is not closed (verbs forbids using a closed context), so it is the context of a live Ctx.
        match gid_of(unsafe { ctx_of(context) }, index as u32) {
            Some(g) => {
                // SAFETY: gid is valid for writing.
                unsafe { gid.write(g) };
                0
            }
            None => {
                set_errno(libc::EINVAL);
                -1
            }
        }
    })())
}

fn ifindex(c: &Ctx) -> u32 {
    let name = c.ctx.device().ifname.clone();
    let Ok(cname) = std::ffi::CString::new(name) else {
        return 0;
    };
    // SAFETY: cname is a valid NUL-terminated string.
    unsafe { libc::if_nametoindex(cname.as_ptr()) }
}

fn gid_entry(c: &Ctx, index: u32) -> Option<ibv_gid_entry> {
    gid_of(c, index).map(|gid| ibv_gid_entry {
        gid,
        gid_index: index,
        port_num: 1,
        gid_type: 2, // IBV_GID_TYPE_ROCE_V2
        ndev_ifindex: ifindex(c),
    })
}

/// `_ibv_query_gid_ex` (behind verbs.h's `ibv_query_gid_ex`).
///
/// # Safety
/// `context` is live; `entry` holds `entry_size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if context.is_null() || entry.is_null() || flags != 0 || port_num != 1 {
            return libc::EINVAL;
        }
        if entry_size < core::mem::size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        // SAFETY: `context` came from this library's ibv_open_device and is not closed (verbs forbids using a closed context), so it is the context of a live Ctx.
        match gid_entry(unsafe { ctx_of(context) }, gid_index) {
            Some(e) => {
                // SAFETY: entry is valid for entry_size >= sizeof bytes.
                unsafe { entry.write(e) };
                0
            }
            None => libc::ENODATA,
        }
    })())
}

/// `_ibv_query_gid_table` (behind verbs.h's `ibv_query_gid_table`): the number of entries.
///
/// # Safety
/// `context` is live; `entries` holds `max_entries` entries of `entry_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    if context.is_null() || flags != 0 || entry_size < core::mem::size_of::<ibv_gid_entry>() {
        return -(libc::EINVAL as isize);
    }
    // SAFETY: `context` came from this library's ibv_open_device and is not closed (verbs forbids using a closed context), so it is the context of a live Ctx.
    let c = unsafe { ctx_of(context) };
    let mut n = 0usize;
    for i in 0..2u32 {
        let Some(e) = gid_entry(c, i) else { continue };
        if n == max_entries {
            return -(libc::EINVAL as isize);
        }
        // SAFETY: n < max_entries, each slot entry_size bytes apart.
        unsafe { entries.byte_add(n * entry_size).write(e) };
        n += 1;
    }
    n as isize
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34, used by perftest): every GID is RoCE v2, which in
/// the sysfs numbering this call uses (`enum ibv_gid_type_sysfs`) is 1.
///
/// # Safety
/// `context` is live; `gid_type` is valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: u32,
    gid_type: *mut c_int,
) -> c_int {
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if context.is_null() || gid_type.is_null() || port_num != 1 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: `context` came from this library's ibv_open_device and is not closed (verbs forbids using a closed context), so it is the context of a live Ctx.
        if gid_of(unsafe { ctx_of(context) }, index).is_none() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: gid_type is valid for writing.
        unsafe { *gid_type = 1 };
        0
    })())
}

/// `ibv_query_pkey`: one P_Key, the default 0xffff.
///
/// # Safety
/// `pkey` is valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // errno as rdma-core leaves it (its errors come from system calls).
    crate::status((|| {
        if context.is_null() || pkey.is_null() || port_num != 1 || index != 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: pkey is valid for writing.
        unsafe { *pkey = 0xffffu16.to_be() };
        0
    })())
}

/// `ibv_get_pkey_index`: 0 for the default P_Key.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_pkey_index(context: *mut ibv_context, port_num: u8, pkey: u16) -> c_int {
    if context.is_null() || port_num != 1 || u16::from_be(pkey) != 0xffff {
        set_errno(libc::EINVAL);
        return -1;
    }
    0
}

/// The active MTU of a context's port (for QP checks).
pub fn active_mtu(c: &Ctx) -> Mtu {
    c.ctx.query_port().active_mtu
}
