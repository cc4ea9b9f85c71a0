//! Memory windows (`ibv_mw`, IBTA 10.6.7): a window opens part of a registered region to
//! remote access under its own rkey and rights, and can be moved or closed without touching
//! the region. Type 1 windows are bound with [`QueuePair::bind_mw`] and serve every QP of the
//! PD; type 2 windows are bound by a `BIND_MW` work request ([`SendWr::bind_mw`]), serve only
//! the QP that bound them, and are closed by `LOCAL_INV` or a peer's SEND with invalidate.
//! Binding and invalidating happen in the engine, in send-queue order; the table here keeps
//! the windows beside the regions they open onto.

use std::sync::Arc;

use ferroce_transport::memory::MemError;
use ferroce_transport::{AccessFlags, MwBind, SendWr};

use crate::mr::{Keys, MrInner, MrTable};
use crate::{Error, MemoryRegion, ProtectionDomain, QueuePair, Result};

/// `enum ibv_mw_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MwType {
    /// `IBV_MW_TYPE_1`: bound with `ibv_bind_mw`, for every QP of the PD.
    Type1 = 1,
    /// `IBV_MW_TYPE_2`: bound by a `BIND_MW` work request, for the QP that posted it.
    Type2 = 2,
}

/// A window in the table.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    pd: u32,
    kind: MwType,
    /// The current rkey (index in bits 31:8, a key byte the binder chooses).
    rkey: u32,
    bound: Option<Bound>,
}

#[derive(Debug, Clone)]
struct Bound {
    mr: Arc<MrInner>,
    addr: u64,
    len: u64,
    access: AccessFlags,
    /// Type 2: the QP it answers.
    qpn: Option<u32>,
}

/// `ibv_inc_rkey`: the same window index, the next key byte.
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

impl MrTable {
    fn alloc_window(&self, pd: u32, kind: MwType) -> std::io::Result<u32> {
        let mut k = self.keys.write();
        let rkey = k.fresh_key()?;
        k.windows.insert(
            rkey >> 8,
            Window {
                pd,
                kind,
                rkey,
                bound: None,
            },
        );
        Ok(rkey)
    }

    fn free_window(&self, index: u32) {
        self.keys.write().windows.remove(&index);
    }

    fn window_rkey(&self, index: u32) -> Option<u32> {
        self.keys.read().windows.get(&index).map(|w| w.rkey)
    }

    /// How many windows are bound onto region `lkey` (`ibv_dereg_mr` refuses while any is).
    pub(crate) fn windows_on(&self, lkey: u32) -> usize {
        self.keys
            .read()
            .windows
            .values()
            .filter(|w| w.bound.as_ref().is_some_and(|b| b.mr.lkey == lkey))
            .count()
    }

    /// Closes every window bound onto region `lkey` (it is being deregistered).
    pub(crate) fn unbind_on(&self, lkey: u32) {
        for w in self.keys.write().windows.values_mut() {
            if w.bound.as_ref().is_some_and(|b| b.mr.lkey == lkey) {
                w.bound = None;
            }
        }
    }

    pub(crate) fn bind_window(
        &self,
        pd: u32,
        qpn: u32,
        b: &MwBind,
    ) -> std::result::Result<(), MemError> {
        let mut k = self.keys.write();
        let index = b.mw_rkey >> 8;
        let w = k
            .windows
            .get(&index)
            .filter(|w| w.rkey == b.mw_rkey && w.pd == pd)
            .cloned()
            .ok_or(MemError::InvalidKey)?;
        if b.new_rkey >> 8 != index
            || (w.kind == MwType::Type2 && w.bound.is_some())
            || (b.new_rkey != w.rkey && k.live.contains(b.new_rkey))
        {
            return Err(MemError::InvalidKey);
        }
        if w.kind == MwType::Type1 && b.access.contains(AccessFlags::ZERO_BASED) {
            // IBTA o10-36.2.2 (rxe too): only a type 2 window may be zero based.
            log::debug!("bind_mw: a type 1 window cannot be zero based");
            return Err(MemError::AccessDenied);
        }
        let bound = if b.length == 0 && w.kind == MwType::Type1 {
            None
        } else {
            let mr = k
                .live
                .get(b.mr_lkey)
                .filter(|m| m.pd == pd)
                .cloned()
                .ok_or(MemError::InvalidKey)?;
            let remote_w = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
            if !mr.access.contains(AccessFlags::MW_BIND)
                || (!(b.access & remote_w).is_empty()
                    && !mr.access.contains(AccessFlags::LOCAL_WRITE))
            {
                return Err(MemError::AccessDenied);
            }
            mr.offset(b.addr, b.length)?;
            Some(Bound {
                mr,
                addr: b.addr,
                len: b.length,
                access: b.access,
                qpn: (w.kind == MwType::Type2).then_some(qpn),
            })
        };
        k.windows.insert(
            index,
            Window {
                rkey: b.new_rkey,
                bound,
                ..w
            },
        );
        Ok(())
    }

