//! Helpers for the loopback tests: two devices on private 127.x addresses, connected RC/UC/UD
//! QPs, completion waiting with a deadline.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ferroce::transport::{
    AccessFlags, AhAttr, Mtu, QpAttr, QpAttrMask, QpCap, QpState, QpType, SendFlags, SendWr,
    WorkCompletion, WrOpcode,
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

/// RESET → INIT → RTR → RTS towards `peer`.
pub fn connect(qp: &QueuePair, peer: IpAddr, peer_qpn: u32, mtu: Mtu, sq_psn: u32, rq_psn: u32) {
    let ud = qp.qp_type() == QpType::Ud;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: ALL,
        qkey: 0x1111_1111,
        ..QpAttr::default()
    };
    let m = QpAttrMask::STATE
        | QpAttrMask::PKEY_INDEX
        | QpAttrMask::PORT
        | if ud {
            QpAttrMask::QKEY
        } else {
            QpAttrMask::ACCESS_FLAGS
        };
    qp.modify(&a, m).unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = mtu;
    a.dest_qp_num = peer_qpn;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 1;
    a.ah_attr = Some(AhAttr::new(peer));
    let m = match qp.qp_type() {
        QpType::Rc => {
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER
        }
        QpType::Uc => {
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
        }
        QpType::Ud => QpAttrMask::STATE,
    };
    qp.modify(&a, m).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = sq_psn;
    a.timeout = 12; // ~17 ms
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    let m = match qp.qp_type() {
        QpType::Rc => {
            QpAttrMask::STATE
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::SQ_PSN
                | QpAttrMask::MAX_QP_RD_ATOMIC
        }
        _ => QpAttrMask::STATE | QpAttrMask::SQ_PSN,
    };
    qp.modify(&a, m).unwrap();
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
            None => std::thread::sleep(Duration::from_micros(200)),
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
    w.sg_list = vec![side.mr.sge(off, len)];
    w.remote.remote_addr = peer.mr.addr() + remote_off as u64;
    w.remote.rkey = peer.mr.rkey();
    w
}

pub fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ salt)
        .collect()
}
