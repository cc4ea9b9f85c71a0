//! An XRC fixture: node A's XRC send QP connected to node B's XRC receive QP, B's domain
//! holding two XRC SRQs (each with its own CQ, both with receives posted) and a third SRQ in
//! another domain: the set-up of the XRC tests and fuzz target.

use crate::memory::VecMr;
use crate::sim::pair::{Opts, PD, connect, pattern};
use crate::sim::{LinkConfig, Network};
use crate::{QpCap, QpInitAttr, QpType, RecvWr, SendWr, SrqAttr, WcQueue, WrOpcode, XrcSrq};

/// Steps the fixture's helpers drive at most.
const STEPS: u64 = 200_000;

/// B's XRC domain.
pub const XRCD: u32 = 5;
/// The domain of B's third SRQ (not the receive QP's).
pub const OTHER_XRCD: u32 = 6;
/// A's send CQ.
pub const SEND_CQ: u32 = 1;
/// The CQ of B's first SRQ (and of the other domain's).
pub const CQ_A: u32 = 50;
/// The CQ of B's second SRQ.
pub const CQ_B: u32 = 60;

/// The XRC fixture.
pub struct XrcPair {
    /// The network (node 0 is A, node 1 is B).
    pub net: Network,
    /// A's XRC send QP.
    pub ini: u32,
    /// B's XRC receive QP, in [`XRCD`].
    pub tgt: u32,
    /// B's XRC SRQs of [`XRCD`] (CQs [`CQ_A`] and [`CQ_B`]).
    pub srq_a: u32,
    /// See `srq_a`.
    pub srq_b: u32,
    /// B's XRC SRQ of [`OTHER_XRCD`].
    pub srq_other: u32,
    /// A's region (a pattern).
    pub mra: VecMr,
    /// B's region (zeroed).
    pub mrb: VecMr,
}

/// A and B connected over `link`; B's two SRQs of [`XRCD`] have four 4 KiB receives each
/// (wr_id 0..4 and 10..14, at B's offsets 0, 4096, ... in order).
pub fn xrc_pair(seed: u64, link: LinkConfig) -> XrcPair {
    let mut net = Network::new(seed, 2, link);
    let o = Opts::default();
    let mra = net.nodes[0].mem.register(PD, pattern(1 << 16, 3), o.access);
    let mrb = net.nodes[1].mem.register(PD, vec![0; 1 << 16], o.access);
    let attr = SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    };
    let mut srq = |xrcd, cq| {
        net.nodes[1]
            .endpoint
            .create_xrc_srq(attr, XrcSrq { xrcd, pd: PD, cq })
    };
    let (srq_a, srq_b, srq_other) = (srq(XRCD, CQ_A), srq(XRCD, CQ_B), srq(OTHER_XRCD, CQ_A));
    let ini = net.nodes[0]
        .endpoint
        .create_qp(QpInitAttr {
            qp_type: QpType::XrcSend,
            pd: PD,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 0,
                max_send_sge: 1,
                max_recv_sge: 0,
                max_inline_data: 0,
            },
            srq: None,
            sq_sig_all: true,
            send_cq: SEND_CQ,
            recv_cq: SEND_CQ,
        })
        .expect("simulated set-up is valid");
    let tgt = net.nodes[1]
        .endpoint
        .create_qp(QpInitAttr {
            qp_type: QpType::XrcRecv,
            pd: XRCD,
            cap: QpCap::default(),
            srq: None,
            sq_sig_all: false,
            send_cq: 0,
            recv_cq: 0,
        })
        .expect("simulated set-up is valid");
    let (aa, ab) = (net.nodes[0].addr, net.nodes[1].addr);
    let send = Opts {
        qp_type: QpType::XrcSend,
        ..o
    };
    connect(&mut net, 0, ini, ab, tgt, 100, 200, &send);
    let recv = Opts {
        qp_type: QpType::XrcRecv,
        ..o
    };
    connect(&mut net, 1, tgt, aa, ini, 200, 100, &recv);
    for (i, s) in [(0u64, srq_a), (1, srq_b)] {
        for k in 0..4u64 {
            net.nodes[1]
                .endpoint
                .post_srq_recv(
                    s,
                    RecvWr {
                        wr_id: i * 10 + k,
                        sg_list: vec![mrb.sge((i * 4 + k) * 4096, 4096)].into(),
                    },
                )
                .expect("simulated set-up is valid");
        }
    }
    XrcPair {
        net,
        ini,
        tgt,
        srq_a,
        srq_b,
        srq_other,
        mra,
        mrb,
    }
}

impl XrcPair {
    /// Posts a signaled WR on A's send QP for B's SRQ `srqn`: `len` bytes of A's region at
    /// `off`, to B's region at `remote` (WRITE/READ/atomics; an atomic adds 1).
    pub fn send(
        &mut self,
        wr_id: u64,
        opcode: WrOpcode,
        srqn: u32,
        off: u64,
        len: u32,
        remote: u64,
    ) {
        let mut w = SendWr::new(wr_id, opcode);
        w.sg_list = vec![self.mra.sge(off, len)].into();
        w.remote.remote_addr = self.mrb.addr + remote;
        w.remote.rkey = self.mrb.rkey;
        w.compare_add = 1;
        w.remote_srqn = srqn;
        let n = &mut self.net.nodes[0];
        n.endpoint
            .post_send(self.ini, w, &n.mem, self.net.now)
            .expect("simulated set-up is valid");
    }

    /// Drives until A has `n` send completions (bounded).
    pub fn run_until_sends(&mut self, n: usize) -> bool {
        let ini = self.ini;
        self.net.drive_until(STEPS, |net| {
            net.nodes[0].completions_of(ini, WcQueue::Send).len() >= n
        })
    }

    /// B's receive completions on CQ `cq`: (wr_id, byte_len, QP number).
    pub fn recv_on(&self, cq: u32) -> Vec<(u64, u32, u32)> {
        self.net.nodes[1]
            .completions
            .iter()
            .filter(|c| c.cq == cq && c.queue == WcQueue::Recv)
            .map(|c| (c.wc.wr_id, c.wc.byte_len, c.qpn))
            .collect()
    }
}
