//! Region memory: the one way ferroce touches the bytes of a registered memory region.
//!
//! A region's bytes are shared with another agent, as DMA memory is shared with a NIC: the
//! runtime copies into and out of them while the program (or, for `reg_mr_raw` memory, C code
//! outside Rust's model) may read and write the same bytes. Plain `copy_nonoverlapping` over
//! such bytes would be a data race in Rust's memory model, and mixing it with `AtomicU64` on
//! the same bytes is forbidden outright. So ferroce uses exactly one access model, here:
//!
//! * **Every access is a relaxed atomic access to the aligned 64-bit words containing it.**
//!   Whole words are loaded or stored with `AtomicU64`; a partial word at either end of a
//!   range is loaded whole (reads) or changed with a compare-exchange loop that rewrites only
//!   the bytes of the range (writes), so a concurrent write to the other bytes of that word is
//!   never lost.
//! * **The 8-byte atomics of RDMA** (`FETCH_ADD`, `CMP_SWP`) are `SeqCst` read-modify-writes
//!   on the same `AtomicU64` words, so they are atomic with respect to every copy.
//! * All accesses have one size (8 bytes) and one alignment, so Miri's data-race and
//!   mixed-size checks accept any interleaving of copies, atomics and program accesses made
//!   through this module (tests below run under `cargo miri test`).
//!
//! What a program may assume: each aligned 8-byte word it reads while the network writes it
//! is either the old or the new value, never a torn word; across words nothing is ordered
//! until a completion (or another synchronising event) says the transfer is done. What it may
//! not assume: that a multi-word message appears all at once, or in any order.
//!
//! Callers guarantee that the whole aligned words containing a range are valid memory (true
//! for any range inside a page, so for every mapping and every allocation aligned to 8).

use std::sync::atomic::{AtomicU64, Ordering};

use ferroce_transport::memory::AtomicOp;

const WORD: usize = 8;

/// The aligned word containing address `p`, and `p`'s offset in it.
fn word_of(p: *mut u8) -> (*mut u64, usize) {
    let off = p.addr() % WORD;
    (p.wrapping_sub(off).cast::<u64>(), off)
}

/// # Safety
/// `w` is an aligned word valid for reads and writes that only this module touches from Rust.
unsafe fn cell<'a>(w: *mut u64) -> &'a AtomicU64 {
    // SAFETY: `w` is 8-aligned and valid (the caller's contract), and every Rust access to it is atomic (this module is the only accessor), which is what `from_ptr` requires.
    unsafe { AtomicU64::from_ptr(w) }
}

/// Copies `dst.len()` bytes starting at `src` out of region memory.
///
/// # Safety
/// `src..src+dst.len()`, widened to whole aligned words, is valid for reads, and every Rust
/// access to it goes through this module.
pub(crate) unsafe fn read(src: *const u8, dst: &mut [u8]) {
    let p = src.cast_mut();
    let head = head_len(p, dst.len());
    let (first, rest) = dst.split_at_mut(head);
    if !first.is_empty() {
        // SAFETY: the word containing `p` is inside the widened range (contract).
        unsafe { read_partial(p, first) };
    }
    let p = p.wrapping_add(head);
    let nwords = rest.len() / WORD;
    let mut words = rest.chunks_exact_mut(WORD);
    let w0 = p.cast::<u64>();
    for (i, chunk) in (&mut words).enumerate() {
        // SAFETY: `p` is 8-aligned here (the head took the rest of its word), and word `i` lies inside the range (contract).
        let v = unsafe { cell(w0.wrapping_add(i)) }.load(Ordering::Relaxed);
        chunk.copy_from_slice(&v.to_ne_bytes());
    }
    let tail = words.into_remainder();
    if !tail.is_empty() {
        // SAFETY: the tail's word is the one after the whole words, inside the widened range.
        unsafe { read_partial(p.wrapping_add(nwords * WORD), tail) };
    }
}

