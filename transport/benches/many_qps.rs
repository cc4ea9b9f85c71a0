//! The engine's per-operation cost with many QPs: one QP does a 4 KiB RDMA WRITE and its ACK
//! (post, transmit, handle on both sides, `poll_timeout` after each step as the runtime calls
//! it) while 0, 999 or 9,999 other QPs of the same endpoint sit with a retransmit timer armed.
//! With per-QP deadlines in a heap the time must not grow with the number of QPs (it grew
//! linearly when `poll_timeout` and `handle_timeout` scanned every QP).

use std::hint::black_box;
use std::net::SocketAddr;

use criterion::{BenchmarkId, Criterion, criterion_main};
use ferroce_transport::sim::LinkConfig;
use ferroce_transport::sim::pair::{Opts, Pair, connect, pair};
use ferroce_transport::{
    Datagram, Mtu, QpCap, QpInitAttr, QpType, RemoteAddr, SendFlags, SendWr, Sge, WrOpcode,
};

const LEN: u32 = 4096;

fn setup(idle_qps: usize) -> Pair {
    let opts = Opts {
        mtu: Mtu::Mtu4096,
        mem_len: 1 << 16,
        // 4.3 s: the idle QPs' timers never fire during a measurement.
        timeout: 20,
        ..Opts::default()
    };
    let mut p = pair(1, LinkConfig::default(), opts);
    let b_addr = p.net.nodes[1].addr;
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let init = QpInitAttr {
        qp_type: QpType::Rc,
        pd: 1,
        cap,
        srq: None,
        sq_sig_all: false,
        send_cq: 0,
        recv_cq: 0,
    };
    let mut buf = vec![0u8; 8192];
    for i in 0..idle_qps {
        let q = p.net.nodes[0]
            .endpoint
            .create_qp(init)
            .expect("bench set-up is valid");
        connect(&mut p.net, 0, q, b_addr, 0x80_0000 + i as u32, 1, 1, &opts);
        let n = &mut p.net.nodes[0];
        let mut w = SendWr::new(0, WrOpcode::RdmaWrite);
        w.sg_list = vec![Sge {
            addr: p.mra.addr,
            length: 8,
            lkey: p.mra.lkey,
        }]
        .into();
        w.remote = RemoteAddr {
            remote_addr: p.mrb.addr,
            rkey: p.mrb.rkey,
        };
        n.endpoint
            .post_send(q, w, &n.mem, p.net.now)
            .expect("bench set-up is valid");
        // Sent and never delivered: the QP waits with its timer armed.
        while n
            .endpoint
            .poll_transmit(p.net.now, &mut buf, &n.mem)
            .expect("the buffer is long enough")
            .is_some()
        {}
    }
    p
}

/// One signaled 4 KiB WRITE on the pair's QP, packets moved until it completes.
fn one_write(p: &mut Pair, buf: &mut [u8]) -> u64 {
    let mut w = p.wr(1, WrOpcode::RdmaWrite, 0, LEN, 0);
    w.send_flags = SendFlags::SIGNALED;
    p.post_send(0, w);
    let (a, b) = (p.net.nodes[0].addr, p.net.nodes[1].addr);
    let now = p.net.now;
    let mut deadline_sum = 0;
    loop {
        let mut moved = false;
        for (from, to, src, dst) in [(0usize, 1usize, a, b), (1, 0, b, a)] {
            loop {
                let n = &mut p.net.nodes[from];
                let Some(tx) = n
                    .endpoint
                    .poll_transmit(now, buf, &n.mem)
                    .expect("the buffer is long enough")
                else {
                    break;
                };
                let m = &mut p.net.nodes[to];
                m.endpoint.receive(
                    now,
                    Datagram::new(SocketAddr::new(src, 4791), dst, &buf[..tx.len]),
                    &m.mem,
                );
                moved = true;
            }
            let n = &mut p.net.nodes[from];
            deadline_sum += n.endpoint.poll_timeout().map_or(0, |t| t.as_nanos() & 1);
        }
        if p.net.nodes[0].endpoint.poll_completion().is_some() {
            return deadline_sum;
        }
        assert!(moved, "engine stalled");
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("many_qps");
    let mut buf = vec![0u8; 8192];
    for idle in [0usize, 999, 9_999] {
        let mut p = setup(idle);
        g.bench_with_input(
            BenchmarkId::new("write_4KiB_and_ack_with_idle_qps", idle),
            &idle,
            |b, _| b.iter(|| black_box(one_write(&mut p, &mut buf))),
        );
    }
    g.finish();
}

mod group {
    #![allow(missing_docs)]
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);
