//! Transmit: the rotation of QPs with something to send, and QP1's stand-in answers, one
//! datagram per call into the caller's buffer.

use std::net::{IpAddr, SocketAddr};

use ferroce_wire::{BthRepr, DethRepr, ExtHeaders, Opcode, PacketRepr, Psn};

use super::{BufferTooShort, Endpoint, FlushIcrc, MAX_UNSERVED_MADS, MIN_TRANSMIT_BUF, Transmit};
use crate::memory::Memory;
use crate::qp::Timer;
use crate::time::Instant;

impl Endpoint {
    /// Builds the next datagram to send into `buf`, with its ICRC; `Ok(None)` when nothing is
    /// waiting.
    ///
    /// # Errors
    /// [`BufferTooShort`] if `buf` is shorter than [`MIN_TRANSMIT_BUF`] (nothing is consumed).
    pub fn poll_transmit<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        mem: &M,
    ) -> Result<Option<Transmit>, BufferTooShort> {
        if buf.len() < MIN_TRANSMIT_BUF {
            return Err(BufferTooShort { len: buf.len() });
        }
        Ok(self.next_transmit(now, buf, mem))
    }

    pub(super) fn next_transmit<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        mem: &M,
    ) -> Option<Transmit> {
        if let Some(tx) = self.next_unserved_mad(buf) {
            return Some(tx);
        }
        while let Some(qpn) = self.active.pop_front() {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            let cc = self.cfg.congestion;
            let mut ctx = ctx!(self, mem, now, None);
            // A CNP first (never paced), then what the QP's pacing allows: everything, or
            // only bare acknowledgements while it waits.
            let tx = if let Some(cnp) = qp.poll_cnp(now, buf) {
                ctx.counters.cnp_sent += 1;
                Some(cnp)
            } else if let Some(until) = qp.pace(now, &cc) {
                let ack = if qp.resp.ack_first() {
                    qp.poll_response(&mut ctx, buf)
                } else {
                    None
                };
                if ack.is_none() {
                    qp.timers.set(Timer::Pace, until);
                }
                ack
            } else {
                let tx = qp
                    .poll_response(&mut ctx, buf)
                    .or_else(|| qp.poll_request(&mut ctx, buf));
                if let Some(tx) = &tx {
                    qp.charge(now, tx.len, &cc);
                }
                tx
            };
            if tx.is_none() {
                qp.scheduled = false;
            }
            // Sending arms the retransmit timer; a failed request may have stopped it.
            self.rearm(qpn);
            self.account(qpn);
            if let Some(tx) = tx {
                // More may follow: back to the end of the rotation.
                self.active.push_back(qpn);
                let dst = SocketAddr::new(tx.dest, self.cfg.dst_port);
                let Some(icrc) = self.icrc_to(tx.dest) else {
                    self.counters.dropped += 1;
                    continue;
                };
                if buf[0] == Opcode::RC_FLUSH.0 && self.cfg.flush_icrc == FlushIcrc::Rxe {
                    icrc.fill_rxe_flush(&mut buf[..tx.len]);
                } else {
                    icrc.fill(&mut buf[..tx.len]);
                }
                return Some(Transmit {
                    dst,
                    len: tx.len,
                    hop_limit: tx.hop_limit,
                    traffic_class: tx.traffic_class,
                    qpn,
                });
            }
        }
        None
    }

    /// The next answer to an unserved MAD, built into `buf`: a UD SEND from QP1 with the GSI
    /// Q_Key to the asking QP.
    pub(super) fn next_unserved_mad(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        while let Some((dest, dest_qpn, mad)) = self.unserved_mads.pop_front() {
            let repr = PacketRepr {
                bth: BthRepr::new(Opcode::UD_SEND_ONLY, dest_qpn, Psn::new(0)),
                ext: ExtHeaders {
                    deth: Some(DethRepr {
                        qkey: ferroce_wire::GSI_QKEY,
                        src_qp: 1,
                    }),
                    ..ExtHeaders::default()
                },
                payload: &mad,
            };
            let len = repr.buffer_len();
            let Some(icrc) = self.icrc_to(dest) else {
                self.counters.dropped += 1;
                continue;
            };
            // `poll_transmit` takes no buffer shorter than MIN_TRANSMIT_BUF, above a MAD's.
            let out = buf.get_mut(..len)?;
            repr.emit(out);
            icrc.fill(out);
            self.counters.sent_pkts += 1;
            return Some(Transmit {
                dst: SocketAddr::new(dest, self.cfg.dst_port),
                len,
                hop_limit: 64,
                traffic_class: 0,
                qpn: 1,
            });
        }
        None
    }

    /// A MAD for QP1 while this endpoint has none (no connection manager runs in this
    /// process): a Get or Set is answered as the kernel's MAD layer answers one that no agent
    /// serves, the MAD back to the sender's QP as a GetResp with status 0x000C (unsupported
    /// method/attribute) — how a prober (`ferroce doctor`) finds a RoCE stack here; a CM DREQ
    /// (for a connection of a process that is gone, routed to this role holder) gets its DREP,
    /// as the kernel's CM answers one for a connection it does not hold. False for anything
    /// else (counted as for no QP), or when [`MAX_UNSERVED_MADS`] answers wait.
    pub(super) fn answer_unserved_mad(&mut self, src: IpAddr, pkt: &PacketRepr<'_>) -> bool {
        let Some(deth) = pkt.ext.deth else {
            return false;
        };
        if pkt.bth.opcode != Opcode::UD_SEND_ONLY || deth.qkey != ferroce_wire::GSI_QKEY {
            return false;
        }
        let (resp, answer) = if let Some(r) = crate::cm::unmatched_response(pkt.payload) {
            (
                r,
                "a Get/Set nobody serves: answered unsupported (status 0x000c), as the kernel's \
                 MAD layer does",
            )
        } else if let Some(r) = crate::cm::unserved_dreq_answer(pkt.payload) {
            (
                r,
                "a CM DREQ for a connection nobody here holds (its process is gone): answered \
                 with its DREP, as the kernel's CM does",
            )
        } else {
            return false;
        };
        if self.unserved_mads.len() >= MAX_UNSERVED_MADS {
            log::debug!(
                "a MAD from {src} QP {:#x} for QP1, which nothing here serves: dropped, \
                 {MAX_UNSERVED_MADS} answers wait already",
                deth.src_qp
            );
            return false;
        }
        log::debug!(
            "a MAD of class {:#04x} from {src} QP {:#x} for QP1, which no connection manager \
             here serves, {answer}",
            pkt.payload[1],
            deth.src_qp
        );
        self.unserved_mads.push_back((src, deth.src_qp, resp));
        true
    }
}