/// Copies `src` into region memory starting at `dst`.
///
/// # Safety
/// `dst..dst+src.len()`, widened to whole aligned words, is valid for reads and writes, and
/// every Rust access to it goes through this module.
pub(crate) unsafe fn write(dst: *mut u8, src: &[u8]) {
    let head = head_len(dst, src.len());
    let (first, rest) = src.split_at(head);
    if !first.is_empty() {
        // SAFETY: the word containing `dst` is inside the widened range (contract).
        unsafe { write_partial(dst, first) };
    }
    let p = dst.wrapping_add(head);
    let nwords = rest.len() / WORD;
    let mut words = rest.chunks_exact(WORD);
    let w0 = p.cast::<u64>();
    for (i, chunk) in (&mut words).enumerate() {
        let mut b = [0u8; WORD];
        b.copy_from_slice(chunk);
        // SAFETY: `p` is 8-aligned here, and word `i` lies inside the range (contract).
        unsafe { cell(w0.wrapping_add(i)) }.store(u64::from_ne_bytes(b), Ordering::Relaxed);
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        // SAFETY: the tail's word is the one after the whole words, inside the widened range.
        unsafe { write_partial(p.wrapping_add(nwords * WORD), tail) };
    }
}

/// How many bytes of a `len`-byte range at `p` lie in `p`'s word before the next boundary
/// (0 when `p` is aligned).
fn head_len(p: *mut u8, len: usize) -> usize {
    ((WORD - p.addr() % WORD) % WORD).min(len)
}

/// Reads `dst.len()` bytes (within one word) at `p`.
///
/// # Safety
/// The aligned word containing `p..p+dst.len()` is valid and reached only through this module.
unsafe fn read_partial(p: *mut u8, dst: &mut [u8]) {
    let (w, off) = word_of(p);
    // SAFETY: the caller's contract is `cell`'s for that word.
    let bytes = unsafe { cell(w) }.load(Ordering::Relaxed).to_ne_bytes();
    dst.copy_from_slice(&bytes[off..off + dst.len()]);
}

/// Writes `src` (within one word) at `p`, leaving the word's other bytes as they are: a
/// concurrent change to them makes the exchange fail and the merge run again on the new value.
///
/// # Safety
/// As [`read_partial`], and the word is valid for writes.
unsafe fn write_partial(p: *mut u8, src: &[u8]) {
    let (w, off) = word_of(p);
    // SAFETY: the caller's contract is `cell`'s for that word.
    let a = unsafe { cell(w) };
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
        let mut b = old.to_ne_bytes();
        b[off..off + src.len()].copy_from_slice(src);
        Some(u64::from_ne_bytes(b))
    });
}

/// An RDMA atomic on the aligned word at `w`; returns the original value.
///
/// # Safety
/// `w` is 8-aligned, valid for reads and writes, and every Rust access to it goes through
/// this module.
pub(crate) unsafe fn atomic(w: *mut u64, op: AtomicOp) -> u64 {
    // SAFETY: the caller's contract is `cell`'s.
    let a = unsafe { cell(w) };
    match op {
        AtomicOp::FetchAdd { add } => a.fetch_add(add, Ordering::SeqCst),
        AtomicOp::CompareSwap { compare, swap } => {
            match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            }
        }
    }
}

/// Stores the aligned word at `w` at once (an ATOMIC WRITE): `SeqCst`, so it is ordered
/// after every earlier copy and atomic of this thread, as IBTA 1.5 orders it after every
/// earlier request.
///
/// # Safety
/// As [`atomic`].
pub(crate) unsafe fn store_word(w: *mut u64, value: u64) {
    // SAFETY: the caller's contract is `cell`'s.
    unsafe { cell(w) }.store(value, Ordering::SeqCst)
}

