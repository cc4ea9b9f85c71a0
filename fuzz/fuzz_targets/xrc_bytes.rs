//! Arbitrary bytes thrown at an XRC pair: at the receive QP as a raw datagram (ICRC fixed up),
//! and as a well-formed packet of any opcode at its expected PSN whose XRCETH names an SRQ
//! from the input (one of its domain's, another domain's, or none); at the send QP likewise
//! (stray responses). Then real XRC traffic must still be handled: nothing may panic, and
//! each QP stays usable or goes to ERR cleanly.
#![no_main]

use ferroce_transport::sim::xrc::xrc_pair;
use ferroce_transport::sim::LinkConfig;
use ferroce_transport::{Datagram, Ecn, SendWr, WrOpcode};
use ferroce_wire::{BthRepr, ExtHeaders, IcrcContext, Opcode, PacketRepr, Psn, XrcEthRepr};
use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, SocketAddr};

fuzz_target!(|data: &[u8]| {
    let mut x = xrc_pair(1, LinkConfig::default());
    let (IpAddr::V4(a), IpAddr::V4(b)) = (x.net.nodes[0].addr, x.net.nodes[1].addr) else { return };
    let now = x.net.now;
    let ecn = Ecn::from_tos(data.last().copied().unwrap_or(0));
    // 1. Raw bytes for the receive QP, its QPN patched in, a valid ICRC.
    let mut raw = data.to_vec();
    if raw.len() >= 16 {
        raw[5..8].copy_from_slice(&x.tgt.to_be_bytes()[1..]);
        IcrcContext::v4(a, b, 0, 4791, 4791).fill(&mut raw);
    }
    let n = &mut x.net.nodes[1];
    n.endpoint.receive(now, Datagram::new(SocketAddr::new(IpAddr::V4(a), 4791), IpAddr::V4(b), &raw).with_ecn(ecn), &n.mem);
    // 2. A well-formed packet of the input's opcode, its XRCETH naming an SRQ the input picks.
    if let Some((&op, rest)) = data.split_first() {
        let opcode = Opcode(op);
        if let Some(info) = opcode.info() {
            let pick = rest.first().copied().unwrap_or(0);
            let srq = match pick % 4 {
                0 => x.srq_a,
                1 => x.srq_b,
                2 => x.srq_other,
                _ => u32::from(pick) << 8,
            };
            let take = |i: usize| rest.get(i..i + 8).map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])));
            let payload = if info.has_payload { &rest[..rest.len().min(1024)] } else { &[][..] };
            use ferroce_wire::opcode::HeaderSet as H;
            let mut ext = ExtHeaders::default();
            if info.headers.contains(H::XRCETH) {
                ext.xrceth = Some(XrcEthRepr { xrcsrq: srq & 0xFF_FFFF });
            }
            if info.headers.contains(H::RETH) {
                ext.reth = Some(ferroce_wire::RethRepr { va: x.mrb.addr + take(1) % 70000, rkey: x.mrb.rkey, dma_len: (take(9) % 70000) as u32 });
            }
            if info.headers.contains(H::ATOMIC_ETH) {
                ext.atomic_eth = Some(ferroce_wire::AtomicEthRepr { va: x.mrb.addr + take(1) % 70000, rkey: x.mrb.rkey, swap_add: take(9), compare: take(17) });
            }
            if info.headers.contains(H::AETH) {
                ext.aeth = Some(ferroce_wire::AethRepr { syndrome: pick, msn: 1 });
            }
            if info.headers.contains(H::ATOMIC_ACK_ETH) {
                ext.atomic_ack_eth = Some(ferroce_wire::AtomicAckEthRepr { orig: take(1) });
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
            for (to, qpn, psn) in [(1usize, x.tgt, 200u32), (0usize, x.ini, 100u32)] {
                let repr = PacketRepr { bth: BthRepr::new(opcode, qpn, Psn::new(psn)), ext, payload }.with_pad();
                let mut buf = vec![0u8; repr.buffer_len()];
                repr.emit(&mut buf);
                let (src, dst) = if to == 1 { (a, b) } else { (b, a) };
                IcrcContext::v4(src, dst, 0, 4791, 4791).fill(&mut buf);
                let n = &mut x.net.nodes[to];
                n.endpoint.receive(now, Datagram::new(SocketAddr::new(IpAddr::V4(src), 4791), IpAddr::V4(dst), &buf).with_ecn(ecn), &n.mem);
            }
        }
    }
    // 3. Real traffic after it: a SEND to each SRQ, a WRITE and a READ.
    let srqs = [x.srq_a, x.srq_b];
    for (i, op) in [WrOpcode::Send, WrOpcode::Send, WrOpcode::RdmaWrite, WrOpcode::RdmaRead].into_iter().enumerate() {
        let mut w = SendWr::new(i as u64, op);
        w.sg_list = vec![x.mra.sge(i as u64 * 100, 100)].into();
        w.remote.remote_addr = x.mrb.addr + 40_000;
        w.remote.rkey = x.mrb.rkey;
        w.remote_srqn = srqs[i % 2];
        let n = &mut x.net.nodes[0];
        let _ = n.endpoint.post_send(x.ini, w, &n.mem, x.net.now);
    }
    x.net.drive(10_000);
});
