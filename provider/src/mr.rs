//! Memory regions (`ibv_mr`) and the key table the runtime reaches them through.
//!
//! A region's bytes are shared with the network the way a NIC shares DMA memory: the runtime
//! copies into and out of them whenever the transport says so (a remote WRITE arriving, a
//! SEND going out, a READ being answered). See the crate docs for the contract this puts on
//! programs; region bytes are touched only through [`crate::dma`], the one access model.
//!
//! # Keys
//! An lkey/rkey is 32 bits from the operating system's random source (`getrandom(2)`), drawn
//! again if it is 0, a live key of the device, or one of the last [`QUARANTINE`] keys freed, so
//! a peer that has seen any number of keys learns nothing about the others (a blind guess hits
//! a live key with probability `live / 2^32`: 2^-32 for one region), and a peer still holding a
//! freed key cannot reach a region registered after it. The lookup is a hash-table probe, O(1).
//!
//! # Lookups without a lock
//! The table's lock guards registration; the data path reads none. Each change publishes a new
//! immutable [`Regions`] (copy on write, one of [`BUCKETS`] buckets copied) and bumps the
//! table's version; each shard keeps its own [`Snapshot`], checks the version (one atomic load)
//! whenever it runs the engine and takes the new regions if it moved. A deregistration passes
//! every shard's lock and renews its snapshot there ([`crate::driver`]'s `copy_barrier`), so
//! when `ibv_dereg_mr` returns no shard holds the region. Windows, rare and changed by the
//! engine itself (`BIND_MW`, invalidation), stay under the lock: a key the snapshot does not
//! hold is looked for among them.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ferroce_transport::AccessFlags;
use ferroce_transport::memory::{AtomicOp, MemError, Memory};
use parking_lot::RwLock;

use crate::dma;

/// Where a region's bytes come from.
enum Backing {
    /// An anonymous mapping ferroce owns (kept to unmap on drop).
    Owned { _map: memmap2::MmapMut },
    /// Caller memory registered with [`crate::ProtectionDomain::reg_mr_raw`].
    Foreign,
    /// The same bytes as a region re-registered with a new PD or access (`ibv_rereg_mr`),
    /// kept alive through it.
    Kept { _prev: Arc<MrInner> },
    /// The whole address space (implicit on-demand paging): no bytes of its own; each access
    /// first has the kernel fault in the pages it names, with the rights it needs.
    Implicit,
}

/// The shared part of a memory region.
pub(crate) struct MrInner {
    pub(crate) pd: u32,
    pub(crate) lkey: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: AccessFlags,
    ptr: *mut u8,
    /// An implicit region: `addr` is 0, `len` the whole address space, `ptr` unused; byte
    /// `a` of it is the process's address `a`.
    pub(crate) implicit: bool,
    _backing: Backing,
}

// SAFETY: `ptr` is the only non-Send field. The bytes it points to are reached only through `dma`, whose every access is atomic, so using them from any thread is race-free; the pointer stays valid while the MrInner lives (an owned mapping is dropped with it; foreign memory is kept valid until deregistration by `reg_mr_raw`'s caller).
unsafe impl Send for MrInner {}
// SAFETY: every method takes &self and touches the bytes only through `dma` (atomic accesses), so shared use from several threads cannot race; the other fields are immutable.
unsafe impl Sync for MrInner {}

impl fmt::Debug for MrInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("access", &self.access)
            .finish()
    }
}

impl MrInner {
    /// A region over a fresh zeroed anonymous mapping of `len` bytes (at least one page),
    /// backed by 2 MiB huge pages if `huge` (the mapping is rounded up to whole huge pages).
    pub(crate) fn owned(
        pd: u32,
        len: usize,
        access: AccessFlags,
        huge: bool,
    ) -> std::io::Result<MrInner> {
        let mut opts = memmap2::MmapOptions::new();
        if huge {
            opts.huge(Some(21))
                .len(len.max(1).next_multiple_of(2 << 20));
        } else {
            opts.len(len.max(1));
        }
        let mut map = opts.map_anon()?;
        let ptr = map.as_mut_ptr();
        Ok(MrInner {
            pd,
            lkey: 0,
            addr: ptr as u64,
            len: len as u64,
            access,
            ptr,
            implicit: false,
            _backing: Backing::Owned { _map: map },
        })
    }

