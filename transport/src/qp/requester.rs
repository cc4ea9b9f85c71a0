//! The requester: turns send WQEs into request packets — segmentation to the path MTU,
//! first/middle/last/only opcodes, PSN assignment, AckReq, the unacknowledged-PSN window,
//! `max_rd_atomic`, FENCE — built straight into the caller's buffer.

use std::net::IpAddr;

use ferroce_wire::{
    AtomicEthRepr, BthRepr, DethRepr, ExtHeaders, FethRepr, IethRepr, ImmDtRepr, Opcode,
    PacketRepr, Psn, RethRepr, XrcEthRepr,
};

use super::timers::Timer;
use super::{Ctx, ErrorCause, MAX_PKTS_PER_ACK, Qp, READ_PAIR_PKTS, READ_WINDOW_PKTS};
use crate::memory::{self, Memory, ScatterError};
use crate::verbs::{QpState, QpType, SendFlags, WcStatus, WrOpcode};

/// Why a request packet could not be built: the status its WQE completes with and why.
type BuildError = (WcStatus, ErrorCause);

/// Zeros standing in for payload while headers are emitted; the payload is then copied in place.
static ZEROS: [u8; 4096] = [0; 4096];

/// A packet a QP has built into the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tx {
    /// Bytes of the UDP payload written (ICRC included, still zero).
    pub(crate) len: usize,
    /// Destination IP.
    pub(crate) dest: IpAddr,
    /// IP TTL / hop limit.
    pub(crate) hop_limit: u8,
    /// IP TOS / traffic class.
    pub(crate) traffic_class: u8,
}

/// The requester's state: where in the send queue it is and the next PSN it assigns. Only
/// this file changes it; the rest of the QP asks through the methods.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Requester {
    /// Index in the send queue of the WQE being sent.
    idx: usize,
    /// Bytes of that WQE already sent.
    off: u32,
    /// The PSN of the next new request packet.
    next_psn: Psn,
    /// The PSN after the last one of the latest message started (`next_psn` when none is
    /// part-sent).
    committed: Psn,
    /// Packets sent since the last one with AckReq.
    noack_pkts: u32,
    /// SQD: the send queue is draining (no new WQE starts).
    draining: bool,
}

impl Default for Requester {
    fn default() -> Requester {
        Requester {
            idx: 0,
            off: 0,
            next_psn: Psn::new(0),
            committed: Psn::new(0),
            noack_pkts: 0,
            draining: false,
        }
    }
}

impl Requester {
    /// RTR → RTS: new requests start at `sq_psn`.
    pub(crate) fn start(&mut self, sq_psn: Psn) {
        self.next_psn = sq_psn;
        self.committed = sq_psn;
    }

    /// The PSN after the last one of the latest message started, or the next PSN if that is
    /// further.
    pub(crate) fn committed_psn(&self) -> Psn {
        if self.next_psn.is_before(self.committed) {
            self.committed
        } else {
            self.next_psn
        }
    }

    /// The PSN the next new request gets.
    pub(crate) fn next_psn(&self) -> Psn {
        self.next_psn
    }

    /// Whether an SQD drain is in progress.
    pub(crate) fn draining(&self) -> bool {
        self.draining
    }

    /// RTS → SQD: no new WQE starts until the QP leaves SQD.
    pub(crate) fn start_draining(&mut self) {
        self.draining = true;
    }

    /// Ends the drain; true if one was in progress.
    pub(crate) fn finish_draining(&mut self) -> bool {
        std::mem::take(&mut self.draining)
    }

    /// The send queue was flushed: start from its (new) head.
    pub(crate) fn restart(&mut self) {
        self.idx = 0;
        self.off = 0;
    }

    /// The head WQE retired. If the requester was about to (re)send exactly that WQE, it
    /// resumes the next one at `resume_next()` bytes (where the peer's ACKs leave it).
    pub(crate) fn head_retired(&mut self, resume_next: impl FnOnce() -> u32) {
        if self.idx == 0 {
            self.off = resume_next();
        }
        self.idx = self.idx.saturating_sub(1);
    }

    /// Whether WQEs of a send queue of `sq_len` are still to be sent.
    pub(crate) fn has_pending(&self, sq_len: usize) -> bool {
        self.idx < sq_len
    }
}

