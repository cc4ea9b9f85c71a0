//! How a verbs object lives in memory, and the rules for touching it.
//!
//! Every object the program holds (`ibv_pd`, `ibv_cq`, `ibv_qp`, ...) is the first field of a
//! `#[repr(C)]` box [`Obj<C, R>`]: the C struct `C`, which the program reads and writes (and
//! which ferroce updates from other threads: `ibv_qp.state`, the event counters), followed by
//! the Rust state `R`. The rules, which make every access sound in Rust's model:
//!
//! * No reference ever covers the C struct: it is reached only through the raw pointer the
//!   program passed, with plain reads of fields nobody writes after creation and atomic
//!   accesses ([`atomic_u32`], [`atomic_i32`]) for the fields that change.
//! * The Rust state is reached by projecting to it from that raw pointer ([`Obj::rust`]), never
//!   through a reference to the whole box; it is `Sync` and changes only behind its own locks
//!   and atomics.
//! * The box is freed ([`Obj::free`]) from the raw pointer too, only after the object is out of
//!   every table that could hand it to another thread and every event reported for it has been
//!   acknowledged ([`EventAcks`]), as rdma-core's destroy calls wait.

use core::cell::UnsafeCell;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use parking_lot::{Condvar, Mutex};

/// A verbs object: the C struct the program holds, then ferroce's state for it.
#[repr(C)]
pub struct Obj<C, R> {
    /// What the program sees; written by the program and by other threads, so only ever
    /// reached through raw pointers.
    c: UnsafeCell<C>,
    /// ferroce's state.
    rust: R,
}

impl<C, R> Obj<C, R> {
    /// Boxes the object and hands out the pointer the program holds (its C struct).
    pub fn into_raw(c: C, rust: R) -> *mut C {
        // `c` is the first field of a repr(C) struct and UnsafeCell is repr(transparent), so
        // the box's address is the C struct's.
        Box::into_raw(Box::new(Obj {
            c: UnsafeCell::new(c),
            rust,
        }))
        .cast()
    }

    /// The Rust state of the object whose C struct is at `p`.
    ///
    /// # Safety
    /// `p` was returned by [`Obj::into_raw`] for this `C` and `R` and is not freed during `'a`.
    pub unsafe fn rust<'a>(p: *const C) -> &'a R {
        // SAFETY: `p` points at the start of a live Obj<C, R> (the caller's contract); the place projection reaches the `rust` field without forming a reference to the box, so the C struct, which other threads write, is not covered by it.
        unsafe { &(*p.cast::<Obj<C, R>>()).rust }
    }

    /// Frees the object whose C struct is at `p`.
    ///
    /// # Safety
    /// `p` was returned by [`Obj::into_raw`] for this `C` and `R`, and no thread uses it or a
    /// reference from [`Obj::rust`] any more (it is out of every table; its events are acked).
    pub unsafe fn free(p: *mut C) {
        // SAFETY: the box was leaked by into_raw with this type, and this is its last use.
        drop(unsafe { Box::from_raw(p.cast::<Obj<C, R>>()) });
    }
}

/// An atomic view of a `u32` field of a C struct that several threads update.
///
/// # Safety
/// `f` is an aligned field of a live object that is accessed only atomically while others may.
pub unsafe fn atomic_u32<'a>(f: *mut u32) -> &'a AtomicU32 {
    // SAFETY: the caller's contract is exactly `from_ptr`'s.
    unsafe { AtomicU32::from_ptr(f) }
}

/// An atomic view of an `i32` field of a C struct that several threads update.
///
/// # Safety
/// As [`atomic_u32`].
pub unsafe fn atomic_i32<'a>(f: *mut i32) -> &'a AtomicI32 {
    // SAFETY: the caller's contract is exactly `from_ptr`'s.
    unsafe { AtomicI32::from_ptr(f) }
}

/// The events handed to the program for one object and how many it acknowledged: what
/// `ibv_destroy_qp`/`_srq`/`_cq` wait on, as rdma-core's `events_completed` counters are.
#[derive(Debug, Default)]
pub struct EventAcks {
    /// (reported, acknowledged)
    counts: Mutex<(u64, u64)>,
    cond: Condvar,
}

impl EventAcks {
    /// One more event of the object was handed to the program.
    pub fn reported(&self) {
        self.counts.lock().0 += 1;
    }

    /// The program acknowledged `n` events; returns the acknowledged total (for the C field).
    pub fn acked(&self, n: u32) -> u64 {
        let mut c = self.counts.lock();
        c.1 += u64::from(n);
        self.cond.notify_all();
        c.1
    }

