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
use ferroce_transport::{QpCap, QpInitAttr, QpType, WcStatus, WorkCompletion};

pub fn statuses(wcs: &[WorkCompletion]) -> Vec<WcStatus> {
    wcs.iter().map(|w| w.status).collect()
}

pub fn lossless() -> LinkConfig {
    LinkConfig::default()
}

/// An RC QP of PD [`PD`] with one SGE each way, reporting to CQ 0: `max_wr` send and receive
/// WRs.
pub fn rc_init(max_wr: u32) -> QpInitAttr {
    QpInitAttr {
        qp_type: QpType::Rc,
        pd: PD,
        cap: QpCap {
            max_send_wr: max_wr,
            max_recv_wr: max_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        srq: None,
        sq_sig_all: false,
        send_cq: 0,
        recv_cq: 0,
    }
}
