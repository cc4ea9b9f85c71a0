//! The `requester` campaign: the target's QP as the requester. Its agent posts an RDMA WRITE
//! to the QP we pretend to be, and we answer it as a responder would, or would not: an ACK, a
//! remote access or invalid request NAK, RNR NAKs until its `rnr_retry` is used up, silence
//! until its `retry_cnt` is, an ACK for a PSN it never sent (a ghost), a sequence NAK that must
//! bring the message again. The oracle is the completion the target reports (`WC`) and how
//! often it sent.

use std::io;
use std::time::{Duration, Instant};

use ferroce_transport::rng::Rng;

use super::Campaign;
use crate::fuzz::case::{Body, CampaignId as Id, Case, MTU, ReqKind};
use crate::fuzz::harness::{Harness, Verdict};
use crate::fuzz::packet::{Conn, PORT};

/// The `requester` campaign.
pub struct Requester;

impl Campaign for Requester {
    fn id(&self) -> Id {
        Id::Requester
    }

    fn generate(&self, seed: u64, index: u32) -> Case {
        let (_, start_psn) = super::start(Id::Requester, seed, index);
        let (kind, len, what, rule) = kind_of(seed, index);
        Case {
            campaign: Id::Requester,
            seed,
            index,
            what,
            rule,
            start_psn,
            body: Body::Requester { kind, len },
        }
    }

    fn run(&self, case: &Case, h: &mut Harness) -> io::Result<Verdict> {
        let Body::Requester { kind, len } = case.body else {
            return Err(io::Error::other(format!(
                "{} is not a requester case",
                case.id()
            )));
        };
        let v = run_requester(h, case, kind, len)?;
        h.probed(case, v)
    }
}

/// The `ibv_wc_status` the target must report for `kind` (`None`: any, as long as one comes).
pub const fn expected_status(kind: ReqKind) -> Option<i32> {
    match kind {
        ReqKind::Ack | ReqKind::GhostAck(_) | ReqKind::SeqNak => Some(0),
        ReqKind::NakInvalid => Some(9),
        ReqKind::NakAccess => Some(10),
        ReqKind::Silence(_) => Some(12),
        ReqKind::RnrExhaust(_) => Some(13),
        ReqKind::AckMsn(_) => None,
    }
}

/// How often the message's first packet must be sent for `kind`, where the case fixes it.
pub const fn expected_tries(kind: ReqKind) -> Option<u32> {
    match kind {
        ReqKind::RnrExhaust(n) | ReqKind::Silence(n) => Some(n as u32 + 1),
        ReqKind::SeqNak => Some(2),
        ReqKind::Ack | ReqKind::NakAccess | ReqKind::NakInvalid | ReqKind::GhostAck(_) => Some(1),
        ReqKind::AckMsn(_) => None,
    }
}

/// How we answer in case `index` for `seed`, the WRITE's length, the name and the rule.
pub fn kind_of(seed: u64, index: u32) -> (ReqKind, u32, String, &'static str) {
    let mut rng = Rng::new(seed ^ 0x4E_0000_0000 ^ u64::from(index) << 24);
    let len = 1 + rng.below(3 * 1024) as u32;
    let (kind, rule) = match rng.below(8) {
        0 => (
            ReqKind::Ack,
            "an ACK of the message's last PSN completes it successfully",
        ),
        1 => (
            ReqKind::NakAccess,
            "a remote access error NAK completes the WR with IBV_WC_REM_ACCESS_ERR",
        ),
        2 => (
            ReqKind::NakInvalid,
            "an invalid request NAK completes the WR with IBV_WC_REM_INV_REQ_ERR",
        ),
        3 => (
            ReqKind::RnrExhaust(rng.below(4) as u8),
            "after rnr_retry RNR NAKs more the WR completes with IBV_WC_RNR_RETRY_EXC_ERR (rnr_retry + 1 tries)",
        ),
        4 => (
            ReqKind::Silence(1 + rng.below(3) as u8),
            "with no answer the WR completes with IBV_WC_RETRY_EXC_ERR after retry_cnt retries (retry_cnt + 1 tries)",
        ),
        5 => (
            ReqKind::GhostAck(1 + rng.below(1000) as u32),
            "an ACK for a PSN never sent is ignored; the real ACK completes the WR",
        ),
        6 => (
            ReqKind::SeqNak,
            "a sequence NAK naming the first PSN brings the whole message again",
        ),
        _ => (
            ReqKind::AckMsn(2 + rng.below(0xFF_FFFD) as u32),
            "an ACK with another MSN still ends in a completion, and the target keeps serving",
        ),
    };
    let what = match kind {
        ReqKind::Ack => format!("requester-ack-{len}"),
        ReqKind::NakAccess => format!("requester-nak-access-{len}"),
        ReqKind::NakInvalid => format!("requester-nak-invalid-{len}"),
        ReqKind::RnrExhaust(n) => format!("requester-rnr-retry-{n}-{len}"),
        ReqKind::Silence(n) => format!("requester-silence-retry-{n}-{len}"),
        ReqKind::GhostAck(d) => format!("requester-ghost-ack-plus-{d}-{len}"),
        ReqKind::SeqNak => format!("requester-seq-nak-{len}"),
        ReqKind::AckMsn(m) => format!("requester-ack-msn-{m}-{len}"),
    };
    (kind, len, what, rule)
}

