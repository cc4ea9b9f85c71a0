//! Helpers for the loopback tests: two devices on private 127.x addresses, connected RC/UC/UD
//! QPs, completion waiting with a deadline.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ferroce::transport::{
    AccessFlags, Mtu, QpCap, QpType, SendFlags, SendWr, WorkCompletion, WrOpcode,
};
use ferroce::{
    CompletionQueue, Context, Device, MemoryRegion, ProtectionDomain, QpInitAttr, QueuePair,
};

pub const ALL: AccessFlags = AccessFlags(1 | 2 | 4 | 8);

/// A device on 127.`net`.`host`.1-style addresses unique to a test.
pub fn open(a: [u8; 4]) -> Context {
    Device::for_addr(IpAddr::from(a)).unwrap().open().unwrap()
}

pub struct Side {
    pub ctx: Context,
    pub pd: ProtectionDomain,
    pub cq: CompletionQueue,
    pub qp: QueuePair,
    pub mr: MemoryRegion,
}

pub fn side(addr: [u8; 4], qp_type: QpType, mem: usize) -> Side {
    let ctx = open(addr);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4096, None).unwrap();
    let cap = QpCap {
        max_send_wr: 1024,
        max_recv_wr: 1024,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 256,
    };
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap,
            sq_sig_all: false,
        })
        .unwrap();
    let mr = pd.reg_mr(mem, ALL).unwrap();
    Side {
        ctx,
        pd,
        cq,
        qp,
        mr,
    }
}

/// RESET → INIT → RTR → RTS towards `peer` (the tools' bring-up).
pub fn connect(qp: &QueuePair, peer: IpAddr, peer_qpn: u32, mtu: Mtu, sq_psn: u32, rq_psn: u32) {
    qp.connect_to(peer, peer_qpn, mtu, sq_psn, rq_psn).unwrap();
}

pub fn pair(a: [u8; 4], b: [u8; 4], qp_type: QpType, mtu: Mtu, mem: usize) -> (Side, Side) {
    let x = side(a, qp_type, mem);
    let y = side(b, qp_type, mem);
    connect(&x.qp, IpAddr::from(b), y.qp.qp_num(), mtu, 100, 200);
    connect(&y.qp, IpAddr::from(a), x.qp.qp_num(), mtu, 200, 100);
    (x, y)
}

/// Waits (bounded by `timeout`) for `n` completions.
pub fn wait(cq: &CompletionQueue, n: usize, timeout: Duration) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        match cq.poll_one() {
            Some(wc) => out.push(wc),
            None => std::thread::yield_now(),
        }
    }
    out
}

pub fn wr(
    side: &Side,
    peer: &Side,
    wr_id: u64,
    opcode: WrOpcode,
    off: usize,
    len: u32,
    remote_off: usize,
) -> SendWr {
    let mut w = SendWr::new(wr_id, opcode);
    w.send_flags = SendFlags::SIGNALED;
    w.sg_list = vec![side.mr.sge(off, len)].into();
    w.remote.remote_addr = peer.mr.addr() + remote_off as u64;
    w.remote.rkey = peer.mr.rkey();
    w
}

pub fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ salt)
        .collect()
}

/// One RC QP of a context, its CQ and a 64 KiB region open to every access: the tests of one
/// device's contexts and shards, where both ends share an address.
pub struct CtxSide {
    pub cq: CompletionQueue,
    pub qp: QueuePair,
    pub mr: MemoryRegion,
}

pub fn ctx_side(ctx: &Context) -> CtxSide {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64, None).unwrap();
    let qp = pd.qp(QpType::Rc, &cq).max_send_wr(16).build().unwrap();
    let mr = pd.reg_mr(1 << 16, ALL).unwrap();
    CtxSide { cq, qp, mr }
}

/// Connects two [`CtxSide`]s' QPs (PSNs 1 and 2).
pub fn connect_sides(x: &CtxSide, y: &CtxSide) {
    x.qp.connect(1, &y.qp.endpoint(2)).unwrap();
    y.qp.connect(2, &x.qp.endpoint(1)).unwrap();
}

/// The next completion of `cq` within 10 s, which must be a success.
pub fn ok(cq: &CompletionQueue) -> WorkCompletion {
    let wc = cq.wait(Duration::from_secs(10)).expect("a completion");
    assert_eq!(wc.status, ferroce::transport::WcStatus::Success, "{wc:?}");
    wc
}
