//! The `read` campaign, READs: the data as the region holds it, past the end, a duplicate READ
//! executed again.

use ferroce_wire::NakCode;

use super::packets::{Draft, PacketCampaign, step};
use crate::fuzz::case::{CampaignId as Id, Counter, Expect, MTU, PacketSpec, REGION_LEN};

/// The `read` campaign.
pub const CAMPAIGN: PacketCampaign = PacketCampaign { id: Id::Read, make };

/// One case's packets, from the draft's draws.
fn make(d: &mut Draft) {
    {
        let rlen = 1 + d.rng.below(4 * u64::from(MTU)) as u32;
        let roff = d.rng.below(REGION_LEN - u64::from(rlen)) as i64;
        let data = Expect::ReadData {
            psn_off: 0,
            off: roff as u64,
            len: rlen,
        };
        match d.rng.below(3) {
            0 => {
                d.what = format!("read-{rlen}-at-{roff}");
                d.rule = "a READ in bounds returns the region's bytes in ceil(len/MTU) responses";
                d.steps.push(step(PacketSpec::read(0, roff, rlen), data));
            }
            1 => {
                let past = REGION_LEN as i64 - i64::from(rlen) + 1;
                d.what = format!("read-one-past-{rlen}");
                d.rule = "a READ past the region is NAKed (remote access error)";
                d.steps.push(step(
                    PacketSpec::read(0, past, rlen),
                    Expect::Nak(NakCode::RemoteAccessError, 0),
                ));
            }
            _ => {
                d.what = format!("read-duplicate-{rlen}");
                d.counter = Some(Counter::DuplicateRequest);
                d.rule = "a duplicate READ is executed again from the region";
                d.steps.push(step(PacketSpec::read(0, roff, rlen), data));
                d.steps.push(step(PacketSpec::read(0, roff, rlen), data));
            }
        }
    }
}