    /// Waits until every reported event has been acknowledged. The caller has already made
    /// sure no new event can be reported (the object is out of the lookup tables).
    pub fn wait_all_acked(&self) {
        let mut c = self.counts.lock();
        while c.1 < c.0 {
            self.cond.wait(&mut c);
        }
    }

    /// Whether events are waiting for acknowledgement.
    pub fn pending(&self) -> bool {
        let c = self.counts.lock();
        c.1 < c.0
    }
}

/// Stores `v` into a C counter field with the atomic view (the program may read it).
///
/// # Safety
/// As [`atomic_u32`].
pub unsafe fn publish_u32(f: *mut u32, v: u64) {
    // SAFETY: `f` is an aligned field of a live object, accessed only atomically (this function's contract is atomic_u32's).
    unsafe { atomic_u32(f) }.store(v as u32, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A C face shaped like `ibv_qp`'s head: a field another thread updates atomically.
    #[repr(C)]
    struct Face {
        handle: u32,
        state: i32,
        events_completed: u32,
    }

    struct State {
        name: String,
        acks: EventAcks,
    }

    /// The lifecycle of an object as ibverbs runs it, under Miri: create; one thread publishes
    /// the C state atomically while another reads the Rust state; an event is reported and
    /// acknowledged on one thread while another destroys (which waits for the ack); free.
    #[test]
    fn lifecycle_with_concurrent_c_writes_and_event_acks() {
        let p = Obj::into_raw(
            Face {
                handle: 7,
                state: 0,
                events_completed: 0,
            },
            State {
                name: "qp".into(),
                acks: EventAcks::default(),
            },
        );
        let addr = p as usize;
        // SAFETY: p is live until free below, after both threads are joined.
        let r = unsafe { Obj::<Face, State>::rust(p) };
        r.acks.reported();
        std::thread::scope(|s| {
            s.spawn(move || {
                let p = addr as *mut Face;
                for st in 1..=3 {
                    // SAFETY: `state` is an aligned i32 of the live object, written only atomically.
                    unsafe { atomic_i32(&raw mut (*p).state) }.store(st, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(5));
                // SAFETY: `p` is live until free (after the scope); the Rust state never covers the C face.
                let n = unsafe { Obj::<Face, State>::rust(p) }.acks.acked(1);
                // SAFETY: `events_completed` is an aligned u32 of the live object, written only atomically.
                unsafe { publish_u32(&raw mut (*p).events_completed, n) };
            });
            s.spawn(move || {
                let p = addr as *mut Face;
                // SAFETY: live; the Rust state is Sync and never covers the C face.
                let r = unsafe { Obj::<Face, State>::rust(p) };
                assert_eq!(r.name, "qp");
                // SAFETY: `handle` is never written after creation.
                assert_eq!(unsafe { (*p).handle }, 7);
                r.acks.wait_all_acked();
                // SAFETY: the ack is published before `acked` returned's value is stored; read atomically as it is written.
                let st = unsafe { atomic_i32(&raw mut (*p).state) }.load(Ordering::SeqCst);
                assert!((0..=3).contains(&st));
            });
        });
        assert!(!r.acks.pending());
        // SAFETY: both threads are done; nothing else holds p.
        unsafe { Obj::<Face, State>::free(p) };
    }

    /// The context's pattern, under Miri: the program holds a pointer to a field inside the
    /// C struct (the `ibv_context` at the end of `verbs_context`); ferroce gets back to the
    /// box from it by pointer arithmetic, reads the Rust state, and frees it ("close").
    #[test]
    fn interior_pointer_round_trip_and_close() {
        #[repr(C)]
        struct Outer {
            head: [u64; 3],
            inner: Face,
        }
        let p = Obj::into_raw(
            Outer {
                head: [1, 2, 3],
                inner: Face {
                    handle: 9,
                    state: 0,
                    events_completed: 0,
                },
            },
            State {
                name: "ctx".into(),
                acks: EventAcks::default(),
            },
        );
        // SAFETY: p is live; raw projection keeps the box's provenance.
        let inner = unsafe { &raw mut (*p).inner };
        let back = inner
            .wrapping_byte_sub(core::mem::offset_of!(Outer, inner))
            .cast::<Outer>();
        assert_eq!(back, p);
        // SAFETY: `back` is the live box's C struct.
        assert_eq!(unsafe { Obj::<Outer, State>::rust(back) }.name, "ctx");
        // SAFETY: fields of the live object, written only at creation.
        assert_eq!(unsafe { ((*back).head[2], (*inner).handle) }, (3, 9));
        // SAFETY: nothing else holds the object.
        unsafe { Obj::<Outer, State>::free(back) };
    }
}
