//! The `rkey` campaign, R_Keys and region edges: a wrong key, a WRITE that ends on the last byte or
//! one past it, below the start (remote access NAK; the QP goes to ERR).

use ferroce_wire::NakCode;

use super::packets::{Draft, PacketCampaign, step};
use crate::fuzz::case::{CampaignId as Id, Expect, PacketSpec, REGION_LEN};

/// The `rkey` campaign.
pub const CAMPAIGN: PacketCampaign = PacketCampaign { id: Id::Rkey, make };

/// One case's packets, from the draft's draws.
fn make(d: &mut Draft) {
    let (off, len) = (d.off, d.len);
    match d.rng.below(4) {
        0 => {
            let x = 1 + d.rng.below(0xFFFF_FFFE) as u32;
            d.what = format!("rkey-wrong-{x:08x}");
            d.rule = "a WRITE with an R_Key that is not the region's is NAKed (remote access error) and the QP goes to ERR";
            d.steps.push(step(
                PacketSpec {
                    rkey_xor: x,
                    ..PacketSpec::write_only(0, off, len)
                },
                Expect::Nak(NakCode::RemoteAccessError, 0),
            ));
            d.steps
                .push(step(PacketSpec::write_only(1, off, len), Expect::Silence));
        }
        1 => {
            let end = REGION_LEN as i64 - i64::from(len);
            d.what = format!("rkey-edge-last-byte-{len}");
            d.rule = "a WRITE that ends on the region's last byte is in bounds";
            d.steps
                .push(step(PacketSpec::write_only(0, end, len), Expect::Ack(0)));
        }
        2 => {
            let end = REGION_LEN as i64 - i64::from(len) + 1;
            d.what = format!("rkey-edge-one-past-{len}");
            d.rule = "a WRITE one byte past the region is NAKed (remote access error)";
            d.steps.push(step(
                PacketSpec::write_only(0, end, len),
                Expect::Nak(NakCode::RemoteAccessError, 0),
            ));
        }
        _ => {
            let below = 1 + d.rng.below(4096) as i64;
            d.what = format!("rkey-below-start-{below}");
            d.rule = "a WRITE that starts before the region is NAKed (remote access error)";
            d.steps.push(step(
                PacketSpec::write_only(0, -below, len),
                Expect::Nak(NakCode::RemoteAccessError, 0),
            ));
        }
    }
}