    pub(crate) fn invalidate_window(
        &self,
        pd: u32,
        qpn: u32,
        rkey: u32,
    ) -> std::result::Result<(), MemError> {
        let mut k = self.keys.write();
        let w = k
            .windows
            .get_mut(&(rkey >> 8))
            .filter(|w| w.rkey == rkey && w.pd == pd && w.kind == MwType::Type2)
            .ok_or(MemError::InvalidKey)?;
        match &w.bound {
            Some(b) if b.qpn == Some(qpn) => {
                w.bound = None;
                Ok(())
            }
            _ => Err(MemError::InvalidKey),
        }
    }

    pub(crate) fn window_qp(&self, rkey: u32) -> Option<u32> {
        self.keys
            .read()
            .windows
            .get(&(rkey >> 8))
            .filter(|w| w.rkey == rkey)
            .and_then(|w| w.bound.as_ref())
            .and_then(|b| b.qpn)
    }
}

impl Keys {
    /// If `rkey` is a window's: the region it opens onto, once the access fits its range and
    /// rights (an unbound window is an invalid key); `None` if it is no window's key.
    pub(crate) fn through_window(
        &self,
        pd: u32,
        rkey: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> std::result::Result<Option<(&MrInner, u64)>, MemError> {
        let Some(w) = self.windows.get(&(rkey >> 8)).filter(|w| w.rkey == rkey) else {
            return Ok(None);
        };
        let b = w
            .bound
            .as_ref()
            .filter(|_| w.pd == pd)
            .ok_or(MemError::InvalidKey)?;
        if !b.access.contains(need) {
            return Err(MemError::AccessDenied);
        }
        let end = addr.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if b.access.contains(AccessFlags::ZERO_BASED) {
            // Offsets 0..len of the window are the region's addresses b.addr.. (inside the
            // region: checked at bind).
            if end > b.len {
                return Err(MemError::OutOfBounds);
            }
            return Ok(Some((&b.mr, b.addr + addr)));
        }
        if addr < b.addr || end > b.addr + b.len {
            return Err(MemError::OutOfBounds);
        }
        Ok(Some((&b.mr, addr)))
    }
}

struct MwInner {
    pd: ProtectionDomain,
    kind: MwType,
    index: u32,
}

impl Drop for MwInner {
    fn drop(&mut self) {
        self.pd.ctx.shared.mrs().free_window(self.index);
    }
}

/// A memory window (`ibv_mw`); `ibv_dealloc_mw` is dropping the last handle.
#[derive(Clone)]
pub struct MemoryWindow {
    inner: Arc<MwInner>,
}

impl std::fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MemoryWindow({:?}, rkey {:#x})",
            self.inner.kind,
            self.rkey()
        )
    }
}

impl MemoryWindow {
    /// The window's current rkey (`mw->rkey`): after a bind, the bind's new key.
    pub fn rkey(&self) -> u32 {
        self.inner
            .pd
            .ctx
            .shared
            .mrs()
            .window_rkey(self.inner.index)
            .unwrap_or(0)
    }

    /// `mw->type`.
    pub fn mw_type(&self) -> MwType {
        self.inner.kind
    }