    /// A region over caller memory (its key is set by [`MrTable::register`]).
    ///
    /// # Safety
    /// `ptr..ptr+len`, widened to whole aligned 8-byte words, must stay valid for reads and
    /// writes until the region is deregistered and no handle of it is used any more, and be
    /// touched by Rust code only through [`crate::dma`] meanwhile.
    pub(crate) unsafe fn foreign(
        pd: u32,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> MrInner {
        MrInner {
            pd,
            lkey: 0,
            addr: ptr as u64,
            len: len as u64,
            access,
            ptr,
            implicit: false,
            _backing: Backing::Foreign,
        }
    }

    /// A region over the whole address space (`ibv_reg_mr(pd, NULL, SIZE_MAX,
    /// IBV_ACCESS_ON_DEMAND | ...)`, implicit ODP): the network may reach any address of the
    /// process, each access checked against the process's mappings when it runs.
    ///
    /// # Safety
    /// Every range a work request or a peer (holding the rkey) names through it must, while
    /// the access runs, be memory Rust code reaches only through [`crate::dma`] (or memory
    /// outside Rust, such as C allocations), and must not be unmapped by another thread
    /// meanwhile (a range unmapped before the access is refused, not touched).
    pub(crate) unsafe fn implicit(pd: u32, access: AccessFlags) -> MrInner {
        MrInner {
            pd,
            lkey: 0,
            addr: 0,
            len: u64::MAX,
            access,
            ptr: std::ptr::null_mut(),
            implicit: true,
            _backing: Backing::Implicit,
        }
    }

    /// The same memory as `prev`, for `pd` with `access` (a re-registration that keeps the
    /// translation).
    pub(crate) fn same_memory(prev: &Arc<MrInner>, pd: u32, access: AccessFlags) -> MrInner {
        MrInner {
            pd,
            lkey: 0,
            addr: prev.addr,
            len: prev.len,
            access,
            ptr: prev.ptr,
            implicit: prev.implicit,
            _backing: Backing::Kept {
                _prev: prev.clone(),
            },
        }
    }

    /// The offset of `[addr, addr+len)` inside the region, if it lies inside.
    pub(crate) fn offset(&self, addr: u64, len: u64) -> Result<usize, MemError> {
        let off = addr.checked_sub(self.addr).ok_or(MemError::OutOfBounds)?;
        let end = off.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if end > self.len {
            return Err(MemError::OutOfBounds);
        }
        usize::try_from(off).map_err(|_| MemError::OutOfBounds)
    }

    /// The address of byte `off` of the region for an access of `len` bytes. For an implicit
    /// region the kernel first faults in the pages under it for reading, or writing if
    /// `write`, and refuses a range that is unmapped or lacks the right (so no access ever
    /// faults); other regions are valid memory throughout (their registration's contract).
    fn at(&self, off: usize, len: usize, write: bool) -> Result<*mut u8, MemError> {
        if !self.implicit {
            return Ok(self.ptr.wrapping_add(off));
        }
        if len > 0 {
            populate(off, len, write)?;
        }
        // An implicit region's byte `off` is the process's address `off` (its `addr` is 0).
        Ok(std::ptr::with_exposed_provenance_mut(off))
    }

    /// Copies bytes out of the region.
    pub(crate) fn copy_out(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let off = self.offset(addr, buf.len() as u64)?;
        let p = self.at(off, buf.len(), false)?;
        // SAFETY: `p..p+buf.len()` is inside the region (checked above), whose memory (widened to whole words: `foreign`'s contract, a page-aligned mapping, or pages `at` just found mapped and readable) is valid while `self` lives and reached by Rust only through `dma`.
        unsafe { dma::read(p, buf) };
        Ok(())
    }

    /// Copies bytes into the region.
    pub(crate) fn copy_in(&self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        let off = self.offset(addr, data.len() as u64)?;
        let p = self.at(off, data.len(), true)?;
        // SAFETY: as in copy_out: the range is inside the region's valid (for an implicit region: found writable by `at`), dma-only memory.
        unsafe { dma::write(p, data) };
        Ok(())
    }

    /// An atomic on 8 aligned bytes; returns the original value.
    pub(crate) fn atomic(&self, addr: u64, op: AtomicOp) -> Result<u64, MemError> {
        if addr % 8 != 0 {
            return Err(MemError::Misaligned);
        }
        let off = self.offset(addr, 8)?;
        let p = self.at(off, 8, true)?;
        // SAFETY: the 8 bytes are inside the region and 8-aligned (addr is; checked above), in memory valid while `self` lives (writable, for an implicit region: `at`) and reached by Rust only through `dma`.
        Ok(unsafe { dma::atomic(p.cast(), op) })
    }

    /// Stores the aligned 8-byte word at `addr` at once (an ATOMIC WRITE).
    pub(crate) fn store_word(&self, addr: u64, value: [u8; 8]) -> Result<(), MemError> {
        if addr % 8 != 0 {
            return Err(MemError::Misaligned);
        }
        let off = self.offset(addr, 8)?;
        let p = self.at(off, 8, true)?;
        // SAFETY: the 8 bytes are inside the region and 8-aligned (checked above), in memory valid while `self` lives (writable, for an implicit region: `at`) and reached by Rust only through `dma`.
        unsafe { dma::store_word(p.cast(), u64::from_ne_bytes(value)) };
        Ok(())
    }

    /// Reads the aligned 8-byte word at `addr` (`SeqCst`, as remote atomics write it).
    pub(crate) fn load_word(&self, addr: u64) -> Result<u64, MemError> {
        if addr % 8 != 0 {
            return Err(MemError::Misaligned);
        }
        let off = self.offset(addr, 8)?;
        let p = self.at(off, 8, false)?;
        // SAFETY: the 8 bytes are inside the region and 8-aligned (checked above), in memory valid while `self` lives (readable, for an implicit region: `at`) and reached by Rust only through `dma`.
        Ok(unsafe { dma::load_word(p.cast()) })
    }

    /// The process address of byte `off` (for page-level advice).
    fn address_of(&self, off: usize) -> usize {
        if self.implicit {
            off
        } else {
            self.ptr.addr() + off
        }
    }
}

/// Has the kernel fault in the pages under `[addr, addr+len)` for reading, or writing if
/// `write` (`MADV_POPULATE_READ`/`_WRITE`, which change no byte); refuses a range that is
/// not mapped with that right.
fn populate(addr: usize, len: usize, write: bool) -> Result<(), MemError> {
    const PAGE: usize = 4096;
    let start = addr & !(PAGE - 1);
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_next_multiple_of(PAGE))
        .ok_or(MemError::OutOfBounds)?;
    let advice = if write {
        libc::MADV_POPULATE_WRITE
    } else {
        libc::MADV_POPULATE_READ
    };
    // SAFETY: MADV_POPULATE_* faults the pages of the range in without changing a byte of them (a write fault on a private page copies it, keeping its contents); the kernel checks the range is mapped with the right and refuses (ENOMEM, EFAULT, EINVAL) otherwise, so no address is dereferenced by this process.
    let r = unsafe { libc::madvise(start as *mut libc::c_void, end - start, advice) };
    if r != 0 {
        log::debug!(
            "populating {len} bytes at {addr:#x} for {}: {}",
            if write { "writing" } else { "reading" },
            std::io::Error::last_os_error()
        );
        return Err(MemError::OutOfBounds);
    }
    Ok(())
}

