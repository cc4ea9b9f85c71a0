//! The `opcode` campaign, Opcode sequences: MIDDLE without FIRST, a new message inside a multi-
//! packet one, a reserved opcode, a SEND with no receive posted (RNR NAK).

use ferroce_wire::{NakCode, Opcode};

use super::packets::{Draft, PacketCampaign, step};
use crate::fuzz::case::{CampaignId as Id, Expect, MTU, PacketSpec};

/// The `opcode` campaign.
pub const CAMPAIGN: PacketCampaign = PacketCampaign {
    id: Id::Opcode,
    make,
};

/// One case's packets, from the draft's draws.
fn make(d: &mut Draft) {
    let (off, len) = (d.off, d.len);
    match d.rng.below(4) {
        0 => {
            d.what = "opcode-middle-without-first".into();
            d.rule = "a MIDDLE with no message in progress is NAKed (invalid request)";
            d.steps.push(step(
                PacketSpec {
                    payload_len: MTU,
                    ..PacketSpec::new(Opcode::RC_RDMA_WRITE_MIDDLE, 0)
                },
                Expect::Nak(NakCode::InvalidRequest, 0),
            ));
        }
        1 => {
            d.what = "opcode-only-inside-first".into();
            d.rule =
                "a new message before the LAST of a multi-packet one is NAKed (invalid request)";
            d.steps.push(step(
                PacketSpec {
                    reth: Some((0, 3 * MTU)),
                    payload_len: MTU,
                    ..PacketSpec::new(Opcode::RC_RDMA_WRITE_FIRST, 0)
                },
                Expect::Silence,
            ));
            d.steps.push(step(
                PacketSpec::write_only(1, off, len),
                Expect::Nak(NakCode::InvalidRequest, 1),
            ));
        }
        2 => {
            let op = [0x18u8, 0x19, 0x1A, 0x1B, 0x1E, 0x1F][d.rng.below(6) as usize];
            d.what = format!("opcode-reserved-{op:#04x}");
            d.rule = "a reserved RC opcode is not executed (rxe drops it; a NAK invalid request is allowed)";
            d.steps.push(step(
                PacketSpec {
                    payload_len: 0,
                    ..PacketSpec::new(Opcode(op), 0)
                },
                Expect::SilenceOrNak(NakCode::InvalidRequest, 0),
            ));
            d.steps
                .push(step(PacketSpec::write_only(0, off, len), Expect::Ack(0)));
        }
        _ => {
            d.what = format!("opcode-send-no-receive-{len}");
            d.rule = "a SEND with no receive posted is answered with an RNR NAK";
            d.steps.push(step(
                PacketSpec {
                    payload_len: len,
                    ..PacketSpec::new(Opcode::RC_SEND_ONLY, 0)
                },
                Expect::Rnr(0),
            ));
        }
    }
}
