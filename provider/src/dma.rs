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
//! * **Bulk copies** (x86-64, outside Miri) move 64-byte blocks with aligned 16-byte SSE2
//!   loads and stores written in inline assembly ([`bulk`]), about twice as fast as the word
//!   loop, which LLVM cannot widen because each word is an atomic. An aligned 16-byte access
//!   is carried out as one access (processors with AVX guarantee it) or as two aligned 8-byte
//!   accesses, each of which is single-copy atomic (Intel SDM vol. 3A, "Guaranteed Atomic
//!   Operations"; the same holds on AMD64), so a block copy is, to every other agent, a
//!   sequence of relaxed 8-byte atomic accesses to the same words in some order: the model
//!   above, not a weaker one. The assembly is opaque to the compiler, which therefore assumes
//!   it may touch any memory it is given. Miri and other targets run the word loop, and the
//!   tests check the two byte for byte.
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
    // SAFETY: `src..src+dst.len()`, widened to whole aligned words, is valid for reads and reached by Rust only through this module (this function's contract), as `read_with` requires.
    unsafe { read_with(src, dst, BULK) }
}

/// [`read`], with the block path (`bulk`) or the word loop only.
///
/// # Safety
/// As [`read`].
unsafe fn read_with(src: *const u8, dst: &mut [u8], bulk: bool) {
    let p = src.cast_mut();
    let head = head_len(p, dst.len());
    let (first, rest) = dst.split_at_mut(head);
    if !first.is_empty() {
        // SAFETY: the word containing `p` is inside the widened range (contract).
        unsafe { read_partial(p, first) };
    }
    let p = p.wrapping_add(head);
    let whole = rest.len() - rest.len() % WORD;
    let (words, tail) = rest.split_at_mut(whole);
    // SAFETY: `p` is 8-aligned here (the head took the rest of its word) and `p..p+whole` lies inside the range (contract).
    unsafe { load_words(p, words, bulk) };
    if !tail.is_empty() {
        // SAFETY: `p + whole` is the start of the tail, whose bytes lie in the one aligned word after the whole words; that word is inside the caller's range widened to whole words, valid for reads and reached only through this module.
        unsafe { read_partial(p.wrapping_add(whole), tail) };
    }
}

/// Copies `src` into region memory starting at `dst`.
///
/// # Safety
/// `dst..dst+src.len()`, widened to whole aligned words, is valid for reads and writes, and
/// every Rust access to it goes through this module.
pub(crate) unsafe fn write(dst: *mut u8, src: &[u8]) {
    // SAFETY: `dst..dst+src.len()`, widened to whole aligned words, is valid for reads and writes and reached by Rust only through this module (this function's contract), as `write_with` requires.
    unsafe { write_with(dst, src, BULK) }
}

/// [`write`], with the block path (`bulk`) or the word loop only.
///
/// # Safety
/// As [`write`].
unsafe fn write_with(dst: *mut u8, src: &[u8], bulk: bool) {
    let head = head_len(dst, src.len());
    let (first, rest) = src.split_at(head);
    if !first.is_empty() {
        // SAFETY: the word containing `dst` is inside the widened range (contract).
        unsafe { write_partial(dst, first) };
    }
    let p = dst.wrapping_add(head);
    let whole = rest.len() - rest.len() % WORD;
    let (words, tail) = rest.split_at(whole);
    // SAFETY: `p` is 8-aligned (the head took the rest of its word) and `p..p+whole` lies inside the range (contract).
    unsafe { store_words(p, words, bulk) };
    if !tail.is_empty() {
        // SAFETY: the tail's word is the one after the whole words, inside the widened range.
        unsafe { write_partial(p.wrapping_add(whole), tail) };
    }
}

/// For `benches/dma.rs`: copies `data` into `mem` (memory of this caller's own, so no other
/// agent) at byte `off`, through the block path if `bulk`, else the word loop alone. Panics
/// if the range does not fit.
#[doc(hidden)]
pub fn bench_write(mem: &mut [u64], off: usize, data: &[u8], bulk: bool) {
    assert!(off + data.len() <= mem.len() * WORD, "outside the buffer");
    // SAFETY: the range lies inside `mem` (checked), which is 8-aligned and borrowed exclusively for the call.
    unsafe { write_with(mem.as_mut_ptr().cast::<u8>().add(off), data, bulk) }
}

