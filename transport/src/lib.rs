//! The sans-IO RoCEv2 transport engine of ferroce.
//!
//! This crate does what the transport of a RoCEv2 HCA does — RC, UC and UD queue pairs, the QP
//! state machine, requester, responder and completer with their timers — with no sockets,
//! threads, clock or randomness of its own. Kernel rxe is the behaviour matched on the wire;
//! the IBTA spec where rxe is lax.
#![forbid(unsafe_code)]

pub mod state;
pub mod verbs;

pub use state::{ModifyLimits, ModifyQpError, Service};
pub use verbs::*;
