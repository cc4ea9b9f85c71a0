//! The responder: executes incoming requests in PSN order and answers them — ACKs (coalesced,
//! only when asked), NAKs, RNR NAKs, READ responses and atomic ACKs — with the duplicate and
//! out-of-sequence rules of IBTA §9.7.5 as kernel rxe applies them.

use std::collections::VecDeque;
use std::net::IpAddr;

use ferroce_wire::{
    AethRepr, AtomicAckEthRepr, BthRepr, ExtHeaders, NakCode, Opcode, Operation, PacketRepr,
    Position, Psn, RethRepr, Syndrome,
};

use super::{Ctx, Qp, Tx, wc};
use crate::endpoint::{AsyncEvent, WcQueue};
use crate::memory::{self, AtomicOp, MemError, Memory, ScatterError};
use crate::verbs::{AccessFlags, QpState, QpType, RecvWr, WcFlags, WcOpcode, WcStatus};

/// Bytes of GRH space at the start of a UD receive buffer (verbs' `struct ibv_grh`).
pub use ferroce_wire::GRH_LEN;
use ferroce_wire::GrhRepr;

/// The longest message the responder accepts (the device's `max_msg_sz`): a SEND, WRITE or
/// READ longer than this is answered with NAK invalid request (IBTA C9-96: "length error" is
/// an invalid request), never walked.
const MAX_MSG_LEN: u64 = crate::verbs::MAX_MSG_SZ;

/// A receive WQE being filled by a multi-packet SEND.
#[derive(Debug, Clone)]
struct InSend {
    wqe: RecvWr,
    offset: u32,
}

/// An RDMA WRITE in progress.
#[derive(Debug, Clone, Copy)]
struct InWrite {
    va: u64,
    rkey: u32,
    resid: u32,
    total: u32,
}

/// A responder resource: what it takes to answer a duplicate atomic (the saved original
/// value; an atomic must never run twice). READs hold a slot too, as on an HCA, so that
/// `max_dest_rd_atomic` bounds READs and atomics together.
#[derive(Debug, Clone, Copy)]
enum Resource {
    Read,
    Atomic { psn: Psn, orig: u64 },
}

/// A response waiting to be sent, in PSN order.
#[derive(Debug, Clone, Copy)]
enum Response {
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: u32,
        /// The answer to a duplicate (it replays the original's resource, holding none).
        dup: bool,
    },
    Read {
        psn: Psn,
        va: u64,
        rkey: u32,
        remaining: u32,
        first: bool,
        msn: u32,
        /// As for `AtomicAck`.
        dup: bool,
    },
}

/// The responder's state.
#[derive(Debug, Default)]
pub(crate) struct Responder {
    /// The PSN expected next (`rq_psn` at RTR).
    pub(crate) psn: Psn,
    /// Message sequence number: messages completed, 24 bits.
    pub(crate) msn: u32,
    nak_seq_sent: bool,
    comm_est: bool,
    in_send: Option<InSend>,
    in_write: Option<InWrite>,
    /// UC: the rest of a message is being dropped after a gap or error.
    uc_dropping: bool,
    resources: VecDeque<Resource>,
    out: VecDeque<Response>,
}

/// Why a request could not be executed: the NAK to send (RC), with the QP going to ERR.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Nak(NakCode),
    /// A receive-side failure: the receive WQE completes with this status, then the NAK.
    Recv(WcStatus, NakCode),
}

impl Responder {
    pub(crate) fn new(psn: Psn) -> Responder {
        Responder {
            psn,
            ..Responder::default()
        }
    }

    pub(crate) fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    pub(crate) fn take_in_progress_recv(&mut self) -> Option<RecvWr> {
        self.in_write = None;
        self.in_send.take().map(|s| s.wqe)
    }

    fn push(&mut self, r: Response) {
        // Coalesce: a new ACK replaces an ACK not yet sent at the tail (never a NAK).
        if let (Response::Ack { syndrome: new, .. }, Some(Response::Ack { syndrome: old, .. })) =
            (r, self.out.back())
        {
            if new == Syndrome::ACK_UNLIMITED && *old == Syndrome::ACK_UNLIMITED {
                self.out.pop_back();
            }
        }
        self.out.push_back(r);
    }

    fn ack(&mut self, psn: Psn) {
        let msn = self.msn;
        self.push(Response::Ack {
            psn,
            syndrome: Syndrome::ACK_UNLIMITED,
            msn,
        });
    }

    fn nak(&mut self, psn: Psn, code: NakCode) {
        let msn = self.msn;
        self.push(Response::Ack {
            psn,
            syndrome: Syndrome::nak(code),
            msn,
        });
    }

