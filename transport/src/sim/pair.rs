//! A connected pair of QPs on two simulated nodes, brought up as `ibv_rc_pingpong` does, with
//! one memory region each: the fixture of the engine's tests, fuzz targets and benchmark.

use crate::memory::VecMr;
use crate::sim::{LinkConfig, Network};
use crate::{
    AccessFlags, Endpoint, EndpointConfig, Instant, Mtu, QpCap, QpInitAttr, QpState, QpType,
    RecvWr, SendFlags, SendWr, WorkCompletion, WrOpcode,
};

/// The protection domain every simulated QP and region uses.
pub const PD: u32 = 7;

/// Knobs of a connected pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opts {
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout (4.096 µs · 2^timeout).
    pub timeout: u8,
    /// `retry_cnt`.
    pub retry_cnt: u8,
    /// `rnr_retry`.
    pub rnr_retry: u8,
    /// `min_rnr_timer` of both responders.
    pub min_rnr_timer: u8,
    /// `max_rd_atomic` of both requesters.
    pub max_rd_atomic: u8,
    /// `max_dest_rd_atomic` of both responders.
    pub max_dest_rd_atomic: u8,
    /// QP and memory region access flags.
    pub access: AccessFlags,
    /// Node A's first send PSN (and B's expected one).
    pub psn_a: u32,
    /// Node B's first send PSN.
    pub psn_b: u32,
    /// Bytes of each node's memory region.
    pub mem_len: usize,
    /// `max_send_wr` and `max_recv_wr`.
    pub max_wr: u32,
    /// The UDP source port of node B's packets: 4791, ferroce's, or another to make B look
    /// like kernel rxe (which sends from 0xC000 and up) to A.
    pub b_src_port: u16,
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
            b_src_port: ferroce_wire::ROCE_UDP_PORT,
        }
    }
}

/// Two nodes, one QP each, connected, each with one memory region of `mem_len` bytes
/// (node A's filled with a pattern, node B's zeroed).
pub struct Pair {
    /// The network (node 0 is A, node 1 is B).
    pub net: Network,
    /// A's QP number.
    pub qa: u32,
    /// B's QP number.
    pub qb: u32,
    /// A's region.
    pub mra: VecMr,
    /// B's region.
    pub mrb: VecMr,
    /// How the pair was made.
    pub opts: Opts,
}

/// Deterministic bytes: `len` of them, varied by `salt`.
pub fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ salt)
        .collect()
}

/// Two nodes joined by `link`, one QP each, connected as `opts` says.
pub fn pair(seed: u64, link: LinkConfig, opts: Opts) -> Pair {
    let mut net = Network::new(seed, 2, link);
    if opts.b_src_port != net.nodes[1].endpoint.config().src_port {
        let cfg = EndpointConfig {
            src_port: opts.b_src_port,
            ..*net.nodes[1].endpoint.config()
        };
        net.nodes[1].endpoint = Endpoint::new(cfg);
    }
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
        send_cq: 0,
        recv_cq: 0,
    };
    let qa = net.nodes[0]
        .endpoint
        .create_qp(init)
        .expect("simulated set-up is valid");
    let qb = net.nodes[1]
        .endpoint
        .create_qp(init)
        .expect("simulated set-up is valid");
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

/// RESET → INIT → RTR → RTS as `ibv_rc_pingpong` does it, with the pair's options.
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
    let up = crate::BringUp {
        peer,
        dest_qp_num: peer_qpn,
        path_mtu: o.mtu,
        sq_psn,
        rq_psn,
        qp_access_flags: o.access,
        qkey: 0x1111_1111,
        timeout: o.timeout,
        retry_cnt: o.retry_cnt,
        rnr_retry: o.rnr_retry,
        min_rnr_timer: o.min_rnr_timer,
        max_rd_atomic: o.max_rd_atomic,
        max_dest_rd_atomic: o.max_dest_rd_atomic,
    };
    for (attr, mask) in up.steps(crate::Service::of(o.qp_type, qpn)) {
        n.endpoint
            .modify_qp(qpn, &attr, mask, &n.mem, Instant::ZERO)
            .expect("simulated set-up is valid");
    }
}

impl Pair {
    /// Posts a receive of `len` bytes at `offset` into the node's region.
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
                    sg_list: vec![mr.sge(offset, len)].into(),
                },
                &n.mem,
                self.net.now,
            )
            .expect("simulated set-up is valid");
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
        wr.sg_list = vec![self.mra.sge(offset, len)].into();
        wr.remote.remote_addr = self.mrb.addr + remote_offset;
        wr.remote.rkey = self.mrb.rkey;
        wr
    }

    /// Posts a send work request on the node's QP.
    pub fn post_send(&mut self, node: usize, wr: SendWr) {
        let qpn = if node == 0 { self.qa } else { self.qb };
        let n = &mut self.net.nodes[node];
        n.endpoint
            .post_send(qpn, wr, &n.mem, self.net.now)
            .expect("simulated set-up is valid");
    }

    /// The node's send completions so far.
    pub fn send_wcs(&self, node: usize) -> Vec<WorkCompletion> {
        let qpn = if node == 0 { self.qa } else { self.qb };
        self.net.nodes[node].completions_of(qpn, crate::WcQueue::Send)
    }

    /// The node's receive completions so far.
    pub fn recv_wcs(&self, node: usize) -> Vec<WorkCompletion> {
        let qpn = if node == 0 { self.qa } else { self.qb };
        self.net.nodes[node].completions_of(qpn, crate::WcQueue::Recv)
    }

    /// A copy of the node's region.
    pub fn bytes(&self, node: usize) -> Vec<u8> {
        let key = if node == 0 {
            self.mra.lkey
        } else {
            self.mrb.lkey
        };
        self.net.nodes[node]
            .mem
            .bytes(key)
            .expect("simulated set-up is valid")
    }

    /// Drives until A has `n` send completions (bounded).
    pub fn run_until_send_wcs(&mut self, n: usize, max_steps: u64) -> bool {
        let qa = self.qa;
        self.net.drive_until(max_steps, |net| {
            net.nodes[0].completions_of(qa, crate::WcQueue::Send).len() >= n
        })
    }

    /// The node's counters.
    pub fn counters(&self, node: usize) -> crate::Counters {
        *self.net.nodes[node].endpoint.counters()
    }

    /// The state of the node's QP.
    pub fn state(&self, node: usize) -> QpState {
        let qpn = if node == 0 { self.qa } else { self.qb };
        self.net.nodes[node]
            .endpoint
            .qp_state(qpn)
            .expect("simulated set-up is valid")
    }
}