/// Freed keys that are never handed out again until this many later keys were freed.
pub(crate) const QUARANTINE: usize = 1 << 17;

use ferroce_transport::hash::{NumberMap as KeyMap, NumberSet as KeySet};

/// Random 32-bit values from the OS, fetched in batches.
#[derive(Default)]
struct KeySource {
    buf: Vec<u32>,
}

impl KeySource {
    fn next(&mut self) -> std::io::Result<u32> {
        if self.buf.is_empty() {
            let mut bytes = [0u8; 256];
            fill_random(&mut bytes)?;
            self.buf.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]])),
            );
        }
        // The buffer was just filled if it was empty: never None here.
        self.buf
            .pop()
            .ok_or_else(|| std::io::Error::other("random buffer empty"))
    }
}

/// Fills `buf` from the kernel's random source (`getrandom(2)`, which blocks only before the
/// pool is initialised at boot).
pub(crate) fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is a valid writable buffer of `rest.len()` bytes for the call.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(())
}

/// How many buckets [`Regions`] has: a registration copies one of them (and the bucket
/// array), so registering the n-th region costs O(n / BUCKETS), not O(n).
pub(crate) const BUCKETS: usize = 64;

/// The live regions by key, as published to the shards: immutable once published (a change
/// makes a new one that shares every bucket it did not touch).
#[derive(Clone)]
pub(crate) struct Regions {
    buckets: [Arc<KeyMap<Arc<MrInner>>>; BUCKETS],
}

