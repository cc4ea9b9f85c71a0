//! The small helpers of libibverbs: status and type names, rate conversions, fork control.

use core::ffi::{c_char, c_int, c_void};

macro_rules! cstr {
    ($s:literal) => {
        concat!($s, "\0").as_ptr().cast::<c_char>()
    };
}

/// `ibv_wc_status_str`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    match status {
        0 => cstr!("success"),
        1 => cstr!("local length error"),
        2 => cstr!("local QP operation error"),
        3 => cstr!("local EE context operation error"),
        4 => cstr!("local protection error"),
        5 => cstr!("Work Request Flushed Error"),
        6 => cstr!("memory management operation error"),
        7 => cstr!("bad response error"),
        8 => cstr!("local access error"),
        9 => cstr!("remote invalid request error"),
        10 => cstr!("remote access error"),
        11 => cstr!("remote operation error"),
        12 => cstr!("transport retry counter exceeded"),
        13 => cstr!("RNR retry counter exceeded"),
        14 => cstr!("local RDD violation error"),
        15 => cstr!("remote invalid RD request"),
        16 => cstr!("aborted error"),
        17 => cstr!("invalid EE context number"),
        18 => cstr!("invalid EE context state"),
        19 => cstr!("fatal error"),
        20 => cstr!("response timeout error"),
        21 => cstr!("general error"),
        22 => cstr!("TM error"),
        23 => cstr!("TM software rendezvous"),
        _ => cstr!("unknown"),
    }
}

/// `ibv_node_type_str`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    match node_type {
        1 => cstr!("InfiniBand channel adapter"),
        2 => cstr!("InfiniBand switch"),
        3 => cstr!("InfiniBand router"),
        4 => cstr!("iWARP NIC"),
        5 => cstr!("usNIC"),
        6 => cstr!("usNIC UDP"),
        7 => cstr!("unspecified"),
        _ => cstr!("unknown"),
    }
}

/// `ibv_port_state_str`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_port_state_str(port_state: c_int) -> *const c_char {
    match port_state {
        0 => cstr!("PORT_NOP"),
        1 => cstr!("PORT_DOWN"),
        2 => cstr!("PORT_INIT"),
        3 => cstr!("PORT_ARMED"),
        4 => cstr!("PORT_ACTIVE"),
        5 => cstr!("PORT_ACTIVE_DEFER"),
        _ => cstr!("invalid state"),
    }
}

/// `ibv_event_type_str`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    match event {
        0 => cstr!("CQ error"),
        1 => cstr!("local work queue catastrophic error"),
        2 => cstr!("invalid request local work queue error"),
        3 => cstr!("local access violation work queue error"),
        4 => cstr!("communication established"),
        5 => cstr!("send queue drained"),
        6 => cstr!("path migrated"),
        7 => cstr!("path migration request error"),
        8 => cstr!("local catastrophic error"),
        9 => cstr!("port active"),
        10 => cstr!("port error"),
        11 => cstr!("LID change"),
        12 => cstr!("P_Key change"),
        13 => cstr!("SM change"),
        14 => cstr!("SRQ catastrophic error"),
        15 => cstr!("SRQ limit reached"),
        16 => cstr!("last WQE reached"),
        17 => cstr!("client reregistration"),
        18 => cstr!("GID table change"),
        19 => cstr!("WQ fatal"),
        _ => cstr!("unknown"),
    }
}

/// `enum ibv_rate` → Mb/s.
const RATES: [(c_int, c_int); 23] = [
    (2, 2500),
    (5, 5000),
    (3, 10000),
    (6, 20000),
    (4, 30000),
    (7, 40000),
    (8, 60000),
    (9, 80000),
    (10, 120000),
    (11, 14062),
    (12, 56250),
    (13, 112500),
    (14, 168750),
    (15, 25781),
    (16, 103125),
    (17, 206250),
    (18, 309375),
    (19, 28125),
    (20, 53125),
    (21, 425000),
    (22, 637500),
    (23, 850000),
    (24, 1275000),
];

/// `ibv_rate_to_mult`: the rate as a multiple of 2.5 Gb/s (the SDR-based ones only), or -1.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    match rate {
        2 => 1,
        5 => 2,
        3 => 4,
        6 => 8,
        4 => 12,
        7 => 16,
        8 => 24,
        9 => 32,
        10 => 48,
        _ => -1,
    }
}

