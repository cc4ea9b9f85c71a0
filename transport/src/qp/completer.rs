//! The completer: what an RC requester does with what comes back — coalesced ACKs retire every
//! WQE they cover, READ responses and atomic ACKs deliver data, NAKs and timeouts send the
//! requester back to the oldest unacknowledged PSN (go-back-N) or end the QP with the matching
//! completion status.

use ferroce_wire::{AckType, NakCode, Opcode, PacketRepr, Psn, timer};

use super::timers::Timer;
use super::{Ctx, ErrorCause, Qp};
use crate::memory::{self, Memory};
use crate::verbs::{QpState, WcStatus, WrOpcode};

/// The completer's state: the oldest unacknowledged PSN and the retry budgets. Only this file
/// changes it; the rest of the QP asks through the methods.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Completer {
    /// The oldest PSN not yet acknowledged (`comp_psn`).
    psn: Psn,
    /// Retries left of `retry_cnt`.
    retry_left: u8,
    /// Retries left of `rnr_retry` (7 = infinite).
    rnr_left: u8,
    /// A go-back-N for a READ response gap or an implied NAK happened and nothing has been
    /// acknowledged since: further such signals are echoes of the same loss.
    read_gap_rewound: bool,
    /// The PSN of the last sequence NAK acted on.
    last_seq_nak: Option<Psn>,
}

impl Default for Completer {
    fn default() -> Completer {
        Completer {
            psn: Psn::new(0),
            retry_left: 0,
            rnr_left: 0,
            read_gap_rewound: false,
            last_seq_nak: None,
        }
    }
}

impl Completer {
    /// RTR → RTS: nothing is outstanding before `sq_psn`; full retry budgets.
    pub(crate) fn start(&mut self, sq_psn: Psn, retry_cnt: u8, rnr_retry: u8) {
        self.psn = sq_psn;
        self.retry_left = retry_cnt;
        self.rnr_left = rnr_retry;
    }

    /// The oldest unacknowledged PSN.
    pub(crate) fn psn(&self) -> Psn {
        self.psn
    }

    /// `modify_qp` with `IBV_QP_RETRY_CNT`: a fresh budget.
    pub(crate) fn set_retry_cnt(&mut self, n: u8) {
        self.retry_left = n;
    }

    /// `modify_qp` with `IBV_QP_RNR_RETRY`: a fresh budget.
    pub(crate) fn set_rnr_retry(&mut self, n: u8) {
        self.rnr_left = n;
    }
}

