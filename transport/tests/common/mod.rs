//! Shared set-up for the engine's scenario and property tests: the simulator's pair fixture,
//! the scripted-loss recorder and small helpers.
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    unused_imports,
    clippy::unwrap_used
)]

pub mod script;

pub use ferroce_transport::sim::pair::*;
pub use ferroce_transport::sim::workload;

use ferroce_transport::sim::LinkConfig;
use ferroce_transport::{WcStatus, WorkCompletion};

pub fn statuses(wcs: &[WorkCompletion]) -> Vec<WcStatus> {
    wcs.iter().map(|w| w.status).collect()
}

pub fn lossless() -> LinkConfig {
    LinkConfig::default()
}
