//! How the engine reaches registered memory: the [`Memory`] trait the caller implements (the
//! provider over its memory regions, tests and the simulator over [`VecMemory`]).
//!
//! Every access names the protection domain of the QP making it; a key from another PD is an
//! invalid key, as on an HCA.

use std::cell::RefCell;

use crate::hash::NumberMap;
use crate::verbs::{AccessFlags, MwBind, Sge};

/// Why a memory access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemError {
    /// No memory region has this key in this protection domain.
    InvalidKey,
    /// The range is not inside the region.
    OutOfBounds,
    /// The region does not grant the access.
    AccessDenied,
    /// An atomic on an address that is not 8-byte aligned.
    Misaligned,
}

/// An atomic operation on 8 bytes of remote memory (IBTA §9.4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// Compare and swap: if the value equals `compare`, write `swap`.
    CompareSwap {
        /// Compare operand.
        compare: u64,
        /// Swap operand.
        swap: u64,
    },
    /// Fetch and add `add` (wrapping).
    FetchAdd {
        /// Addend.
        add: u64,
    },
}

impl AtomicOp {
    /// The value to store given the original one.
    pub const fn apply(self, orig: u64) -> u64 {
        match self {
            AtomicOp::CompareSwap { compare, swap } => {
                if orig == compare {
                    swap
                } else {
                    orig
                }
            }
            AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
        }
    }
}

/// Registered memory as the engine sees it. Local accesses use an lkey, remote ones an rkey;
/// the implementation checks the key's PD, the bounds and the region's access flags.
/// Methods take `&self`: memory is shared with the application, as an HCA's is.
pub trait Memory {
    /// Reads local memory for a send (no access flag needed).
    ///
    /// # Errors
    /// [`MemError`] if the lkey, bounds or PD do not fit.
    fn read_local(&self, pd: u32, lkey: u32, addr: u64, buf: &mut [u8]) -> Result<(), MemError>;

    /// Writes local memory for a receive or a READ/atomic result (needs `LOCAL_WRITE`).
    ///
    /// # Errors
    /// [`MemError`] if the lkey, bounds, PD or access flags do not fit.
    fn write_local(&self, pd: u32, lkey: u32, addr: u64, data: &[u8]) -> Result<(), MemError>;

    /// Checks that `rkey` names a region of `pd` granting `access`, wherever in it (a FLUSH
    /// of the whole region, whose address the IBTA leaves unused). The default refuses.
    ///
    /// # Errors
    /// [`MemError`] if it does not.
    fn check_region_key(&self, pd: u32, rkey: u32, access: AccessFlags) -> Result<(), MemError> {
        let _ = (pd, rkey, access);
        Err(MemError::InvalidKey)
    }

