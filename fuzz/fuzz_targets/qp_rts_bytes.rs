//! Arbitrary bytes thrown at a connected QP in RTS, both as a raw datagram (with a valid ICRC,
//! so it gets past the check) and as the payload of a packet aimed at the QP's expected PSN
//! with an arbitrary opcode, each with an ECN field from the input (CE asks for a CNP; a CNP
//! opcode cuts the QP's rate). Nothing may panic, and the QP stays usable or goes to ERR
//! cleanly.
#![no_main]

use ferroce_transport::sim::pair::{Opts, pair};
use ferroce_transport::sim::LinkConfig;
use ferroce_transport::{Datagram, Ecn};
use ferroce_wire::{BthRepr, ExtHeaders, IcrcContext, Opcode, PacketRepr, Psn};
use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, SocketAddr};

fuzz_target!(|data: &[u8]| {
    let mut p = pair(1, LinkConfig::default(), Opts::default());
    let (IpAddr::V4(a), IpAddr::V4(b)) = (p.net.nodes[0].addr, p.net.nodes[1].addr) else { return };
    let ctx = IcrcContext::v4(a, b, 0, 4791, 4791);
    let from = SocketAddr::new(IpAddr::V4(a), 4791);
    // 1. Raw bytes with a fixed-up ICRC and the QP number patched in.
    let mut raw = data.to_vec();
    if raw.len() >= 16 {
        raw[5..8].copy_from_slice(&p.qb.to_be_bytes()[1..]);
        ctx.fill(&mut raw);
    }
    let now = p.net.now;
    let ecn = Ecn::from_tos(data.last().copied().unwrap_or(0));
    let n = &mut p.net.nodes[1];
    n.endpoint.receive(now, Datagram::new(from, IpAddr::V4(b), &raw).with_ecn(ecn), &n.mem);
    // 2. A well-formed packet with an arbitrary opcode at the expected PSN.
    if let Some((&op, rest)) = data.split_first() {
        let opcode = Opcode(op);
        if let Some(info) = opcode.info() {
            let payload = if info.has_payload { &rest[..rest.len().min(1024)] } else { &[][..] };
            let mut ext = ExtHeaders::default();
            let take = |i: usize| rest.get(i..i + 8).map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])));
            use ferroce_wire::opcode::HeaderSet as H;
            if info.headers.contains(H::RETH) {
                ext.reth = Some(ferroce_wire::RethRepr { va: p.mrb.addr + take(0) % 70000, rkey: p.mrb.rkey, dma_len: (take(8) % 70000) as u32 });
            }
            if info.headers.contains(H::ATOMIC_ETH) {
                ext.atomic_eth = Some(ferroce_wire::AtomicEthRepr { va: p.mrb.addr + take(0) % 70000, rkey: p.mrb.rkey, swap_add: take(8), compare: take(16) });
            }
            if info.headers.contains(H::AETH) {
                ext.aeth = Some(ferroce_wire::AethRepr { syndrome: op, msn: 1 });
            }
            if info.headers.contains(H::ATOMIC_ACK_ETH) {
                ext.atomic_ack_eth = Some(ferroce_wire::AtomicAckEthRepr { orig: take(0) });
            }
            if info.headers.contains(H::IMMDT) {
                ext.immdt = Some(ferroce_wire::ImmDtRepr { imm: 7 });
            }
            if info.headers.contains(H::IETH) {
                ext.ieth = Some(ferroce_wire::IethRepr { rkey: 7 });
            }
            if info.headers.contains(H::DETH) {
                ext.deth = Some(ferroce_wire::DethRepr { qkey: 0x1111_1111, src_qp: 5 });
            }
            if info.headers.contains(H::FETH) {
                ext.feth = Some(ferroce_wire::FethRepr { bits: 0 });
            }
            if info.headers.contains(H::CNP) {
                ext.cnp = Some(ferroce_wire::CnpRepr::default());
            }
            let psn = Psn::new(p.opts.psn_a);
            for (to, qpn) in [(1usize, p.qb), (0usize, p.qa)] {
                let repr = PacketRepr { bth: BthRepr::new(opcode, qpn, psn), ext, payload }.with_pad();
                let mut buf = vec![0u8; repr.buffer_len()];
                repr.emit(&mut buf);
                let (src, dst) = if to == 1 { (a, b) } else { (b, a) };
                IcrcContext::v4(src, dst, 0, 4791, 4791).fill(&mut buf);
                let n = &mut p.net.nodes[to];
                n.endpoint.receive(now, Datagram::new(SocketAddr::new(IpAddr::V4(src), 4791), IpAddr::V4(dst), &buf).with_ecn(ecn), &n.mem);
            }
        }
    }
    p.net.drive(10_000);
});
