//! Why a QP's work failed: the first error of a QP with the facts the engine saw that decide it
//! (a hardware NIC cannot tell its user which of the classic pitfalls it was; the engine saw
//! every packet and every answer).

use core::fmt;
use std::net::IpAddr;

use ferroce_wire::{NakCode, Opcode, Psn};

use crate::memory::{MemError, ScatterError, SgeFault};
use crate::verbs::{Sge, WcStatus, WrOpcode};

/// What made a work request fail, with the facts that decide it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCause {
    /// `IBV_WC_RETRY_EXC_ERR`: the retransmissions of `psn` ran out (`retry_cnt` of them, each
    /// after the local ACK timeout `timeout`, 4.096 µs × 2^timeout).
    NoAnswer {
        /// The oldest unacknowledged PSN.
        psn: Psn,
        /// `retry_cnt`: the retransmissions made.
        retries: u8,
        /// `timeout`, the IBTA exponent.
        timeout: u8,
        /// Whether any response came from the peer since the QP reached RTS.
        heard_since_rts: bool,
    },
    /// `IBV_WC_RETRY_EXC_ERR` on a connection that never made progress although the peer
    /// answered: its answers carried PSNs outside what this QP had outstanding (the two sides'
    /// PSNs disagree: this QP's `sq_psn` is not the peer's `rq_psn`).
    PsnMismatch {
        /// The oldest unacknowledged PSN.
        psn: Psn,
        /// Answers whose PSN fit nothing outstanding.
        strays: u32,
        /// The PSN of the last of them.
        peer_psn: Psn,
    },
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: the responder had no receive WQE; RNR NAKs exhausted
    /// `rnr_retry`.
    RnrExhausted {
        /// The PSN the RNR NAKs were for.
        psn: Psn,
        /// RNR NAKs received by this QP.
        rnr_naks: u32,
        /// `rnr_retry`.
        rnr_retry: u8,
    },
    /// The responder answered with a NAK (REM_ACCESS_ERR, REM_INV_REQ_ERR, REM_OP_ERR).
    Nak {
        /// Its code.
        code: NakCode,
        /// The PSN it NAKed.
        psn: Psn,
        /// The payload bytes of the SEND or WRITE packet at that PSN (0 for other requests).
        packet_bytes: u32,
        /// This QP's `path_mtu`, in bytes.
        path_mtu: u32,
    },
    /// `IBV_WC_LOC_LEN_ERR`: a message longer than the buffer it lands in.
    LocalLength {
        /// Bytes of the message (so far, when it was cut off).
        message: u64,
        /// Bytes of the buffer's scatter list.
        buffer: u64,
    },
    /// `IBV_WC_LOC_PROT_ERR`: an SGE of the work request that its memory refused.
    LocalProtection {
        /// The SGE and why its memory refused it.
        sge: SgeFault,
        /// Whether the access was a write into local memory (a receive buffer, a READ's or an
        /// atomic's result: it needs `IBV_ACCESS_LOCAL_WRITE`) rather than a read for a send.
        write: bool,
    },
    /// `IBV_WC_BAD_RESP_ERR`: the peer answered a request with a response that does not
    /// match it (IBTA C9-138: a response of the wrong kind or size).
    BadResponse {
        /// The request's first PSN.
        psn: Psn,
        /// What was requested.
        request: WrOpcode,
        /// The response's opcode.
        response: Opcode,
        /// The response's payload bytes.
        bytes: u32,
        /// The payload bytes this response should have carried.
        expected: u32,
    },
    /// `IBV_WC_BAD_RESP_ERR`: the peer answered with an AETH syndrome the IBTA reserves.
    ReservedSyndrome {
        /// The PSN it answered.
        psn: Psn,
        /// The AETH syndrome byte.
        syndrome: u8,
    },
    /// `IBV_WC_REM_INV_REQ_ERR` on a receive: the peer's SEND with invalidate named a key this
    /// QP could not invalidate (IBTA 9.4.1.1.5); this QP NAKed it (invalid request).
    RemoteInvalidate {
        /// The SEND's PSN.
        psn: Psn,
        /// The key in its IETH.
        rkey: u32,
        /// Why the memory refused.
        error: MemError,
    },
    /// `IBV_WC_LOC_QP_OP_ERR`: a READ or atomic on a QP whose `max_rd_atomic` is 0.
    NoRdAtomic,
    /// `IBV_WC_MW_BIND_ERR`: a memory window bind or a local invalidate the memory refused.
    LocalOperation {
        /// `IBV_WR_BIND_MW` or `IBV_WR_LOCAL_INV`.
        opcode: WrOpcode,
        /// Why the memory refused it.
        error: MemError,
    },
    /// `IBV_WC_LOC_QP_OP_ERR`: a work request without the operands its opcode needs (a FLUSH
    /// without its placement type and selectivity level); `post_send` refuses these, so only a
    /// caller of the engine that skips its checks meets it.
    MissingOperands {
        /// The work request's opcode.
        opcode: WrOpcode,
    },
    /// A request from the peer this QP refused as a responder: it sent NAK `code` for `psn`
    /// and went to ERR (what the peer then completes with).
    RemoteRequest {
        /// The NAK sent.
        code: NakCode,
        /// The request's PSN.
        psn: Psn,
    },
}

