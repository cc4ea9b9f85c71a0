//! The `header` campaign, Header fields: P_Key, TVer, DestQP, ICRC (silent drops), a payload that
//! disagrees with the RETH length, the pad count or the MTU (invalid request NAK).

use ferroce_wire::{NakCode, Opcode};

use super::packets::dropped_then_taken;
use super::packets::{Draft, PacketCampaign, step};
use crate::fuzz::case::{CampaignId as Id, Expect, MTU, PacketSpec};

/// The `header` campaign.
pub const CAMPAIGN: PacketCampaign = PacketCampaign {
    id: Id::Header,
    make,
};

/// One case's packets, from the draft's draws.
fn make(d: &mut Draft) {
    let (off, len) = (d.off, d.len);
    {
        match d.rng.below(7) {
            0 => {
                let pkey = (d.rng.below(0x7FFF) as u16) & 0x7FFE;
                d.what = format!("header-pkey-{pkey:04x}");
                d.rule = "a P_Key of another partition is dropped silently";
                dropped_then_taken(
                    d,
                    PacketSpec {
                        pkey: Some(pkey),
                        ..PacketSpec::write_only(0, off, len)
                    },
                );
            }
            1 => {
                let tver = 1 + d.rng.below(15) as u8;
                d.what = format!("header-tver-{tver}");
                d.rule = "a transport header version other than 0 is dropped silently";
                dropped_then_taken(
                    d,
                    PacketSpec {
                        tver,
                        ..PacketSpec::write_only(0, off, len)
                    },
                );
            }
            2 => {
                d.what = "header-bad-icrc".into();
                d.rule = "a packet whose ICRC is wrong is dropped silently";
                dropped_then_taken(
                    d,
                    PacketSpec {
                        bad_icrc: true,
                        ..PacketSpec::write_only(0, off, len)
                    },
                );
            }
            3 => {
                let x = 1 + d.rng.below(0xFF) as u32;
                d.what = format!("header-wrong-qpn-{x:02x}");
                d.rule = "a packet for a QP that does not exist is dropped silently";
                d.steps.push(step(
                    PacketSpec {
                        qpn_xor: x << 8,
                        ..PacketSpec::write_only(0, off, len)
                    },
                    Expect::Silence,
                ));
            }
            4 => {
                let claimed = len + 1 + d.rng.below(64) as u32;
                d.what = format!("header-reth-length-{claimed}-payload-{len}");
                d.rule =
                    "a WRITE ONLY whose payload is not the RETH length is NAKed (invalid request)";
                d.steps.push(step(
                    PacketSpec {
                        reth: Some((off, claimed)),
                        ..PacketSpec::write_only(0, off, len)
                    },
                    Expect::Nak(NakCode::InvalidRequest, 0),
                ));
            }
            6 => {
                // A length that needs padding, and another pad count than it needs: the
                // payload the receiver computes is not the RETH's length.
                let len = (len | 3).max(5) - 2;
                let right = (4 - len % 4) % 4;
                let pad = (right + 1 + d.rng.below(3) as u32) % 4;
                d.what = format!("header-pad-count-{pad}-for-{len}");
                d.rule = "a WRITE ONLY whose pad count makes its payload differ from the RETH length is NAKed (invalid request)";
                d.steps.push(step(
                    PacketSpec {
                        pad: Some(pad as u8),
                        ..PacketSpec::write_only(0, off, len)
                    },
                    Expect::Nak(NakCode::InvalidRequest, 0),
                ));
            }
            _ => {
                let short = MTU - 1 - d.rng.below(u64::from(MTU) - 1) as u32;
                d.what = format!("header-first-short-{short}");
                d.rule =
                    "a FIRST packet whose payload is not the path MTU is NAKed (invalid request)";
                d.steps.push(step(
                    PacketSpec {
                        reth: Some((0, 4 * MTU)),
                        payload_len: short,
                        ..PacketSpec::new(Opcode::RC_RDMA_WRITE_FIRST, 0)
                    },
                    Expect::Nak(NakCode::InvalidRequest, 0),
                ));
            }
        }
    }
}
