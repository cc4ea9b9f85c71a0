//! Engine-only RDMA WRITE throughput: two endpoints joined in memory (no sockets, no simulator
//! queues), 4 KiB path MTU, 64 KiB messages. Each iteration posts 16 WRITEs and pumps packets
//! both ways until all complete. The number the provider's socket runtime has to approach.

use std::hint::black_box;
use std::net::SocketAddr;

use criterion::{Criterion, Throughput, criterion_main};
use ferroce_transport::sim::LinkConfig;
use ferroce_transport::sim::pair::{Opts, Pair, pair};
use ferroce_transport::{Datagram, Mtu, WrOpcode};

const MSG: u32 = 64 << 10;
const BATCH: u64 = 16;
/// 8-byte WRITEs per iteration of the message-rate bench (`ferroce bw`'s default depth).
const SMALL_BATCH: u64 = 128;

fn setup() -> Pair {
    let opts = Opts {
        mtu: Mtu::Mtu4096,
        mem_len: (BATCH as usize) * MSG as usize,
        max_wr: 1024,
        ..Opts::default()
    };
    pair(1, LinkConfig::default(), opts)
}

/// Posts `n` WRITEs of `len` bytes and moves packets directly between the endpoints until
/// every one is done.
fn run_batch(p: &mut Pair, buf: &mut [u8], n: u64, len: u32) -> u64 {
    for i in 0..n {
        let w = p.wr(
            i,
            WrOpcode::RdmaWrite,
            i * u64::from(len),
            len,
            i * u64::from(len),
        );
        p.post_send(0, w);
    }
    let (a_addr, b_addr) = (p.net.nodes[0].addr, p.net.nodes[1].addr);
    let now = p.net.now;
    let mut packets = 0;
    let mut done = 0;
    while done < n {
        let mut moved = false;
        for (from, to, src, dst) in [(0usize, 1usize, a_addr, b_addr), (1, 0, b_addr, a_addr)] {
            loop {
                let n = &mut p.net.nodes[from];
                let Some(tx) = n
                    .endpoint
                    .poll_transmit(now, buf, &n.mem)
                    .expect("the bench buffer is MIN_TRANSMIT_BUF long")
                else {
                    break;
                };
                let m = &mut p.net.nodes[to];
                m.endpoint.receive(
                    now,
                    Datagram::new(SocketAddr::new(src, 4791), dst, &buf[..tx.len]),
                    &m.mem,
                );
                packets += 1;
                moved = true;
            }
        }
        while p.net.nodes[0].endpoint.poll_completion().is_some() {
            done += 1;
        }
        assert!(moved || done == n, "engine stalled");
    }
    packets
}

fn bench(c: &mut Criterion) {
    let mut p = setup();
    let mut buf = vec![0u8; 8192];
    let packets = run_batch(&mut p, &mut buf, BATCH, MSG);
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Bytes(BATCH * u64::from(MSG)));
    g.bench_function("rc_write_64KiB_mtu4096_bytes", |b| {
        b.iter(|| black_box(run_batch(&mut p, &mut buf, BATCH, MSG)))
    });
    g.throughput(Throughput::Elements(packets));
    g.bench_function("rc_write_64KiB_mtu4096_packets", |b| {
        b.iter(|| black_box(run_batch(&mut p, &mut buf, BATCH, MSG)))
    });
    // Message rate: a window's worth of 8-byte WRITEs, the engine's per-message cost (both
    // ends) without sockets: what `ferroce bw --op write -s 8` pays in user space.
    g.throughput(Throughput::Elements(SMALL_BATCH));
    g.bench_function("rc_write_8B_messages", |b| {
        b.iter(|| black_box(run_batch(&mut p, &mut buf, SMALL_BATCH, 8)))
    });
    g.finish();
}

mod group {
    #![allow(missing_docs)]
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);
