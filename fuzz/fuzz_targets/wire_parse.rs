//! Arbitrary bytes as a RoCEv2 UDP payload: parsing, every header view, formatting and the
//! ICRC functions must never panic.
#![no_main]

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use ferroce_wire::{
    AethPacket, AethRepr, BthPacket, BthRepr, DethPacket, DethRepr, IcrcContext, Packet, PacketRepr,
    RethPacket, RethRepr,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut s = String::new();
    if let Ok(repr) = PacketRepr::parse(data) {
        let _ = write!(s, "{repr}");
        assert_eq!(repr.buffer_len(), data.len());
        let p = Packet::new_checked(data).expect("parse succeeded, so the view checks");
        assert_eq!(p.payload(), repr.payload);
        let _ = p.icrc();
    }
    if let Ok(b) = BthPacket::new_checked(data) {
        let _ = BthRepr::parse(&b);
    }
    if let Ok(r) = RethPacket::new_checked(data) {
        let _ = RethRepr::parse(&r);
    }
    if let Ok(a) = AethPacket::new_checked(data) {
        if let Ok(r) = AethRepr::parse(&a) {
            let _ = write!(s, "{}", r.ack_type());
        }
    }
    if let Ok(d) = DethPacket::new_checked(data) {
        let _ = DethRepr::parse(&d);
    }
    let ctx = IcrcContext::v4(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), 0, 0xc000, 4791);
    let _ = ctx.verify(data);
    if let Some(id) = ctx.solve_ipv4_ident(data) {
        // A solved ID must make the full check pass.
        let fixed = IcrcContext::v4(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), id, 0xc000, 4791);
        assert!(fixed.verify(data));
    }
});