    /// Checks that `rkey` grants `access` on `len` bytes at `addr`.
    ///
    /// # Errors
    /// [`MemError`] if it does not.
    fn check_remote(
        &self,
        pd: u32,
        rkey: u32,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<(), MemError>;

    /// Reads memory for an incoming RDMA READ (needs `REMOTE_READ`).
    ///
    /// # Errors
    /// [`MemError`] if the rkey, bounds, PD or access flags do not fit.
    fn read_remote(&self, pd: u32, rkey: u32, addr: u64, buf: &mut [u8]) -> Result<(), MemError>;

    /// Writes memory for an incoming RDMA WRITE (needs `REMOTE_WRITE`).
    ///
    /// # Errors
    /// [`MemError`] if the rkey, bounds, PD or access flags do not fit.
    fn write_remote(&self, pd: u32, rkey: u32, addr: u64, data: &[u8]) -> Result<(), MemError>;

    /// Executes an atomic on 8 aligned bytes (needs `REMOTE_ATOMIC`) and returns the original
    /// value. Atomics through one `Memory` are atomic with respect to each other.
    ///
    /// # Errors
    /// [`MemError`] if the rkey, bounds, alignment, PD or access flags do not fit.
    fn atomic(&self, pd: u32, rkey: u32, addr: u64, op: AtomicOp) -> Result<u64, MemError>;

    /// Stores `value` (the bytes as they came) in the aligned 8 bytes at `addr` at once, for
    /// an incoming ATOMIC WRITE (needs `REMOTE_WRITE`); a concurrent reader sees the old or
    /// the new word, never a mix. The default checks the access and writes the 8 bytes.
    ///
    /// # Errors
    /// [`MemError`] if the rkey, bounds, alignment, PD or access flags do not fit.
    fn atomic_write(&self, pd: u32, rkey: u32, addr: u64, value: [u8; 8]) -> Result<(), MemError> {
        if addr % 8 != 0 {
            return Err(MemError::Misaligned);
        }
        self.write_remote(pd, rkey, addr, &value)
    }

    /// Binds a memory window for QP `qpn` of `pd` (a `BIND_MW` work request): afterwards
    /// `bind.new_rkey` grants `bind.access` on the bound range of region `bind.mr_lkey`, and a
    /// type 2 window only to requests arriving on `qpn`. Memory without windows refuses.
    ///
    /// # Errors
    /// [`MemError`]: no such window or region in `pd`, a region without `MW_BIND`, a range
    /// outside it, a type 2 window already bound, or a new key of another index.
    fn bind_mw(&self, pd: u32, qpn: u32, bind: &MwBind) -> Result<(), MemError> {
        let _ = (pd, qpn, bind);
        Err(MemError::InvalidKey)
    }

    /// Invalidates `rkey` for QP `qpn` of `pd` (`LOCAL_INV`, or the IETH of a received SEND
    /// with invalidate): a type 2 window bound to `qpn` becomes unbound and its key dead.
    ///
    /// # Errors
    /// [`MemError::InvalidKey`] if `rkey` is no such window.
    fn invalidate(&self, pd: u32, qpn: u32, rkey: u32) -> Result<(), MemError> {
        let _ = (pd, qpn, rkey);
        Err(MemError::InvalidKey)
    }

    /// The QP a type 2 window with `rkey` is bound to: remote access through it is allowed
    /// only on that QP. `None` for region keys and type 1 windows.
    fn bound_qp(&self, rkey: u32) -> Option<u32> {
        let _ = rkey;
        None
    }
}

/// Copies bytes `[offset, offset + out.len())` of the message an SGE list describes.
///
/// # Errors
/// [`ScatterError::Memory`] naming the SGE the memory refused, or [`ScatterError::TooLong`]
/// if the SGEs hold fewer bytes.
pub fn gather<M: Memory + ?Sized>(
    mem: &M,
    pd: u32,
    sges: &[Sge],
    mut offset: u64,
    mut out: &mut [u8],
) -> Result<(), ScatterError> {
    for s in sges {
        if out.is_empty() {
            return Ok(());
        }
        let len = u64::from(s.length);
        if offset >= len {
            offset -= len;
            continue;
        }
        let n = (len - offset).min(out.len() as u64) as usize;
        let (head, rest) = out.split_at_mut(n);
        mem.read_local(pd, s.lkey, s.addr + offset, head)
            .map_err(|error| ScatterError::Memory(SgeFault::of(s, error)))?;
        out = rest;
        offset = 0;
    }
    if out.is_empty() {
        Ok(())
    } else {
        Err(ScatterError::TooLong)
    }
}

/// Why a gather or a scatter failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScatterError {
    /// The data does not fit in the SGEs (a local length error).
    TooLong,
    /// The memory refused one SGE (a local protection error).
    Memory(SgeFault),
}

/// The scatter/gather element (`struct ibv_sge`) the memory refused, and why: the facts of an
/// `IBV_WC_LOC_PROT_ERR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SgeFault {
    /// The SGE's `lkey`.
    pub lkey: u32,
    /// The SGE's `addr`.
    pub addr: u64,
    /// The SGE's `length`.
    pub length: u32,
    /// Why the memory refused it.
    pub error: MemError,
}

