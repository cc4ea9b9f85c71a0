//! Region copies (`provider/src/dma.rs`): the block path (aligned SSE2 blocks in inline
//! assembly) against the word loop (one relaxed atomic per 8 bytes) and a plain
//! `copy_from_slice`, into and out of a region, for a 4 KiB packet's payload in cache (hot)
//! and spread over 64 MiB (cold, past every cache). The number a packet's copy costs per side.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_main};

const PAYLOAD: usize = 4096;
/// Bytes of region the cold runs walk through, well past this machine's caches.
const COLD: usize = 64 << 20;

fn copies(c: &mut Criterion) {
    let data = vec![0x5Au8; PAYLOAD];
    let mut out = vec![0u8; PAYLOAD];
    let mut g = c.benchmark_group("region_copy_4k");
    g.throughput(Throughput::Bytes(PAYLOAD as u64));
    for (name, span) in [("hot", PAYLOAD + 64), ("cold", COLD)] {
        let mut mem = vec![0u64; span / 8];
        let slots = (span - PAYLOAD) / PAYLOAD + 1;
        for bulk in [true, false] {
            let path = if bulk { "block" } else { "word" };
            let mut i = 0usize;
            g.bench_function(BenchmarkId::new(format!("write_{path}"), name), |b| {
                b.iter(|| {
                    i = (i + 1) % slots;
                    ferroce::bench_write(&mut mem, i * PAYLOAD, black_box(&data), bulk);
                })
            });
            g.bench_function(BenchmarkId::new(format!("read_{path}"), name), |b| {
                b.iter(|| {
                    i = (i + 1) % slots;
                    ferroce::bench_read(&mut mem, i * PAYLOAD, &mut out, bulk);
                    black_box(&out);
                })
            });
        }
        let mut plain = vec![0u8; span];
        let mut i = 0usize;
        g.bench_function(BenchmarkId::new("memcpy", name), |b| {
            b.iter(|| {
                i = (i + 1) % slots;
                plain[i * PAYLOAD..(i + 1) * PAYLOAD].copy_from_slice(black_box(&data));
                black_box(&plain);
            })
        });
    }
    g.finish();
}

mod group {
    #![allow(missing_docs)]
    criterion::criterion_group!(benches, super::copies);
}
criterion_main!(group::benches);
