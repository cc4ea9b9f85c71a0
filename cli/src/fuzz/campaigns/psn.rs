//! The `psn` campaign, PSNs: in order, ahead (sequence NAK, once), duplicates (re-ACK), across the
//! 2^24 wrap, a packet for a QP destroyed since.

use ferroce_wire::NakCode;

use super::packets::{Draft, PacketCampaign, step};
use crate::fuzz::case::{CampaignId as Id, Counter, Expect, PacketSpec};

/// The `psn` campaign.
pub const CAMPAIGN: PacketCampaign = PacketCampaign { id: Id::Psn, make };

/// One case's packets, from the draft's draws.
fn make(d: &mut Draft) {
    let (off, len) = (d.off, d.len);
    match d.rng.below(7) {
        0 => {
            let n = 1 + d.rng.below(4) as u32;
            d.what = format!("psn-in-order-{n}");
            d.rule = "in-order requests are executed and acknowledged";
            for i in 0..n {
                d.steps
                    .push(step(PacketSpec::write_only(i, off, len), Expect::Ack(i)));
            }
        }
        1 => {
            let k = 1 + d.rng.below(1000) as u32;
            d.what = format!("psn-ahead-{k}");
            d.counter = Some(Counter::OutOfSeqRequest);
            d.rule =
                "a request past the expected PSN is NAKed (sequence error) with the expected PSN";
            d.steps.push(step(
                PacketSpec::write_only(k, off, len),
                Expect::Nak(NakCode::PsnSeqError, 0),
            ));
        }
        2 => {
            let k = 1 + d.rng.below(100) as u32;
            d.what = format!("psn-ahead-twice-{k}");
            d.counter = Some(Counter::OutOfSeqRequest);
            d.rule = "one sequence NAK until the expected PSN arrives, then on as usual";
            d.steps.push(step(
                PacketSpec::write_only(k, off, len),
                Expect::Nak(NakCode::PsnSeqError, 0),
            ));
            d.steps.push(step(
                PacketSpec::write_only(k + 1, off, len),
                Expect::Silence,
            ));
            d.steps
                .push(step(PacketSpec::write_only(0, off, len), Expect::Ack(0)));
        }
        3 => {
            d.what = "psn-duplicate".into();
            d.counter = Some(Counter::DuplicateRequest);
            d.rule = "a duplicate WRITE is not executed again but acknowledged again";
            d.steps
                .push(step(PacketSpec::write_only(0, off, len), Expect::Ack(0)));
            d.steps
                .push(step(PacketSpec::write_only(1, off, len), Expect::Ack(1)));
            d.steps
                .push(step(PacketSpec::write_only(0, off, len), Expect::Ack(1)));
        }
        5 => {
            d.what = "psn-reordered".into();
            d.rule = "a request overtaken by the next one: the later is NAKed (sequence error, once) and dropped, the earlier taken, the later taken when it comes again";
            d.steps.push(step(
                PacketSpec::write_only(1, off, len),
                Expect::Nak(NakCode::PsnSeqError, 0),
            ));
            d.steps
                .push(step(PacketSpec::write_only(0, off, len), Expect::Ack(0)));
            d.steps
                .push(step(PacketSpec::write_only(1, off, len), Expect::Ack(1)));
        }
        6 => {
            d.what = "psn-replayed-from-another-connection".into();
            d.rule = "a packet for a QP destroyed since (replayed from an earlier connection) is dropped silently";
            d.steps.push(step(
                PacketSpec {
                    to_previous_qp: true,
                    ..PacketSpec::write_only(0, off, len)
                },
                Expect::Silence,
            ));
            d.steps
                .push(step(PacketSpec::write_only(0, off, len), Expect::Ack(0)));
        }
        _ => {
            d.start_psn = 0xFF_FFFF - d.rng.below(2) as u32;
            d.what = "psn-wrap".into();
            d.rule = "PSNs are modulo 2^24; the wrap is one step like any other";
            for i in 0..4 {
                d.steps
                    .push(step(PacketSpec::write_only(i, off, len), Expect::Ack(i)));
            }
        }
    }
}
