//! The `cm` campaign: CM MADs at the target's connection manager (QP1), through ferroce's own
//! sans-IO CM engine. A listener on the target rejects every request (the lab's `cm_reject
//! serve`, or `ferroce fuzz-agent`'s `CMLISTEN`), so a valid REQ must be answered with REJ 28
//! (or a REP, from a listener that accepts: then we reject it). Each case builds a REQ as
//! rdma_cm would (the rdma_cm header in its private data), then sends it as is, to a port
//! nobody listens on, cut short, with a MAD base version the CM cannot know, twice, or with
//! random bytes overwritten; the REQ of a later probe must still be answered.

use std::io;
use std::time::Duration;

use ferroce_transport::rng::Rng;

use super::Campaign;
use crate::fuzz::case::{Body, CampaignId as Id, Case, CmKind};
use crate::fuzz::harness::cm_side::{self, CmAnswer, CmSide};
use crate::fuzz::harness::{Harness, Verdict};

/// The `cm` campaign.
pub struct Cm;

impl Campaign for Cm {
    fn id(&self) -> Id {
        Id::Cm
    }

    fn generate(&self, seed: u64, index: u32) -> Case {
        let (_, start_psn) = super::start(Id::Cm, seed, index);
        let (kind, what, rule) = kind_of(seed, index);
        Case {
            campaign: Id::Cm,
            seed,
            index,
            what,
            rule,
            start_psn,
            body: Body::Cm(kind),
        }
    }

    fn run(&self, case: &Case, h: &mut Harness) -> io::Result<Verdict> {
        match &case.body {
            Body::Cm(kind) => run_cm(h, case, kind),
            _ => Err(io::Error::other(format!("{} is not a cm case", case.id()))),
        }
    }
}

/// The kind of case `index` for `seed`, its name and rule.
pub fn kind_of(seed: u64, index: u32) -> (CmKind, String, &'static str) {
    let mut rng = Rng::new(seed ^ 0xC0_0000_0000 ^ u64::from(index) << 24);
    match rng.below(7) {
        0 => (
            CmKind::Valid,
            "cm-req".into(),
            "a REQ for a listened port is answered (REP, or REJ with the application's reason 28)",
        ),
        1 => {
            let d = 1 + rng.below(1000) as u16;
            (
                CmKind::ClosedPort(d),
                format!("cm-req-closed-port-plus-{d}"),
                "a REQ for a port nobody listens on is rejected at once with reason 8 (invalid service ID)",
            )
        }
        2 => {
            let n = rng.below(256) as u16;
            (
                CmKind::Truncated(n),
                format!("cm-req-truncated-{n}"),
                "a MAD shorter than 256 bytes is dropped silently",
            )
        }
        3 => {
            let v = [0u8, 2, 3, 0x7F, 0xFF][rng.below(5) as usize];
            (
                CmKind::BaseVersion(v),
                format!("cm-mad-base-version-{v}"),
                "a MAD of an unknown base version is dropped silently",
            )
        }
        4 => (
            CmKind::Duplicate,
            "cm-req-duplicate".into(),
            "a duplicate REQ does not make a second connection",
        ),
        _ => {
            let n = 1 + rng.below(6);
            // The CM message (after the 24-byte MAD header) mostly, the header now and then.
            let pokes: Vec<(u16, u8)> = (0..n)
                .map(|_| {
                    let at = if rng.below(6) == 0 {
                        rng.below(24)
                    } else {
                        24 + rng.below(232)
                    };
                    (at as u16, rng.below(256) as u8)
                })
                .collect();
            let what: Vec<String> = pokes.iter().map(|(a, v)| format!("{a}={v:02x}")).collect();
            (
                CmKind::Havoc(pokes),
                format!("cm-req-havoc-[{}]", what.join(",")),
                "any REQ, however damaged, gets a well-formed answer or none, and the CM keeps serving",
            )
        }
    }
}

/// Runs a `cm` case, then its liveness probe (a valid REQ is still answered).
fn run_cm(h: &mut Harness, case: &Case, kind: &CmKind) -> io::Result<Verdict> {
    if !h.cm_ready {
        // The agent's own listener if it has one (fuzz-agent); otherwise one already runs
        // on the target (the lab's `cm_reject serve`).
        let _ = h.agent.cmd(&format!("CMLISTEN {}", h.cm_port));
        h.cm_ready = true;
    }
    let mut rng = Rng::new(case.seed ^ u64::from(case.index).rotate_left(28));
    let qpn = 0x100 + rng.below(0xFF_FE00) as u32;
    let mut side = CmSide::new(case.seed ^ u64::from(case.index) << 8, h.local, h.target);
    let port = match kind {
        CmKind::ClosedPort(d) => h.cm_port.wrapping_add(*d),
        _ => h.cm_port,
    };
    let Some(mad) = side.request(port, qpn) else {
        return Err(io::Error::other("the CM engine built no REQ"));
    };
    let mut bytes = mad.to_vec();
    match kind {
        CmKind::Truncated(n) => bytes.truncate(usize::from(*n)),
        CmKind::BaseVersion(v) => bytes[0] = *v,
        CmKind::Havoc(pokes) => {
            for &(at, v) in pokes {
                if let Some(b) = bytes.get_mut(usize::from(at)) {
                    *b = v;
                }
            }
        }
        _ => {}
    }
    let wire = cm_side::wrap(&bytes, h.local, h.target);
    h.send(&wire)?;
    if *kind == CmKind::Duplicate {
        h.send(&wire)?;
    }
    let silent = matches!(kind, CmKind::Truncated(_) | CmKind::BaseVersion(_));
    let window = if silent {
        h.window
    } else {
        h.window.max(Duration::from_secs(3))
    };
    let answer = h.collect_cm(&mut side, window, !silent)?;
    let ok = matches!(
        (kind, &answer),
        (
            CmKind::Valid | CmKind::Duplicate,
            Some(CmAnswer::Rejected(28) | CmAnswer::Reply)
        ) | (CmKind::ClosedPort(_), Some(CmAnswer::Rejected(8)))
            | (CmKind::Truncated(_) | CmKind::BaseVersion(_), None)
            | (CmKind::Havoc(_), _)
    );
    if !ok {
        return Ok(Verdict::Deviates {
            step: 0,
            why: format!("the target's CM answered {answer:?}"),
        });
    }
    // Liveness: a valid REQ to the listener is still answered.
    let mut probe = CmSide::new(
        case.seed ^ 0x5EED ^ u64::from(case.index),
        h.local,
        h.target,
    );
    let Some(mad) = probe.request(h.cm_port, qpn ^ 0x40_0000) else {
        return Err(io::Error::other("the CM engine built no REQ"));
    };
    h.send(&cm_side::wrap(&mad, h.local, h.target))?;
    match h.collect_cm(&mut probe, h.window.max(Duration::from_secs(3)), true)? {
        Some(CmAnswer::Rejected(28) | CmAnswer::Reply) => Ok(Verdict::Conforms),
        other => Ok(Verdict::Hang(format!(
            "after {}, a valid REQ got {other:?}",
            case.what
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kinds_all_come_up_and_are_a_function_of_the_seed() {
        let kinds: std::collections::BTreeSet<String> = (0..200)
            .map(|i| {
                kind_of(1, i)
                    .1
                    .split('-')
                    .take(3)
                    .collect::<Vec<_>>()
                    .join("-")
            })
            .collect();
        assert!(kinds.len() >= 6, "{kinds:?}");
        assert_eq!(kind_of(5, 9), kind_of(5, 9));
    }
}
