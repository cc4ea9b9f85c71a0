//! Memory regions (`ibv_mr`) and the key table the runtime reaches them through.
//!
//! A region's bytes are shared with the network the way a NIC shares DMA memory: the runtime
//! copies into and out of them whenever the transport says so (a remote WRITE arriving, a
//! SEND going out, a READ being answered). See the crate docs for the contract this puts on
//! programs; everything here touches region bytes only through raw pointers.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ferroce_transport::AccessFlags;
use ferroce_transport::memory::{AtomicOp, MemError, Memory};
use parking_lot::RwLock;

/// Where a region's bytes come from.
enum Backing {
    /// An anonymous mapping ferroce owns (kept to unmap on drop).
    Owned { _map: memmap2::MmapMut },
    /// Caller memory registered with [`crate::ProtectionDomain::reg_mr_raw`].
    Foreign,
}

/// The shared part of a memory region.
pub(crate) struct MrInner {
    pub(crate) pd: u32,
    pub(crate) lkey: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: AccessFlags,
    ptr: *mut u8,
    _backing: Backing,
}

// SAFETY: the region's bytes are plain memory reached only through raw-pointer copies (the
// contract in the crate docs); the pointer stays valid as long as the MrInner lives, because
// the owned mapping is dropped with it and foreign memory is guaranteed by `reg_mr_raw`'s caller.
unsafe impl Send for MrInner {}
// SAFETY: as for Send; all methods take &self and copy through raw pointers.
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
        lkey: u32,
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
            lkey,
            addr: ptr as u64,
            len: len as u64,
            access,
            ptr,
            _backing: Backing::Owned { _map: map },
        })
    }

    /// A region over caller memory.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid for reads and writes, and not be freed, until the region
    /// is deregistered and every handle to it dropped.
    pub(crate) unsafe fn foreign(
        pd: u32,
        lkey: u32,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> MrInner {
        MrInner {
            pd,
            lkey,
            addr: ptr as u64,
            len: len as u64,
            access,
            ptr,
            _backing: Backing::Foreign,
        }
    }

    /// The offset of `[addr, addr+len)` inside the region, if it lies inside.
    fn offset(&self, addr: u64, len: u64) -> Result<usize, MemError> {
        let off = addr.checked_sub(self.addr).ok_or(MemError::OutOfBounds)?;
        let end = off.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if end > self.len {
            return Err(MemError::OutOfBounds);
        }
        usize::try_from(off).map_err(|_| MemError::OutOfBounds)
    }

    /// Copies bytes out of the region.
    pub(crate) fn copy_out(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let off = self.offset(addr, buf.len() as u64)?;
        // SAFETY: `off + buf.len()` is inside the region (checked above), whose memory is valid
        // while `self` lives; `buf` is a distinct Rust buffer, so the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// Copies bytes into the region.
    pub(crate) fn copy_in(&self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        let off = self.offset(addr, data.len() as u64)?;
        // SAFETY: as in copy_out, with the roles of the two ranges swapped.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
        Ok(())
    }

    /// An atomic on 8 aligned bytes; returns the original value.
    pub(crate) fn atomic(&self, addr: u64, op: AtomicOp) -> Result<u64, MemError> {
        if addr % 8 != 0 {
            return Err(MemError::Misaligned);
        }
        let off = self.offset(addr, 8)?;
        // SAFETY: the 8 bytes are inside the region and 8-aligned (checked above); all atomics
        // on region memory go through AtomicU64, so they are atomic with respect to each other.
        let cell = unsafe { AtomicU64::from_ptr(self.ptr.add(off).cast()) };
        let orig = match op {
            AtomicOp::FetchAdd { add } => cell.fetch_add(add, Ordering::SeqCst),
            AtomicOp::CompareSwap { compare, swap } => {
                match cell.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
        };
        Ok(orig)
    }
}

/// Every registered region of a device, by key (lkey and rkey are equal, as on rxe).
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    map: RwLock<HashMap<u32, Arc<MrInner>>>,
}

impl MrTable {
    pub(crate) fn insert(&self, mr: Arc<MrInner>) {
        self.map.write().insert(mr.lkey, mr);
    }

    pub(crate) fn remove(&self, key: u32) -> Option<Arc<MrInner>> {
        self.map.write().remove(&key)
    }

    pub(crate) fn contains(&self, key: u32) -> bool {
        self.map.read().contains_key(&key)
    }

    /// The region of `key` in `pd` granting `need`; the Arc keeps its memory alive while the
    /// caller copies, even if it is deregistered meanwhile.
    fn lookup(&self, pd: u32, key: u32, need: AccessFlags) -> Result<Arc<MrInner>, MemError> {
        let mr = self
            .map
            .read()
            .get(&key)
            .cloned()
            .ok_or(MemError::InvalidKey)?;
        if mr.pd != pd {
            return Err(MemError::InvalidKey);
        }
        if !mr.access.contains(need) {
            return Err(MemError::AccessDenied);
        }
        Ok(mr)
    }
}

impl Memory for MrTable {
    fn read_local(&self, pd: u32, lkey: u32, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.lookup(pd, lkey, AccessFlags::EMPTY)?
            .copy_out(addr, buf)
    }

    fn write_local(&self, pd: u32, lkey: u32, addr: u64, data: &[u8]) -> Result<(), MemError> {
        self.lookup(pd, lkey, AccessFlags::LOCAL_WRITE)?
            .copy_in(addr, data)
    }

    fn check_remote(
        &self,
        pd: u32,
        rkey: u32,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<(), MemError> {
        self.lookup(pd, rkey, access)?.offset(addr, len).map(|_| ())
    }

    fn read_remote(&self, pd: u32, rkey: u32, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.lookup(pd, rkey, AccessFlags::REMOTE_READ)?
            .copy_out(addr, buf)
    }

    fn write_remote(&self, pd: u32, rkey: u32, addr: u64, data: &[u8]) -> Result<(), MemError> {
        self.lookup(pd, rkey, AccessFlags::REMOTE_WRITE)?
            .copy_in(addr, data)
    }

    fn atomic(&self, pd: u32, rkey: u32, addr: u64, op: AtomicOp) -> Result<u64, MemError> {
        self.lookup(pd, rkey, AccessFlags::REMOTE_ATOMIC)?
            .atomic(addr, op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_checks_keys_pd_bounds_access() {
        let t = MrTable::default();
        let mr = Arc::new(
            MrInner::owned(
                1,
                0x1234,
                100,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
                false,
            )
            .unwrap(),
        );
        let a = mr.addr;
        t.insert(mr.clone());
        assert_eq!(t.write_local(1, 0x1234, a + 10, &[1, 2, 3]), Ok(()));
        let mut b = [0u8; 3];
        assert_eq!(t.read_local(1, 0x1234, a + 10, &mut b), Ok(()));
        assert_eq!(b, [1, 2, 3]);
        assert_eq!(
            t.read_local(2, 0x1234, a, &mut b),
            Err(MemError::InvalidKey)
        );
        assert_eq!(
            t.read_local(1, 0x1234, a + 98, &mut b),
            Err(MemError::OutOfBounds)
        );
        assert_eq!(
            t.read_remote(1, 0x1234, a, &mut b),
            Err(MemError::AccessDenied)
        );
        assert_eq!(
            t.atomic(1, 0x1234, a + 16, AtomicOp::FetchAdd { add: 2 }),
            Ok(0)
        );
        assert_eq!(
            t.atomic(
                1,
                0x1234,
                a + 16,
                AtomicOp::CompareSwap {
                    compare: 2,
                    swap: 9
                }
            ),
            Ok(2)
        );
        assert_eq!(
            t.atomic(1, 0x1234, a + 12, AtomicOp::FetchAdd { add: 2 }),
            Err(MemError::Misaligned)
        );
        t.remove(0x1234);
        assert_eq!(
            t.read_local(1, 0x1234, a, &mut b),
            Err(MemError::InvalidKey)
        );
        // The handle still works after deregistration (the memory is still ours).
        mr.copy_out(a + 10, &mut b).unwrap();
    }
}