impl ErrorCause {
    /// The status and cause of a failed placement into a work request's buffers (a receive,
    /// a READ's or an atomic's result) of a `message` of that many bytes: `LOC_LEN_ERR` if it
    /// is longer than the buffers, `LOC_PROT_ERR` if the memory refused an SGE.
    pub(crate) fn of_scatter(e: ScatterError, message: u64, sges: &[Sge]) -> (WcStatus, Self) {
        match e {
            ScatterError::TooLong => (
                WcStatus::LocLenErr,
                ErrorCause::LocalLength {
                    message,
                    buffer: sges.iter().map(|g| u64::from(g.length)).sum(),
                },
            ),
            ScatterError::Memory(sge) => (
                WcStatus::LocProtErr,
                ErrorCause::LocalProtection { sge, write: true },
            ),
        }
    }
}

/// The first error of a QP: the work request it failed and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpError {
    /// The completion's status.
    pub status: WcStatus,
    /// The failed work request's `wr_id`.
    pub wr_id: u64,
    /// Why.
    pub cause: ErrorCause,
    /// The peer's address (connected QPs).
    pub peer: Option<IpAddr>,
    /// `dest_qp_num` (connected QPs).
    pub dest_qp_num: u32,
}

impl fmt::Display for QpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let peer = self
            .peer
            .map_or_else(|| "the peer".to_owned(), |p| p.to_string());
        let qpn = self.dest_qp_num;
        match self.cause {
            ErrorCause::NoAnswer {
                psn,
                retries,
                timeout,
                heard_since_rts,
            } => {
                let each = 4.096e-6 * f64::from(1u32 << timeout.min(31));
                write!(
                    f,
                    "{retries} retransmission{} of PSN {:#x} to {peer} QPN {qpn:#x}, no \
                     answer within {each:.3} s after each (timeout {timeout}); ",
                    if retries == 1 { "" } else { "s" },
                    psn.value()
                )?;
                if heard_since_rts {
                    f.write_str(
                        "the peer answered earlier on this connection: it went away, or \
                         the path loses everything now",
                    )
                } else {
                    f.write_str(
                        "nothing has come from that peer since the QP reached RTS (a wrong \
                         dest_qp_num or GID, the peer's QP not in RTR, the peer down, or UDP \
                         4791 filtered?)",
                    )
                }
            }
            ErrorCause::PsnMismatch {
                psn,
                strays,
                peer_psn,
            } => write!(
                f,
                "{peer} QPN {qpn:#x} answered {strays} times, but never for the PSNs this QP \
                 sent: it waited for PSN {:#x} while the answers were for PSN {:#x}; the two \
                 sides' PSNs disagree (this QP's sq_psn must be the peer's rq_psn, and its \
                 rq_psn the peer's sq_psn)",
                psn.value(),
                peer_psn.value()
            ),
            ErrorCause::RnrExhausted {
                psn,
                rnr_naks,
                rnr_retry,
            } => write!(
                f,
                "{rnr_naks} RNR NAKs for PSN {:#x} from {peer} QPN {qpn:#x}: its receive queue \
                 was empty each time and rnr_retry {rnr_retry} ran out{}",
                psn.value(),
                if rnr_retry == 0 {
                    " (rnr_retry 0 gives up at the first RNR NAK: post receives before the \
                     peer sends, or set rnr_retry 7)"
                } else {
                    ""
                }
            ),
            ErrorCause::Nak {
                code,
                psn,
                packet_bytes,
                path_mtu,
            } => {
                let what = match code {
                    NakCode::RemoteAccessError => {
                        "remote access error: the rkey is unknown to it (deregistered, \
                         invalidated, of another PD), the range is outside the region, or the \
                         region or QP does not grant the access (REMOTE_WRITE/READ/ATOMIC)"
                    }
                    NakCode::InvalidRequest => {
                        "invalid request: an operation its QP does not allow, a message \
                         beyond its receive buffer or max_msg_sz, or more READs/atomics than \
                         its max_dest_rd_atomic"
                    }
                    NakCode::RemoteOperationalError => {
                        "remote operational error: it could not complete the request (its \
                         receive buffer's lkey refused the data)"
                    }
                    NakCode::InvalidRdRequest => {
                        "invalid RD request: a Reliable Datagram NAK, which no RC responder \
                         should send (the peer is not speaking RC as this QP does)"
                    }
                    NakCode::PsnSeqError | NakCode::Unknown(_) => "an error NAK",
                };
                write!(
                    f,
                    "{peer} QPN {qpn:#x} answered PSN {:#x} with a NAK: {what}",
                    psn.value()
                )?;
                // 256 is the smallest path MTU: a packet of more may be more than the peer's.
                if code == NakCode::InvalidRequest && packet_bytes > 256 {
                    write!(
                        f,
                        "; the packet at that PSN carried {packet_bytes} bytes (this QP's \
                         path_mtu is {path_mtu}): a peer whose path_mtu is smaller refuses \
                         longer packets, so both sides must use the same path_mtu"
                    )?;
                }
                Ok(())
            }
            ErrorCause::LocalLength { message, buffer } => write!(
                f,
                "a message of {message} bytes or more does not fit the {buffer} bytes of the \
                 work request's scatter list"
            ),
            ErrorCause::LocalProtection { sge, write } => {
                let end = sge.addr.wrapping_add(u64::from(sge.length));
                write!(
                    f,
                    "the SGE lkey {:#x} [{:#x}, {end:#x}) ({} bytes, {}) was refused: ",
                    sge.lkey,
                    sge.addr,
                    sge.length,
                    if write {
                        "written: a receive, READ or atomic result buffer"
                    } else {
                        "read for a send"
                    }
                )?;
                f.write_str(match sge.error {
                    MemError::InvalidKey => {
                        "no region of this QP's PD has that lkey (deregistered, of another PD, \
                         or not an lkey)"
                    }
                    MemError::OutOfBounds => {
                        "the range is not inside the region the lkey names (address or length \
                         wrong, or the region smaller than meant)"
                    }
                    MemError::AccessDenied => {
                        "the region was registered without IBV_ACCESS_LOCAL_WRITE, which a \
                         buffer the device writes needs"
                    }
                    MemError::Misaligned => "a misaligned address",
                })
            }
            ErrorCause::BadResponse {
                psn,
                request,
                response,
                bytes,
                expected,
            } => write!(
                f,
                "{peer} QPN {qpn:#x} answered the {request:?} at PSN {:#x} with {response:?} \
                 carrying {bytes} bytes where {expected} were due: a response that does not \
                 match the request (a peer bug, or two requesters on one connection)",
                psn.value()
            ),
            ErrorCause::ReservedSyndrome { psn, syndrome } => write!(
                f,
                "{peer} QPN {qpn:#x} answered PSN {:#x} with AETH syndrome {syndrome:#04x}, \
                 which the IBTA reserves: the peer is not speaking RC as this QP does",
                psn.value()
            ),
            ErrorCause::RemoteInvalidate { psn, rkey, error } => write!(
                f,
                "{peer} QPN {qpn:#x} sent a SEND with invalidate at PSN {:#x} for rkey \
                 {rkey:#x}, which this QP could not invalidate ({}); it NAKed it (invalid \
                 request) and went to ERR",
                psn.value(),
                if error == MemError::InvalidKey {
                    "no memory window of this QP's PD has that key bound to this QP: a \
                     region's key, a window bound elsewhere, or one already invalid"
                } else {
                    "refused by the memory"
                }
            ),
            ErrorCause::NoRdAtomic => f.write_str(
                "a READ or atomic on a QP whose max_rd_atomic is 0: none may be outstanding \
                 (set max_rd_atomic, IBV_QP_MAX_QP_RD_ATOMIC, in the RTR to RTS transition; \
                 rdma_cm sets it from initiator_depth)",
            ),
            ErrorCause::LocalOperation { opcode, error } => {
                let op = if opcode == WrOpcode::LocalInv {
                    "a local invalidate"
                } else {
                    "a memory window bind"
                };
                let why = match error {
                    MemError::InvalidKey => {
                        "no region or window of this QP's PD has the key (deregistered, of \
                         another PD, already invalidated, or a window bound elsewhere)"
                    }
                    MemError::OutOfBounds => "the bound range is not inside the region",
                    MemError::AccessDenied => {
                        "the region does not grant it (a bind needs MW_BIND on the region, and \
                         remote write or atomic rights need LOCAL_WRITE on it)"
                    }
                    MemError::Misaligned => "a misaligned address",
                };
                write!(f, "{op} refused: {why}")
            }
            ErrorCause::MissingOperands { opcode } => {
                write!(f, "a {opcode:?} work request without the operands it needs")
            }
            ErrorCause::RemoteRequest { code, psn } => write!(
                f,
                "this QP refused the request at PSN {:#x} from {peer} QPN {qpn:#x} with NAK \
                 {code:?} and went to ERR (FERROCE_LOG=debug names the check)",
                psn.value()
            ),
        }
    }
}
