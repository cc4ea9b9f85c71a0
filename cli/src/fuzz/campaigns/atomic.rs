//! The `atomic` campaign, Atomics: FETCH_ADD and COMPARE_SWAP (the original value comes back),
//! misaligned (invalid request), past the region (remote access).

use ferroce_wire::{NakCode, Opcode};

use super::packets::{Draft, PacketCampaign, step};
use crate::fuzz::case::{CampaignId as Id, Expect, PacketSpec, REGION_LEN};

/// The `atomic` campaign.
pub const CAMPAIGN: PacketCampaign = PacketCampaign {
    id: Id::Atomic,
    make,
};

/// One case's packets, from the draft's draws.
fn make(d: &mut Draft) {
    {
        let word = (d.rng.below(REGION_LEN / 8) * 8) as i64;
        match d.rng.below(4) {
            0 | 1 => {
                let (opcode, name) = if d.rng.below(2) == 0 {
                    (Opcode::RC_FETCH_ADD, "fetch-add")
                } else {
                    (Opcode::RC_COMPARE_SWAP, "compare-swap")
                };
                d.what = format!("atomic-{name}-{word}");
                d.rule = "an aligned atomic in bounds returns the original value";
                d.steps.push(step(
                    PacketSpec {
                        atomic: Some((word, d.rng.next_u64(), d.rng.next_u64())),
                        ..PacketSpec::new(opcode, 0)
                    },
                    Expect::AtomicOrig {
                        psn_off: 0,
                        off: word as u64,
                    },
                ));
            }
            2 => {
                let mis = word + 1 + d.rng.below(7) as i64;
                d.what = format!("atomic-misaligned-{mis}");
                d.rule = "an atomic whose address is not 8-byte aligned is NAKed (invalid request)";
                d.steps.push(step(
                    PacketSpec {
                        atomic: Some((mis.min(REGION_LEN as i64 - 8), 1, 0)),
                        ..PacketSpec::new(Opcode::RC_FETCH_ADD, 0)
                    },
                    Expect::Nak(NakCode::InvalidRequest, 0),
                ));
            }
            _ => {
                d.what = "atomic-past-the-end".into();
                d.rule = "an atomic past the region is NAKed (remote access error)";
                d.steps.push(step(
                    PacketSpec {
                        atomic: Some((REGION_LEN as i64, 1, 0)),
                        ..PacketSpec::new(Opcode::RC_FETCH_ADD, 0)
                    },
                    Expect::Nak(NakCode::RemoteAccessError, 0),
                ));
            }
        }
    }
}