impl Default for Regions {
    fn default() -> Regions {
        Regions {
            buckets: std::array::from_fn(|_| Arc::default()),
        }
    }
}

impl Regions {
    /// Keys are random (module docs), so their low bits spread them over the buckets.
    fn bucket(key: u32) -> usize {
        key as usize % BUCKETS
    }

    /// The region of `key`.
    pub(crate) fn get(&self, key: u32) -> Option<&Arc<MrInner>> {
        self.buckets[Self::bucket(key)].get(&key)
    }

    /// Whether `key` is a live region's.
    pub(crate) fn contains(&self, key: u32) -> bool {
        self.get(key).is_some()
    }

    fn insert(&mut self, key: u32, mr: Arc<MrInner>) {
        Arc::make_mut(&mut self.buckets[Self::bucket(key)]).insert(key, mr);
    }

    fn remove(&mut self, key: u32) -> Option<Arc<MrInner>> {
        let b = &mut self.buckets[Self::bucket(key)];
        if !b.contains_key(&key) {
            return None;
        }
        Arc::make_mut(b).remove(&key)
    }

    /// How many regions are live.
    pub(crate) fn len(&self) -> usize {
        self.buckets.iter().map(|b| b.len()).sum()
    }

    /// The live region of `key` in `pd` granting `need`.
    fn region(&self, pd: u32, key: u32, need: AccessFlags) -> Result<&Arc<MrInner>, MemError> {
        let mr = self.get(key).ok_or(MemError::InvalidKey)?;
        if mr.pd != pd {
            return Err(MemError::InvalidKey);
        }
        if !mr.access.contains(need) {
            return Err(MemError::AccessDenied);
        }
        Ok(mr)
    }
}

/// The table's state under its lock.
#[derive(Default)]
pub(crate) struct Keys {
    /// The live regions, as last published ([`MrTable::version`] counts the publications).
    pub(crate) live: Arc<Regions>,
    /// Memory windows by index, their rkey's bits 31:8 (see `mw.rs`).
    pub(crate) windows: KeyMap<crate::mw::Window>,
    /// Freed keys, oldest first, and the same as a set.
    freed: VecDeque<u32>,
    freed_set: KeySet,
    source: KeySource,
}

impl Keys {
    pub(crate) fn fresh_key(&mut self) -> std::io::Result<u32> {
        loop {
            let k = self.source.next()?;
            if k != 0
                && !self.live.contains(k)
                && !self.freed_set.contains(&k)
                && !self.windows.contains_key(&(k >> 8))
            {
                return Ok(k);
            }
        }
    }
}

/// Every registered region of a device, by key (lkey and rkey are equal, as on rxe).
#[derive(Default)]
pub(crate) struct MrTable {
    pub(crate) keys: RwLock<Keys>,
    /// Bumped, under the lock to write, each time [`Keys::live`] is replaced.
    version: AtomicU64,
}

/// One shard's copy of the live regions, read on the data path with no lock.
#[derive(Default)]
pub(crate) struct Snapshot {
    version: u64,
    regions: Arc<Regions>,
}

impl Snapshot {
    /// Takes `table`'s regions if they changed since this copy was taken (one atomic load
    /// when they did not), and returns the view the engine reaches memory through.
    pub(crate) fn view<'a>(&'a mut self, table: &'a MrTable) -> MrView<'a> {
        self.renew(table);
        MrView {
            table,
            regions: &self.regions,
        }
    }

    /// Takes `table`'s regions if they changed since this copy was taken.
    pub(crate) fn renew(&mut self, table: &MrTable) {
        if table.version.load(Ordering::Acquire) != self.version {
            let k = table.keys.read();
            // The version moves only under the lock to write: under this read it matches
            // `live`.
            self.version = table.version.load(Ordering::Relaxed);
            self.regions = k.live.clone();
        }
    }
}

