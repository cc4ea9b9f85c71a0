//! The endpoint's in-flight budget: many QPs with deep queues never have more request PSNs
//! unacknowledged together than the budget allows (a READ's request may reserve its whole
//! response range at once), every QP still gets its turn, and every transfer completes with
//! the right bytes, on a clean link and under loss.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::*;
use ferroce_transport::sim::{LinkConfig, Network};
use ferroce_transport::{
    AccessFlags, Endpoint, EndpointConfig, SendFlags, SendWr, WcQueue, WcStatus, WrOpcode,
};

const QPS: usize = 16;
const WRS: usize = 8;
const LEN: u32 = 64 << 10;
const BUDGET: u32 = 200;

/// 16 QP pairs between two nodes whose endpoints have `budget`; node 0 posts 8 × 64 KiB
/// WRITEs (or READs) on each. Returns the network and the QP numbers of each side.
fn setup(seed: u64, link: LinkConfig, budget: u32) -> (Network, Vec<(u32, u32)>) {
    let mut net = Network::new(seed, 2, link);
    for n in &mut net.nodes {
        n.endpoint = Endpoint::new(EndpointConfig {
            solve_unknown_ident: false,
            inflight_budget: budget,
            ..EndpointConfig::new(n.addr)
        });
    }
    let opts = Opts::default();
    let init = rc_init(64);
    let (aa, ab) = (net.nodes[0].addr, net.nodes[1].addr);
    let mut qps = Vec::new();
    for i in 0..QPS as u32 {
        let qa = net.nodes[0].endpoint.create_qp(init).unwrap();
        let qb = net.nodes[1].endpoint.create_qp(init).unwrap();
        connect(&mut net, 0, qa, ab, qb, 0x100 + i, 0x9000 + i, &opts);
        connect(&mut net, 1, qb, aa, qa, 0x9000 + i, 0x100 + i, &opts);
        qps.push((qa, qb));
    }
    (net, qps)
}

fn access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
}

/// Runs the workload; checks the budget at every step and the data at the end.
fn run(seed: u64, link: LinkConfig, op: WrOpcode) -> Result<(), String> {
    let (mut net, qps) = setup(seed, link, BUDGET);
    let total = QPS * WRS * LEN as usize;
    let src = pattern(total, seed as u8);
    // Node 0 requests: a WRITE from its region into node 1's, a READ of node 1's into its own.
    let read = op == WrOpcode::RdmaRead;
    let (init0, init1) = if read {
        (vec![0; total], src.clone())
    } else {
        (src.clone(), vec![0; total])
    };
    let mr0 = net.nodes[0].mem.register(PD, init0, access());
    let mr1 = net.nodes[1].mem.register(PD, init1, access());
    for (q, &(qa, _)) in qps.iter().enumerate() {
        for w in 0..WRS {
            let off = ((q * WRS + w) * LEN as usize) as u64;
            let mut wr = SendWr::new((q * WRS + w) as u64, op);
            wr.send_flags = SendFlags::SIGNALED;
            wr.sg_list = vec![mr0.sge(off, LEN)].into();
            wr.remote.remote_addr = mr1.addr + off;
            wr.remote.rkey = mr1.rkey;
            let now = net.now;
            let n = &mut net.nodes[0];
            n.endpoint.post_send(qa, wr, &n.mem, now).unwrap();
        }
    }
    let mut peak = 0;
    let mut over = None;
    let done = net.drive_until(20_000_000, |net| {
        let inflight = net.nodes[0].endpoint.inflight();
        peak = peak.max(inflight);
        // A READ request takes its response range (at most one 64-packet chunk) at once.
        if inflight > BUDGET + 64 && over.is_none() {
            over = Some(inflight);
        }
        qps.iter()
            .all(|&(qa, _)| net.nodes[0].completions_of(qa, WcQueue::Send).len() == WRS)
    });
    if let Some(n) = over {
        return Err(format!("{n} PSNs in flight with a budget of {BUDGET}"));
    }
    if !done {
        return Err("the transfers did not finish".into());
    }
    for &(qa, _) in &qps {
        let wcs = net.nodes[0].completions_of(qa, WcQueue::Send);
        if statuses(&wcs) != vec![WcStatus::Success; WRS] {
            return Err(format!("QP {qa:#x}: {:?}", statuses(&wcs)));
        }
    }
    let got = if read {
        net.nodes[0].mem.bytes(mr0.lkey)
    } else {
        net.nodes[1].mem.bytes(mr1.lkey)
    }
    .unwrap();
    if got != src {
        return Err("the bytes differ".into());
    }
    if peak < BUDGET / 2 {
        return Err(format!(
            "only {peak} PSNs ever in flight: the budget is not what limits"
        ));
    }
    Ok(())
}

#[test]
fn many_qps_stay_within_the_budget_on_a_clean_link() {
    ferroce_transport::sim::run_seeds(0..3, |seed| run(seed, lossless(), WrOpcode::RdmaWrite));
}

#[test]
fn many_qps_stay_within_the_budget_under_loss() {
    let lossy = LinkConfig {
        loss: 0.02,
        ..lossless()
    };
    ferroce_transport::sim::run_seeds(10..13, |seed| run(seed, lossy, WrOpcode::RdmaWrite));
}

#[test]
fn reads_count_their_response_ranges() {
    ferroce_transport::sim::run_seeds(20..22, |seed| run(seed, lossless(), WrOpcode::RdmaRead));
}

#[test]
fn no_budget_means_no_limit() {
    // The default (u32::MAX): all 16 windows of 128 PSNs at once.
    let (mut net, qps) = setup(5, lossless(), u32::MAX);
    let mr0 = net.nodes[0]
        .mem
        .register(PD, vec![1; (QPS * LEN as usize) * 2], access());
    let mr1 = net.nodes[1]
        .mem
        .register(PD, vec![0; (QPS * LEN as usize) * 2], access());
    for (q, &(qa, _)) in qps.iter().enumerate() {
        for w in 0..2u64 {
            let off = (q as u64 * 2 + w) * u64::from(LEN);
            let mut wr = SendWr::new(w, WrOpcode::RdmaWrite);
            wr.sg_list = vec![mr0.sge(off, LEN)].into();
            wr.remote.remote_addr = mr1.addr + off;
            wr.remote.rkey = mr1.rkey;
            let now = net.now;
            let n = &mut net.nodes[0];
            n.endpoint.post_send(qa, wr, &n.mem, now).unwrap();
        }
    }
    let mut peak = 0;
    net.drive_until(1_000_000, |net| {
        peak = peak.max(net.nodes[0].endpoint.inflight());
        false
    });
    assert!(peak > BUDGET * 4, "{peak}");
    assert_eq!(net.nodes[0].endpoint.inflight(), 0, "all acknowledged");
}
