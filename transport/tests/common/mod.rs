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
use ferroce_transport::{
    Endpoint, EndpointConfig, QpCap, QpInitAttr, QpType, WcStatus, WorkCompletion,
};

pub fn statuses(wcs: &[WorkCompletion]) -> Vec<WcStatus> {
    wcs.iter().map(|w| w.status).collect()
}

pub fn lossless() -> LinkConfig {
    LinkConfig::default()
}

/// A link that loses `loss` of the packets, reorders 5 % and duplicates 1 %.
pub fn lossy_reordering(loss: f64) -> LinkConfig {
    LinkConfig {
        loss,
        reorder: 0.05,
        dup: 0.01,
        ..lossless()
    }
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

/// Gives node A of `p` a fresh engine of `cfg` and a new RC QP of `max_wr` WRs connected to B's
/// QP (the first QP of a fresh engine takes the number A's had): the pair as [`pair`] builds it,
/// A's engine configured otherwise.
pub fn reconfigure_a(p: &mut Pair, cfg: EndpointConfig, max_wr: u32) {
    p.net.nodes[0].endpoint = Endpoint::new(cfg);
    let qa = p.net.nodes[0].endpoint.create_qp(rc_init(max_wr)).unwrap();
    let addr_b = p.net.nodes[1].addr;
    connect(
        &mut p.net,
        0,
        qa,
        addr_b,
        p.qb,
        p.opts.psn_a,
        p.opts.psn_b,
        &p.opts,
    );
    p.qa = qa;
}
