//! How the engine checks the ICRC of IPv4 packets whose IP ID a UDP socket cannot see: a
//! ferroce sender's ID 0 and a train segment's index are checked with all 32 bits; a kernel
//! rxe peer's consecutive IDs are solved once (16 bits) and then predicted (last + 1, all 32
//! bits); a jump is solved again; a corrupted packet is never taken as a predicted one.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ferroce_transport::memory::VecMemory;
use ferroce_transport::{Datagram, Endpoint, EndpointConfig, Instant};
use ferroce_wire::{BthRepr, ExtHeaders, IcrcContext, Opcode, PacketRepr};

const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const RXE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const SPORT: u16 = 0xc123;

/// An RC SEND ONLY of 200 bytes to a QP nobody has, its ICRC right for IP ID `ident`.
fn packet(psn: u32, ident: u16) -> Vec<u8> {
    let payload = [0x5a; 200];
    let repr = PacketRepr {
        bth: BthRepr::new(Opcode::RC_SEND_ONLY, 0x77, ferroce_wire::Psn::new(psn)),
        ext: ExtHeaders::default(),
        payload: &payload,
    };
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit(&mut b);
    IcrcContext::v4(RXE, LOCAL, ident, SPORT, 4791).fill(&mut b);
    b
}

fn deliver(ep: &mut Endpoint, bytes: &[u8], ident: u16) {
    let mem = VecMemory::new();
    let from = SocketAddr::new(IpAddr::V4(RXE), SPORT);
    let dg = Datagram::new(from, IpAddr::V4(LOCAL), bytes).with_ident(ident);
    ep.receive(Instant::ZERO, dg, &mem);
}

#[test]
fn consecutive_ids_are_predicted_and_checked_fully() {
    let mut ep = Endpoint::new(EndpointConfig::new(IpAddr::V4(LOCAL)));
    for (i, id) in [0x4000u16, 0x4001, 0x4002, 0x4003].into_iter().enumerate() {
        deliver(&mut ep, &packet(i as u32, id), 0);
    }
    let c = *ep.counters();
    assert_eq!(
        (c.icrc_errors, c.icrc_partial),
        (0, 1),
        "solved once, then predicted"
    );
    assert_eq!(c.no_qp, 4, "all four accepted past the ICRC");

    // A jump (another rxe QP's traffic in between) is solved again, and predicted after.
    deliver(&mut ep, &packet(9, 0x9000), 0);
    deliver(&mut ep, &packet(10, 0x9001), 0);
    let c = *ep.counters();
    assert_eq!((c.icrc_errors, c.icrc_partial), (0, 2));

    // A corrupted packet with the predicted ID is not taken for the predicted one: it fails,
    // or at best passes the weaker 16-bit check.
    let mut bad = packet(11, 0x9002);
    bad[40] ^= 0x01;
    deliver(&mut ep, &bad, 0);
    let c2 = *ep.counters();
    assert_eq!(
        (c2.icrc_errors - c.icrc_errors) + (c2.icrc_partial - c.icrc_partial),
        1
    );
}

#[test]
fn ferroce_ids_are_checked_fully() {
    let mut ep = Endpoint::new(EndpointConfig::new(IpAddr::V4(LOCAL)));
    // Plain datagrams (ID 0) and the segments of a coalesced train (ID = index).
    deliver(&mut ep, &packet(1, 0), 0);
    for j in 0..15u16 {
        deliver(&mut ep, &packet(2 + u32::from(j), j), j);
    }
    // A plain datagram inside a coalesced read still carries ID 0.
    deliver(&mut ep, &packet(20, 0), 3);
    let c = *ep.counters();
    assert_eq!((c.icrc_errors, c.icrc_partial, c.no_qp), (0, 0, 17));
}

#[test]
fn without_the_solve_only_known_ids_pass() {
    let mut ep = Endpoint::new(EndpointConfig {
        solve_unknown_ident: false,
        ..EndpointConfig::new(IpAddr::V4(LOCAL))
    });
    deliver(&mut ep, &packet(1, 0x1234), 0);
    deliver(&mut ep, &packet(2, 5), 5);
    let c = *ep.counters();
    assert_eq!((c.icrc_errors, c.icrc_partial, c.no_qp), (1, 0, 1));
}
