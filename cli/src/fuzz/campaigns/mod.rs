//! The campaigns: each a module holding its generator (a case from the seed and an index),
//! its runner (the case against the [`Harness`]) and its rules (the verdict). The packet
//! campaigns share their draws and their runner ([`packets`]); `cm`, `requester` and the
//! `--pingpong` mode run their own.

pub mod atomic;
pub mod cm;
pub mod havoc;
pub mod header;
pub mod opcode;
pub mod packets;
pub mod pingpong;
pub mod psn;
pub mod read;
pub mod requester;
pub mod rkey;

use std::io;

use super::case::{CampaignId as Id, Case};
use super::harness::{Harness, Verdict};

/// A campaign of cases: generated from a seed and an index alone (so a campaign is the same
/// cases for the same seed, and a case can be replayed by its name), run against a harness and
/// judged by the campaign's rules.
pub trait Campaign: Sync {
    /// Which campaign it is.
    fn id(&self) -> Id;

    /// The case `index` for `seed`.
    fn generate(&self, seed: u64, index: u32) -> Case;

    /// Runs `case` (one this campaign generated) and judges it; the packet campaigns send
    /// their steps and then probe the target's liveness.
    ///
    /// # Errors
    /// Reaching the agent or the target's socket (the caller's crash).
    fn run(&self, case: &Case, h: &mut Harness) -> io::Result<Verdict> {
        packets::run(case, h)
    }
}

/// The campaign of `id`.
pub fn get(id: Id) -> &'static dyn Campaign {
    match id {
        Id::Psn => &psn::CAMPAIGN,
        Id::Rkey => &rkey::CAMPAIGN,
        Id::Opcode => &opcode::CAMPAIGN,
        Id::Header => &header::CAMPAIGN,
        Id::Atomic => &atomic::CAMPAIGN,
        Id::Read => &read::CAMPAIGN,
        Id::Havoc => &havoc::CAMPAIGN,
        Id::Cm => &cm::Cm,
        Id::Requester => &requester::Requester,
    }
}

/// The case `index` of campaign `id` for `seed`.
pub fn generate(id: Id, seed: u64, index: u32) -> Case {
    get(id).generate(seed, index)
}

/// The generator every campaign's case starts from, and the case's first PSN (anywhere, and
/// near the 2^24 wrap one time in four), drawn from it first.
fn start(id: Id, seed: u64, index: u32) -> (ferroce_transport::rng::Rng, u32) {
    let mut rng =
        ferroce_transport::rng::Rng::new(seed ^ (id as u64) << 56 ^ u64::from(index) << 20);
    let start_psn = if rng.below(4) == 0 {
        0xFF_FFFF - rng.below(4) as u32
    } else {
        rng.below(1 << 24) as u32
    };
    (rng, start_psn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzz::case::Body;

    #[test]
    fn each_campaign_is_its_own_and_generates_its_own_cases() {
        for id in Id::ALL {
            assert_eq!(get(id).id(), id);
            let case = generate(id, 3, 5);
            assert_eq!((case.campaign, case.seed, case.index), (id, 3, 5));
        }
    }

    #[test]
    fn cases_are_a_function_of_seed_campaign_and_index() {
        for c in Id::ALL {
            for i in 0..50 {
                assert_eq!(generate(c, 7, i), generate(c, 7, i));
            }
            let a: Vec<_> = (0..20).map(|i| generate(c, 7, i).what).collect();
            let b: Vec<_> = (0..20).map(|i| generate(c, 8, i).what).collect();
            assert_ne!(a, b, "{c:?}: another seed, other cases");
        }
    }

    #[test]
    fn every_kind_of_case_comes_up_and_stays_inside_the_rules() {
        for c in Id::ALL {
            let mut kinds = std::collections::BTreeSet::new();
            for i in 0..400 {
                let case = generate(c, 1, i);
                assert!(!case.rule.is_empty());
                let packets = matches!(case.body, Body::Packets(_));
                assert_eq!(packets, !matches!(c, Id::Cm | Id::Requester));
                assert!(!packets || !case.steps().is_empty());
                assert!(case.start_psn < 1 << 24);
                assert!(case.what.starts_with(c.name()), "{}", case.what);
                kinds.insert(case.what.split('-').take(3).collect::<Vec<_>>().join("-"));
                for s in case.steps() {
                    if let Some((_, l)) = s.packet.reth {
                        assert!(l > 0);
                    }
                }
            }
            assert!(kinds.len() >= 3, "{c:?}: {kinds:?}");
        }
    }
}

/// The cases of seed 7 as text, one line each: the first 60 of every campaign and 30 of the
/// `--pingpong` mode, every field. `cli/tests/data/fuzz-cases-seed7.txt` holds them as
/// generated when the campaigns became modules: same seed, same cases, across refactors.
#[cfg(test)]
fn seed7_text() -> String {
    use crate::fuzz::case::{Body, Packets};
    let mut out = String::new();
    for c in Id::ALL {
        for i in 0..60 {
            let k = generate(c, 7, i);
            let (nr, ctr, steps) = match &k.body {
                Body::Packets(Packets {
                    needs_recv,
                    counter,
                    steps,
                }) => (*needs_recv, *counter, steps.clone()),
                _ => (false, None, Vec::new()),
            };
            let cm = match &k.body {
                Body::Cm(x) => Some(x.clone()),
                _ => None,
            };
            let req = match &k.body {
                Body::Requester { kind, len } => Some((*kind, *len)),
                _ => None,
            };
            out += &format!(
                "{} {} {} {} {nr:?}|{ctr:?}|{cm:?}|{req:?}|{steps:?}\n",
                k.id(),
                k.what,
                k.rule,
                k.start_psn
            );
        }
    }
    for i in 0..30 {
        let k = pingpong::generate(7, i, 64);
        out += &format!(
            "pp {} {} {} {:?} {:?}\n",
            k.what,
            k.rule,
            k.start_psn,
            k.campaign,
            k.steps()
        );
    }
    out
}

#[cfg(test)]
mod golden {
    #[test]
    fn seed_7_is_the_same_cases_as_ever() {
        let golden = include_str!("../../../tests/data/fuzz-cases-seed7.txt");
        let now = super::seed7_text();
        for (i, (a, b)) in golden.lines().zip(now.lines()).enumerate() {
            assert_eq!(a, b, "line {}: seed 7's case changed", i + 1);
        }
        assert_eq!(golden.lines().count(), now.lines().count());
    }
}
