//! Shared set-up for the engine's scenario and property tests.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

pub mod script;
pub mod workload;

use std::time::Duration;

use ferroce_transport::memory::VecMr;
use ferroce_transport::sim::{LinkConfig, Network};
use ferroce_transport::{
    AccessFlags, AhAttr, Instant, Mtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType,
    RecvWr, SendFlags, SendWr, WcStatus, WorkCompletion, WrOpcode,
};

pub const PD: u32 = 7;

/// Knobs of a connected pair.
#[derive(Debug, Clone, Copy)]
pub struct Opts {
    pub qp_type: QpType,
    pub mtu: Mtu,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub access: AccessFlags,
    pub psn_a: u32,
    pub psn_b: u32,
    pub mem_len: usize,
    pub max_wr: u32,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            qp_type: QpType::Rc,
            mtu: Mtu::Mtu1024,
            timeout: 10, // 4.2 ms
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1, // 10 µs
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            psn_a: 0x100,
            psn_b: 0x200,
            mem_len: 1 << 16,
            max_wr: 4096,
        }
    }
}

/// Two nodes, one QP each, connected, each with one memory region of `mem_len` bytes
/// (node A's filled with a pattern, node B's zeroed).
pub struct Pair {
    pub net: Network,
    pub qa: u32,
    pub qb: u32,
    pub mra: VecMr,
    pub mrb: VecMr,
    pub opts: Opts,
}

pub fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ salt)
        .collect()
}

pub fn pair(seed: u64, link: LinkConfig, opts: Opts) -> Pair {
    let mut net = Network::new(seed, 2, link);
    let cap = QpCap {
        max_send_wr: opts.max_wr,
        max_recv_wr: opts.max_wr,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 256,
    };
    let init = QpInitAttr {
        qp_type: opts.qp_type,
        pd: PD,
        cap,
        srq: None,
        sq_sig_all: false,
    };
    let qa = net.nodes[0].endpoint.create_qp(init).unwrap();
    let qb = net.nodes[1].endpoint.create_qp(init).unwrap();
    let mra = net.nodes[0]
        .mem
        .register(PD, pattern(opts.mem_len, 0x5A), opts.access);
    let mrb = net.nodes[1]
        .mem
        .register(PD, vec![0; opts.mem_len], opts.access);
    let (aa, ab) = (net.nodes[0].addr, net.nodes[1].addr);
    connect(&mut net, 0, qa, ab, qb, opts.psn_a, opts.psn_b, &opts);
    connect(&mut net, 1, qb, aa, qa, opts.psn_b, opts.psn_a, &opts);
    Pair {
        net,
        qa,
        qb,
        mra,
        mrb,
        opts,
    }
}

/// RESET → INIT → RTR → RTS as ibv_rc_pingpong does it.
#[allow(clippy::too_many_arguments)]
pub fn connect(
    net: &mut Network,
    node: usize,
    qpn: u32,
    peer: std::net::IpAddr,
    peer_qpn: u32,
    sq_psn: u32,
    rq_psn: u32,
    o: &Opts,
) {
    let n = &mut net.nodes[node];
    let now = Instant::ZERO;
    let ud = o.qp_type == QpType::Ud;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: o.access,
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
    n.endpoint.modify_qp(qpn, &a, m, &n.mem, now).unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = o.mtu;
    a.dest_qp_num = peer_qpn;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = o.max_dest_rd_atomic;
    a.min_rnr_timer = o.min_rnr_timer;
    a.ah_attr = Some(AhAttr::new(peer));
    let m = match o.qp_type {
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
    n.endpoint.modify_qp(qpn, &a, m, &n.mem, now).unwrap();
    if ud {
        // UD keeps its path MTU at the default unless set; set it as the provider will.
        let _ = &a;
    }
    a.qp_state = QpState::Rts;
    a.sq_psn = sq_psn;
    a.timeout = o.timeout;
    a.retry_cnt = o.retry_cnt;
    a.rnr_retry = o.rnr_retry;
    a.max_rd_atomic = o.max_rd_atomic;
    let m = match o.qp_type {
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
    n.endpoint.modify_qp(qpn, &a, m, &n.mem, now).unwrap();
}

impl Pair {
    pub fn post_recv(&mut self, node: usize, wr_id: u64, offset: u64, len: u32) {
        let (qpn, mr) = if node == 0 {
            (self.qa, self.mra)
        } else {
            (self.qb, self.mrb)
        };
        let n = &mut self.net.nodes[node];
        n.endpoint
            .post_recv(
                qpn,
                RecvWr {
                    wr_id,
                    sg_list: vec![mr.sge(offset, len)],
                },
                &n.mem,
                self.net.now,
            )
            .unwrap();
    }

    /// A signaled work request from node A's region at `offset` (len bytes) to node B's
    /// region at `remote_offset`.
    pub fn wr(
        &self,
        wr_id: u64,
        opcode: WrOpcode,
        offset: u64,
        len: u32,
        remote_offset: u64,
    ) -> SendWr {
        let mut wr = SendWr::new(wr_id, opcode);
        wr.send_flags = SendFlags::SIGNALED;
        wr.sg_list = vec![self.mra.sge(offset, len)];
        wr.remote.remote_addr = self.mrb.addr + remote_offset;
        wr.remote.rkey = self.mrb.rkey;
        wr
    }

    pub fn post_send(&mut self, node: usize, wr: SendWr) {
        let qpn = if node == 0 { self.qa } else { self.qb };
        let n = &mut self.net.nodes[node];
        n.endpoint.post_send(qpn, wr, &n.mem, self.net.now).unwrap();
    }

    pub fn send_wcs(&self, node: usize) -> Vec<WorkCompletion> {
        let qpn = if node == 0 { self.qa } else { self.qb };
        self.net.nodes[node].completions_of(qpn, ferroce_transport::WcQueue::Send)
    }

    pub fn recv_wcs(&self, node: usize) -> Vec<WorkCompletion> {
        let qpn = if node == 0 { self.qa } else { self.qb };
        self.net.nodes[node].completions_of(qpn, ferroce_transport::WcQueue::Recv)
    }

    pub fn bytes(&self, node: usize) -> Vec<u8> {
        let key = if node == 0 {
            self.mra.lkey
        } else {
            self.mrb.lkey
        };
        self.net.nodes[node].mem.bytes(key).unwrap()
    }

    /// Drives until A has `n` send completions (bounded).
    pub fn run_until_send_wcs(&mut self, n: usize, max_steps: u64) -> bool {
        let qa = self.qa;
        self.net.drive_until(max_steps, |net| {
            net.nodes[0]
                .completions_of(qa, ferroce_transport::WcQueue::Send)
                .len()
                >= n
        })
    }

    pub fn counters(&self, node: usize) -> ferroce_transport::Counters {
        *self.net.nodes[node].endpoint.counters()
    }

    pub fn state(&self, node: usize) -> QpState {
        let qpn = if node == 0 { self.qa } else { self.qb };
        self.net.nodes[node].endpoint.qp_state(qpn).unwrap()
    }
}

pub fn statuses(wcs: &[WorkCompletion]) -> Vec<WcStatus> {
    wcs.iter().map(|w| w.status).collect()
}

pub fn lossless() -> LinkConfig {
    LinkConfig::default()
}

pub fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}