/// The engine's way to memory ([`Memory`]): regions from a shard's [`Snapshot`], windows
/// from the table under its lock.
pub(crate) struct MrView<'a> {
    table: &'a MrTable,
    regions: &'a Regions,
}

impl fmt::Debug for MrTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MrTable")
            .field("live", &self.keys.read().live.len())
            .finish()
    }
}

impl MrTable {
    /// Gives `mr` a fresh key and registers it.
    ///
    /// # Errors
    /// The OS random source failed (never on Linux ≥ 3.17 after boot).
    pub(crate) fn register(&self, mut mr: MrInner) -> std::io::Result<Arc<MrInner>> {
        let mut k = self.keys.write();
        mr.lkey = k.fresh_key()?;
        let mr = Arc::new(mr);
        Arc::make_mut(&mut k.live).insert(mr.lkey, mr.clone());
        self.published();
        Ok(mr)
    }

    /// Puts `mr` in the place of the live region `key`, under the same key (`ibv_rereg_mr`
    /// keeps lkey and rkey, as rxe does); `None` if `key` is not live.
    pub(crate) fn replace(&self, key: u32, mut mr: MrInner) -> Option<Arc<MrInner>> {
        let mut k = self.keys.write();
        if !k.live.contains(key) {
            return None;
        }
        mr.lkey = key;
        let mr = Arc::new(mr);
        Arc::make_mut(&mut k.live).insert(key, mr.clone());
        self.published();
        Some(mr)
    }

    /// Removes `key`; it is not handed out again for the next [`QUARANTINE`] deregistrations.
    pub(crate) fn remove(&self, key: u32) -> Option<Arc<MrInner>> {
        let mut k = self.keys.write();
        let mr = Arc::make_mut(&mut k.live).remove(key)?;
        self.published();
        if k.freed.len() == QUARANTINE {
            if let Some(old) = k.freed.pop_front() {
                k.freed_set.remove(&old);
            }
        }
        k.freed.push_back(key);
        k.freed_set.insert(key);
        Some(mr)
    }

    /// Tells the shards' snapshots that [`Keys::live`] was replaced (called under the lock
    /// to write, after the change).
    fn published(&self) {
        self.version.fetch_add(1, Ordering::Release);
    }

    /// How many regions are registered.
    #[cfg(test)]
    fn live(&self) -> usize {
        self.keys.read().live.len()
    }

    /// Asks the kernel to populate the pages under `[addr, addr+len)` of region `key` in `pd`
    /// (`ibv_advise_mr`'s prefetch): for reading, or writing if `write`. The bytes do not change.
    ///
    /// # Errors
    /// [`MemError::InvalidKey`] or [`MemError::OutOfBounds`] for an SGE outside a live region
    /// of the PD; [`MemError::OutOfBounds`] too if the kernel finds part of it unmapped.
    pub(crate) fn prefetch(
        &self,
        pd: u32,
        key: u32,
        addr: u64,
        len: u64,
        write: bool,
    ) -> Result<(), MemError> {
        let mr = self.lookup(pd, key, AccessFlags::EMPTY)?;
        let off = mr.offset(addr, len)?;
        if len == 0 {
            return Ok(());
        }
        populate(mr.address_of(off), len as usize, write)
    }

    /// The region of `key` in `pd` granting `need`, as a handle that keeps its descriptor
    /// alive after the table's lock is released.
    pub(crate) fn lookup(
        &self,
        pd: u32,
        key: u32,
        need: AccessFlags,
    ) -> Result<Arc<MrInner>, MemError> {
        self.keys.read().live.region(pd, key, need).cloned()
    }
}

impl MrView<'_> {
    /// Runs `f` on the region a remote key reaches for `[addr, addr+len)` with `need`, and
    /// the region address `addr` names: the region of that rkey (the same address), or the one
    /// a bound window opens onto (checked against the window's range and rights; a zero-based
    /// window's offset becomes the region address it stands for). A region's key is found in
    /// the snapshot with no lock; only a key it does not hold (a window's, or none) takes the
    /// table's lock, to read, held while `f` copies (an unbind waits for the copy).
    fn with_remote<R>(
        &self,
        pd: u32,
        rkey: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
        f: impl FnOnce(&MrInner, u64) -> Result<R, MemError>,
    ) -> Result<R, MemError> {
        if self.regions.contains(rkey) {
            // No window has a live region's key: `fresh_key` and `bind_window` see to it.
            return f(self.regions.region(pd, rkey, need)?, addr);
        }
        let k = self.table.keys.read();
        match k.through_window(pd, rkey, addr, len, need)? {
            Some((mr, at)) => f(mr, at),
            None => Err(MemError::InvalidKey),
        }
    }

    /// Runs `f` on the region of `key` in `pd` granting `need`.
    fn with_local<R>(
        &self,
        pd: u32,
        key: u32,
        need: AccessFlags,
        f: impl FnOnce(&MrInner) -> Result<R, MemError>,
    ) -> Result<R, MemError> {
        f(self.regions.region(pd, key, need)?)
    }
}