impl Qp {
    /// Builds the next request packet into `buf`, if the requester may send one now.
    pub(crate) fn poll_request<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        buf: &mut [u8],
    ) -> Option<Tx> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd)
            || self.timers.is_armed(Timer::RnrWait)
        {
            return None;
        }
        if !self.run_local_ops(ctx) {
            return None;
        }
        let idx = self.req.idx;
        let mtu = self.mtu();
        let w = self.sq.get(idx)?;
        let fresh = !w.started;
        if fresh {
            if self.state == QpState::Sqd || self.req.draining {
                return None;
            }
            if self.fenced(idx) {
                return None;
            }
            if self.qp_type.is_reliable()
                && self.comp.psn().distance_to(self.req.next_psn) >= self.send_window()
            {
                return None;
            }
            // A message starts only while the endpoint's in-flight budget has room; once
            // started it runs to its end (its PSNs are counted from here, see
            // `Qp::unacked_psns`), so a stop never leaves packets waiting for an ACK that
            // only a later packet of the message would ask for.
            if self.qp_type.is_reliable() && !ctx.budget_open {
                self.budget_blocked = true;
                return None;
            }
        }
        let read_continues =
            w.wr.opcode == WrOpcode::RdmaRead && w.started && self.req.off > w.read_done;
        if read_continues {
            if self.req.off - w.read_done >= READ_WINDOW_PKTS * mtu {
                return None;
            }
        } else if w.wr.opcode.is_read_or_atomic() && self.attr.max_rd_atomic == 0 {
            // No READ/atomic may ever be outstanding: a local QP operation error.
            self.fail_because(ctx, idx, WcStatus::LocQpOpErr, ErrorCause::NoRdAtomic);
            return None;
        } else if self.qp_type.is_reliable()
            && !w.wr.opcode.is_read_or_atomic()
            && self.comp.psn().distance_to(self.req.next_psn) >= self.send_window()
        {
            return None;
        }

        // Every READ request message (each chunk of a long READ) and every atomic holds a
        // responder resource until its response is in: never more than max_rd_atomic of them
        // (the responder NAKs one beyond its max_dest_rd_atomic).
        if self.sq[idx].wr.opcode.is_read_or_atomic()
            && self.rd_requests_outstanding() >= u32::from(self.attr.max_rd_atomic)
        {
            return None;
        }
        if fresh {
            let w = &self.sq[idx];
            let npkts = w.npkts(mtu);
            let first = self.req.next_psn;
            let w = &mut self.sq[idx];
            w.first_psn = first;
            w.last_psn = first + (npkts - 1);
            w.started = true;
            let toward_ferroce = self.peer_ferroce && self.qp_type == QpType::Rc;
            w.split = match w.wr.opcode {
                WrOpcode::RdmaWrite => ctx.split_writes && toward_ferroce && npkts > 1,
                WrOpcode::RdmaRead => {
                    ctx.pair_reads
                        && toward_ferroce
                        && npkts > READ_PAIR_PKTS
                        && u32::from(self.attr.max_rd_atomic) * READ_PAIR_PKTS >= READ_WINDOW_PKTS
                }
                _ => false,
            };
            self.req.off = 0;
            self.req.committed = first + npkts;
        }
        let result = match self.sq[idx].wr.opcode {
            WrOpcode::RdmaRead => self.build_read(buf),
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => self.build_atomic(buf),
            WrOpcode::Flush => self.build_flush(buf),
            _ => self.build_send_or_write(ctx, buf),
        };
        match result {
            Ok(tx) => {
                ctx.counters.sent_pkts += 1;
                if self.qp_type.is_reliable() && !self.timers.is_armed(Timer::Retransmit) {
                    self.arm_retrans(ctx.now);
                }
                Some(tx)
            }
            Err((status, cause)) => {
                self.fail_because(ctx, idx, status, cause);
                None
            }
        }
    }

    /// Runs the local operations (bind a window, invalidate a key) the requester has reached,
    /// in send-queue order: they send nothing and finish at once; each retires, in order,
    /// behind the WQEs before it. One already run (the requester came back to it after a
    /// rewind) is stepped over. Returns false if the requester must stop here (a fence, SQD,
    /// or a failed operation, which moves the QP to ERR).
    fn run_local_ops<M: Memory + ?Sized>(&mut self, ctx: &mut Ctx<'_, M>) -> bool {
        while let Some(w) = self.sq.get(self.req.idx) {
            if !w.wr.opcode.is_local() {
                return true;
            }
            if w.started {
                self.req.idx += 1;
                self.req.off = 0;
                continue;
            }
            if self.state == QpState::Sqd || self.req.draining {
                return false;
            }
            let idx = self.req.idx;
            if self.fenced(idx) {
                return false;
            }
            let r = match (w.wr.opcode, &w.wr.bind_mw) {
                (WrOpcode::BindMw, Some(b)) => ctx.mem.bind_mw(self.pd, self.qpn, b),
                (WrOpcode::LocalInv, _) => {
                    ctx.mem.invalidate(self.pd, self.qpn, w.wr.invalidate_rkey)
                }
                _ => Err(crate::memory::MemError::InvalidKey),
            };
            if let Err(e) = r {
                log::debug!(
                    "qp {:#x}: {:?} (wr_id {}) failed: {e:?}: the QP goes to ERR",
                    self.qpn,
                    w.wr.opcode,
                    w.wr.wr_id
                );
                let cause = ErrorCause::LocalOperation {
                    opcode: w.wr.opcode,
                    error: e,
                };
                self.fail_because(ctx, idx, WcStatus::MwBindErr, cause);
                return false;
            }
            let w = &mut self.sq[idx];
            w.started = true;
            w.status = Some(WcStatus::Success);
            self.req.idx += 1;
            self.req.off = 0;
            self.retire_done(ctx);
        }
        true
    }

    /// Whether WQE `idx` carries `IBV_SEND_FENCE` with a READ or atomic before it still in the
    /// send queue: it waits for them.
    fn fenced(&self, idx: usize) -> bool {
        self.sq[idx].wr.send_flags.contains(SendFlags::FENCE)
            && self
                .sq
                .iter()
                .take(idx)
                .any(|p| p.wr.opcode.is_read_or_atomic())
    }

    /// (Re)arms the local ACK timeout from `now`.
    pub(crate) fn arm_retrans(&mut self, now: crate::time::Instant) {
        match ferroce_wire::timer::local_ack_timeout(self.attr.timeout) {
            Some(d) => self.timers.set(Timer::Retransmit, now + d),
            None => self.timers.stop(Timer::Retransmit),
        }
    }

    fn dest(&self, idx: usize) -> (IpAddr, u8, u8) {
        let ah = match &self.sq[idx].wr.ud {
            Some(ud) => Some(ud.ah),
            None => self.attr.ah_attr,
        };
        match ah {
            Some(a) => (a.dest, a.hop_limit, a.traffic_class),
            None => (IpAddr::from([0, 0, 0, 0]), 64, 0),
        }
    }

    /// Writes the headers of `repr` for WR `idx` into `buf` (an XRC send QP's as XRC: the
    /// XRC opcode and an XRCETH naming the WR's `remote_srqn`); the caller fills the payload
    /// behind `repr.header_len()`.
    fn emit(&self, idx: usize, repr: &mut PacketRepr<'_>, buf: &mut [u8]) -> Tx {
        if self.qp_type == QpType::XrcSend {
            // post_send refuses the opcodes XRC lacks (FLUSH, ATOMIC WRITE).
            if let Some(x) = repr.bth.opcode.rc_as_xrc() {
                repr.bth.opcode = x;
                repr.ext.xrceth = Some(XrcEthRepr {
                    xrcsrq: self.sq[idx].wr.remote_srqn & 0xFF_FFFF,
                });
            }
        }
        let len = repr.buffer_len();
        repr.emit_header(&mut buf[..len]);
        let (dest, hop_limit, traffic_class) = self.dest(idx);
        Tx {
            len,
            dest,
            hop_limit,
            traffic_class,
        }
    }

    fn build_send_or_write<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        buf: &mut [u8],
    ) -> Result<Tx, BuildError> {
        let idx = self.req.idx;
        let mtu = self.mtu();
        let w = &self.sq[idx];
        let off = self.req.off;
        let plen = (w.len - off).min(mtu);
        let first = off == 0;
        let last = off + plen == w.len;
        let psn = w.first_psn + off / mtu;
        let imm = matches!(
            w.wr.opcode,
            WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm
        );
        let inv = w.wr.opcode == WrOpcode::SendWithInv;
        let atomic_write = w.wr.opcode == WrOpcode::AtomicWrite;
        let write = matches!(
            w.wr.opcode,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::AtomicWrite
        );
        // A split WRITE (`SendWqe::split`): every packet a WRITE ONLY.
        let split = w.split;
        let mut opcode = if split {
            request_opcode(self.qp_type, write, true, true, false)
        } else {
            request_opcode(self.qp_type, write, first, last, imm)
        };
        if atomic_write {
            opcode = Opcode::RC_ATOMIC_WRITE;
        }
        if inv && last {
            opcode = if first {
                Opcode::RC_SEND_ONLY_WITH_INVALIDATE
            } else {
                Opcode::RC_SEND_LAST_WITH_INVALIDATE
            };
        }
        let mut ext = ExtHeaders::default();
        if inv && last {
            ext.ieth = Some(IethRepr {
                rkey: w.wr.invalidate_rkey,
            });
        }
        if write && (first || split) {
            ext.reth = Some(RethRepr {
                va: w.wr.remote.remote_addr.wrapping_add(u64::from(off)),
                rkey: w.wr.remote.rkey,
                dma_len: if split { plen } else { w.len },
            });
        }
        if imm && last {
            ext.immdt = Some(ImmDtRepr { imm: w.wr.imm_data });
        }
        let mut dest_qp = self.attr.dest_qp_num;
        if let Some(ud) = &w.wr.ud {
            dest_qp = ud.remote_qpn;
            // A Q_Key with the high bit set means "use the QP's own" (IBTA 10.2.5).
            let qkey = if ud.remote_qkey & 0x8000_0000 != 0 && self.qpn != 1 {
                self.attr.qkey
            } else {
                ud.remote_qkey
            };
            ext.deth = Some(DethRepr {
                qkey,
                src_qp: self.qpn,
            });
        }
        self.req.noack_pkts += 1;
        let ack_req = match self.qp_type {
            QpType::Rc | QpType::XrcSend | QpType::XrcRecv => {
                atomic_write
                    || self.req.noack_pkts >= MAX_PKTS_PER_ACK
                    || (last && self.ack_at_end_of(idx, psn, ctx.budget_low))
            }
            QpType::Uc => false,
            QpType::Ud => true,
        };
        if ack_req {
            self.req.noack_pkts = 0;
        }
        let mut bth = BthRepr::new(opcode, dest_qp, psn).with_ack_req(ack_req);
        bth.se = last && w.wr.send_flags.contains(SendFlags::SOLICITED);
        let mut repr = PacketRepr {
            bth,
            ext,
            payload: &ZEROS[..plen as usize],
        }
        .with_pad();
        let tx = self.emit(idx, &mut repr, buf);
        let hl = repr.header_len();
        let payload = &mut buf[hl..hl + plen as usize];
        match &w.wr.inline_data {
            Some(data) => payload.copy_from_slice(&data[off as usize..(off + plen) as usize]),
            None => memory::gather(ctx.mem, self.pd, &w.wr.sg_list, u64::from(off), payload)
                .map_err(|e| match e {
                    ScatterError::Memory(sge) => (
                        WcStatus::LocProtErr,
                        ErrorCause::LocalProtection { sge, write: false },
                    ),
                    ScatterError::TooLong => (
                        WcStatus::LocLenErr,
                        ErrorCause::LocalLength {
                            message: u64::from(w.len),
                            buffer: w.wr.sg_list.iter().map(|g| u64::from(g.length)).sum(),
                        },
                    ),
                })?,
        }
        self.req.next_psn = psn + 1;
        if last {
            self.req.idx += 1;
            self.req.off = 0;
            if !self.qp_type.is_reliable() {
                // UC and UD complete as soon as the message is on the wire.
                self.sq[idx].status = Some(WcStatus::Success);
                self.retire_done(ctx);
            }
        } else {
            self.req.off = off + plen;
        }
        Ok(tx)
    }

    /// Whether the last packet of WR `idx` (PSN `psn`) asks for an ACK: at the end of a burst
    /// (no SEND or WRITE of this QP follows right behind it: its send queue drains, or a READ,
    /// atomic or local operation comes next), when half the QP's window of unacknowledged PSNs
    /// would be in flight, or when the endpoint's in-flight budget is half used (a QP that
    /// cannot start its next message must not wait for a timeout to hear about this one). Inside
    /// a burst the responder acknowledges the later packet, which covers this one (IBTA 9.7.5.1:
    /// ACKs are cumulative); kernel rxe answers only packets that ask, so every burst's last
    /// packet does.
    fn ack_at_end_of(&self, idx: usize, psn: Psn, budget_low: bool) -> bool {
        let burst_goes_on = self.sq.get(idx + 1).is_some_and(|next| {
            let op = next.wr.opcode;
            !op.is_read_or_atomic() && !op.is_local()
        });
        !burst_goes_on
            || self.comp.psn().distance_to(psn + 1) >= self.send_window() / 2
            || budget_low
    }

    fn build_read(&mut self, buf: &mut [u8]) -> Result<Tx, BuildError> {
        let idx = self.req.idx;
        let mtu = self.mtu();
        let w = &self.sq[idx];
        // A long READ goes out as consecutive READ requests of at most READ_CHUNK_PKTS
        // packets, each a valid request on the wire, at most READ_WINDOW_PKTS ahead of the
        // data received: the responder cannot flood a receiver that has no flow control.
        let from = self.req.off;
        // Chunks are aligned to their size from the start of the WQE, so a chunk reissued
        // after a loss never reaches past what the first requests covered (the responder only
        // replays duplicates that end before the PSN it expects).
        let per = w.read_chunk_pkts();
        let boundary = (from / mtu / per + 1) * per * mtu;
        let chunk = boundary.min(w.len) - from;
        let psn = w.first_psn + from / mtu;
        // A zero-length READ's R_Key is not looked at (C9-88), but kernel rxe's duplicate
        // detection compares it with the one it recorded, which its versions record
        // differently: 6.12 records 0 (and drops a duplicate with any other key silently),
        // 6.1 the key sent (and drops a duplicate with another silently; replaying it, it
        // looks the key up, so 0 draws a NAK). Its first request carries the posted key, its
        // retries 0 and the posted key in turn: each version replays one of every two.
        let rkey = if w.len == 0 && w.sends % 2 == 1 {
            0
        } else {
            w.wr.remote.rkey
        };
        if w.len == 0 {
            self.sq[idx].sends = self.sq[idx].sends.wrapping_add(1);
        }
        let w = &self.sq[idx];
        let mut repr = PacketRepr {
            bth: BthRepr::new(Opcode::RC_RDMA_READ_REQUEST, self.attr.dest_qp_num, psn)
                .with_ack_req(true),
            ext: ExtHeaders {
                reth: Some(RethRepr {
                    va: w.wr.remote.remote_addr + u64::from(from),
                    rkey,
                    dma_len: chunk,
                }),
                ..Default::default()
            },
            payload: &[],
        };
        let tx = self.emit(idx, &mut repr, buf);
        if from + chunk >= w.len {
            self.req.next_psn = w.last_psn + 1;
            self.req.idx += 1;
            self.req.off = 0;
        } else {
            self.req.next_psn = psn + chunk / mtu;
            self.req.off = from + chunk;
        }
        Ok(tx)
    }

    fn build_atomic(&mut self, buf: &mut [u8]) -> Result<Tx, BuildError> {
        let idx = self.req.idx;
        let w = &self.sq[idx];
        let (opcode, swap_add, compare) = match w.wr.opcode {
            WrOpcode::AtomicCmpAndSwp => (Opcode::RC_COMPARE_SWAP, w.wr.swap, w.wr.compare_add),
            _ => (Opcode::RC_FETCH_ADD, w.wr.compare_add, 0),
        };
        let mut repr = PacketRepr {
            bth: BthRepr::new(opcode, self.attr.dest_qp_num, w.first_psn).with_ack_req(true),
            ext: ExtHeaders {
                atomic_eth: Some(AtomicEthRepr {
                    va: w.wr.remote.remote_addr,
                    rkey: w.wr.remote.rkey,
                    swap_add,
                    compare,
                }),
                ..Default::default()
            },
            payload: &[],
        };
        let tx = self.emit(idx, &mut repr, buf);
        self.req.next_psn = w.first_psn + 1;
        self.req.idx += 1;
        self.req.off = 0;
        Ok(tx)
    }

    /// An RC FLUSH: FETH (placement type, selectivity level) and RETH (the range), no payload,
    /// asking for its response (a zero-length READ response).
    fn build_flush(&mut self, buf: &mut [u8]) -> Result<Tx, BuildError> {
        let idx = self.req.idx;
        let w = &self.sq[idx];
        // post_send refuses a FLUSH without its operands.
        let spec = w.wr.flush.ok_or((
            WcStatus::LocQpOpErr,
            ErrorCause::MissingOperands {
                opcode: w.wr.opcode,
            },
        ))?;
        let mut repr = PacketRepr {
            bth: BthRepr::new(Opcode::RC_FLUSH, self.attr.dest_qp_num, w.first_psn)
                .with_ack_req(true),
            ext: ExtHeaders {
                feth: Some(FethRepr {
                    bits: spec.feth_bits(),
                }),
                reth: Some(RethRepr {
                    va: w.wr.remote.remote_addr,
                    rkey: w.wr.remote.rkey,
                    dma_len: spec.len,
                }),
                ..Default::default()
            },
            payload: &[],
        };
        let tx = self.emit(idx, &mut repr, buf);
        self.req.next_psn = w.first_psn + 1;
        self.req.idx += 1;
        self.req.off = 0;
        Ok(tx)
    }

    /// READ request messages and atomics sent whose responses are not all in: each READ WQE
    /// counts the chunks (aligned requests of `SendWqe::read_chunk_pkts`) between the data received
    /// and what was requested; after a rewind only what was requested again counts.
    pub(crate) fn rd_requests_outstanding(&self) -> u32 {
        let mtu = self.mtu();
        let mut n = 0;
        for (i, w) in self.sq.iter().enumerate().take(self.req.idx + 1) {
            if !w.started || w.status.is_some() {
                continue;
            }
            let whole = i < self.req.idx;
            match w.wr.opcode {
                WrOpcode::RdmaRead => {
                    let chunk = w.read_chunk_pkts() * mtu;
                    let requested = if whole { w.len } else { self.req.off };
                    if requested > w.read_done {
                        n += requested.div_ceil(chunk) - w.read_done / chunk;
                    } else if whole && w.len == 0 {
                        n += 1; // a zero-length READ is one request
                    }
                }
                WrOpcode::AtomicCmpAndSwp
                | WrOpcode::AtomicFetchAndAdd
                | WrOpcode::AtomicWrite
                | WrOpcode::Flush
                    if whole =>
                {
                    n += 1
                }
                _ => {}
            }
        }
        n
    }

    /// Go-back-N: the requester resends from the oldest unacknowledged PSN (`comp_psn`), which
    /// lies in the head WQE; a partly answered READ is reissued for the rest.
    pub(crate) fn rewind(&mut self) {
        self.req.idx = 0;
        self.req.off = 0;
        self.req.noack_pkts = 0;
        self.req.off = self.sq.front().map_or(0, |w| self.resume_offset(w));
        self.req.next_psn = self.comp.psn();
    }
}