/// Runs a `requester` case: the agent's WRITE to us, answered as the case says; then the
/// completion it reports.
fn run_requester(h: &mut Harness, case: &Case, kind: ReqKind, len: u32) -> io::Result<Verdict> {
    let mut rng = Rng::new(case.seed ^ u64::from(case.index).rotate_left(36));
    let qpn = 0x100 + rng.below(0xFF_FE00) as u32;
    h.agent.cmd("RESET")?;
    let (retry, rnr) = match kind {
        ReqKind::Silence(n) => (n, 7),
        ReqKind::RnrExhaust(n) => (7, n),
        _ => (7, 7),
    };
    // timeout 12: 16.8 ms per try.
    let [target_qpn, target_psn, ..] =
        h.agent_connect(qpn, rng.below(1 << 24) as u32, rnr, retry, 12)?;
    let conn = Conn {
        local: h.local,
        target: h.target,
        local_qpn: qpn,
        target_qpn: target_qpn as u32,
        start_psn: target_psn as u32,
        rkey: 0,
        addr: 0,
    };
    h.agent
        .cmd(&format!("POST write 0 {len} 4096 4660 0 0 0"))?;
    let npkts = len.div_ceil(MTU).max(1);
    let last = npkts - 1;
    let mut tries = 0u32;
    let deadline = Instant::now() + Duration::from_secs(4).max(h.window * 4);
    let mut acked_once = false;
    while Instant::now() < deadline {
        let got = h.collect_until(&conn, Duration::from_millis(50), |a| !a.is_empty())?;
        let mut done = false;
        for a in got {
            // Requests only (our own answers never come back); the first packet counts tries.
            if !a.opcode.is_request() {
                continue;
            }
            if a.psn_off == 0 {
                tries += 1;
            }
            let first = a.psn_off == 0;
            let is_last = a.psn_off == last;
            let reply = match kind {
                ReqKind::Ack if is_last => {
                    Some(ack_for(&conn, last, ferroce_wire::Syndrome::ACK_UNLIMITED))
                }
                ReqKind::AckMsn(msn) if is_last => {
                    let mut b = ack_for(&conn, last, ferroce_wire::Syndrome::ACK_UNLIMITED);
                    // The AETH's MSN: bytes 13..16 (after the 12-byte BTH and syndrome).
                    b[13..16].copy_from_slice(&msn.to_be_bytes()[1..]);
                    ferroce_wire::IcrcContext::v4(conn.local, conn.target, 0, PORT, PORT)
                        .fill(&mut b);
                    Some(b)
                }
                ReqKind::NakAccess if first => Some(ack_for(
                    &conn,
                    0,
                    ferroce_wire::Syndrome::nak(ferroce_wire::NakCode::RemoteAccessError),
                )),
                ReqKind::NakInvalid if first => Some(ack_for(
                    &conn,
                    0,
                    ferroce_wire::Syndrome::nak(ferroce_wire::NakCode::InvalidRequest),
                )),
                ReqKind::RnrExhaust(_) if first => {
                    Some(ack_for(&conn, 0, ferroce_wire::Syndrome::rnr_nak(1)))
                }
                ReqKind::GhostAck(d) if is_last => {
                    h.send(&ack_for(
                        &conn,
                        last + d,
                        ferroce_wire::Syndrome::ACK_UNLIMITED,
                    ))?;
                    Some(ack_for(&conn, last, ferroce_wire::Syndrome::ACK_UNLIMITED))
                }
                ReqKind::SeqNak if is_last && !acked_once => {
                    acked_once = true;
                    Some(ack_for(
                        &conn,
                        0,
                        ferroce_wire::Syndrome::nak(ferroce_wire::NakCode::PsnSeqError),
                    ))
                }
                ReqKind::SeqNak if is_last => {
                    Some(ack_for(&conn, last, ferroce_wire::Syndrome::ACK_UNLIMITED))
                }
                _ => None,
            };
            if let Some(r) = reply {
                h.send(&r)?;
                done = !matches!(kind, ReqKind::RnrExhaust(_) | ReqKind::SeqNak)
                    || (matches!(kind, ReqKind::SeqNak) && tries >= 2 && is_last);
            }
        }
        if done {
            break;
        }
        if let ReqKind::RnrExhaust(n) | ReqKind::Silence(n) = kind {
            // The last try's answer (or silence) given: its timer ends the WR.
            if tries > u32::from(n) {
                let _ = h.collect(&conn, Duration::from_millis(300))?;
                break;
            }
        }
    }
    let wc = h.agent.cmd("WC")?;
    let status: Option<i32> = wc.split_whitespace().nth(2).and_then(|s| s.parse().ok());
    // Whatever the target still sends is not the next case's.
    let _ = h.collect(&conn, Duration::from_millis(20));
    let expected = expected_status(kind);
    if status.is_none() || (expected.is_some() && status != expected) {
        return Ok(Verdict::Deviates {
            step: 0,
            why: format!(
                "the WR completed {wc:?}, expected status {} ({tries} tries)",
                expected.map_or("any".to_owned(), |s| s.to_string())
            ),
        });
    }
    if let Some(t) = expected_tries(kind) {
        if tries != t {
            return Ok(Verdict::Deviates {
                step: 0,
                why: format!("the message was sent {tries} times, expected {t}"),
            });
        }
    }
    Ok(Verdict::Conforms)
}