impl SgeFault {
    fn of(s: &Sge, error: MemError) -> SgeFault {
        SgeFault {
            lkey: s.lkey,
            addr: s.addr,
            length: s.length,
            error,
        }
    }
}

/// Writes `data` at byte `offset` of the message an SGE list describes.
///
/// # Errors
/// [`ScatterError::TooLong`] if the SGEs are too short, or the memory's error.
pub fn scatter<M: Memory + ?Sized>(
    mem: &M,
    pd: u32,
    sges: &[Sge],
    mut offset: u64,
    mut data: &[u8],
) -> Result<(), ScatterError> {
    for s in sges {
        if data.is_empty() {
            return Ok(());
        }
        let len = u64::from(s.length);
        if offset >= len {
            offset -= len;
            continue;
        }
        let n = (len - offset).min(data.len() as u64) as usize;
        mem.write_local(pd, s.lkey, s.addr + offset, &data[..n])
            .map_err(|error| ScatterError::Memory(SgeFault::of(s, error)))?;
        data = &data[n..];
        offset = 0;
    }
    if data.is_empty() {
        Ok(())
    } else {
        Err(ScatterError::TooLong)
    }
}

/// A memory region of [`VecMemory`].
#[derive(Debug, Clone)]
struct Region {
    pd: u32,
    addr: u64,
    access: AccessFlags,
    bytes: Vec<u8>,
}

/// A simple in-process [`Memory`]: regions backed by `Vec<u8>`, for tests and the simulator.
#[derive(Debug, Default)]
pub struct VecMemory {
    regions: RefCell<NumberMap<Region>>,
    next_key: RefCell<u32>,
    /// Memory windows by current rkey.
    windows: RefCell<NumberMap<Window>>,
}

/// A memory window of [`VecMemory`].
#[derive(Debug, Clone, Copy)]
struct Window {
    pd: u32,
    /// 1 or 2 (`IBV_MW_TYPE_1`, `_2`).
    kind: u8,
    bound: Option<Binding>,
}

#[derive(Debug, Clone, Copy)]
struct Binding {
    mr: u32,
    addr: u64,
    len: u64,
    access: AccessFlags,
    /// Type 2: the QP it is bound to.
    qpn: Option<u32>,
}

/// What [`VecMemory::register`] returns: the keys and address of a new region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VecMr {
    /// The region's start address.
    pub addr: u64,
    /// Its length.
    pub length: u64,
    /// Local key.
    pub lkey: u32,
    /// Remote key (equal to the lkey here).
    pub rkey: u32,
}

impl VecMr {
    /// An SGE covering `len` bytes at `offset` into the region.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr + offset,
            length: len,
            lkey: self.lkey,
        }
    }
}

impl VecMemory {
    /// An empty memory.
    pub fn new() -> VecMemory {
        VecMemory::default()
    }

    /// Registers `bytes` in protection domain `pd` with the given access flags. Each region
    /// gets its own address range (regions start 4 GiB apart).
    pub fn register(&self, pd: u32, bytes: Vec<u8>, access: AccessFlags) -> VecMr {
        let mut next = self.next_key.borrow_mut();
        *next += 1;
        let key = *next * 0x100 + 0x42;
        let addr = u64::from(*next) << 32;
        let length = bytes.len() as u64;
        self.regions.borrow_mut().insert(
            key,
            Region {
                pd,
                addr,
                access,
                bytes,
            },
        );
        VecMr {
            addr,
            length,
            lkey: key,
            rkey: key,
        }
    }

    /// `ibv_alloc_mw`: an unbound window of `kind` (1 or 2) in `pd`; returns its rkey.
    pub fn alloc_mw(&self, pd: u32, kind: u8) -> u32 {
        let mut next = self.next_key.borrow_mut();
        *next += 1;
        let rkey = *next * 0x100 + 0x77;
        self.windows.borrow_mut().insert(
            rkey,
            Window {
                pd,
                kind,
                bound: None,
            },
        );
        rkey
    }

