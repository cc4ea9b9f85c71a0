//! UC and UD receives: no ACKs, no retries; UC drops the rest of a message after a gap, UD
//! prepends the GRH area.

use std::net::IpAddr;

use ferroce_wire::{Operation, PacketRepr, Position};

use super::super::{Ctx, Qp, wc};
use super::*;
use crate::endpoint::WcQueue;
use crate::memory::{self, Memory};
use crate::verbs::{AccessFlags, WcFlags, WcOpcode, WcStatus};

impl Qp {
    /// UC: no ACKs; a gap drops the rest of the message and resynchronises on the next FIRST
    /// or ONLY packet (IBTA §9.8.3).
    pub(super) fn uc_request<M: Memory + ?Sized>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        pkt: &PacketRepr<'_>,
    ) {
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
                if let Fault::Recv(status, cause, _) = fault {
                    self.complete_recv_error(ctx, status, cause);
                }
                ctx.counters.dropped += 1;
                self.uc_abort_message();
            }
        }
    }

    /// Drops a UC message in progress; its receive WQE is kept for the next message.
    pub(super) fn uc_abort_message(&mut self) {
        self.resp.in_write = None;
        if let Some(s) = self.resp.in_send.take() {
            self.rq.push_front(s.wqe);
        }
        self.resp.uc_dropping = true;
    }

    pub(super) fn ud_request<M: Memory + ?Sized>(
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
        if let Err(e) = placed {
            // A UD receive that fails completes in error; the QP stays in RTS (rxe's too).
            let message = (GRH_LEN + pkt.payload.len()) as u64;
            let (s, cause) = super::super::ErrorCause::of_scatter(e, message, &wqe.sg_list);
            status = s;
            self.note_error(status, wqe.wr_id, cause);
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
        c.sl = if src.is_ipv4() {
            crate::ROCE_PKT_TYPE_V2_IPV4
        } else {
            crate::ROCE_PKT_TYPE_V2_IPV6
        };
        if let Some(i) = pkt.ext.immdt {
            c.imm_data = i.imm;
            c.wc_flags |= WcFlags::WITH_IMM;
        }
        self.report(ctx, WcQueue::Recv, c);
    }
}

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
