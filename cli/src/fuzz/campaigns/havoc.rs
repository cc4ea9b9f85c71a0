//! The `havoc` campaign: a valid request with random bytes of its headers overwritten, its
//! length cut or grown, its ICRC right or wrong, sent in a state reached first (idle, inside a
//! multi-packet WRITE, with READ responses in flight, after a sequence NAK, after an atomic).
//! Any answer must be well formed; the liveness probe after it must pass.

use ferroce_wire::{NakCode, Opcode};

use super::packets::{Draft, PacketCampaign, step};
use crate::fuzz::case::{CampaignId as Id, Expect, MTU, PacketSpec};

/// The `havoc` campaign.
pub const CAMPAIGN: PacketCampaign = PacketCampaign {
    id: Id::Havoc,
    make,
};

/// A havoc case: a state, then a valid request of a random kind with random damage.
fn make(d: &mut Draft) {
    let (off, len) = (d.off, d.len);
    let (state, mut psn): (&str, u32) = match d.rng.below(5) {
        0 => ("idle", 0),
        1 => {
            // Inside a 4-packet WRITE: FIRST sent, the rest to come.
            d.steps.push(step(
                PacketSpec {
                    reth: Some((0, 4 * MTU)),
                    payload_len: MTU,
                    ..PacketSpec::new(Opcode::RC_RDMA_WRITE_FIRST, 0)
                },
                Expect::Silence,
            ));
            ("mid-write", 1)
        }
        2 => {
            // A 4-packet READ whose responses are still coming when the damage arrives.
            d.steps
                .push(step(PacketSpec::read(0, 0, 4 * MTU), Expect::Anything));
            ("mid-read", 1)
        }
        3 => {
            d.steps.push(step(
                PacketSpec::write_only(5, off, len),
                Expect::Nak(NakCode::PsnSeqError, 0),
            ));
            ("after-nak", 0)
        }
        _ => {
            d.steps.push(step(
                PacketSpec {
                    atomic: Some((8, 1, 0)),
                    ..PacketSpec::new(Opcode::RC_FETCH_ADD, 0)
                },
                Expect::Anything,
            ));
            ("after-atomic", 1)
        }
    };
    // The damaged packet's base: a valid request at the next PSN, sometimes one off.
    if d.rng.below(4) == 0 {
        psn = psn.wrapping_add(d.rng.below(3) as u32).wrapping_sub(1) & 0xFF_FFFF;
    }
    let mut p = match d.rng.below(6) {
        0 => PacketSpec::write_only(psn, off, len),
        1 => PacketSpec::read(psn, off, len),
        2 => PacketSpec {
            payload_len: len,
            ..PacketSpec::new(Opcode::RC_SEND_ONLY, psn)
        },
        3 => PacketSpec {
            atomic: Some((off & !7, d.rng.next_u64(), d.rng.next_u64())),
            ..PacketSpec::new(Opcode::RC_COMPARE_SWAP, psn)
        },
        4 => PacketSpec {
            payload_len: MTU,
            ..PacketSpec::new(Opcode::RC_RDMA_WRITE_MIDDLE, psn)
        },
        _ => PacketSpec {
            payload_len: len.min(MTU),
            ..PacketSpec::new(Opcode::RC_RDMA_WRITE_LAST, psn)
        },
    };
    // 1-4 header bytes (BTH 0..12, then up to 28 of extended headers) overwritten.
    let n = 1 + d.rng.below(4);
    for _ in 0..n {
        let at = d.rng.below(40) as u16;
        // Keep DestQP (bytes 5..8) ours mostly: damage to it is the header campaign's.
        if (5..8).contains(&at) && d.rng.below(4) != 0 {
            continue;
        }
        p.pokes.push((at, d.rng.below(256) as u8));
    }
    if d.rng.below(5) == 0 {
        p.resize = Some(d.rng.below(u64::from(MTU) + 64) as u16);
    }
    p.bad_icrc = d.rng.below(8) == 0;
    let what: Vec<String> = p
        .pokes
        .iter()
        .map(|(a, v)| format!("{a}={v:02x}"))
        .collect();
    d.what = format!(
        "havoc-{state}-{}-[{}]{}{}",
        p.opcode.name().to_ascii_lowercase(),
        what.join(","),
        p.resize.map(|r| format!("-len{r}")).unwrap_or_default(),
        if p.bad_icrc { "-badicrc" } else { "" }
    );
    d.rule = "any packet, however damaged, gets a well-formed answer or none, and the target keeps serving new connections";
    d.steps.push(step(p, Expect::Anything));
}