impl Memory for MrView<'_> {
    fn read_local(&self, pd: u32, lkey: u32, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.with_local(pd, lkey, AccessFlags::EMPTY, |mr| mr.copy_out(addr, buf))
    }

    fn write_local(&self, pd: u32, lkey: u32, addr: u64, data: &[u8]) -> Result<(), MemError> {
        self.with_local(pd, lkey, AccessFlags::LOCAL_WRITE, |mr| {
            mr.copy_in(addr, data)
        })
    }

    fn check_region_key(&self, pd: u32, rkey: u32, access: AccessFlags) -> Result<(), MemError> {
        self.with_local(pd, rkey, access, |_| Ok(()))
    }

    fn check_remote(
        &self,
        pd: u32,
        rkey: u32,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<(), MemError> {
        self.with_remote(pd, rkey, addr, len, access, |mr, at| {
            mr.offset(at, len).map(|_| ())
        })
    }

    fn read_remote(&self, pd: u32, rkey: u32, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let len = buf.len() as u64;
        self.with_remote(pd, rkey, addr, len, AccessFlags::REMOTE_READ, |mr, at| {
            mr.copy_out(at, buf)
        })
    }

    fn write_remote(&self, pd: u32, rkey: u32, addr: u64, data: &[u8]) -> Result<(), MemError> {
        let len = data.len() as u64;
        self.with_remote(pd, rkey, addr, len, AccessFlags::REMOTE_WRITE, |mr, at| {
            mr.copy_in(at, data)
        })
    }

    fn atomic(&self, pd: u32, rkey: u32, addr: u64, op: AtomicOp) -> Result<u64, MemError> {
        self.with_remote(pd, rkey, addr, 8, AccessFlags::REMOTE_ATOMIC, |mr, at| {
            mr.atomic(at, op)
        })
    }

    fn atomic_write(&self, pd: u32, rkey: u32, addr: u64, value: [u8; 8]) -> Result<(), MemError> {
        self.with_remote(pd, rkey, addr, 8, AccessFlags::REMOTE_WRITE, |mr, at| {
            mr.store_word(at, value)
        })
    }

    fn bind_mw(&self, pd: u32, qpn: u32, bind: &ferroce_transport::MwBind) -> Result<(), MemError> {
        self.table.bind_window(pd, qpn, bind)
    }

    fn invalidate(&self, pd: u32, qpn: u32, rkey: u32) -> Result<(), MemError> {
        self.table.invalidate_window(pd, qpn, rkey)
    }

    fn bound_qp(&self, rkey: u32) -> Option<u32> {
        // A region's key is no window's (as in `with_remote`): only another key takes the lock.
        if self.regions.contains(rkey) {
            return None;
        }
        self.table.window_qp(rkey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// A region over test-owned words (what `reg_mr_raw` does; runs under Miri, no mmap).
    fn foreign(mem: &mut [u64], access: AccessFlags) -> MrInner {
        // SAFETY: `mem` is 8-aligned and outlives every use in the test that made it.
        unsafe { MrInner::foreign(1, mem.as_mut_ptr().cast(), mem.len() * 8, access) }
    }

    #[test]
    fn table_checks_keys_pd_bounds_access() {
        let t = MrTable::default();
        let mut s = Snapshot::default();
        let mut mem = vec![0u64; 13];
        let mr = t
            .register(foreign(
                &mut mem,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
            ))
            .unwrap();
        let (a, k) = (mr.addr, mr.lkey);
        assert_eq!(s.view(&t).write_local(1, k, a + 10, &[1, 2, 3]), Ok(()));
        let mut b = [0u8; 3];
        assert_eq!(s.view(&t).read_local(1, k, a + 10, &mut b), Ok(()));
        assert_eq!(b, [1, 2, 3]);
        assert_eq!(
            s.view(&t).read_local(2, k, a, &mut b),
            Err(MemError::InvalidKey)
        );
        assert_eq!(
            s.view(&t).read_local(1, k, a + 102, &mut b),
            Err(MemError::OutOfBounds)
        );
        assert_eq!(
            s.view(&t).read_remote(1, k, a, &mut b),
            Err(MemError::AccessDenied)
        );
        assert_eq!(
            s.view(&t)
                .atomic(1, k, a + 16, AtomicOp::FetchAdd { add: 2 }),
            Ok(0)
        );
        let cas = AtomicOp::CompareSwap {
            compare: 2,
            swap: 9,
        };
        assert_eq!(s.view(&t).atomic(1, k, a + 16, cas), Ok(2));
        assert_eq!(mr.load_word(a + 16), Ok(9));
        assert_eq!(
            s.view(&t)
                .atomic(1, k, a + 12, AtomicOp::FetchAdd { add: 2 }),
            Err(MemError::Misaligned)
        );
        assert!(t.remove(k).is_some());
        assert_eq!(
            s.view(&t).read_local(1, k, a, &mut b),
            Err(MemError::InvalidKey)
        );
        assert!(t.remove(k).is_none(), "a key is removed once");
    }

    /// A shard's snapshot takes a registration when it next runs (no renewal when nothing
    /// changed), and once renewed after a deregistration it neither finds the key nor holds
    /// the region.
    #[test]
    fn snapshots_take_changes_and_let_go_of_removed_regions() {
        let t = MrTable::default();
        let mut s = Snapshot::default();
        let mut mem = vec![0u64; 4];
        let mr = t
            .register(foreign(&mut mem, AccessFlags::LOCAL_WRITE))
            .unwrap();
        let (a, k) = (mr.addr, mr.lkey);
        assert_eq!(s.view(&t).write_local(1, k, a, &[5]), Ok(()));
        let seen = Arc::clone(&s.regions);
        s.renew(&t);
        assert!(
            Arc::ptr_eq(&seen, &s.regions),
            "nothing changed, nothing taken"
        );
        drop(seen);
        let held = Arc::downgrade(&mr);
        drop(mr);
        assert!(t.remove(k).is_some());
        assert!(held.upgrade().is_some(), "the old snapshot still holds it");
        s.renew(&t);
        assert!(held.upgrade().is_none(), "no one holds a removed region");
        let mut b = [0u8; 1];
        assert_eq!(
            s.view(&t).read_local(1, k, a, &mut b),
            Err(MemError::InvalidKey)
        );
    }

    /// A registration publishes new regions that share every bucket but the new key's with
    /// the last publication (registering stays cheap with many regions).
    #[test]
    fn a_registration_copies_one_bucket() {
        let t = MrTable::default();
        let mut mem = vec![0u64; 1];
        for _ in 0..100 {
            t.register(foreign(&mut mem, AccessFlags::EMPTY)).unwrap();
        }
        let before = t.keys.read().live.clone();
        let k = t
            .register(foreign(&mut mem, AccessFlags::EMPTY))
            .unwrap()
            .lkey;
        let after = t.keys.read().live.clone();
        assert_eq!((before.len(), after.len()), (100, 101));
        for (i, (x, y)) in before.buckets.iter().zip(&after.buckets).enumerate() {
            assert_eq!(Arc::ptr_eq(x, y), i != Regions::bucket(k), "bucket {i}");
        }
    }

    #[cfg(not(miri))]
    #[test]
    fn owned_regions_are_zeroed_mappings() {
        let t = MrTable::default();
        let mr = t
            .register(MrInner::owned(1, 5000, AccessFlags::LOCAL_WRITE, false).unwrap())
            .unwrap();
        let mut b = vec![1u8; 5000];
        mr.copy_out(mr.addr, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        mr.copy_in(mr.addr + 4999, &[7]).unwrap();
        assert_eq!(mr.copy_in(mr.addr + 5000, &[7]), Err(MemError::OutOfBounds));
    }

    /// 100,000 registrations and deregistrations (always a few live): no key repeats a live
    /// or recently freed one, and the keys show no structure (per-bit balance, low byte,
    /// consecutive differences). The bounds are 6 standard deviations wide: random keys fail
    /// them with odds below 1e-8, an index-plus-random-byte scheme (rxe's) fails at once.
    #[cfg(not(miri))]
    #[test]
    fn keys_never_repeat_and_show_no_structure() {
        const N: usize = 100_000;
        let t = MrTable::default();
        let mut mem = vec![0u64; 1];
        let mut live = VecDeque::new();
        let mut keys = Vec::with_capacity(N);
        let mut seen = HashSet::new();
        for _ in 0..N {
            let mr = t.register(foreign(&mut mem, AccessFlags::EMPTY)).unwrap();
            assert!(seen.insert(mr.lkey), "key {:#x} handed out twice", mr.lkey);
            keys.push(mr.lkey);
            live.push_back(mr.lkey);
            if live.len() > 8 {
                t.remove(live.pop_front().unwrap());
            }
        }
        assert_eq!(t.live(), 8);
        let n = N as f64;
        let sd = (n * 0.25).sqrt();
        for bit in 0..32 {
            let ones = keys.iter().filter(|k| *k >> bit & 1 == 1).count() as f64;
            assert!(
                (ones - n / 2.0).abs() < 6.0 * sd,
                "bit {bit}: {ones} of {n} set"
            );
        }
        // Chi-square over 256 classes (255 degrees of freedom: mean 255, sd 22.6): the low
        // byte, and the low byte of the difference of consecutive keys.
        let chi2 = |class: &dyn Fn(usize) -> usize, count: usize| {
            let mut c = [0f64; 256];
            for i in 0..count {
                c[class(i)] += 1.0;
            }
            let e = count as f64 / 256.0;
            c.iter().map(|o| (o - e) * (o - e) / e).sum::<f64>()
        };
        let low = chi2(&|i| (keys[i] & 0xff) as usize, N);
        assert!(low < 255.0 + 6.0 * 22.6, "low byte chi2 {low}");
        let diff = chi2(
            &|i| (keys[i + 1].wrapping_sub(keys[i]) & 0xff) as usize,
            N - 1,
        );
        assert!(diff < 255.0 + 6.0 * 22.6, "difference chi2 {diff}");
        let high = chi2(&|i| (keys[i] >> 24) as usize, N);
        assert!(high < 255.0 + 6.0 * 22.6, "high byte chi2 {high}");
        // Differences of consecutive keys repeat no more than random ones would (birthday:
        // ~1.2 expected repeats among 1e5 random 32-bit differences).
        let mut d: Vec<u32> = keys.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
        d.sort_unstable();
        let repeats = d.windows(2).filter(|w| w[0] == w[1]).count();
        assert!(repeats < 12, "{repeats} repeated differences");
    }

    /// A freed key is not reused even when the source offers it again at once.
    #[test]
    fn freed_keys_are_quarantined() {
        let t = MrTable::default();
        let mut mem = vec![0u64; 1];
        let a = t
            .register(foreign(&mut mem, AccessFlags::EMPTY))
            .unwrap()
            .lkey;
        t.remove(a);
        // The next draws from the source are `a`, then 0, then a fresh value.
        t.keys.write().source.buf.extend([0x5151_5151, 0, a]);
        let b = t
            .register(foreign(&mut mem, AccessFlags::EMPTY))
            .unwrap()
            .lkey;
        assert_eq!(b, 0x5151_5151, "neither the freed key nor 0 is handed out");
    }

    /// 10^6 random rkeys against a device with one region: the engine's key lookup finds
    /// nothing (a hit has odds 1e6 / 2^32 = 2.3e-4 per run, the bound any 32-bit key allows).
    #[cfg(not(miri))]
    #[test]
    fn a_million_guessed_rkeys_find_nothing() {
        let t = MrTable::default();
        let mut s = Snapshot::default();
        let mut mem = vec![0u64; 512];
        let mr = t
            .register(foreign(
                &mut mem,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            ))
            .unwrap();
        let mut src = KeySource::default();
        let mut hits = 0;
        for _ in 0..1_000_000 {
            let guess = src.next().unwrap();
            if s.view(&t)
                .check_remote(1, guess, mr.addr, 8, AccessFlags::REMOTE_WRITE)
                .is_ok()
            {
                hits += 1;
            }
        }
        assert_eq!(hits, 0);
    }
}