/// Reads the aligned word at `w` (`SeqCst`, to see remote atomics in order).
///
/// # Safety
/// As [`atomic`].
pub(crate) unsafe fn load_word(w: *mut u64) -> u64 {
    // SAFETY: the caller's contract is `cell`'s.
    unsafe { cell(w) }.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Region-like memory: 8-aligned words, reached only through this module.
    fn region(words: usize) -> Vec<u64> {
        vec![0u64; words]
    }

    #[test]
    fn copies_round_trip_at_every_offset_and_length() {
        let mut mem = region(8);
        let base = mem.as_mut_ptr().cast::<u8>();
        for off in 0..24 {
            for len in 0..(64 - off).min(30) {
                let data: Vec<u8> = (0..len).map(|i| (i * 7 + off + 1) as u8).collect();
                // SAFETY: off+len <= 64 bytes, inside the 8 words of `mem`.
                unsafe { write(base.add(off), &data) };
                let mut back = vec![0u8; len];
                // SAFETY: off+len <= 64 bytes, inside the 8 words of `mem`.
                unsafe { read(base.add(off), &mut back) };
                assert_eq!(back, data, "off {off} len {len}");
            }
        }
    }

    #[test]
    fn partial_word_writes_leave_neighbours_alone() {
        let mut mem = region(2);
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: 16 bytes inside `mem`.
        unsafe { write(base, &[0xAA; 16]) };
        // SAFETY: bytes 3..6, inside `mem`.
        unsafe { write(base.add(3), &[1, 2, 3]) };
        let mut all = [0u8; 16];
        // SAFETY: inside `mem`.
        unsafe { read(base, &mut all) };
        let mut want = [0xAA; 16];
        want[3..6].copy_from_slice(&[1, 2, 3]);
        assert_eq!(all, want);
    }

    #[test]
    fn atomics_and_copies_share_words() {
        let mut mem = region(1);
        let w = mem.as_mut_ptr();
        // SAFETY: `w` is the one aligned word of `mem`.
        unsafe {
            assert_eq!(atomic(w, AtomicOp::FetchAdd { add: 5 }), 0);
            assert_eq!(
                atomic(
                    w,
                    AtomicOp::CompareSwap {
                        compare: 5,
                        swap: 9
                    }
                ),
                5
            );
            assert_eq!(load_word(w), 9);
            let mut b = [0u8; 8];
            read(w.cast(), &mut b);
            assert_eq!(u64::from_ne_bytes(b), 9);
        }
    }

    /// The pattern of a live region: the runtime writes a message and runs remote atomics while
    /// the program reads and writes the same words on another thread. Under Miri this is the
    /// check that no interleaving is a data race or a mixed-size access.
    #[test]
    fn concurrent_copies_and_atomics_are_race_free() {
        let mut mem = region(4);
        let base = mem.as_mut_ptr() as usize;
        let rounds = if cfg!(miri) { 20 } else { 2000 };
        std::thread::scope(|s| {
            s.spawn(move || {
                let p = base as *mut u8;
                for i in 0..rounds {
                    let data = [i as u8; 13];
                    // SAFETY: bytes 3..16 of the 32-byte `mem`, alive for the scope.
                    unsafe { write(p.add(3), &data) };
                    // SAFETY: word 3 of `mem`.
                    unsafe { atomic(p.add(24).cast(), AtomicOp::FetchAdd { add: 1 }) };
                }
            });
            s.spawn(move || {
                let p = base as *mut u8;
                let mut buf = [0u8; 32];
                for i in 0..rounds {
                    // SAFETY: the whole of `mem`, alive for the scope.
                    unsafe { read(p, &mut buf) };
                    // SAFETY: bytes 17..20 of `mem`.
                    unsafe { write(p.add(17), &[i as u8; 3]) };
                }
            });
        });
        // SAFETY: bytes 24..32 are the 8-aligned word 3 of the live 32-byte `mem`, and the scope has joined both threads, so nothing else touches it.
        let counted = unsafe { load_word((base as *mut u8).add(24).cast()) };
        assert_eq!(counted, rounds);
        let mut out = [0u8; 32];
        // SAFETY: the whole of `mem`.
        unsafe { read(base as *const u8, &mut out) };
        assert!(
            out[3..16].iter().all(|&b| b == out[3]),
            "a write was torn: {out:?}"
        );
    }
}