    fn add_resource(&mut self, r: Resource, max: u8) {
        // rxe recycles the ring without policing overruns; the oldest entry goes.
        while self.resources.len() >= usize::from(max.max(1)) {
            self.resources.pop_front();
        }
        self.resources.push_back(r);
    }

    /// Queues the responses of a READ (`dup`: a duplicate's, replaying its original).
    fn queue_read(&mut self, psn: Psn, reth: &RethRepr, msn: u32, dup: bool) {
        self.push(Response::Read {
            psn,
            va: reth.va,
            rkey: reth.rkey,
            remaining: reth.dma_len,
            first: true,
            msn,
            dup,
        });
    }

    fn bump_msn(&mut self) {
        self.msn = (self.msn + 1) & 0xFF_FFFF;
    }
}

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
            QpType::Rc => self.rc_request(ctx, pkt),
            QpType::Uc => self.uc_request(ctx, pkt),
            QpType::Ud => self.ud_request(ctx, pkt, src, dst),
        }
    }

    fn rc_request<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>, pkt: &PacketRepr<'_>) {
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
                    Fault::Nak(code) => code,
                    Fault::Recv(status, code) => {
                        self.complete_recv_error(ctx, status);
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
    fn execute<M: Memory + ?Sized>(
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
        self.check_sequence(info.operation, info.position)?;
        let access = &self.attr.qp_access_flags;
        let allowed = match info.operation {
            Operation::Send => true,
            Operation::Write => access.contains(AccessFlags::REMOTE_WRITE),
            Operation::ReadRequest => access.contains(AccessFlags::REMOTE_READ),
            Operation::CompareSwap | Operation::FetchAdd => {
                access.contains(AccessFlags::REMOTE_ATOMIC)
            }
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
            _ => return self.receive_atomic(ctx, pkt).map(Some),
        }
        if pkt.bth.ack_req {
            self.resp.ack(psn);
        }
        Ok(Some(psn + 1))
    }

    /// READ and atomic responses queued and not yet sent in full: those of new requests
    /// (`dup == false`), which hold responder resources, or those of duplicates.
    fn rd_atomic_outstanding(&self, dups: bool) -> usize {
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
    fn check_rd_atomic_room<M: Memory + ?Sized>(&self, ctx: &mut Ctx<'_, M>) -> Result<(), Fault> {
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
    fn check_sequence(&self, op: Operation, pos: Position) -> Result<(), Fault> {
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

    fn take_recv_wqe<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>) -> Option<RecvWr> {
        match ctx.srq.as_deref_mut() {
            Some(srq) => srq.pop(ctx.events),
            None => self.rq.pop_front(),
        }
    }

    fn rnr_nak<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>, psn: Psn) {
        if self.qp_type != QpType::Rc {
            return;
        }
        ctx.counters.send_rnr_err += 1;
        let msn = self.resp.msn;
        let syndrome = Syndrome::rnr_nak(self.attr.min_rnr_timer);
        self.resp.push(Response::Ack { psn, syndrome, msn });
    }

    /// Places SEND payload; `Ok(false)` when there is no receive WQE (RNR).
    fn receive_send<M: Memory + ?Sized>(
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
        match memory::scatter(
            ctx.mem,
            self.pd,
            &cur.wqe.sg_list,
            u64::from(cur.offset),
            pkt.payload,
        ) {
            Ok(()) => {}
            Err(ScatterError::TooLong) => {
                return Err(Fault::Recv(WcStatus::LocLenErr, NakCode::InvalidRequest));
            }
            Err(ScatterError::Memory(_)) => {
                return Err(Fault::Recv(
                    WcStatus::LocProtErr,
                    NakCode::RemoteOperationalError,
                ));
            }
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
            return Err(Fault::Recv(WcStatus::LocLenErr, NakCode::InvalidRequest));
        }
        cur.offset = total as u32;
        if matches!(pos, Position::Last | Position::Only) {
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
            self.report(ctx, WcQueue::Recv, c);
            self.resp.bump_msn();
        }
        Ok(true)
    }

    /// Places WRITE payload; `Ok(false)` when a WRITE with immediate finds no receive WQE.
    fn receive_write<M: Memory + ?Sized>(
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
                return Err(Fault::Nak(NakCode::InvalidRequest));
            }
            // A zero-length WRITE touches no memory and skips the R_Key check (C9-88).
            if reth.dma_len > 0 {
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

    fn receive_read<M: Memory + ?Sized>(
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
            return Err(Fault::Nak(NakCode::InvalidRequest));
        }
        self.check_rd_atomic_room(ctx)?;
        if reth.dma_len > 0 {
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
        self.resp.queue_read(psn, &reth, msn, false);
        Ok(last + 1)
    }

    fn receive_atomic<M: Memory + ?Sized>(
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

    /// A request behind the expected PSN (C9-104 … C9-111): SEND/WRITE are acknowledged again,
    /// READs replayed from a responder resource, atomics answered with the saved value.
    fn duplicate<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>, pkt: &PacketRepr<'_>) {
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
                        self.resp.queue_read(psn, &reth, msn, true);
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
            _ => {}
        }
    }

    fn complete_recv_error<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>, status: WcStatus) {
        if let Some(s) = self.resp.in_send.take() {
            self.report(
                ctx,
                WcQueue::Recv,
                wc(self.qpn, s.wqe.wr_id, status, WcOpcode::Recv, 0),
            );
        }
    }

    /// UC: no ACKs; a gap drops the rest of the message and resynchronises on the next FIRST
    /// or ONLY packet (IBTA §9.8.3).
    fn uc_request<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>, pkt: &PacketRepr<'_>) {
        let Some(info) = pkt.bth.opcode.info() else {
            return;
        };
        let psn = pkt.bth.psn;
        let starts = matches!(info.position, Position::First | Position::Only);
        if psn != self.resp.psn || self.resp.uc_dropping {
            if !starts {
                if psn != self.resp.psn {
                    ctx.counters.out_of_seq_request += 1;
                }
                self.uc_abort_message();
                self.resp.psn = psn + 1;
                return;
            }
            self.uc_abort_message();
            self.resp.uc_dropping = false;
        }
        self.resp.psn = psn + 1;
        let access_ok = info.operation == Operation::Send
            || (info.operation == Operation::Write
                && self
                    .attr
                    .qp_access_flags
                    .contains(AccessFlags::REMOTE_WRITE));
        let mtu = self.mtu() as usize;
        let len_ok = match info.position {
            Position::First | Position::Middle => pkt.payload.len() == mtu,
            _ => pkt.payload.len() <= mtu,
        };
        if !access_ok || !len_ok || self.check_sequence(info.operation, info.position).is_err() {
            ctx.counters.dropped += 1;
            self.uc_abort_message();
            return;
        }
        let result = match info.operation {
            Operation::Send => self.receive_send(ctx, pkt, info.position),
            _ => self.receive_write(ctx, pkt, info.position, info.has_imm),
        };
        // UC never NAKs: an RNR drops the message; a receive error completes the WQE in error.
        match result {
            Ok(true) => {}
            Ok(false) => {
                ctx.counters.dropped += 1;
                self.uc_abort_message();
            }
            Err(fault) => {
                if let Fault::Recv(status, _) = fault {
                    self.complete_recv_error(ctx, status);
                }
                ctx.counters.dropped += 1;
                self.uc_abort_message();
            }
        }
    }

    /// Drops a UC message in progress; its receive WQE is kept for the next message.
    fn uc_abort_message(&mut self) {
        self.resp.in_write = None;
        if let Some(s) = self.resp.in_send.take() {
            self.rq.push_front(s.wqe);
        }
        self.resp.uc_dropping = true;
    }

    fn ud_request<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        pkt: &PacketRepr<'_>,
        src: IpAddr,
        dst: IpAddr,
    ) {
        let Some(deth) = pkt.ext.deth else { return };
        if deth.qkey != self.attr.qkey {
            ctx.counters.qkey_violations += 1;
            return;
        }
        let Some(wqe) = self.take_recv_wqe(ctx) else {
            ctx.counters.dropped += 1;
            return;
        };
        let grh = grh_bytes(src, dst, pkt.payload.len());
        let mut status = WcStatus::Success;
        let placed = memory::scatter(ctx.mem, self.pd, &wqe.sg_list, 0, &grh).and_then(|()| {
            memory::scatter(ctx.mem, self.pd, &wqe.sg_list, GRH_LEN as u64, pkt.payload)
        });
        match placed {
            Ok(()) => {}
            Err(ScatterError::TooLong) => status = WcStatus::LocLenErr,
            Err(ScatterError::Memory(_)) => status = WcStatus::LocProtErr,
        }
        let mut c = wc(
            self.qpn,
            wqe.wr_id,
            status,
            WcOpcode::Recv,
            (GRH_LEN + pkt.payload.len()) as u32,
        );
        c.src_qp = deth.src_qp;
        c.wc_flags = WcFlags::GRH;
        if let Some(i) = pkt.ext.immdt {
            c.imm_data = i.imm;
            c.wc_flags |= WcFlags::WITH_IMM;
        }
        self.report(ctx, WcQueue::Recv, c);
    }

    /// Builds the next queued response into `buf`.
    pub(crate) fn poll_response<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        buf: &mut [u8],
    ) -> Option<Tx> {
        let peer = self.attr.ah_attr?;
        let dest_qp = self.attr.dest_qp_num;
        let mtu = self.mtu();
        loop {
            let front = *self.resp.out.front()?;
            let repr_len = match front {
                Response::Ack { psn, syndrome, msn } => {
                    self.resp.out.pop_front();
                    let repr = PacketRepr {
                        bth: BthRepr::new(Opcode::RC_ACKNOWLEDGE, dest_qp, psn),
                        ext: ExtHeaders {
                            aeth: Some(AethRepr {
                                syndrome: syndrome.0,
                                msn,
                            }),
                            ..Default::default()
                        },
                        payload: &[],
                    };
                    let n = repr.buffer_len();
                    repr.emit(&mut buf[..n]);
                    n
                }
                Response::AtomicAck { psn, orig, msn, .. } => {
                    self.resp.out.pop_front();
                    let repr = PacketRepr {
                        bth: BthRepr::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, dest_qp, psn),
                        ext: ExtHeaders {
                            aeth: Some(AethRepr {
                                syndrome: Syndrome::ACK_UNLIMITED.0,
                                msn,
                            }),
                            atomic_ack_eth: Some(AtomicAckEthRepr { orig }),
                            ..Default::default()
                        },
                        payload: &[],
                    };
                    let n = repr.buffer_len();
                    repr.emit(&mut buf[..n]);
                    n
                }
                Response::Read {
                    psn,
                    va,
                    rkey,
                    remaining,
                    first,
                    msn,
                    ..
                } => {
                    let plen = remaining.min(mtu);
                    let last = plen == remaining;
                    let opcode = match (first, last) {
                        (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                        (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                        (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                        (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                    };
                    let aeth = (first || last).then_some(AethRepr {
                        syndrome: Syndrome::ACK_UNLIMITED.0,
                        msn,
                    });
                    let repr = PacketRepr {
                        bth: BthRepr::new(opcode, dest_qp, psn),
                        ext: ExtHeaders {
                            aeth,
                            ..Default::default()
                        },
                        payload: &ZERO_PAYLOAD[..plen as usize],
                    }
                    .with_pad();
                    let n = repr.buffer_len();
                    repr.emit_header(&mut buf[..n]);
                    let hl = repr.header_len();
                    if last {
                        self.resp.out.pop_front();
                    } else if let Some(Response::Read {
                        psn,
                        va,
                        remaining,
                        first,
                        ..
                    }) = self.resp.out.front_mut()
                    {
                        *psn += 1;
                        *va += u64::from(plen);
                        *remaining -= plen;
                        *first = false;
                    }
                    if plen > 0
                        && ctx
                            .mem
                            .read_remote(self.pd, rkey, va, &mut buf[hl..hl + plen as usize])
                            .is_err()
                    {
                        // The region was deregistered after the request was checked: the
                        // READ ends with the remote-access NAK (at a PSN inside its response
                        // range, which the requester matches to the READ), and the QP goes to
                        // ERR as for any R_Key violation. Silence would cost the requester
                        // its whole retry budget and end in RETRY_EXC_ERR.
                        log::debug!(
                            "QP {:#x}: READ response at PSN {psn}: rkey {rkey:#x} no longer \
                             valid, NAK remote access error",
                            self.qpn
                        );
                        self.resp.out.clear();
                        self.resp.nak(psn, NakCode::RemoteAccessError);
                        self.state = QpState::Err;
                        self.attr.qp_state = QpState::Err;
                        self.flush(ctx, None);
                        continue;
                    }
                    n
                }
            };
            ctx.counters.sent_pkts += 1;
            return Some(Tx {
                len: repr_len,
                dest: peer.dest,
                hop_limit: peer.hop_limit,
                traffic_class: peer.traffic_class,
            });
        }
    }
}

static ZERO_PAYLOAD: [u8; 4096] = [0; 4096];

/// The 40 bytes verbs puts before a UD payload (the wire crate's GRH area): the IPv4 header
/// for RoCEv2 over IPv4 (rxe's layout), or the IPv6 header; TTL/hop limit 64 and traffic
/// class 0, as the runtime sends.
fn grh_bytes(src: IpAddr, dst: IpAddr, payload_len: usize) -> [u8; GRH_LEN] {
    // UDP header, BTH, DETH, payload, ICRC.
    let next_len = 8 + 12 + 8 + payload_len + 4;
    let mut g = [0u8; GRH_LEN];
    GrhRepr {
        src,
        dst,
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
        next_len: u16::try_from(next_len).unwrap_or(u16::MAX),
    }
    .emit(&mut g);
    g
}
