//! QP1 of an endpoint that has none (no connection manager runs in its process): a Get or Set
//! MAD is answered as the kernel's MAD layer answers one no agent serves — a GetResp with
//! status 0x000C from QP1 to the asking QP — so a prober finds a RoCE stack; a CM DREQ (for a
//! connection of a process that is gone) gets its DREP, as the kernel's CM answers one for a
//! connection it does not hold; any other MAD is dropped as for no QP, and at most 16 answers
//! wait.
#![allow(clippy::unwrap_used)]

mod common;

use common::script::inject;
use common::*;
use ferroce_wire::{BthRepr, DethRepr, ExtHeaders, IcrcContext, Opcode, PacketRepr, Psn};

fn get_mad(method: u8) -> [u8; 256] {
    let mut m = [0u8; 256];
    m[..4].copy_from_slice(&[1, 0x07, 2, method]); // base 1, class CM, version 2
    m[8..16].copy_from_slice(&0x1122_3344_5566_7788u64.to_be_bytes());
    m[16..18].copy_from_slice(&0x0001u16.to_be_bytes()); // ClassPortInfo
    m
}

fn mad_to_qp1(p: &mut Pair, mad: &[u8; 256]) {
    inject(
        &mut p.net,
        0,
        1,
        PacketRepr {
            bth: BthRepr::new(Opcode::UD_SEND_ONLY, 1, Psn::new(9)),
            ext: ExtHeaders {
                deth: Some(DethRepr {
                    qkey: ferroce_wire::GSI_QKEY,
                    src_qp: 0x12_3456,
                }),
                ..ExtHeaders::default()
            },
            payload: mad,
        },
    );
}

/// What node 1 sends now: every datagram, parsed.
fn sent_by_1(p: &mut Pair) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let now = p.net.now;
    let n = &mut p.net.nodes[1];
    let mut buf = vec![0u8; 8192];
    while let Some(t) = n.endpoint.poll_transmit(now, &mut buf, &n.mem).unwrap() {
        out.push(buf[..t.len].to_vec());
    }
    out
}

#[test]
fn a_get_for_qp1_of_an_endpoint_without_one_is_answered_unsupported() {
    let mut p = pair(71, lossless(), Opts::default());
    let get = get_mad(0x01);
    mad_to_qp1(&mut p, &get);
    assert!(p.net.nodes[1].endpoint.has_transmit());
    let sent = sent_by_1(&mut p);
    assert_eq!(sent.len(), 1);
    let pkt = PacketRepr::parse(&sent[0]).unwrap();
    assert_eq!(pkt.bth.opcode, Opcode::UD_SEND_ONLY);
    assert_eq!(pkt.bth.dest_qp, 0x12_3456);
    assert_eq!(
        pkt.ext.deth,
        Some(DethRepr {
            qkey: ferroce_wire::GSI_QKEY,
            src_qp: 1
        })
    );
    let mut want = get;
    want[3] = 0x81; // GetResp
    want[4..6].copy_from_slice(&0x000Cu16.to_be_bytes());
    assert_eq!(pkt.payload, &want[..]);
    let (a, b) = (p.net.nodes[0].addr, p.net.nodes[1].addr);
    let (std::net::IpAddr::V4(a), std::net::IpAddr::V4(b)) = (a, b) else {
        panic!("IPv4 nodes")
    };
    assert!(IcrcContext::v4(b, a, 0, 4791, 4791).verify(&sent[0]));
    assert_eq!(p.counters(1).no_qp, 0);

    // A Send (a CM message with no CM to take it) is dropped, as for no QP.
    mad_to_qp1(&mut p, &get_mad(0x03));
    assert!(sent_by_1(&mut p).is_empty());
    assert_eq!(p.counters(1).no_qp, 1);

    // A flood: 16 answers wait at most.
    for _ in 0..40 {
        mad_to_qp1(&mut p, &get);
    }
    assert_eq!(sent_by_1(&mut p).len(), 16);
    assert_eq!(p.counters(1).no_qp, 1 + 24);
}

/// The role holder of an address may run no connection manager (a verbs-only program); the
/// DREQs of connections whose processes died reach it. Unanswered, the peer would resend its
/// DREQ for a minute before its DISCONNECTED event (rping's and ucmatose's servers wait for it);
/// the kernel's CM answers at once with the DREP, and so does this QP1.
#[test]
fn a_dreq_for_qp1_of_an_endpoint_without_one_gets_its_drep() {
    use ferroce_wire::cm::{Message, drep, dreq};
    let mut p = pair(72, lossless(), Opts::default());
    let tid = 0x0000_0002_1234_5678;
    let mut mad = [0u8; 256];
    Message::Dreq(
        dreq::Repr {
            local_comm_id: 0x0300_0011,
            remote_comm_id: 0x0700_0022,
            remote_qpn: 0x07_0001,
        },
        &[],
    )
    .emit(tid, &mut mad)
    .unwrap();
    mad_to_qp1(&mut p, &mad);
    let sent = sent_by_1(&mut p);
    assert_eq!(sent.len(), 1);
    let pkt = PacketRepr::parse(&sent[0]).unwrap();
    assert_eq!(pkt.bth.opcode, Opcode::UD_SEND_ONLY);
    assert_eq!(pkt.bth.dest_qp, 0x12_3456);
    let (hdr, msg) = Message::parse(pkt.payload).unwrap();
    assert_eq!(hdr.transaction_id, tid);
    let Message::Drep(r, _) = msg else {
        panic!("not a DREP: {msg:?}")
    };
    assert_eq!(
        r,
        drep::Repr {
            local_comm_id: 0x0700_0022,
            remote_comm_id: 0x0300_0011,
        }
    );
    assert_eq!(p.counters(1).no_qp, 0);

    // A DREP (nothing to answer) is dropped as for no QP.
    let mut drep_mad = [0u8; 256];
    drep_mad.copy_from_slice(pkt.payload);
    mad_to_qp1(&mut p, &drep_mad);
    assert!(sent_by_1(&mut p).is_empty());
    assert_eq!(p.counters(1).no_qp, 1);
}
