//! Memory per idle QP: 10,000 RC QPs created on one device and brought to RTS cost at most
//! 16 KiB each of resident memory (engine state, the verbs object, its tables), measured as
//! the process's RSS delta.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::net::IpAddr;

use ferroce::QpInitAttr;
use ferroce::transport::{Mtu, QpCap, QpType};

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn ten_thousand_idle_qps_cost_at_most_16_kib_each() {
    const N: usize = 10_000;
    let ctx = common::open([127, 0, 84, 1]);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(1024, None).unwrap();
    let init = QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        },
        sq_sig_all: false,
    };
    // Warm up the allocator and the tables with a few first.
    let mut qps: Vec<_> = (0..16).map(|_| pd.create_qp(&init).unwrap()).collect();
    let before = rss_bytes();
    for i in 0..N {
        let qp = pd.create_qp(&init).unwrap();
        let peer = IpAddr::from([127, 0, 84, 2]);
        qp.connect_to(peer, 0x100 + i as u32, Mtu::Mtu4096, 1, 1)
            .unwrap();
        qps.push(qp);
    }
    let per_qp = (rss_bytes().saturating_sub(before)) / N;
    eprintln!("{per_qp} bytes of RSS per idle RC QP in RTS ({N} QPs)");
    assert!(per_qp <= 16 << 10, "{per_qp} bytes per idle QP");
    drop(qps);
}
