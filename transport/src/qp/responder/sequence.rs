//! RC request intake: the PSN sequence (new, duplicate, out of sequence), the checks a
//! request passes before it runs (opcode sequence, `max_dest_rd_atomic`, a receive WQE), and
//! RNR NAKs.

use std::net::IpAddr;

use ferroce_wire::{NakCode, Operation, PacketRepr, Position, Psn, Syndrome};

use super::super::{Ctx, ErrorCause, Qp};
use super::*;
use crate::endpoint::AsyncEvent;
use crate::memory::Memory;
use crate::verbs::{AccessFlags, QpState, QpType, RecvWr, WcStatus};

impl Qp {
    /// Handles a request packet (SEND, WRITE, READ, atomic) addressed to this QP.
    pub(crate) fn handle_request<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        pkt: &PacketRepr<'_>,
        src: IpAddr,
        dst: IpAddr,
    ) {
        if !matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            ctx.counters.dropped += 1;
            return;
        }
        if self.state == QpState::Rtr && !self.resp.comm_est {
            self.resp.comm_est = true;
            ctx.events.push_back(AsyncEvent::CommEst { qpn: self.qpn });
        }
        match self.qp_type {
            QpType::Rc | QpType::XrcRecv => self.rc_request(ctx, pkt),
            QpType::Uc => self.uc_request(ctx, pkt),
            QpType::Ud => self.ud_request(ctx, pkt, src, dst),
            // The endpoint hands an XRC send QP responses only.
            QpType::XrcSend => ctx.counters.dropped += 1,
        }
    }

    pub(super) fn rc_request<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        pkt: &PacketRepr<'_>,
    ) {
        let psn = pkt.bth.psn;
        let diff = self.resp.psn.distance_to(psn);
        if diff > 0 {
            ctx.counters.out_of_seq_request += 1;
            if !self.resp.nak_seq_sent {
                self.resp.nak_seq_sent = true;
                let expected = self.resp.psn;
                self.resp.nak(expected, NakCode::PsnSeqError);
            }
            return;
        }
        if diff < 0 {
            ctx.counters.duplicate_request += 1;
            self.duplicate(ctx, pkt);
            return;
        }
        self.resp.nak_seq_sent = false;
        match self.execute(ctx, pkt) {
            Ok(Some(next_psn)) => {
                self.resp.psn = next_psn;
            }
            Ok(None) => {} // RNR NAK sent; the PSN stays
            Err(fault) => {
                let code = match fault {
                    Fault::Nak(code) => {
                        let status = match code {
                            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                            NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                            _ => WcStatus::RemInvReqErr,
                        };
                        self.note_error(status, 0, ErrorCause::RemoteRequest { code, psn });
                        code
                    }
                    Fault::Recv(status, cause, code) => {
                        self.complete_recv_error(ctx, status, cause);
                        code
                    }
                };
                self.resp.nak(psn, code);
                self.state = QpState::Err;
                self.attr.qp_state = QpState::Err;
                self.flush(ctx, None);
            }
        }
    }

    /// Executes the request at the expected PSN. `Ok(Some(psn))` is the next expected PSN;
    /// `Ok(None)` means an RNR NAK went out and the request will come again.
    pub(super) fn execute<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        pkt: &PacketRepr<'_>,
    ) -> Result<Option<Psn>, Fault> {
        let info = pkt
            .bth
            .opcode
            .info()
            .ok_or(Fault::Nak(NakCode::InvalidRequest))?;
        let psn = pkt.bth.psn;
        if self.qp_type == QpType::XrcRecv && !self.xrc_srq_ok {
            // An XRCETH naming no XRC SRQ of the target's domain: an invalid request.
            log::debug!(
                "XRC QP {:#x}: request at PSN {psn} names XRC SRQ {:#x}, which is not an SRQ                  of this QP's XRC domain: NAK invalid request",
                self.qpn,
                pkt.ext.xrceth.map_or(0, |x| x.xrcsrq)
            );
            return Err(Fault::Nak(NakCode::InvalidRequest));
        }
        self.check_sequence(info.operation, info.position)?;
        let access = &self.attr.qp_access_flags;
        let allowed = match info.operation {
            Operation::Send => true,
            Operation::Write | Operation::AtomicWrite => access.contains(AccessFlags::REMOTE_WRITE),
            Operation::ReadRequest => access.contains(AccessFlags::REMOTE_READ),
            Operation::CompareSwap | Operation::FetchAdd => {
                access.contains(AccessFlags::REMOTE_ATOMIC)
            }
            // The QP must allow the flush its placement type asks for (rxe checks the same).
            Operation::Flush => pkt.ext.feth.is_some_and(|f| {
                let spec = crate::verbs::FlushSpec::from_feth(f.bits, 0);
                spec.is_valid() && access.contains(spec.access())
            }),
            _ => false,
        };
        if !allowed {
            return Err(Fault::Nak(NakCode::InvalidRequest));
        }
        let mtu = self.mtu() as usize;
        if matches!(info.operation, Operation::Send | Operation::Write) {
            let len_ok = match info.position {
                Position::First | Position::Middle => pkt.payload.len() == mtu,
                Position::Last | Position::Only => pkt.payload.len() <= mtu,
            };
            if !len_ok {
                return Err(Fault::Nak(NakCode::InvalidRequest));
            }
        }
        match info.operation {
            Operation::Send => {
                if !self.receive_send(ctx, pkt, info.position)? {
                    return Ok(None);
                }
            }
            Operation::Write => {
                if !self.receive_write(ctx, pkt, info.position, info.has_imm)? {
                    return Ok(None);
                }
            }
            Operation::ReadRequest => return self.receive_read(ctx, pkt).map(Some),
            Operation::AtomicWrite => return self.receive_atomic_write(ctx, pkt).map(Some),
            Operation::Flush => return self.receive_flush(ctx, pkt).map(Some),
            _ => return self.receive_atomic(ctx, pkt).map(Some),
        }
        if pkt.bth.ack_req {
            self.resp.ack(psn);
        }
        Ok(Some(psn + 1))
    }

    /// READ and atomic responses queued and not yet sent in full: those of new requests
    /// (`dup == false`), which hold responder resources, or those of duplicates.
    pub(super) fn rd_atomic_outstanding(&self, dups: bool) -> usize {
        self.resp
            .out
            .iter()
            .filter(|r| {
                matches!(r, Response::Read { dup, .. } | Response::AtomicAck { dup, .. } if *dup == dups)
            })
            .count()
    }

    /// Room for one more READ or atomic: at most `max_dest_rd_atomic` of them may be in
    /// progress at the responder (IBTA 9.4.4, o9-23: a requester must not exceed it; one
    /// that does gets NAK invalid request, which ends its QP). So a peer cannot make the
    /// responder queue without bound.
    pub(super) fn check_rd_atomic_room<M: Memory + ?Sized>(
        &self,
        ctx: &mut Ctx<'_, M>,
    ) -> Result<(), Fault> {
        let max = usize::from(self.attr.max_dest_rd_atomic);
        if self.rd_atomic_outstanding(false) >= max {
            ctx.counters.rd_atomic_exceeded += 1;
            log::debug!(
                "QP {:#x}: a READ/atomic request beyond max_dest_rd_atomic ({max}, the \
                 responder_resources): NAK invalid request",
                self.qpn
            );
            return Err(Fault::Nak(NakCode::InvalidRequest));
        }
        Ok(())
    }

    /// Opcode sequence (IBTA C9-90): inside a SEND or WRITE only its MIDDLE/LAST may come.
    pub(super) fn check_sequence(&self, op: Operation, pos: Position) -> Result<(), Fault> {
        let continuing = matches!(pos, Position::Middle | Position::Last);
        let ok = if self.resp.in_send.is_some() {
            op == Operation::Send && continuing
        } else if self.resp.in_write.is_some() {
            op == Operation::Write && continuing
        } else {
            !continuing
        };
        if ok {
            Ok(())
        } else {
            Err(Fault::Nak(NakCode::InvalidRequest))
        }
    }

    pub(super) fn take_recv_wqe<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
    ) -> Option<RecvWr> {
        match ctx.srq.as_deref_mut() {
            Some(srq) => srq.pop(ctx.events),
            None => self.rq.pop_front(),
        }
    }

    pub(super) fn rnr_nak<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>, psn: Psn) {
        if !self.qp_type.is_reliable() {
            return;
        }
        ctx.counters.send_rnr_err += 1;
        let msn = self.resp.msn;
        let syndrome = Syndrome::rnr_nak(self.attr.min_rnr_timer);
        self.resp.push(Response::Ack { psn, syndrome, msn });
    }
}