/// An ACK or NAK (`syndrome`) from us for `conn`'s PSN offset `psn_off`, MSN 1.
fn ack_for(conn: &Conn, psn_off: u32, syndrome: ferroce_wire::Syndrome) -> Vec<u8> {
    let repr = ferroce_wire::PacketRepr {
        bth: ferroce_wire::BthRepr::new(
            ferroce_wire::Opcode::RC_ACKNOWLEDGE,
            conn.target_qpn,
            ferroce_wire::Psn::new(conn.start_psn.wrapping_add(psn_off) & 0xFF_FFFF),
        ),
        ext: ferroce_wire::ExtHeaders {
            aeth: Some(ferroce_wire::AethRepr {
                syndrome: syndrome.0,
                msn: 1,
            }),
            ..Default::default()
        },
        payload: &[],
    };
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit(&mut b);
    ferroce_wire::IcrcContext::v4(conn.local, conn.target, 0, PORT, PORT).fill(&mut b);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_comes_up_with_its_status_and_tries() {
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..300 {
            let (k, len, what, rule) = kind_of(2, i);
            assert!((1..=3072).contains(&len) && what.starts_with("requester") && !rule.is_empty());
            seen.insert(what.split('-').nth(1).unwrap_or_default().to_owned());
            assert!(expected_tries(k).is_none_or(|t| t >= 1));
        }
        assert_eq!(seen.len(), 6, "{seen:?}");
        assert!((0..300).any(|i| matches!(kind_of(2, i).0, ReqKind::AckMsn(_))));
        assert_eq!(expected_tries(ReqKind::RnrExhaust(2)), Some(3));
        assert_eq!(expected_status(ReqKind::Silence(3)), Some(12));
        assert_eq!(expected_status(ReqKind::AckMsn(9)), None);
        assert_eq!(kind_of(9, 4), kind_of(9, 4));
    }
}
