//! A device of several shards (`OpenOptions::shards`): RC QPs spread over the shards, each
//! shard's QPN slot steering its QPs' datagrams to its own socket and engine, with the
//! verbs, the data and the counters as with one shard; QP1, SRQ, UD and XRC QPs on the first.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::{CtxSide, connect_sides, ctx_side, ok};

use ferroce::transport::SrqAttr;
use ferroce::{
    AccessFlags, Context, Device, OpenOptions, QpType, QueuePair, RecvWr, SendWr, WcOpcode,
    WcStatus,
};

const T: Duration = Duration::from_secs(10);

fn open(addr: &str, shards: usize) -> Context {
    Device::find(addr)
        .unwrap()
        .open_with(OpenOptions {
            shards: Some(shards),
            ..OpenOptions::default()
        })
        .unwrap()
}

/// SEND, WRITE and READ from `x` to `y`, 8 KiB each (two packets at the default MTU), data
/// checked.
fn traffic(x: &CtxSide, y: &CtxSide, salt: u8) {
    let data: Vec<u8> = (0..8192u32).map(|i| (i as u8) ^ salt).collect();
    let mut got = vec![0u8; data.len()];
    x.mr.write(0, &data).unwrap();
    y.qp.post_recv(&RecvWr::new(10, y.mr.sge(8192, 8192)))
        .unwrap();
    x.qp.post_send(&SendWr::send(1, x.mr.sge(0, 8192))).unwrap();
    ok(&x.cq);
    assert_eq!(ok(&y.cq).byte_len, 8192);
    y.mr.read(8192, &mut got).unwrap();
    assert_eq!(got, data, "SEND data");
    x.qp.post_send(&SendWr::write(
        2,
        x.mr.sge(0, 8192),
        y.mr.remote().at(16384),
    ))
    .unwrap();
    ok(&x.cq);
    y.mr.read(16384, &mut got).unwrap();
    assert_eq!(got, data, "WRITE data");
    x.qp.post_send(&SendWr::read(
        3,
        x.mr.sge(32768, 8192),
        y.mr.remote().at(16384),
    ))
    .unwrap();
    assert_eq!(ok(&x.cq).opcode, WcOpcode::RdmaRead);
    x.mr.read(32768, &mut got).unwrap();
    assert_eq!(got, data, "READ data");
}

/// Four RC QPs of one device of two shards: two on each shard (the slot in their QPNs), the
/// pairs crossing shards, every operation's data right, and every packet steered to its own
/// shard's socket (none for a QP the shard lacks, none sent on to another member).
#[test]
fn rc_qps_spread_over_shards_and_each_shard_takes_its_own_packets() {
    let ctx = open("127.91.8.1", 2);
    let slots: Vec<u8> = ctx
        .shard_counters()
        .iter()
        .map(|(slot, _, _)| slot.unwrap())
        .collect();
    assert_eq!(slots.len(), 2, "two shards");
    assert_ne!(slots[0], slots[1]);
    assert!(
        slots[0] < slots[1],
        "the first shard has the lowest slot: {slots:?}"
    );
    let sides: Vec<CtxSide> = (0..4).map(|_| ctx_side(&ctx)).collect();
    let slot_of = |s: &CtxSide| (s.qp.qp_num() >> 16) as u8;
    let on: Vec<u8> = sides.iter().map(slot_of).collect();
    assert_eq!(
        on.iter().filter(|&&s| s == slots[0]).count(),
        2,
        "QPs not spread: {on:?} over {slots:?}"
    );
    assert_eq!(on.iter().filter(|&&s| s == slots[1]).count(), 2, "{on:?}");
    // Pair each QP with one on the other shard.
    let (a, b): (Vec<&CtxSide>, Vec<&CtxSide>) = sides.iter().partition(|s| slot_of(s) == slots[0]);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        connect_sides(x, y);
        traffic(x, y, i as u8);
        traffic(y, x, 0x80 | i as u8);
    }
    let per = ctx.shard_counters();
    for (slot, e, r) in &per {
        assert!(
            e.rcvd_pkts > 0 && e.sent_pkts > 0,
            "shard {slot:?} idle: {e:?}"
        );
        assert_eq!(
            e.no_qp, 0,
            "shard {slot:?} got packets for QPs it lacks: {e:?}"
        );
        assert_eq!(
            r.forwarded, 0,
            "shard {slot:?} was steered others' datagrams: {r:?}"
        );
    }
    let (sum, _) = ctx.counters();
    assert_eq!(
        sum.rcvd_pkts,
        per.iter().map(|(_, e, _)| e.rcvd_pkts).sum::<u64>()
    );
}

/// What must share an engine goes to the first shard: a QP on an SRQ (with the SRQ), a UD
/// QP; and a CQ fed by QPs of both shards gets every completion.
#[test]
fn srq_and_ud_qps_are_on_the_first_shard_and_a_cq_takes_both_shards() {
    let ctx = open("127.91.8.2", 2);
    let first = ctx.shard_counters()[0].0.unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64, None).unwrap();
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    // Two plain RC QPs first: one per shard.
    let plain: Vec<QueuePair> = (0..2)
        .map(|_| pd.qp(QpType::Rc, &cq).build().unwrap())
        .collect();
    let on_srq = pd.qp(QpType::Rc, &cq).srq(&srq).build().unwrap();
    let ud = pd.qp(QpType::Ud, &cq).build().unwrap();
    assert_eq!((on_srq.qp_num() >> 16) as u8, first, "a QP on an SRQ");
    assert_eq!((ud.qp_num() >> 16) as u8, first, "a UD QP");
    assert_ne!(
        plain[0].qp_num() >> 16,
        plain[1].qp_num() >> 16,
        "two RC QPs on one shard"
    );
    // Both plain QPs (one per shard) report to `cq`: loop each to the other, one CQ.
    let mr = pd
        .reg_mr(
            1 << 14,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    plain[0].connect(1, &plain[1].endpoint(2)).unwrap();
    plain[1].connect(2, &plain[0].endpoint(1)).unwrap();
    for (i, (x, y)) in [(&plain[0], &plain[1]), (&plain[1], &plain[0])]
        .into_iter()
        .enumerate()
    {
        y.post_recv(&RecvWr::new(100 + i as u64, mr.sge(4096, 64)))
            .unwrap();
        x.post_send(&SendWr::send(i as u64, mr.sge(0, 64))).unwrap();
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let wc = cq.wait(T).expect("a completion from each shard's QP");
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            seen.push(wc.wr_id);
        }
        seen.sort_unstable();
        assert_eq!(seen, vec![i as u64, 100 + i as u64]);
    }
}
