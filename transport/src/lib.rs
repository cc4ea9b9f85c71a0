//! The sans-IO RoCEv2 transport engine of ferroce.
//!
//! Not written yet: this crate is where the RC/UC/UD engine (QP state machine, requester,
//! responder, completer, timers and the lossy-network simulator) will live. It exports nothing
//! today, so nothing can mistake it for a working engine.
#![forbid(unsafe_code)]
