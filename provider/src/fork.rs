//! `fork(2)`: a child starts with none of its parent's devices, as with rdma-core, where a
//! child opens the device files anew and leaves the parent's contexts alone.
//!
//! The child's memory holds copies of the parent's runtimes, CM agents and their locks, but
//! none of their threads. After a fork the child forgets them (they are leaked, never dropped:
//! their drop would join threads the child does not have and hand the parent's slot of the
//! address's group back), so the child's next open of a device starts a runtime of its own
//! with a slot of its own. An inherited object the child drops anyway does nothing to what
//! its parent shares (each records the process that made it). Programs that open devices and
//! fork workers (Python's multiprocessing, rdma-core's pyverbs tests, MPI launchers) rely on
//! this.

use std::sync::Once;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A reset the C ABI adds for its own per-process caches (at most a few).
static HOOKS: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

/// Installs the child handler (once per process); every runtime's start calls it.
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // `in_child` is a static function of this library, which stays loaded for the
        // process's life (the C ABI's libraries are never unloaded before exit).
        // SAFETY: the handler is a valid `extern "C" fn()` for as long as it is registered.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        if rc != 0 {
            log::warn!("pthread_atfork: {rc}: a forked child would share its parent's devices");
        }
    });
}

/// Registers `f` to run in a forked child after the provider has forgotten its runtimes
/// (`ibv_fork_init`-time caches of the C ABI: its per-device rdma_cm contexts).
pub fn on_fork_child(f: extern "C" fn()) {
    for h in &HOOKS {
        if h.compare_exchange(0, f as usize, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return;
        }
    }
    log::warn!("fork: no room for another child hook");
}

/// The process id, for objects to tell whether they are their creator's ([`owned`]).
pub(crate) fn pid() -> u32 {
    std::process::id()
}

/// Whether an object made by process `owner` is this process's (not a forked child's copy).
pub(crate) fn owned(owner: u32) -> bool {
    owner == pid()
}

extern "C" fn in_child() {
    crate::driver::forget_all();
    crate::cm::forget_agents();
    for h in &HOOKS {
        let f = h.load(Ordering::Acquire);
        if f != 0 {
            // Only `on_fork_child` stores into HOOKS, and 0 is never a function.
            // SAFETY: `f` is an `extern "C" fn()` pointer cast to usize, never anything else.
            let f: extern "C" fn() = unsafe { std::mem::transmute::<usize, extern "C" fn()>(f) };
            f();
        }
    }
}
