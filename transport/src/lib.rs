//! The sans-IO RoCEv2 transport engine of ferroce.
//!
//! This crate does what the transport of a RoCEv2 HCA does — RC, UC and UD queue pairs, the QP
//! state machine, requester, responder and completer with their timers — with no sockets,
//! threads, clock or randomness of its own. Kernel rxe is the behaviour matched on the wire;
//! the IBTA spec where rxe is lax.
//!
//! The [`Endpoint`] is the whole engine of one device; its docs give the order in which to
//! call it. Registered memory is reached through the [`Memory`] trait.
#![forbid(unsafe_code)]

pub mod cm;
pub mod congestion;
pub mod endpoint;
pub mod hash;
pub mod mcast;
pub mod memory;
pub mod modify;
pub mod qp;
pub mod rng;
#[cfg(any(test, fuzzing, feature = "sim"))]
pub mod sim;
pub mod smallvec;
pub mod srq;
pub mod state;
pub mod time;
pub mod verbs;

pub use congestion::{CongestionConfig, Ecn};
pub use endpoint::{
    AsyncEvent, BufferTooShort, Completion, Counters, Datagram, Endpoint, EndpointConfig,
    FlushIcrc, MIN_TRANSMIT_BUF, Transmit, VerbError, WcQueue,
};
pub use mcast::{MULTICAST_QPN, McastError};
pub use memory::{AtomicOp, MemError, Memory, ScatterError, SgeFault, VecMemory};
pub use modify::QpModify;
pub use qp::{
    ErrorCause, FERROCE_PEER_UNACKED_PSNS, MAX_UNACKED_PSNS, PostError, QpError, QpInitAttr,
};
pub use smallvec::SmallVec;
pub use srq::{SrqAttr, XrcSrq};
pub use state::{BringUp, ModifyLimits, ModifyQpError, Service};
pub use time::Instant;
pub use verbs::*;