    /// The work request that binds this (type 2) window onto `[addr, addr+len)` of `mr` with
    /// `access` under the next key (`ibv_inc_rkey`); post it on the QP that will use it.
    pub fn bind_wr(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> SendWr {
        let rkey = self.rkey();
        SendWr::bind_mw(
            wr_id,
            MwBind {
                mw_rkey: rkey,
                new_rkey: inc_rkey(rkey),
                mr_lkey: mr.lkey(),
                addr,
                length: len,
                access,
            },
        )
    }
}

impl ProtectionDomain {
    /// `ibv_alloc_mw`: an unbound window of `kind` in this PD.
    ///
    /// # Errors
    /// [`Error::Io`] if the random key source fails.
    pub fn alloc_mw(&self, kind: MwType) -> Result<MemoryWindow> {
        let rkey = self.ctx.shared.mrs().alloc_window(self.handle(), kind)?;
        Ok(MemoryWindow {
            inner: Arc::new(MwInner {
                pd: self.clone(),
                kind,
                index: rkey >> 8,
            }),
        })
    }
}

impl QueuePair {
    /// `ibv_bind_mw` for a type 1 window: posts the bind on this QP, signaled (it completes as
    /// `IBV_WC_BIND_MW` with `wr_id`, in send-queue order), and returns the key the window
    /// has once it is bound ([`MemoryWindow::rkey`] follows when the bind runs). `len` 0
    /// unbinds.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a type 2 window (bind those with a work request,
    /// [`MemoryWindow::bind_wr`]); as [`QueuePair::post_send`].
    pub fn bind_mw(
        &self,
        mw: &MemoryWindow,
        mr: &MemoryRegion,
        addr: u64,
        len: u64,
        access: AccessFlags,
        wr_id: u64,
    ) -> Result<u32> {
        if mw.inner.kind != MwType::Type1 {
            return Err(Error::InvalidArgument(
                "ibv_bind_mw binds type 1 windows (type 2: a BIND_MW work request)",
            ));
        }
        let wr = mw.bind_wr(wr_id, mr, addr, len, access);
        let new = wr.bind_mw.map_or(0, |b| b.new_rkey);
        self.post_send(&wr)?;
        Ok(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mr::Snapshot;
    use ferroce_transport::Memory;

    /// Through a shard's view: a type 2 window answers only the QP it is bound to and reaches
    /// its region (looked up under the table's lock); the region's own key, found in the
    /// snapshot with no lock, is bound to no QP.
    #[test]
    fn a_type_2_window_is_found_beside_the_snapshot() {
        let t = MrTable::default();
        let mut mem = vec![0u64; 8];
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND | AccessFlags::REMOTE_WRITE;
        // SAFETY: `mem` is 8-aligned and outlives every use in this test.
        let mr = unsafe { MrInner::foreign(1, mem.as_mut_ptr().cast(), 64, access) };
        let mr = t.register(mr).unwrap();
        let mw = t.alloc_window(1, MwType::Type2).unwrap();
        let rkey = inc_rkey(mw);
        let bind = MwBind {
            mw_rkey: mw,
            new_rkey: rkey,
            mr_lkey: mr.lkey,
            addr: mr.addr + 8,
            length: 16,
            access: AccessFlags::REMOTE_WRITE,
        };
        let mut s = Snapshot::default();
        let v = s.view(&t);
        assert_eq!(v.bind_mw(1, 7, &bind), Ok(()));
        assert_eq!(v.bound_qp(rkey), Some(7));
        assert_eq!(v.bound_qp(mr.lkey), None);
        assert_eq!(v.write_remote(1, rkey, mr.addr + 8, &[9; 16]), Ok(()));
        assert_eq!(
            v.write_remote(1, rkey, mr.addr, &[9]),
            Err(MemError::OutOfBounds)
        );
        assert_eq!(v.write_remote(1, mr.lkey, mr.addr, &[3]), Ok(()));
        let mut b = [0u8; 9];
        assert_eq!(v.read_local(1, mr.lkey, mr.addr, &mut b), Ok(()));
        assert_eq!(b, [3, 0, 0, 0, 0, 0, 0, 0, 9]);
    }
}