    /// Removes a region: its keys become invalid at once.
    pub fn deregister(&self, key: u32) -> bool {
        self.regions.borrow_mut().remove(&key).is_some()
    }

    /// A copy of a region's bytes.
    pub fn bytes(&self, key: u32) -> Option<Vec<u8>> {
        self.regions.borrow().get(&key).map(|r| r.bytes.clone())
    }

    /// Overwrites part of a region (as the application would).
    pub fn fill(&self, key: u32, offset: usize, data: &[u8]) {
        if let Some(r) = self.regions.borrow_mut().get_mut(&key) {
            r.bytes[offset..offset + data.len()].copy_from_slice(data);
        }
    }

    fn with_range<T>(
        &self,
        pd: u32,
        key: u32,
        addr: u64,
        len: usize,
        need: AccessFlags,
        f: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T, MemError> {
        // A window's key reaches its region through the bound range and rights.
        let window = self.windows.borrow().get(&key).copied();
        let Some(w) = window else {
            return self.with_region(pd, key, addr, len, need, f);
        };
        let b = w.bound.filter(|_| w.pd == pd).ok_or(MemError::InvalidKey)?;
        if !b.access.contains(need) {
            return Err(MemError::AccessDenied);
        }
        let end = addr.checked_add(len as u64).ok_or(MemError::OutOfBounds)?;
        if b.access.contains(AccessFlags::ZERO_BASED) {
            // A zero-based window is addressed by offset from its first byte.
            if end > b.len {
                return Err(MemError::OutOfBounds);
            }
            return self.with_region(pd, b.mr, b.addr + addr, len, AccessFlags::EMPTY, f);
        }
        if addr < b.addr || end > b.addr + b.len {
            return Err(MemError::OutOfBounds);
        }
        self.with_region(pd, b.mr, addr, len, AccessFlags::EMPTY, f)
    }

    fn with_region<T>(
        &self,
        pd: u32,
        key: u32,
        addr: u64,
        len: usize,
        need: AccessFlags,
        f: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T, MemError> {
        let mut regions = self.regions.borrow_mut();
        let r = regions
            .get_mut(&key)
            .filter(|r| r.pd == pd)
            .ok_or(MemError::InvalidKey)?;
        if !r.access.contains(need) {
            return Err(MemError::AccessDenied);
        }
        let start = addr.checked_sub(r.addr).ok_or(MemError::OutOfBounds)?;
        let end = start.checked_add(len as u64).ok_or(MemError::OutOfBounds)?;
        if end > r.bytes.len() as u64 {
            return Err(MemError::OutOfBounds);
        }
        Ok(f(&mut r.bytes[start as usize..end as usize]))
    }
}

impl Memory for VecMemory {
    fn read_local(&self, pd: u32, lkey: u32, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.with_range(pd, lkey, addr, buf.len(), AccessFlags::EMPTY, |m| {
            buf.copy_from_slice(m)
        })
    }

    fn write_local(&self, pd: u32, lkey: u32, addr: u64, data: &[u8]) -> Result<(), MemError> {
        self.with_range(pd, lkey, addr, data.len(), AccessFlags::LOCAL_WRITE, |m| {
            m.copy_from_slice(data)
        })
    }

    fn check_region_key(&self, pd: u32, rkey: u32, access: AccessFlags) -> Result<(), MemError> {
        let regions = self.regions.borrow();
        let r = regions
            .get(&rkey)
            .filter(|r| r.pd == pd)
            .ok_or(MemError::InvalidKey)?;
        if r.access.contains(access) {
            Ok(())
        } else {
            Err(MemError::AccessDenied)
        }
    }

    fn check_remote(
        &self,
        pd: u32,
        rkey: u32,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<(), MemError> {
        let len = usize::try_from(len).map_err(|_| MemError::OutOfBounds)?;
        self.with_range(pd, rkey, addr, len, access, |_| ())
    }

    fn read_remote(&self, pd: u32, rkey: u32, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.with_range(pd, rkey, addr, buf.len(), AccessFlags::REMOTE_READ, |m| {
            buf.copy_from_slice(m)
        })
    }

    fn write_remote(&self, pd: u32, rkey: u32, addr: u64, data: &[u8]) -> Result<(), MemError> {
        self.with_range(pd, rkey, addr, data.len(), AccessFlags::REMOTE_WRITE, |m| {
            m.copy_from_slice(data)
        })
    }

    fn atomic(&self, pd: u32, rkey: u32, addr: u64, op: AtomicOp) -> Result<u64, MemError> {
        if addr % 8 != 0 {
            return Err(MemError::Misaligned);
        }
        self.with_range(pd, rkey, addr, 8, AccessFlags::REMOTE_ATOMIC, |m| {
            let mut a = [0u8; 8];
            a.copy_from_slice(m);
            // Atomics operate on host-order 64-bit words, as on the HCA's host.
            let orig = u64::from_ne_bytes(a);
            m.copy_from_slice(&op.apply(orig).to_ne_bytes());
            orig
        })
    }

    fn bind_mw(&self, pd: u32, qpn: u32, b: &MwBind) -> Result<(), MemError> {
        let mut windows = self.windows.borrow_mut();
        let w = *windows
            .get(&b.mw_rkey)
            .filter(|w| w.pd == pd)
            .ok_or(MemError::InvalidKey)?;
        if b.new_rkey >> 8 != b.mw_rkey >> 8 || (w.kind == 2 && w.bound.is_some()) {
            return Err(MemError::InvalidKey);
        }
        if w.kind == 1 && b.access.contains(AccessFlags::ZERO_BASED) {
            return Err(MemError::AccessDenied); // only type 2 windows are zero based
        }
        let binding = if b.length == 0 && w.kind == 1 {
            None
        } else {
            let regions = self.regions.borrow();
            let r = regions
                .get(&b.mr_lkey)
                .filter(|r| r.pd == pd)
                .ok_or(MemError::InvalidKey)?;
            let remote_w = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
            if !r.access.contains(AccessFlags::MW_BIND)
                || (!(b.access & remote_w).is_empty()
                    && !r.access.contains(AccessFlags::LOCAL_WRITE))
            {
                return Err(MemError::AccessDenied);
            }
            let end = b.addr.checked_add(b.length).ok_or(MemError::OutOfBounds)?;
            if b.addr < r.addr || end > r.addr + r.bytes.len() as u64 {
                return Err(MemError::OutOfBounds);
            }
            Some(Binding {
                mr: b.mr_lkey,
                addr: b.addr,
                len: b.length,
                access: b.access,
                qpn: (w.kind == 2).then_some(qpn),
            })
        };
        windows.remove(&b.mw_rkey);
        windows.insert(
            b.new_rkey,
            Window {
                bound: binding,
                ..w
            },
        );
        Ok(())
    }

    fn invalidate(&self, pd: u32, qpn: u32, rkey: u32) -> Result<(), MemError> {
        let mut windows = self.windows.borrow_mut();
        let w = windows
            .get_mut(&rkey)
            .filter(|w| w.pd == pd && w.kind == 2)
            .ok_or(MemError::InvalidKey)?;
        match w.bound {
            Some(b) if b.qpn == Some(qpn) => {
                w.bound = None;
                Ok(())
            }
            _ => Err(MemError::InvalidKey),
        }
    }

    fn bound_qp(&self, rkey: u32) -> Option<u32> {
        self.windows
            .borrow()
            .get(&rkey)
            .and_then(|w| w.bound)
            .and_then(|b| b.qpn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_pd_bounds_and_access() {
        let m = VecMemory::new();
        let a = m.register(
            1,
            vec![0; 64],
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        );
        let mut buf = [0u8; 8];
        assert_eq!(m.read_local(1, a.lkey, a.addr, &mut buf), Ok(()));
        assert_eq!(
            m.read_local(2, a.lkey, a.addr, &mut buf),
            Err(MemError::InvalidKey)
        );
        assert_eq!(
            m.read_local(1, a.lkey + 1, a.addr, &mut buf),
            Err(MemError::InvalidKey)
        );
        assert_eq!(
            m.read_local(1, a.lkey, a.addr + 60, &mut buf),
            Err(MemError::OutOfBounds)
        );
        assert_eq!(
            m.read_local(1, a.lkey, a.addr - 1, &mut buf),
            Err(MemError::OutOfBounds)
        );
        assert_eq!(
            m.write_remote(1, a.rkey, a.addr, &buf),
            Err(MemError::AccessDenied)
        );
        assert_eq!(m.write_local(1, a.lkey, a.addr + 8, &[7; 8]), Ok(()));
        assert_eq!(m.read_remote(1, a.rkey, a.addr + 8, &mut buf), Ok(()));
        assert_eq!(buf, [7; 8]);
        assert!(m.deregister(a.lkey));
        assert_eq!(
            m.read_local(1, a.lkey, a.addr, &mut buf),
            Err(MemError::InvalidKey)
        );
    }

    #[test]
    fn atomics() {
        let m = VecMemory::new();
        let a = m.register(1, vec![0; 16], AccessFlags::REMOTE_ATOMIC);
        assert_eq!(
            m.atomic(1, a.rkey, a.addr, AtomicOp::FetchAdd { add: 5 }),
            Ok(0)
        );
        assert_eq!(
            m.atomic(
                1,
                a.rkey,
                a.addr,
                AtomicOp::CompareSwap {
                    compare: 4,
                    swap: 9
                }
            ),
            Ok(5)
        );
        assert_eq!(
            m.atomic(
                1,
                a.rkey,
                a.addr,
                AtomicOp::CompareSwap {
                    compare: 5,
                    swap: 9
                }
            ),
            Ok(5)
        );
        assert_eq!(
            m.atomic(1, a.rkey, a.addr, AtomicOp::FetchAdd { add: 0 }),
            Ok(9)
        );
        assert_eq!(
            m.atomic(1, a.rkey, a.addr + 4, AtomicOp::FetchAdd { add: 0 }),
            Err(MemError::Misaligned)
        );
        assert_eq!(
            m.atomic(1, a.rkey, a.addr + 16, AtomicOp::FetchAdd { add: 0 }),
            Err(MemError::OutOfBounds)
        );
    }

    #[test]
    fn gather_and_scatter_across_sges() {
        let m = VecMemory::new();
        let a = m.register(1, (0..32).collect(), AccessFlags::LOCAL_WRITE);
        let sges = [a.sge(0, 4), a.sge(10, 6), a.sge(20, 10)];
        let mut out = [0u8; 8];
        gather(&m, 1, &sges, 2, &mut out).unwrap();
        assert_eq!(out, [2, 3, 10, 11, 12, 13, 14, 15]);
        assert_eq!(
            gather(&m, 1, &sges, 15, &mut out),
            Err(ScatterError::TooLong)
        );
        // A refused SGE is named with its lkey, address and length.
        let bad = [
            a.sge(0, 4),
            Sge {
                lkey: 0x77,
                ..a.sge(4, 4)
            },
        ];
        assert_eq!(
            gather(&m, 1, &bad, 0, &mut out),
            Err(ScatterError::Memory(SgeFault {
                lkey: 0x77,
                addr: a.addr + 4,
                length: 4,
                error: MemError::InvalidKey
            }))
        );
        scatter(&m, 1, &sges, 3, &[0xAA, 0xBB, 0xCC]).unwrap();
        let b = m.bytes(a.lkey).unwrap();
        assert_eq!((b[3], b[10], b[11]), (0xAA, 0xBB, 0xCC));
        assert_eq!(
            scatter(&m, 1, &sges, 19, &[1, 2, 3]),
            Err(ScatterError::TooLong)
        );
    }
}
