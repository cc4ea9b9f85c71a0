//! Running a request: SEND placement into receive WQEs, RDMA WRITE, READ (queuing its
//! responses) and atomics, with their key, access and length checks.

use ferroce_wire::{NakCode, Opcode, PacketRepr, Position, Psn};

use super::super::{Ctx, ErrorCause, Qp, wc};
use super::*;
use crate::endpoint::WcQueue;
use crate::memory::{self, AtomicOp, MemError, Memory};
use crate::verbs::{AccessFlags, WcFlags, WcOpcode, WcStatus};

impl Qp {
    /// Places SEND payload; `Ok(false)` when there is no receive WQE (RNR).
    pub(super) fn receive_send<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        pkt: &PacketRepr<'_>,
        pos: Position,
    ) -> Result<bool, Fault> {
        if matches!(pos, Position::First | Position::Only) {
            let Some(wqe) = self.take_recv_wqe(ctx) else {
                self.rnr_nak(ctx, pkt.bth.psn);
                return Ok(false);
            };
            self.resp.in_send = Some(InSend { wqe, offset: 0 });
        }
        let Some(cur) = self.resp.in_send.as_mut() else {
            return Err(Fault::Nak(NakCode::InvalidRequest));
        };
        if let Err(e) = memory::scatter(
            ctx.mem,
            self.pd,
            &cur.wqe.sg_list,
            u64::from(cur.offset),
            pkt.payload,
        ) {
            let arrived = u64::from(cur.offset) + pkt.payload.len() as u64;
            let (status, cause) = ErrorCause::of_scatter(e, arrived, &cur.wqe.sg_list);
            // A message longer than the receive is the requester's invalid request; a receive
            // buffer its memory refuses is this side's operational error.
            let nak = if status == WcStatus::LocLenErr {
                NakCode::InvalidRequest
            } else {
                NakCode::RemoteOperationalError
            };
            return Err(Fault::Recv(status, cause, nak));
        }
        // The SEND so far is within max_msg_sz (so the u32 cannot overflow): a peer cannot
        // push a receive past the device's limit, even into a huge receive buffer.
        let total = u64::from(cur.offset) + pkt.payload.len() as u64;
        if total > MAX_MSG_LEN {
            log::debug!(
                "QP {:#x}: SEND at PSN {} grows past max_msg_sz ({MAX_MSG_LEN}): NAK invalid request",
                self.qpn,
                pkt.bth.psn
            );
            ctx.counters.msg_too_long += 1;
            let buffer: u64 = cur.wqe.sg_list.iter().map(|g| u64::from(g.length)).sum();
            let cause = ErrorCause::LocalLength {
                message: total,
                buffer: buffer.min(MAX_MSG_LEN),
            };
            return Err(Fault::Recv(
                WcStatus::LocLenErr,
                cause,
                NakCode::InvalidRequest,
            ));
        }
        cur.offset = total as u32;
        if matches!(pos, Position::Last | Position::Only) {
            // SEND with invalidate: the key goes before the receive completes (IBTA 9.4.1.1.5).
            if let Some(ieth) = pkt.ext.ieth {
                if let Err(e) = ctx.mem.invalidate(self.pd, self.qpn, ieth.rkey) {
                    log::debug!(
                        "QP {:#x}: SEND with invalidate of rkey {:#x}: {e:?}: NAK invalid request",
                        self.qpn,
                        ieth.rkey
                    );
                    let cause = ErrorCause::RemoteInvalidate {
                        psn: pkt.bth.psn,
                        rkey: ieth.rkey,
                        error: e,
                    };
                    return Err(Fault::Recv(
                        WcStatus::RemInvReqErr,
                        cause,
                        NakCode::InvalidRequest,
                    ));
                }
            }
            let Some(done) = self.resp.in_send.take() else {
                return Ok(true);
            };
            let mut c = wc(
                self.qpn,
                done.wqe.wr_id,
                WcStatus::Success,
                WcOpcode::Recv,
                done.offset,
            );
            c.src_qp = self.attr.dest_qp_num;
            if let Some(imm) = pkt.ext.immdt {
                c.imm_data = imm.imm;
                c.wc_flags |= WcFlags::WITH_IMM;
            }
            if let Some(ieth) = pkt.ext.ieth {
                c.invalidated_rkey = ieth.rkey;
                c.wc_flags |= WcFlags::WITH_INV;
            }
            self.report(ctx, WcQueue::Recv, c);
            self.resp.bump_msn();
        }
        Ok(true)
    }

    /// A remote access through a type 2 memory window must arrive on the QP the window is
    /// bound to; anything else is a remote access error.
    fn window_allows<M: Memory + ?Sized>(&self, ctx: &Ctx<'_, M>, rkey: u32) -> Result<(), Fault> {
        match ctx.mem.bound_qp(rkey) {
            Some(q) if q != self.qpn => {
                log::debug!(
                    "QP {:#x}: rkey {rkey:#x} is a window bound to QP {q:#x}: NAK remote access",
                    self.qpn
                );
                Err(Fault::Nak(NakCode::RemoteAccessError))
            }
            _ => Ok(()),
        }
    }

    /// Places WRITE payload; `Ok(false)` when a WRITE with immediate finds no receive WQE.
    pub(super) fn receive_write<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        pkt: &PacketRepr<'_>,
        pos: Position,
        imm: bool,
    ) -> Result<bool, Fault> {
        let last = matches!(pos, Position::Last | Position::Only);
        if matches!(pos, Position::First | Position::Only) {
            let reth = pkt.ext.reth.ok_or(Fault::Nak(NakCode::InvalidRequest))?;
            if u64::from(reth.dma_len) > MAX_MSG_LEN {
                log::debug!(
                    "QP {:#x}: WRITE of {} bytes is past max_msg_sz ({MAX_MSG_LEN}): NAK invalid request",
                    self.qpn,
                    reth.dma_len
                );
                ctx.counters.msg_too_long += 1;
                return Err(Fault::Nak(NakCode::InvalidRequest));
            }
            // A zero-length WRITE touches no memory and skips the R_Key check (C9-88).
            if reth.dma_len > 0 {
                self.window_allows(ctx, reth.rkey)?;
                ctx.mem
                    .check_remote(
                        self.pd,
                        reth.rkey,
                        reth.va,
                        u64::from(reth.dma_len),
                        AccessFlags::REMOTE_WRITE,
                    )
                    .map_err(|_| Fault::Nak(NakCode::RemoteAccessError))?;
            }
            self.resp.in_write = Some(InWrite {
                va: reth.va,
                rkey: reth.rkey,
                resid: reth.dma_len,
                total: reth.dma_len,
            });
        }
        let Some(w) = self.resp.in_write else {
            return Err(Fault::Nak(NakCode::InvalidRequest));
        };
        let len = pkt.payload.len() as u32;
        if len > w.resid || (last && len != w.resid) {
            return Err(Fault::Nak(NakCode::InvalidRequest));
        }
        let wqe = if imm {
            match self.take_recv_wqe(ctx) {
                Some(wqe) => Some(wqe),
                None => {
                    if matches!(pos, Position::Only) {
                        self.resp.in_write = None;
                    }
                    self.rnr_nak(ctx, pkt.bth.psn);
                    return Ok(false);
                }
            }
        } else {
            None
        };
        if len > 0 {
            ctx.mem
                .write_remote(self.pd, w.rkey, w.va, pkt.payload)
                .map_err(|_| Fault::Nak(NakCode::RemoteAccessError))?;
        }
        if last {
            self.resp.in_write = None;
            self.resp.bump_msn();
            if let Some(wqe) = wqe {
                let mut c = wc(
                    self.qpn,
                    wqe.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    w.total,
                );
                c.src_qp = self.attr.dest_qp_num;
                if let Some(i) = pkt.ext.immdt {
                    c.imm_data = i.imm;
                }
                c.wc_flags |= WcFlags::WITH_IMM;
                self.report(ctx, WcQueue::Recv, c);
            }
        } else {
            self.resp.in_write = Some(InWrite {
                va: w.va + u64::from(len),
                resid: w.resid - len,
                ..w
            });
        }
        Ok(true)
    }

    pub(super) fn receive_read<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        pkt: &PacketRepr<'_>,
    ) -> Result<Psn, Fault> {
        let reth = pkt.ext.reth.ok_or(Fault::Nak(NakCode::InvalidRequest))?;
        if u64::from(reth.dma_len) > MAX_MSG_LEN {
            log::debug!(
                "QP {:#x}: READ of {} bytes is past max_msg_sz ({MAX_MSG_LEN}): NAK invalid request",
                self.qpn,
                reth.dma_len
            );
            ctx.counters.msg_too_long += 1;
            return Err(Fault::Nak(NakCode::InvalidRequest));
        }
        self.check_rd_atomic_room(ctx)?;
        if reth.dma_len > 0 {
            self.window_allows(ctx, reth.rkey)?;
            ctx.mem
                .check_remote(
                    self.pd,
                    reth.rkey,
                    reth.va,
                    u64::from(reth.dma_len),
                    AccessFlags::REMOTE_READ,
                )
                .map_err(|_| Fault::Nak(NakCode::RemoteAccessError))?;
        }
        let psn = pkt.bth.psn;
        let npkts = reth.dma_len.div_ceil(self.mtu()).max(1);
        let last = psn + (npkts - 1);
        self.resp
            .add_resource(Resource::Read, self.attr.max_dest_rd_atomic);
        self.resp.bump_msn();
        let msn = self.resp.msn;
        self.resp.queue_read(psn, &reth, self.pd, msn, false);
        Ok(last + 1)
    }

    pub(super) fn receive_atomic<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        pkt: &PacketRepr<'_>,
    ) -> Result<Psn, Fault> {
        let a = pkt
            .ext
            .atomic_eth
            .ok_or(Fault::Nak(NakCode::InvalidRequest))?;
        if a.va % 8 != 0 {
            return Err(Fault::Nak(NakCode::InvalidRequest));
        }
        self.check_rd_atomic_room(ctx)?;
        self.window_allows(ctx, a.rkey)?;
        let op = if pkt.bth.opcode == Opcode::RC_COMPARE_SWAP {
            AtomicOp::CompareSwap {
                compare: a.compare,
                swap: a.swap_add,
            }
        } else {
            AtomicOp::FetchAdd { add: a.swap_add }
        };
        let orig = ctx
            .mem
            .atomic(self.pd, a.rkey, a.va, op)
            .map_err(|e| match e {
                MemError::Misaligned => Fault::Nak(NakCode::InvalidRequest),
                _ => Fault::Nak(NakCode::RemoteAccessError),
            })?;
        let psn = pkt.bth.psn;
        self.resp
            .add_resource(Resource::Atomic { psn, orig }, self.attr.max_dest_rd_atomic);
        self.resp.bump_msn();
        let msn = self.resp.msn;
        self.resp.push(Response::AtomicAck {
            psn,
            orig,
            msn,
            dup: false,
        });
        Ok(psn + 1)
    }

    /// An ATOMIC WRITE (IBTA 1.5): 8 bytes stored at once at an aligned address the rkey
    /// grants `REMOTE_WRITE` on, after every earlier request; answered by a zero-length READ
    /// response, as rxe does, and holding a responder resource like an atomic.
    pub(super) fn receive_atomic_write<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        pkt: &PacketRepr<'_>,
    ) -> Result<Psn, Fault> {
        let reth = pkt.ext.reth.ok_or(Fault::Nak(NakCode::InvalidRequest))?;
        let psn = pkt.bth.psn;
        let value: [u8; 8] = match <[u8; 8]>::try_from(pkt.payload) {
            Ok(v) if reth.dma_len == 8 => v,
            _ => {
                log::debug!(
                    "QP {:#x}: ATOMIC WRITE at PSN {psn} of {} bytes (RETH length {}): NAK \
                     invalid request",
                    self.qpn,
                    pkt.payload.len(),
                    reth.dma_len
                );
                return Err(Fault::Nak(NakCode::InvalidRequest));
            }
        };
        if reth.va % 8 != 0 {
            log::debug!(
                "QP {:#x}: ATOMIC WRITE at PSN {psn} to unaligned address {:#x}: NAK invalid \
                 request",
                self.qpn,
                reth.va
            );
            return Err(Fault::Nak(NakCode::InvalidRequest));
        }
        self.check_rd_atomic_room(ctx)?;
        self.window_allows(ctx, reth.rkey)?;
        ctx.mem
            .atomic_write(self.pd, reth.rkey, reth.va, value)
            .map_err(|e| {
                log::debug!(
                    "QP {:#x}: ATOMIC WRITE at PSN {psn} through rkey {:#x} at {:#x}: {e:?}: \
                     NAK remote access error",
                    self.qpn,
                    reth.rkey,
                    reth.va
                );
                Fault::Nak(NakCode::RemoteAccessError)
            })?;
        self.resp
            .add_resource(Resource::AtomicWrite { psn }, self.attr.max_dest_rd_atomic);
        self.resp.bump_msn();
        let msn = self.resp.msn;
        self.resp.push(Response::atomic_write_done(psn, msn, false));
        Ok(psn + 1)
    }

    /// A FLUSH (IBTA 1.5): the rkey must grant the flush the placement type asks for
    /// (`FLUSH_GLOBAL` and/or `FLUSH_PERSISTENT`) over the range (level range) or the region
    /// (level region). Every earlier request of the QP has been executed by now, in order, and
    /// region bytes are written through the memory's one access model, so they are already
    /// globally visible; ferroce's regions are ordinary memory, so persistence adds nothing.
    /// Answered by a zero-length READ response, as rxe does, holding a responder resource.
    pub(super) fn receive_flush<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        pkt: &PacketRepr<'_>,
    ) -> Result<Psn, Fault> {
        let (Some(reth), Some(feth)) = (pkt.ext.reth, pkt.ext.feth) else {
            return Err(Fault::Nak(NakCode::InvalidRequest));
        };
        let psn = pkt.bth.psn;
        let spec = crate::verbs::FlushSpec::from_feth(feth.bits, reth.dma_len);
        self.check_rd_atomic_room(ctx)?;
        self.window_allows(ctx, reth.rkey)?;
        // The whole region: the key and its rights; its address and length are not used (as
        // rxe, which also resends a FLUSH with address 0 after a timeout).
        let whole = spec.selectivity_level == crate::verbs::FlushSpec::MR;
        let len = if whole { 0 } else { u64::from(spec.len) };
        let checked = if whole {
            ctx.mem.check_region_key(self.pd, reth.rkey, spec.access())
        } else {
            ctx.mem
                .check_remote(self.pd, reth.rkey, reth.va, len, spec.access())
        };
        checked.map_err(|e| {
            log::debug!(
                "QP {:#x}: FLUSH at PSN {psn} (type {}, level {}) through rkey {:#x} at \
                     {:#x}+{len}: {e:?}: NAK remote access error",
                self.qpn,
                spec.placement_type,
                spec.selectivity_level,
                reth.rkey,
                reth.va
            );
            Fault::Nak(NakCode::RemoteAccessError)
        })?;
        core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
        self.resp
            .add_resource(Resource::Flush, self.attr.max_dest_rd_atomic);
        self.resp.bump_msn();
        let msn = self.resp.msn;
        self.resp.push(Response::atomic_write_done(psn, msn, false));
        Ok(psn + 1)
    }

    pub(super) fn complete_recv_error<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        status: WcStatus,
        cause: ErrorCause,
    ) {
        if let Some(s) = self.resp.in_send.take() {
            self.note_error(status, s.wqe.wr_id, cause);
            self.report(
                ctx,
                WcQueue::Recv,
                wc(self.qpn, s.wqe.wr_id, status, WcOpcode::Recv, 0),
            );
        }
    }
}