/// For `benches/dma.rs`: copies `out.len()` bytes of `mem` at byte `off` out, as
/// [`bench_write`] copies in. Panics if the range does not fit.
#[doc(hidden)]
pub fn bench_read(mem: &mut [u64], off: usize, out: &mut [u8], bulk: bool) {
    assert!(off + out.len() <= mem.len() * WORD, "outside the buffer");
    // SAFETY: as in bench_write.
    unsafe { read_with(mem.as_mut_ptr().cast::<u8>().add(off), out, bulk) }
}

/// Whether [`read`] and [`write`] take the block path ([`bulk`]) for long ranges.
const BULK: bool = cfg!(all(target_arch = "x86_64", not(miri)));

/// Stores whole words: `src.len()` is a multiple of 8, in blocks where `bulk` allows and the
/// block path exists, the rest a relaxed atomic word at a time.
///
/// # Safety
/// `p` is 8-aligned, `p..p+src.len()` is valid for writes, and every Rust access to it goes
/// through this module.
unsafe fn store_words(p: *mut u8, src: &[u8], bulk: bool) {
    let done = if bulk {
        // SAFETY: `p` is 8-aligned and `p..p+src.len()` is valid for writes and reached by Rust only through this module (this function's contract), which is what `bulk::store` requires.
        unsafe { bulk::store(p, src) }
    } else {
        0
    };
    let w0 = p.wrapping_add(done).cast::<u64>();
    for (i, chunk) in src[done..].chunks_exact(WORD).enumerate() {
        let mut b = [0u8; WORD];
        b.copy_from_slice(chunk);
        // SAFETY: `p + done` is 8-aligned (`done` is a multiple of 8), and word `i` lies inside the range (contract).
        unsafe { cell(w0.wrapping_add(i)) }.store(u64::from_ne_bytes(b), Ordering::Relaxed);
    }
}

/// Loads whole words into `dst` (`dst.len()` a multiple of 8), as [`store_words`] stores them.
///
/// # Safety
/// `p` is 8-aligned, `p..p+dst.len()` is valid for reads, and every Rust access to it goes
/// through this module.
unsafe fn load_words(p: *const u8, dst: &mut [u8], bulk: bool) {
    let done = if bulk {
        // SAFETY: `p` is 8-aligned and `p..p+dst.len()` is valid for reads and reached by Rust only through this module (this function's contract), which is what `bulk::load` requires.
        unsafe { bulk::load(p, dst) }
    } else {
        0
    };
    let w0 = p.wrapping_add(done).cast_mut().cast::<u64>();
    for (i, chunk) in dst[done..].chunks_exact_mut(WORD).enumerate() {
        // SAFETY: `p + done` is 8-aligned, and word `i` lies inside the range (contract).
        let v = unsafe { cell(w0.wrapping_add(i)) }.load(Ordering::Relaxed);
        chunk.copy_from_slice(&v.to_ne_bytes());
    }
}

/// The block path: 64-byte blocks through aligned 16-byte SSE2 accesses on the region's side.
#[cfg(all(target_arch = "x86_64", not(miri)))]
mod bulk {
    /// Below this many bytes the word loop is as fast (and aligning costs a word).
    const MIN: usize = 128;
    const BLOCK: usize = 64;

