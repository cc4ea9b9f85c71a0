//! Building the responder's packets: ACKs, NAKs, READ responses and atomic ACKs, in PSN
//! order, straight into the caller's buffer.

use ferroce_wire::{
    AethRepr, AtomicAckEthRepr, BthRepr, ExtHeaders, NakCode, Opcode, PacketRepr, Syndrome,
};

use super::super::{Ctx, Qp, Tx};
use super::*;
use crate::memory::Memory;
use crate::verbs::{QpState, QpType};

impl Qp {
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
                    pd,
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
                            .read_remote(pd, rkey, va, &mut buf[hl..hl + plen as usize])
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
            if self.qp_type == QpType::XrcRecv {
                // XRC's responses are RC's with the XRC opcode (and no XRCETH).
                buf[0] |= 0xA0;
            }
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