impl Qp {
    /// Handles an ACK, NAK, READ response or ATOMIC ACK addressed to this QP.
    pub(crate) fn handle_response<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        pkt: &PacketRepr<'_>,
    ) {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return;
        }
        self.heard_since_rts = true;
        let psn = pkt.bth.psn;
        // A response for a PSN never sent is a ghost; one older than the oldest outstanding
        // PSN is stale. Both are ignored.
        if !psn.is_before(self.req.next_psn()) {
            ctx.counters.ghost_responses += 1;
            self.strays = (self.strays.0.saturating_add(1), psn);
            return;
        }
        let op = pkt.bth.opcode;
        match op {
            Opcode::RC_ACKNOWLEDGE => {
                let Some(aeth) = pkt.ext.aeth else { return };
                match aeth.ack_type() {
                    AckType::Ack(_) => self.on_ack(ctx, psn),
                    AckType::RnrNak { timer } => self.on_rnr_nak(ctx, psn, timer),
                    AckType::Nak(code) => self.on_nak(ctx, psn, code),
                    AckType::Reserved(_) => ctx.counters.malformed += 1,
                }
            }
            Opcode::RC_ATOMIC_ACKNOWLEDGE => {
                if let Some(orig) = pkt.ext.atomic_ack_eth {
                    self.on_atomic_ack(ctx, psn, orig.orig);
                }
            }
            _ => self.on_read_response(ctx, pkt),
        }
        self.retire_done(ctx);
    }

    /// Marks done every SEND/WRITE WQE whose last PSN is at or before `psn` (everything an
    /// ACK or implied ACK covers), stopping at a READ/atomic that has not been answered.
    /// Returns whether that stop is an implied NAK (the peer acknowledged past a READ/atomic
    /// whose response never came).
    fn ack_through<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>, psn: Psn) -> bool {
        let mut progress = false;
        let mut implied_nak = false;
        for w in self.sq.iter_mut() {
            if !w.started || w.status.is_some() {
                if w.status.is_some() {
                    continue;
                }
                break;
            }
            if psn.is_before(w.first_psn) {
                break;
            }
            if w.wr.opcode.is_read_or_atomic() {
                implied_nak = true;
                break;
            }
            if w.last_psn.is_before(psn) || w.last_psn == psn {
                w.status = Some(WcStatus::Success);
                self.comp.psn = w.last_psn + 1;
                progress = true;
            } else {
                // Part of a long message is acknowledged.
                if self.comp.psn.is_before(psn + 1) {
                    self.comp.psn = psn + 1;
                    progress = true;
                }
                break;
            }
        }
        if progress {
            self.on_progress(ctx);
        }
        implied_nak
    }

    fn on_progress<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>) {
        self.progressed = true;
        self.comp.retry_left = self.attr.retry_cnt;
        self.comp.rnr_left = self.attr.rnr_retry;
        self.comp.read_gap_rewound = false;
        if self.comp.psn == self.req.next_psn()
            && self.sq.iter().all(|w| !w.started || w.status.is_some())
        {
            self.timers.stop(Timer::Retransmit);
        } else {
            self.arm_retrans(ctx.now);
        }
    }

    fn on_ack<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>, psn: Psn) {
        if psn.is_before(self.comp.psn.wrapping_sub(1)) {
            self.strays = (self.strays.0.saturating_add(1), psn);
            return; // stale
        }
        // An ACK past an unanswered READ/atomic is an implied NAK; after one go-back-N, more
        // of them (re-ACKs of the resent requests) are no news until progress is made.
        if self.ack_through(ctx, psn) && !self.comp.read_gap_rewound {
            ctx.counters.implied_naks += 1;
            self.retry(ctx);
            self.comp.read_gap_rewound = true;
        }
    }

    fn on_nak<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>, psn: Psn, code: NakCode) {
        if psn.is_before(self.comp.psn) {
            self.strays = (self.strays.0.saturating_add(1), psn);
            return; // stale
        }
        // Everything before the NAKed PSN was received.
        let implied = if psn == self.comp.psn {
            false
        } else {
            self.ack_through(ctx, psn.wrapping_sub(1))
        };
        match code {
            NakCode::PsnSeqError => {
                ctx.counters.rcvd_seq_err += 1;
                // A responder NAKs a given expected PSN once; the same NAK again is a duplicate
                // (or overtaken), and during an RNR wait we go back to this PSN anyway.
                if self.timers.is_armed(Timer::RnrWait)
                    || (self.comp.last_seq_nak == Some(psn) && !implied)
                {
                    return;
                }
                self.comp.last_seq_nak = Some(psn);
                self.retry(ctx);
            }
            _ => {
                let status = match code {
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                    NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr,
                    _ => WcStatus::BadRespErr,
                };
                // The WQEs the NAK implicitly acknowledged complete successfully before the
                // QP fails (IBTA 9.7.5.1.2, as rxe's completer does): a burst's earlier
                // messages asked for no ACK of their own.
                self.retire_done(ctx);
                let idx = self.sq.iter().position(|w| w.status.is_none()).unwrap_or(0);
                let mtu = self.mtu();
                let packet_bytes = self.sq.get(idx).map_or(0, |w| {
                    let k = w.first_psn.distance_to(psn);
                    let carries = matches!(
                        w.wr.opcode,
                        WrOpcode::Send
                            | WrOpcode::SendWithImm
                            | WrOpcode::SendWithInv
                            | WrOpcode::RdmaWrite
                            | WrOpcode::RdmaWriteWithImm
                    );
                    match u32::try_from(k) {
                        Ok(k) if carries && k < w.npkts(mtu) => (w.len - k * mtu).min(mtu),
                        _ => 0,
                    }
                });
                let cause = match code {
                    NakCode::Unknown(v) => ErrorCause::ReservedSyndrome {
                        psn,
                        syndrome: 0x60 | v,
                    },
                    _ => ErrorCause::Nak {
                        code,
                        psn,
                        packet_bytes,
                        path_mtu: mtu,
                    },
                };
                self.fail_because(ctx, idx, status, cause);
            }
        }
    }

    fn on_rnr_nak<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>, psn: Psn, timer_index: u8) {
        if psn.is_before(self.comp.psn) {
            return;
        }
        ctx.counters.rcvd_rnr_err += 1;
        self.rnr_naks += 1;
        if psn != self.comp.psn {
            self.ack_through(ctx, psn.wrapping_sub(1));
        }
        if self.comp.rnr_left == 0 {
            ctx.counters.retry_rnr_exceeded_err += 1;
            // As for a NAK: what the RNR NAK implicitly acknowledged completes first.
            self.retire_done(ctx);
            let idx = self.sq.iter().position(|w| w.status.is_none()).unwrap_or(0);
            let cause = ErrorCause::RnrExhausted {
                psn,
                rnr_naks: self.rnr_naks,
                rnr_retry: self.attr.rnr_retry,
            };
            self.fail_because(ctx, idx, WcStatus::RnrRetryExcErr, cause);
            return;
        }
        if self.attr.rnr_retry != 7 {
            self.comp.rnr_left -= 1;
        }
        // The RNR NAK answers the request we (re)sent: the responder is alive, so the timeouts
        // that retry_cnt counts start again (IBTA counts consecutive unanswered attempts).
        self.comp.retry_left = self.attr.retry_cnt;
        self.timers.stop(Timer::Retransmit);
        self.timers
            .set(Timer::RnrWait, ctx.now + timer::rnr_timer(timer_index));
        self.rewind();
    }

    /// A lost packet, lost ACK or implied NAK: go back to `comp_psn`, or give up.
    pub(crate) fn retry<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>) {
        if self.comp.retry_left == 0 {
            ctx.counters.retry_exceeded_err += 1;
            let idx = self.sq.iter().position(|w| w.status.is_none()).unwrap_or(0);
            // Answered, never for anything sent, and never any progress: the PSNs disagree.
            let cause = if !self.progressed && self.strays.0 > 0 {
                ErrorCause::PsnMismatch {
                    psn: self.comp.psn(),
                    strays: self.strays.0,
                    peer_psn: self.strays.1,
                }
            } else {
                ErrorCause::NoAnswer {
                    psn: self.comp.psn(),
                    retries: self.attr.retry_cnt,
                    timeout: self.attr.timeout,
                    heard_since_rts: self.heard_since_rts,
                }
            };
            self.fail_because(ctx, idx, WcStatus::RetryExcErr, cause);
            return;
        }
        self.comp.retry_left -= 1;
        ctx.counters.completer_retry_err += 1;
        self.rewind();
        self.arm_retrans(ctx.now);
    }

    /// The local ACK timeout or the RNR wait expired.
    pub(crate) fn handle_timeout<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>) {
        let now = ctx.now;
        // Pacing over: the endpoint puts the QP back in its rotation.
        self.timers.expire(Timer::Pace, now);
        if self.timers.expire(Timer::RnrWait, now) {
            self.arm_retrans(now);
        }
        if self.timers.expire(Timer::Retransmit, now) {
            let outstanding = self.sq.iter().any(|w| w.started && w.status.is_none());
            if outstanding && matches!(self.state, QpState::Rts | QpState::Sqd) {
                self.retry(ctx);
            }
        }
    }

    fn on_atomic_ack<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>, psn: Psn, orig: u64) {
        if psn.is_before(self.comp.psn) {
            return; // duplicate
        }
        self.ack_through(ctx, psn.wrapping_sub(1));
        let Some(idx) = self.sq.iter().position(|w| w.status.is_none()) else {
            return;
        };
        let w = &self.sq[idx];
        if !w.started || !w.wr.opcode.is_atomic() || w.first_psn != psn {
            ctx.counters.ghost_responses += 1;
            return;
        }
        // The original value lands in local memory in host order, as verbs returns it.
        let res = memory::scatter(ctx.mem, self.pd, &w.wr.sg_list, 0, &orig.to_ne_bytes());
        match res {
            Ok(()) => {
                self.sq[idx].status = Some(WcStatus::Success);
                self.comp.psn = psn + 1;
                self.on_progress(ctx);
            }
            Err(e) => {
                // Any failure to place an atomic's result is a protection error, as rxe's
                // completer reports it (a too-short buffer keeps its length facts).
                let (_, cause) = ErrorCause::of_scatter(e, 8, &w.wr.sg_list);
                self.fail_because(ctx, idx, WcStatus::LocProtErr, cause);
            }
        }
    }

    fn on_read_response<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>, pkt: &PacketRepr<'_>) {
        let psn = pkt.bth.psn;
        if psn.is_before(self.comp.psn) {
            ctx.counters.duplicate_responses += 1;
            return;
        }
        // A response implies every earlier request was received.
        if psn != self.comp.psn {
            self.ack_through(ctx, psn.wrapping_sub(1));
        }
        let Some(idx) = self.sq.iter().position(|w| w.status.is_none()) else {
            return;
        };
        let mtu = self.mtu();
        let w = &self.sq[idx];
        if w.started
            && matches!(w.wr.opcode, WrOpcode::AtomicWrite | WrOpcode::Flush)
            && w.first_psn == psn
        {
            // An ATOMIC WRITE or a FLUSH is answered by one zero-length READ response (IBTA
            // 1.5 §9.4.6).
            if pkt.bth.opcode != Opcode::RC_RDMA_READ_RESPONSE_ONLY || !pkt.payload.is_empty() {
                let cause = ErrorCause::BadResponse {
                    psn,
                    request: w.wr.opcode,
                    response: pkt.bth.opcode,
                    bytes: pkt.payload.len() as u32,
                    expected: 0,
                };
                return self.fail_because(ctx, idx, WcStatus::BadRespErr, cause);
            }
            self.sq[idx].status = Some(WcStatus::Success);
            self.comp.psn = psn + 1;
            self.on_progress(ctx);
            return;
        }
        if !w.started
            || w.wr.opcode != WrOpcode::RdmaRead
            || !psn.is_within(w.first_psn, w.last_psn)
        {
            ctx.counters.ghost_responses += 1;
            return;
        }
        if psn != self.comp.psn {
            // A response was lost: reissue the READ for the rest, once per gap.
            // Until the reissued READ's first response arrives (progress clears the flag),
            // gaps in older response streams are no news.
            if !self.comp.read_gap_rewound {
                ctx.counters.rcvd_seq_err += 1;
                self.retry(ctx);
                self.comp.read_gap_rewound = true;
            }
            return;
        }
        let expect = (w.len - w.read_done).min(mtu);
        let last = w.read_done + expect == w.len;
        let op = pkt.bth.opcode;
        // A long READ is requested in chunks, so LAST/ONLY end a chunk and FIRST starts one;
        // every packet carries exactly the bytes expected next, and only the WQE's last packet
        // may be short.
        let pos_ok = match op {
            Opcode::RC_RDMA_READ_RESPONSE_ONLY | Opcode::RC_RDMA_READ_RESPONSE_LAST => true,
            Opcode::RC_RDMA_READ_RESPONSE_FIRST | Opcode::RC_RDMA_READ_RESPONSE_MIDDLE => !last,
            _ => false,
        };
        if !pos_ok || pkt.payload.len() != expect as usize {
            let cause = ErrorCause::BadResponse {
                psn: w.first_psn,
                request: w.wr.opcode,
                response: op,
                bytes: pkt.payload.len() as u32,
                expected: expect,
            };
            return self.fail_because(ctx, idx, WcStatus::BadRespErr, cause);
        }
        let res = memory::scatter(
            ctx.mem,
            self.pd,
            &w.wr.sg_list,
            u64::from(w.read_done),
            pkt.payload,
        );
        if let Err(e) = res {
            let (status, cause) = ErrorCause::of_scatter(e, u64::from(w.len), &w.wr.sg_list);
            return self.fail_because(ctx, idx, status, cause);
        }
        let w = &mut self.sq[idx];
        w.read_done += expect;
        self.comp.psn = psn + 1;
        if last {
            w.status = Some(WcStatus::Success);
        }
        self.on_progress(ctx);
    }
}