    /// Copies `$n` (at least 1) 64-byte blocks from `$s` to `$d`, loading with `$ld` and
    /// storing with `$st` (`movdqa` on the region's side, which is 16-aligned; `movdqu` on the
    /// caller's buffer).
    macro_rules! blocks {
        ($ld:literal, $st:literal, $s:expr, $d:expr, $n:expr) => {
            std::arch::asm!(
                "2:",
                concat!($ld, " {a}, [{s}]"),
                concat!($ld, " {b}, [{s} + 16]"),
                concat!($ld, " {c}, [{s} + 32]"),
                concat!($ld, " {e}, [{s} + 48]"),
                concat!($st, " [{d}], {a}"),
                concat!($st, " [{d} + 16], {b}"),
                concat!($st, " [{d} + 32], {c}"),
                concat!($st, " [{d} + 48], {e}"),
                "add {s}, 64",
                "add {d}, 64",
                "dec {n}",
                "jnz 2b",
                s = inout(reg) $s => _,
                d = inout(reg) $d => _,
                n = inout(reg) $n => _,
                a = out(xmm_reg) _,
                b = out(xmm_reg) _,
                c = out(xmm_reg) _,
                e = out(xmm_reg) _,
                options(nostack),
            )
        };
    }

    /// How a range of at least [`MIN`] bytes at `p` splits: the bytes before `p`'s next
    /// 16-byte boundary (0 or 8: `p` is 8-aligned) and the whole blocks after them (at least
    /// one). `None` for a shorter range.
    fn split(p: usize, len: usize) -> Option<(usize, usize)> {
        if len < MIN {
            return None;
        }
        let lead = p % 16;
        Some((lead, (len - lead) / BLOCK))
    }

    /// Stores the leading 16-aligned blocks of `src` at `p` (after one word that aligns `p`
    /// to 16, if needed); returns how many bytes were stored, a multiple of 8.
    ///
    /// # Safety
    /// `p` is 8-aligned, `p..p+src.len()` is valid for writes, and every Rust access to it goes
    /// through `dma`.
    pub(super) unsafe fn store(p: *mut u8, src: &[u8]) -> usize {
        let Some((lead, blocks)) = split(p.addr(), src.len()) else {
            return 0;
        };
        // SAFETY: `lead` is 0 or 8 and inside the range (contract); `src` has at least MIN bytes.
        unsafe { super::store_words(p, &src[..lead], false) };
        let d = p.wrapping_add(lead);
        let s = src[lead..].as_ptr();
        // SAFETY: `d` is 16-aligned and `d..d+blocks*64` lies inside the caller's range, valid for writes; `s..s+blocks*64` lies inside `src`; `blocks` >= 1 (split). Each MOVDQA store is one aligned 16-byte access or two aligned 8-byte ones, each single-copy atomic, so to other threads the loop is relaxed 8-byte atomic stores to words that Rust reaches only atomically (this module's model); the compiler treats the block as touching memory (no `nomem`/`readonly`).
        unsafe { blocks!("movdqu", "movdqa", s, d, blocks) };
        lead + blocks * BLOCK
    }

    /// Loads the leading blocks at `p` into `dst`, as [`store`] stores them; returns how many
    /// bytes were loaded.
    ///
    /// # Safety
    /// `p` is 8-aligned, `p..p+dst.len()` is valid for reads, and every Rust access to it goes
    /// through `dma`.
    pub(super) unsafe fn load(p: *const u8, dst: &mut [u8]) -> usize {
        let Some((lead, blocks)) = split(p.addr(), dst.len()) else {
            return 0;
        };
        // SAFETY: `lead` is 0 or 8 and inside the range (contract); `dst` has at least MIN bytes.
        unsafe { super::load_words(p, &mut dst[..lead], false) };
        let s = p.wrapping_add(lead);
        let d = dst[lead..].as_mut_ptr();
        // SAFETY: `s` is 16-aligned and `s..s+blocks*64` lies inside the caller's range, valid for reads; `d..d+blocks*64` lies inside `dst`, which this function borrows mutably; `blocks` >= 1 (split). Each MOVDQA load is one aligned 16-byte access or two aligned 8-byte ones, each single-copy atomic: relaxed 8-byte atomic loads, as in this module's model.
        unsafe { blocks!("movdqa", "movdqu", s, d, blocks) };
        lead + blocks * BLOCK
    }
}

/// Where the block path does not exist (other targets, Miri) every copy is the word loop.
#[cfg(not(all(target_arch = "x86_64", not(miri))))]
mod bulk {
    /// Stores nothing: the word loop does it all.
    ///
    /// # Safety
    /// None beyond [`super::store_words`]'s (nothing is touched).
    pub(super) unsafe fn store(_p: *mut u8, _src: &[u8]) -> usize {
        0
    }

