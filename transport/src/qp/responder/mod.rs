//! The responder: executes incoming requests in PSN order and answers them — ACKs (coalesced,
//! only when asked), NAKs, RNR NAKs, READ responses and atomic ACKs — with the duplicate and
//! out-of-sequence rules of IBTA §9.7.5 as kernel rxe applies them.
//!
//! This file holds the responder's state; its jobs are one file each: request intake and
//! sequencing ([`sequence`]), running requests ([`execute`]), duplicates ([`duplicate`]), UC and
//! UD ([`unreliable`]) and building responses ([`respond`]).

mod duplicate;
mod execute;
mod respond;
mod sequence;
mod unreliable;

use std::collections::VecDeque;

use ferroce_wire::{NakCode, Psn, RethRepr, Syndrome};

use crate::verbs::{RecvWr, WcStatus};

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
    Atomic {
        psn: Psn,
        orig: u64,
    },
    /// An ATOMIC WRITE done: a duplicate is answered again, never stored twice.
    AtomicWrite {
        psn: Psn,
    },
    /// A FLUSH done; it holds a slot as a READ does (a duplicate is answered again: a flush
    /// may run twice).
    Flush,
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
        /// The PD the request was checked against (an XRC receive QP's changes with the SRQ
        /// each request names): the data is read through it.
        pd: u32,
        remaining: u32,
        first: bool,
        msn: u32,
        /// As for `AtomicAck`.
        dup: bool,
    },
}

impl Response {
    /// The answer to an ATOMIC WRITE or a FLUSH: a READ response of no data (reading no
    /// memory).
    fn atomic_write_done(psn: Psn, msn: u32, dup: bool) -> Response {
        Response::Read {
            psn,
            va: 0,
            rkey: 0,
            pd: 0,
            remaining: 0,
            first: true,
            msn,
            dup,
        }
    }
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
    /// A receive-side failure: the receive WQE completes with this status (the QP's first
    /// error keeps the cause), then the NAK.
    Recv(WcStatus, super::ErrorCause, NakCode),
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

    /// Whether the next response is a bare acknowledgement (an ACK, NAK or atomic ACK): those
    /// leave even while the QP's data is paced, so the peer's requests are never held up by
    /// this side's congestion.
    pub(crate) fn ack_first(&self) -> bool {
        matches!(
            self.out.front(),
            Some(Response::Ack { .. } | Response::AtomicAck { .. })
        )
    }

    pub(crate) fn take_in_progress_recv(&mut self) -> Option<RecvWr> {
        self.in_write = None;
        self.in_send.take().map(|s| s.wqe)
    }

    fn push(&mut self, r: Response) {
        if let (
            Response::Ack {
                psn, syndrome: new, ..
            },
            Some(Response::Ack {
                psn: old_psn,
                syndrome: old,
                ..
            }),
        ) = (r, self.out.back())
        {
            // Coalesce: a new ACK replaces an ACK not yet sent at the tail (never a NAK).
            if new == Syndrome::ACK_UNLIMITED && *old == Syndrome::ACK_UNLIMITED {
                self.out.pop_back();
            } else if psn == *old_psn && new == *old {
                // The same NAK again (an RNR NAK for each copy of a SEND a peer repeats
                // without waiting): one not yet sent says it already, and a flood of them
                // must not grow the queue.
                return;
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
    fn queue_read(&mut self, psn: Psn, reth: &RethRepr, pd: u32, msn: u32, dup: bool) {
        self.push(Response::Read {
            psn,
            va: reth.va,
            rkey: reth.rkey,
            pd,
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
