//! `libibverbs.so.1` on ferroce: the C ABI of rdma-core 44's libibverbs, implemented over the
//! ferroce provider, so that unmodified verbs programs (`ibv_rc_pingpong`, perftest, your own)
//! run on plain UDP with `LD_LIBRARY_PATH` pointing at the library `ibverbs/build.sh` makes.
//!
//! * Devices come from `FERROCE_DEVICES` (comma-separated local addresses, exposed as
//!   `ferroce0`, `ferroce1`, ... in that order), or else every non-loopback address of the
//!   host, or else 127.0.0.1 ([`device`]).
//! * Every verbs object is a `#[repr(C)]` box whose first field is the C struct the program
//!   sees (`ibv_qp`, `ibv_cq`, ...) followed by the ferroce handle it stands for ([`objects`];
//!   each object's verbs in its own module, the C⇄Rust conversions in [`convert`]).
//!   The data path (`ibv_post_send`, `ibv_poll_cq`, ... which verbs.h inlines through
//!   `ibv_context.ops`) converts work requests and completions ([`data`]).
//! * Symbols carry libibverbs' version nodes (IBVERBS_1.0 … IBVERBS_1.14 and the private
//!   IBVERBS_PRIVATE_34 that Debian's libmlx5, libefa and librdmacm import); what ferroce does
//!   not do fails with EOPNOTSUPP ([`unsupported`]).
//!
//! **The C ABI crate of both libraries.** The connection manager's C ABI (`ferroce_rdma_*`,
//! [`rdmacm`]) is here too, and `librdmacm.so.1` (the `ferroce-librdmacm` crate) only forwards
//! each `rdma_*` symbol to it. A process has one provider: the `ibv_context`, `ibv_pd` and
//! `ibv_qp` an `rdma_cm_id` hands the program must be the very objects its `ibv_*` calls
//! reach, with one device list, one runtime per device and one set of object layouts. Two
//! Rust libraries would each link their own copy of the provider's statics (two runtimes on
//! one address, objects neither could convert), so the statics live in one shared object.
//!
//! This crate is all FFI: every `unsafe` block states the invariant it relies on.

pub mod abi;
pub mod ah;
pub mod channel;
pub mod convert;
pub mod cq;
pub mod cq_ex;
pub mod data;
pub mod device;
pub mod event;
pub mod handle;
pub mod mr;
pub mod mw;
pub mod objects;
pub mod pd;
pub mod qp;
pub mod rdmacm;
pub mod srq;
pub mod strings;
pub mod unsupported;
pub mod wr;
pub mod xrc;

use core::ffi::c_int;

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// A verb's return value, with errno set to it when nonzero: rdma-core's control verbs fail
/// with the errno of their system call, and programs print `%m` after them.
#[track_caller]
pub(crate) fn status(rc: c_int) -> c_int {
    if rc > 0 {
        // Every refusal leaves a line at debug level: the verb (by its place here) and errno;
        // the specific reason, where there is one, was logged just before.
        let at = std::panic::Location::caller();
        log::debug!(
            "{}:{}: returns {} ({rc})",
            at.file(),
            at.line(),
            errno_name(rc)
        );
        set_errno(rc);
    }
    rc
}

/// Diagnostics to stderr when `FERROCE_LOG` names a level (`error`, `warn`, `info`, `debug`,
/// `trace`): why a verb failed, QP transitions. Set up once, at the first device listing.
pub(crate) fn init_logging() {
    struct Stderr;
    impl log::Log for Stderr {
        fn enabled(&self, m: &log::Metadata<'_>) -> bool {
            m.level() <= log::max_level()
        }
        fn log(&self, r: &log::Record<'_>) {
            if self.enabled(r.metadata()) {
                eprintln!("ferroce {} {}: {}", r.level(), r.target(), r.args());
            }
        }
        fn flush(&self) {}
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Some(level) = std::env::var("FERROCE_LOG")
            .ok()
            .and_then(|v| v.parse::<log::LevelFilter>().ok())
        else {
            return;
        };
        if log::set_logger(&Stderr).is_ok() {
            log::set_max_level(level);
        }
    });
}

/// Maps a ferroce error to the errno verbs would give, saying why at debug level (where in
/// this library the verb refused, and the provider's reason).
#[track_caller]
pub(crate) fn errno_of(e: &ferroce::Error) -> c_int {
    let at = std::panic::Location::caller();
    log::debug!("{}:{}: refused: {e}", at.file(), at.line());
    e.errno()
}

/// The errno constant's name, for log lines.
pub(crate) fn errno_name(e: c_int) -> &'static str {
    match e {
        libc::EINVAL => "EINVAL",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EBUSY => "EBUSY",
        libc::ENOMEM => "ENOMEM",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::ENODEV => "ENODEV",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::EAGAIN => "EAGAIN",
        libc::ENOENT => "ENOENT",
        _ => "errno",
    }
}
