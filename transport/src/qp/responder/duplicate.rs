//! Duplicate RC requests (IBTA §9.7.5.1.2): re-ACK, re-answer a READ, replay a saved atomic
//! result or an ATOMIC WRITE's answer; never execute twice.

use ferroce_wire::{NakCode, Operation, PacketRepr};

use super::super::{Ctx, Qp};
use super::*;
use crate::memory::Memory;
use crate::verbs::AccessFlags;

impl Qp {
    /// A request behind the expected PSN (C9-104 … C9-111): SEND/WRITE are acknowledged again,
    /// READs replayed from a responder resource, atomics answered with the saved value.
    pub(super) fn duplicate<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        pkt: &PacketRepr<'_>,
    ) {
        let psn = pkt.bth.psn;
        let msn = self.resp.msn;
        match pkt.bth.opcode.info().map(|i| i.operation) {
            Some(Operation::Send | Operation::Write) => {
                let prev = self.resp.psn.wrapping_sub(1);
                self.resp.ack(prev);
            }
            Some(Operation::ReadRequest) => {
                // A duplicate READ is executed again (C9-109): it reads memory and changes
                // nothing. Its responses must end before the expected PSN, or they would
                // overlap newer requests.
                let Some(reth) = pkt.ext.reth else { return };
                let npkts = reth.dma_len.div_ceil(self.mtu()).max(1);
                let fits = (psn + (npkts - 1)).is_before(self.resp.psn);
                let ok = reth.dma_len == 0
                    || ctx
                        .mem
                        .check_remote(
                            self.pd,
                            reth.rkey,
                            reth.va,
                            u64::from(reth.dma_len),
                            AccessFlags::REMOTE_READ,
                        )
                        .is_ok();
                if fits && ok {
                    // The requester went back to `psn`: responses of this READ still queued
                    // from an earlier request are stale; drop them rather than send the data
                    // twice behind them (a long READ would otherwise outlast the timeout).
                    let last = psn + (npkts - 1);
                    self.resp.out.retain(
                        |r| !matches!(r, Response::Read { psn: q, .. } if q.is_within(psn, last)),
                    );
                    if self.rd_atomic_outstanding(true)
                        < usize::from(self.attr.max_dest_rd_atomic.max(1))
                    {
                        self.resp.queue_read(psn, &reth, self.pd, msn, true);
                    } else {
                        // A flood of duplicates must not grow the response queue either.
                        ctx.counters.rd_atomic_exceeded += 1;
                        ctx.counters.dropped += 1;
                    }
                } else if fits {
                    // A READ retried after its region was deregistered: executed again, it
                    // fails the R_Key check, and the requester still waiting for it gets the
                    // NAK (one that already has its data ignores a NAK behind its ACKs). The
                    // responder stays up: a stray duplicate must not end a live connection.
                    log::debug!(
                        "QP {:#x}: duplicate READ at PSN {psn}: rkey {:#x} fails its check, \
                         NAK remote access error",
                        self.qpn,
                        reth.rkey
                    );
                    self.resp.nak(psn, NakCode::RemoteAccessError);
                } else {
                    ctx.counters.dropped += 1;
                }
            }
            Some(Operation::CompareSwap | Operation::FetchAdd) => {
                let saved = self.resp.resources.iter().find_map(|r| match r {
                    Resource::Atomic { psn: p, orig } if *p == psn => Some(*orig),
                    _ => None,
                });
                let room = self.rd_atomic_outstanding(true)
                    < usize::from(self.attr.max_dest_rd_atomic.max(1));
                match saved {
                    Some(orig) if room => self.resp.push(Response::AtomicAck {
                        psn,
                        orig,
                        msn,
                        dup: true,
                    }),
                    _ => ctx.counters.dropped += 1,
                }
            }
            Some(Operation::Flush) => {
                // A flush has no effect to repeat or undo: answered again while there is room.
                let room = self.rd_atomic_outstanding(true)
                    < usize::from(self.attr.max_dest_rd_atomic.max(1));
                if room {
                    self.resp.push(Response::atomic_write_done(psn, msn, true));
                } else {
                    ctx.counters.dropped += 1;
                }
            }
            Some(Operation::AtomicWrite) => {
                let done = self
                    .resp
                    .resources
                    .iter()
                    .any(|r| matches!(r, Resource::AtomicWrite { psn: p } if *p == psn));
                let room = self.rd_atomic_outstanding(true)
                    < usize::from(self.attr.max_dest_rd_atomic.max(1));
                if done && room {
                    self.resp.push(Response::atomic_write_done(psn, msn, true));
                } else {
                    ctx.counters.dropped += 1;
                }
            }
            _ => {}
        }
    }
}
