//! Parse + ICRC verification of a 4 KiB-payload RoCEv2 packet, next to raw crc32fast over the
//! same bytes: the ratio is what the header work and masking cost on top of the CRC itself. And
//! the ICRC of an 8-byte WRITE, where the masked headers are most of what is covered.

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{Criterion, Throughput, criterion_main};
use ferroce_wire::{BthRepr, ExtHeaders, IcrcContext, Opcode, PacketRepr, Psn, RethRepr};

fn packet(len: u32) -> (IcrcContext, Vec<u8>) {
    let payload: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
    let repr = PacketRepr {
        bth: BthRepr::new(Opcode::RC_RDMA_WRITE_ONLY, 0x11, Psn::new(1)).with_ack_req(true),
        ext: ExtHeaders {
            reth: Some(RethRepr {
                va: 0x1000,
                rkey: 0x1234,
                dma_len: len,
            }),
            ..Default::default()
        },
        payload: &payload,
    }
    .with_pad();
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf);
    let ctx = IcrcContext::v4(
        Ipv4Addr::new(127, 0, 0, 1),
        Ipv4Addr::new(127, 0, 0, 2),
        0,
        4791,
        4791,
    );
    ctx.fill(&mut buf);
    (ctx, buf)
}

fn bench(c: &mut Criterion) {
    let (ctx, buf) = packet(4096);
    let mut g = c.benchmark_group("4KiB_packet");
    g.throughput(Throughput::Bytes(buf.len() as u64));
    g.bench_function("parse_and_verify_icrc", |b| {
        b.iter(|| {
            let pkt = black_box(&buf[..]);
            let repr = PacketRepr::parse(pkt).expect("valid packet");
            assert!(ctx.verify(pkt));
            black_box(repr.payload.len())
        })
    });
    g.bench_function("solve_ipv4_ident", |b| {
        b.iter(|| black_box(ctx.solve_ipv4_ident(black_box(&buf[..]))))
    });
    g.bench_function("raw_crc32fast", |b| {
        b.iter(|| black_box(crc32fast::hash(black_box(&buf[..]))))
    });
    g.finish();
    // An 8-byte WRITE ONLY (40-byte UDP payload): the header pieces are most of the CRC.
    let (ctx, mut buf) = packet(8);
    let mut g = c.benchmark_group("8B_write_packet");
    g.throughput(Throughput::Elements(1));
    g.bench_function("verify_icrc", |b| {
        b.iter(|| assert!(ctx.verify(black_box(&buf[..]))))
    });
    g.bench_function("fill_icrc", |b| {
        b.iter(|| ctx.fill(black_box(&mut buf[..])))
    });
    g.finish();
}

mod group {
    #![allow(missing_docs)]
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);
