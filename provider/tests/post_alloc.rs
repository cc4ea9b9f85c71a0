//! Posting allocates nothing: `post_send` and `post_recv` of ordinary work requests (a few
//! SGEs, short inline data), including the datagrams they send from the caller's thread, make
//! no heap allocation once the queues have reached their working size.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use common::{ALL, pair, wait};
use ferroce::transport::{Mtu, QpType, RecvWr, SendFlags, SendWr, WcStatus, WrOpcode};

/// Counts the allocations of the thread that armed it.
struct Counting;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; the thread-locals touched are const-initialised `Cell`s, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ARMED.with(Cell::get) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        // SAFETY: the caller's layout contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above, i.e. from the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ARMED.with(Cell::get) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        // SAFETY: as for `alloc` and `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    COUNT.with(|c| c.set(0));
    ARMED.with(|a| a.set(true));
    f();
    ARMED.with(|a| a.set(false));
    COUNT.with(Cell::get)
}

#[test]
fn posting_sends_and_receives_allocates_nothing() {
    let _ = ALL;
    let (a, b) = pair(
        [127, 61, 0, 1],
        [127, 61, 0, 2],
        QpType::Rc,
        Mtu::Mtu1024,
        1 << 16,
    );
    let write = |i: u64| {
        let mut w = SendWr::write(i, a.mr.sge(0, 2048), b.mr.remote().at((i % 16) * 2048));
        // Two SGEs, still in place.
        w.sg_list = [a.mr.sge(0, 1024), a.mr.sge(4096, 1024)].into();
        w
    };
    let send_inline = |i: u64| {
        let mut w = SendWr::send(i, a.mr.sge(8192, 64)).with_flags(SendFlags::INLINE);
        w.opcode = WrOpcode::Send;
        w
    };
    let recv = |i: u64| RecvWr::new(i, b.mr.sge(16384, 4096));
    // Warm-up: queues, CQs, heaps and batches grow to their working size.
    for round in 0..3u64 {
        for i in 0..32 {
            b.qp.post_recv(&recv(i)).unwrap();
            a.qp.post_send(&write(round * 100 + i)).unwrap();
            a.qp.post_send(&send_inline(round * 100 + 50 + i)).unwrap();
        }
        let done = wait(&a.cq, 64, Duration::from_secs(20));
        assert_eq!(done.len(), 64);
        assert!(done.iter().all(|c| c.status == WcStatus::Success));
        assert_eq!(wait(&b.cq, 32, Duration::from_secs(20)).len(), 32);
    }
    // Three measured rounds. A per-WR allocation shows in every round (at least one per
    // post); a queue or heap that still grows to its working size allocates once, not per WR.
    let mut rounds = Vec::new();
    for round in 0..3u64 {
        let n = allocations(|| {
            for i in 0..32 {
                b.qp.post_recv(&recv(i)).unwrap();
                a.qp.post_send(&write(1000 * (round + 1) + i)).unwrap();
                a.qp.post_send(&send_inline(1000 * (round + 1) + 500 + i))
                    .unwrap();
            }
        });
        let done = wait(&a.cq, 64, Duration::from_secs(20));
        assert!(done.iter().all(|c| c.status == WcStatus::Success));
        assert_eq!(done.len(), 64);
        assert_eq!(wait(&b.cq, 32, Duration::from_secs(20)).len(), 32);
        rounds.push(n);
    }
    assert!(
        rounds.contains(&0) && rounds.iter().sum::<u64>() < 96,
        "allocations in three rounds of 96 posts (32 receives, 32 two-SGE WRITEs, 32 inline \
         SENDs): {rounds:?}"
    );
}