    /// Loads nothing: the word loop does it all.
    ///
    /// # Safety
    /// None beyond [`super::load_words`]'s (nothing is touched).
    pub(super) unsafe fn load(_p: *const u8, _dst: &mut [u8]) -> usize {
        0
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
    use proptest::prelude::*;

    /// A region of `n` bytes (whole words) whose byte `i` is `fill ^ i`.
    fn patterned(n: usize, fill: u8) -> Vec<u64> {
        let mut v = region(n / 8);
        let p = v.as_mut_ptr().cast::<u8>();
        let bytes: Vec<u8> = (0..n).map(|i| fill ^ i as u8).collect();
        // SAFETY: `n` bytes inside `v`, word loop only.
        unsafe { write_with(p, &bytes, false) };
        v
    }

    fn bytes_of(v: &mut [u64]) -> Vec<u8> {
        let mut out = vec![0u8; v.len() * 8];
        // SAFETY: the whole of `v`, word loop only.
        unsafe { read_with(v.as_mut_ptr().cast(), &mut out, false) };
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The block path writes exactly what the word loop writes, and nothing around it,
        /// at any offset and length (both sides of the 128-byte threshold, any alignment).
        /// Not under Miri, which has no block path (and proptest needs the file system).
        #[test]
        #[cfg_attr(miri, ignore)]
        fn block_writes_match_the_word_loop(off in 0usize..80, len in 0usize..1400, fill: u8, seed: u8) {
            let n = 1600;
            let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
            let mut fast = patterned(n, fill);
            let mut slow = patterned(n, fill);
            // SAFETY: off + len < 1600 bytes, inside both regions.
            unsafe {
                write_with(fast.as_mut_ptr().cast::<u8>().add(off), &data, true);
                write_with(slow.as_mut_ptr().cast::<u8>().add(off), &data, false);
            }
            prop_assert_eq!(bytes_of(&mut fast), bytes_of(&mut slow));
        }

        /// The block path reads exactly the bytes the word loop reads.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn block_reads_match_the_word_loop(off in 0usize..80, len in 0usize..1400, fill: u8) {
            let mut mem = patterned(1600, fill);
            let p = mem.as_mut_ptr().cast::<u8>();
            let mut fast = vec![0u8; len];
            let mut slow = vec![0xEEu8; len];
            // SAFETY: off + len < 1600 bytes, inside `mem`.
            unsafe {
                read_with(p.add(off), &mut fast, true);
                read_with(p.add(off), &mut slow, false);
            }
            prop_assert_eq!(&fast, &slow);
            let want: Vec<u8> = (off..off + len).map(|i| fill ^ i as u8).collect();
            prop_assert_eq!(fast, want);
        }
    }

    /// Block copies racing each other never tear an aligned word: a writer fills 1 KiB with
    /// words whose 8 bytes are all equal, a reader checks every word it reads is one of them.
    #[test]
    fn block_copies_never_tear_a_word() {
        let mut mem = region(160);
        let base = mem.as_mut_ptr() as usize;
        let rounds = if cfg!(miri) { 3 } else { 20_000 };
        std::thread::scope(|s| {
            s.spawn(move || {
                for i in 0..rounds {
                    let data = [(i % 251) as u8; 1024];
                    // SAFETY: bytes 8..1032 of the 1280-byte `mem`, alive for the scope.
                    unsafe { write((base as *mut u8).add(8), &data) };
                }
            });
            s.spawn(move || {
                let mut buf = [0u8; 1024];
                for _ in 0..rounds {
                    // SAFETY: bytes 8..1032 of `mem`, alive for the scope.
                    unsafe { read((base as *const u8).add(8), &mut buf) };
                    for w in buf.chunks_exact(8) {
                        assert!(w.iter().all(|&b| b == w[0]), "a torn word: {w:?}");
                    }
                }
            });
        });
    }

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
