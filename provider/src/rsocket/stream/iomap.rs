//! Direct writes of a stream rsocket (`riomap`, `riounmap`, `riowrite`): a side registers a
//! buffer and writes its entry (`struct rs_iomap`: offset, address, rkey, length) into the
//! iomap area the peer offered behind its target SGL; the peer then RDMA-writes into it by
//! offset, with no message and no receive credit.

use ferroce_transport::{AccessFlags, SendWr, WrOpcode};

use super::super::proto::{self, IOMAP_LEN, Iomap, Msg, OLAP_START_SIZE, Op, SGE_LEN, SGL_SIZE};
use super::{Stream, next_piece};
use crate::{Error, MemoryRegion, Result};

/// One `riomap`: a caller's buffer registered for the peer's writes.
pub(super) struct Mapping {
    /// Its entry in the peer's iomap area; `None` for a mapping without `PROT_WRITE`, which
    /// is only registered.
    pub(super) index: Option<u32>,
    pub(super) offset: u64,
    pub(super) mr: MemoryRegion,
    /// Written to the peer's iomap area (or queued until the next `riowrite`).
    pub(super) sent: bool,
}

impl Stream {
    /// `riomap`: registers `len` bytes at `ptr` on this connection. With `writable`
    /// (`PROT_WRITE`) the peer may `riowrite` them, addressed from `offset` (`None`: the
    /// buffer's address, as `riomap`'s offset -1). As rdma-core's, the entry reaches the
    /// peer's iomap area with this side's next [`Stream::send`] or [`Stream::iowrite`] (or
    /// [`Stream::flush_iomaps`]). Returns the offset.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid for reads and writes until [`Stream::iounmap`] of it
    /// returns or the stream is dropped (either deregisters it; the peer's writes may land
    /// in it at any time before).
    ///
    /// # Errors
    /// ENOMEM when every entry of the peer's iomap area is in use (or the peer offered none:
    /// `RDMA_IOMAPSIZE`); EINVAL for a region over 4 GiB; what `ibv_reg_mr` refuses.
    pub unsafe fn iomap(
        &mut self,
        ptr: *mut u8,
        len: usize,
        writable: bool,
        offset: Option<u64>,
    ) -> Result<u64> {
        if u32::try_from(len).is_err() {
            log::debug!("riomap: {len} bytes do not fit an iomap entry's 32-bit length");
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::EINVAL)));
        }
        let index = if writable {
            let free = (0..self.remote_iomap.length)
                .find(|i| !self.iomaps.iter().any(|m| m.index == Some(*i)));
            let Some(i) = free else {
                log::debug!(
                    "riomap: the peer's iomap area has {} entries, all in use (RDMA_IOMAPSIZE)",
                    self.remote_iomap.length
                );
                return Err(self.io_err(libc::ENOMEM));
            };
            Some(i)
        } else {
            None
        };
        let access = if writable {
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
        } else {
            AccessFlags::LOCAL_WRITE
        };
        // This function's contract is reg_mr_raw's; iounmap and the stream's drop deregister.
        // SAFETY: the range stays valid until iounmap or the drop deregisters the region.
        let mr = unsafe { self._pd.reg_mr_raw(ptr, len, access)? };
        let offset = offset.unwrap_or(ptr as u64);
        self.iomaps.push(Mapping {
            index,
            offset,
            mr,
            sent: index.is_none(),
        });
        Ok(offset)
    }

    /// `riounmap`: deregisters the mapping of exactly `ptr`/`len` (the peer's later writes
    /// to it fail; its entry in the peer's area may be reused).
    ///
    /// # Errors
    /// EINVAL when no mapping has that address and length.
    pub fn iounmap(&mut self, ptr: *const u8, len: usize) -> Result<()> {
        let Some(i) = self
            .iomaps
            .iter()
            .position(|m| m.mr.addr() == ptr as u64 && m.mr.len() == len)
        else {
            log::debug!("riounmap: no mapping of {len} bytes at {ptr:p}");
            return Err(self.io_err(libc::EINVAL));
        };
        self.iomaps.swap_remove(i).mr.dereg();
        Ok(())
    }

    /// Writes the entries of new `riomap`s into the peer's iomap area (RDMA WRITE WITH
    /// IMMEDIATE, op IOMAP_SGL and the entry's index, one message credit each).
    ///
    /// # Errors
    /// As [`Stream::send`].
    pub fn flush_iomaps(&mut self, nonblock: bool) -> Result<()> {
        while let Some(i) = self.iomaps.iter().position(|m| !m.sent) {
            self.wait_can_send(nonblock)?;
            let m = &self.iomaps[i];
            // Only mappings with an entry start unsent (see `iomap`).
            let index = m.index.unwrap_or_default();
            let entry = Iomap {
                offset: m.offset,
                sge: proto::Sge {
                    addr: m.mr.addr(),
                    key: m.mr.rkey(),
                    // `iomap` refused lengths over u32.
                    length: m.mr.len() as u32,
                },
            };
            let msg = Msg::new(Op::IomapSgl, index);
            let mut wr = SendWr::new(u64::from(msg.imm()), WrOpcode::RdmaWriteWithImm);
            wr.imm_data = msg.imm();
            wr.remote.remote_addr = self.remote_iomap.addr + u64::from(index) * IOMAP_LEN as u64;
            wr.remote.rkey = self.remote_iomap.key;
            self.stage(&entry.to_bytes(self.swap_sgl), &mut wr)?;
            self.sseq_no = self.sseq_no.wrapping_add(1);
            self.sqe_avail -= 1;
            self.sbuf_bytes_avail -= IOMAP_LEN as u32;
            self.qp.post_send(&wr)?;
            self.iomaps[i].sent = true;
        }
        Ok(())
    }

    /// The peer's mapping that covers `offset`, from this side's iomap area.
    fn find_iomap(&self, offset: u64) -> Option<Iomap> {
        (0..self.sizes.iomap_size as usize).find_map(|i| {
            let mut b = [0u8; IOMAP_LEN];
            // The area is iomap_size entries long, behind the SGL: the read is inside it.
            self.tsgl
                .read(SGL_SIZE as usize * SGE_LEN + i * IOMAP_LEN, &mut b)
                .ok()?;
            let m = Iomap::from_le_bytes(&b);
            (offset >= m.offset && offset - m.offset < u64::from(m.sge.length)).then_some(m)
        })
    }

    /// `riowrite`: RDMA-writes `buf` straight into the peer's mapping at `offset` (no
    /// message, no receive credit: the peer learns of it by its own means, as riostream
    /// polls a byte); returns the bytes taken (all of them when blocking, unless the
    /// mappings end first).
    ///
    /// # Errors
    /// EINVAL when no mapping of the peer covers `offset` (rdma-core's returns 0 there);
    /// otherwise as [`Stream::send`].
    pub fn iowrite(&mut self, buf: &[u8], offset: u64, dontwait: bool) -> Result<usize> {
        let nonblock = self.nonblock || dontwait;
        self.flush_iomaps(nonblock)?;
        let mut done = 0usize;
        let mut olen = OLAP_START_SIZE;
        let mut iom: Option<Iomap> = None;
        while done < buf.len() {
            let off = offset + done as u64;
            let m = match iom {
                Some(m) if off - m.offset < u64::from(m.sge.length) => m,
                _ => match self.find_iomap(off) {
                    Some(m) => {
                        iom = Some(m);
                        m
                    }
                    None if done > 0 => break,
                    None => {
                        log::debug!("riowrite: no mapping of the peer covers offset {off:#x}");
                        return Err(self.io_err(libc::EINVAL));
                    }
                },
            };
            if let Err(e) = self.wait_can_send(nonblock) {
                return if done > 0 { Ok(done) } else { Err(e) };
            }
            let left = (buf.len() - done) as u32;
            let mut xfer = next_piece(&mut olen, left);
            let in_map = u64::from(m.sge.length) - (off - m.offset);
            xfer = xfer.min(self.sbuf_bytes_avail).min(in_map as u32);
            let msg = Msg::new(Op::Write, xfer);
            let mut wr = SendWr::new(u64::from(msg.imm()), WrOpcode::RdmaWrite);
            wr.remote.remote_addr = m.sge.addr + (off - m.offset);
            wr.remote.rkey = m.sge.key;
            self.stage(&buf[done..done + xfer as usize], &mut wr)?;
            self.sqe_avail -= 1;
            self.sbuf_bytes_avail -= xfer;
            self.qp.post_send(&wr)?;
            done += xfer as usize;
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::{Listener, Sizes, Stream};

    fn pair(port: u16, server_iomap: u32) -> (Stream, Stream) {
        let addr: std::net::SocketAddr = format!("127.0.234.1:{port}").parse().unwrap();
        let l = Listener::bind(
            addr,
            4,
            Sizes {
                iomap_size: server_iomap,
                ..Sizes::default()
            },
        )
        .unwrap();
        let c = Stream::connect(
            Some("127.0.234.2:0".parse().unwrap()),
            addr,
            Sizes::default(),
        )
        .unwrap();
        let s = l.accept(false).unwrap().unwrap();
        (s, c)
    }

    fn recv_exact(s: &mut Stream, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        let mut got = 0;
        while got < n {
            let k = s.recv(&mut b[got..], false).unwrap();
            assert!(k > 0, "end of stream");
            got += k;
        }
        b
    }

    /// riostream's pattern: one side maps a buffer in the area the other offered, the other
    /// writes it by offset in several pieces (inline, through the send buffer, wrapping it),
    /// the last byte last; the mapping side sees every byte without a message.
    #[test]
    fn riowrite_lands_in_the_peers_mapping() {
        let (mut c, mut s) = pair(7500, 2);
        const LEN: usize = 300_000;
        let mut target = vec![0u8; LEN].into_boxed_slice();
        let ptr = target.as_mut_ptr();
        // `target` is unmapped below before it is read as a slice or dropped.
        // SAFETY: `target` stays valid (and unborrowed) for as long as it is mapped.
        let off = unsafe { s.iomap(ptr, LEN, true, Some(0x10_0000)) }.unwrap();
        assert_eq!(off, 0x10_0000);
        s.send(b"go", false).unwrap(); // carries the iomap entry before the data
        assert_eq!(recv_exact(&mut c, 2), b"go");
        let data: Vec<u8> = (0..LEN).map(|i| (i * 13 + i / 509 + 1) as u8).collect();
        let mut done = 0;
        for piece in [10, 2048, 70_000, 100_000] {
            done += c
                .iowrite(&data[done..done + piece], off + done as u64, false)
                .unwrap();
        }
        while done < LEN {
            done += c.iowrite(&data[done..], off + done as u64, false).unwrap();
        }
        let t0 = Instant::now();
        // SAFETY: a volatile read of a byte inside `target`, which the runtime may write.
        while unsafe { ptr.add(LEN - 1).read_volatile() } != data[LEN - 1] {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the last byte never landed"
            );
            std::thread::yield_now();
        }
        s.iounmap(ptr, LEN).unwrap();
        assert!(target[..] == data[..], "every byte where it was written");
        // Past the mapping: nothing covers the offset.
        let e = c.iowrite(b"x", off + LEN as u64, false).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
        assert_eq!(s.iounmap(ptr, LEN).unwrap_err().errno(), libc::EINVAL);
    }

    /// rdma-core's rules at the edges: no area offered (ENOMEM), the area full (ENOMEM), an
    /// entry reused after riounmap, a mapping without PROT_WRITE that takes no entry.
    #[test]
    fn the_peers_iomap_area_bounds_the_mappings() {
        let (mut s, mut c) = pair(7501, 1);
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        // The streams (and so the mappings) are dropped before the buffers.
        // SAFETY: both buffers stay valid for as long as they are mapped.
        unsafe {
            // The client offered no area: the server may not map for it.
            assert_eq!(
                s.iomap(a.as_mut_ptr(), 4096, true, None)
                    .unwrap_err()
                    .errno(),
                libc::ENOMEM
            );
            // The server offered one entry.
            let off = c.iomap(a.as_mut_ptr(), 4096, true, None).unwrap();
            assert_eq!(off, a.as_ptr() as u64, "offset -1 maps the address");
            assert_eq!(
                c.iomap(b.as_mut_ptr(), 4096, true, None)
                    .unwrap_err()
                    .errno(),
                libc::ENOMEM
            );
            c.iomap(b.as_mut_ptr(), 4096, false, Some(0)).unwrap();
            c.iounmap(a.as_ptr(), 4096).unwrap();
            c.iomap(b.as_mut_ptr(), 2048, true, Some(0)).unwrap();
        }
        c.flush_iomaps(false).unwrap();
        c.send(b"k", false).unwrap();
        assert_eq!(recv_exact(&mut s, 1), b"k");
        s.iowrite(b"hello", 5, false).unwrap();
        s.send(b"k", false).unwrap();
        assert_eq!(recv_exact(&mut c, 1), b"k");
        // The send after the write completes after it (one QP, in order).
        let t0 = Instant::now();
        loop {
            let got: Vec<u8> = (5..10)
                // SAFETY: a volatile read inside `b` (i < 10 < 4096), which the runtime may write.
                .map(|i| unsafe { b.as_ptr().add(i).read_volatile() })
                .collect();
            if got == b"hello" {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(10));
        }
        // Beyond the 2048 bytes mapped: refused locally.
        assert_eq!(
            s.iowrite(b"z", 2048, false).unwrap_err().errno(),
            libc::EINVAL
        );
        drop(c);
        drop(s);
    }
}