/// `mult_to_ibv_rate`: the inverse of [`ibv_rate_to_mult`] (IBV_RATE_MAX for others).
#[unsafe(no_mangle)]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    (2..=10).find(|&r| ibv_rate_to_mult(r) == mult).unwrap_or(0)
}

/// `ibv_rate_to_mbps`, or -1.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

/// `mbps_to_ibv_rate` (IBV_RATE_MAX for a figure with no enum value).
#[unsafe(no_mangle)]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.1 == mbps).map_or(0, |r| r.0)
}

/// `ibv_fork_init`: nothing to do; ferroce pins no memory, so fork is always safe.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: IBV_FORK_UNNEEDED.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

/// `ibv_dontfork_range`: nothing to do (see [`ibv_fork_init`]).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_dontfork_range(base: *mut c_void, size: usize) -> c_int {
    let _ = (base, size);
    0
}

/// `ibv_dofork_range`: nothing to do (see [`ibv_fork_init`]).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_dofork_range(base: *mut c_void, size: usize) -> c_int {
    let _ = (base, size);
    0
}

/// `ibv_get_sysfs_path`: `SYSFS_PATH` (at most 256 bytes, trailing slashes dropped) unless the
/// process runs set-user-ID, else "/sys", fixed at the first call — rdma-core's rule. ferroce's
/// devices have no kernel sysfs; `ferroce sysfs DIR` lays out a tree of them for programs that
/// read one (docs/c-abi.md).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    static PATH: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        // SAFETY: getuid and geteuid cannot fail.
        let same_user = unsafe { libc::getuid() == libc::geteuid() };
        let env = std::env::var_os("SYSFS_PATH").filter(|_| same_user);
        let mut bytes = env.map_or_else(
            || b"/sys".to_vec(),
            |v| std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()).to_vec(),
        );
        bytes.truncate(256);
        while bytes.last() == Some(&b'/') {
            bytes.pop();
        }
        // An environment value has no NUL byte, so this cannot fail; "/sys" if it did.
        std::ffi::CString::new(bytes).unwrap_or_else(|_| c"/sys".to_owned())
    })
    .as_ptr()
}

/// `ibv_read_sysfs_file`: reads `dir/file` into `buf` (a final newline dropped, the text
/// NUL-terminated); the byte count, or −1 with errno (ENOENT where nothing is there, as for
/// kernel paths of ferroce's devices; ENOSPC-like truncation fails with −1, as rdma-core).
///
/// # Safety
/// `dir` and `file` are C strings; `buf` holds `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's contract: two C strings.
    let (d, f) = unsafe {
        (
            std::ffi::CStr::from_ptr(dir).to_bytes(),
            std::ffi::CStr::from_ptr(file).to_bytes(),
        )
    };
    let mut path = d.to_vec();
    path.push(b'/');
    path.extend_from_slice(f);
    let path = std::path::PathBuf::from(std::ffi::OsString::from(
        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&path),
    ));
    let mut data = match std::fs::read(&path) {
        Ok(d) => d,
        Err(e) => {
            log::debug!("ibv_read_sysfs_file {}: {e}", path.display());
            crate::set_errno(e.raw_os_error().unwrap_or(libc::ENOENT));
            return -1;
        }
    };
    data.truncate(size);
    let mut len = data.len();
    if len > 0 {
        if data[len - 1] == b'\n' {
            len -= 1;
        } else if len == size {
            log::debug!(
                "ibv_read_sysfs_file {}: longer than {size} bytes",
                path.display()
            );
            return -1;
        }
    }
    // SAFETY: `buf` holds `size` bytes and len < size here (a dropped newline, or a short read).
    unsafe {
        core::ptr::copy_nonoverlapping(data.as_ptr(), buf.cast::<u8>(), len);
        if len < size {
            *buf.add(len) = 0;
        }
    }
    len as c_int
}

/// `ibv_wr_opcode_str` (rdma-core 56): the work request opcode's name, "unknown" for none.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_wr_opcode_str(opcode: u32) -> *const c_char {
    let s: &'static core::ffi::CStr = match opcode {
        0 => c"rdma-write",
        1 => c"rdma-write-with-imm",
        2 => c"send",
        3 => c"send-with-imm",
        4 => c"rdma-read",
        5 => c"atomic-cmp-and-swp",
        6 => c"atomic-fetch-and-add",
        7 => c"local-inv",
        8 => c"bind-mw",
        9 => c"send-with-inv",
        10 => c"tso",
        11 => c"driver1",
        14 => c"flush",
        15 => c"atomic-write",
        _ => c"unknown",
    };
    s.as_ptr()
}