/// The opcode of a SEND or WRITE packet.
fn request_opcode(t: QpType, write: bool, first: bool, last: bool, imm: bool) -> Opcode {
    let rc = match (write, first, last, imm) {
        (false, true, true, false) => Opcode::RC_SEND_ONLY,
        (false, true, true, true) => Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
        (false, true, false, _) => Opcode::RC_SEND_FIRST,
        (false, false, false, _) => Opcode::RC_SEND_MIDDLE,
        (false, false, true, false) => Opcode::RC_SEND_LAST,
        (false, false, true, true) => Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
        (true, true, true, false) => Opcode::RC_RDMA_WRITE_ONLY,
        (true, true, true, true) => Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        (true, true, false, _) => Opcode::RC_RDMA_WRITE_FIRST,
        (true, false, false, _) => Opcode::RC_RDMA_WRITE_MIDDLE,
        (true, false, true, false) => Opcode::RC_RDMA_WRITE_LAST,
        (true, false, true, true) => Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
    };
    match t {
        // XRC's opcode comes from RC's as the packet is emitted (`emit`).
        QpType::Rc | QpType::XrcSend | QpType::XrcRecv => rc,
        QpType::Uc => Opcode(rc.0 | 0x20),
        QpType::Ud => {
            if imm {
                Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
            } else {
                Opcode::UD_SEND_ONLY
            }
        }
    }
}
