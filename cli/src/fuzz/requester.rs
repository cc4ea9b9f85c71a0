//! The `requester` campaign: the target's QP as the requester. Its agent posts an RDMA WRITE
//! to the QP we pretend to be, and we answer it as a responder would, or would not: an ACK, a
//! remote access or invalid request NAK, RNR NAKs until its `rnr_retry` is used up, silence
//! until its `retry_cnt` is, an ACK for a PSN it never sent (a ghost), a sequence NAK that must
//! bring the message again. The oracle is the completion the target reports (`WC`) and how
//! often it sent.

use ferroce_transport::rng::Rng;

/// How we answer the target's WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqKind {
    /// An ACK of its last PSN: success.
    Ack,
    /// NAK remote access error at its first PSN: `IBV_WC_REM_ACCESS_ERR`.
    NakAccess,
    /// NAK invalid request at its first PSN: `IBV_WC_REM_INV_REQ_ERR`.
    NakInvalid,
    /// RNR NAK to every try, with the QP's `rnr_retry` this: `rnr_retry` + 1 tries, then
    /// `IBV_WC_RNR_RETRY_EXC_ERR`.
    RnrExhaust(u8),
    /// No answer, with the QP's `retry_cnt` this: `retry_cnt` + 1 tries, then
    /// `IBV_WC_RETRY_EXC_ERR`.
    Silence(u8),
    /// An ACK this far past anything sent (a ghost: ignored), then the real one: success.
    GhostAck(u32),
    /// A sequence NAK naming its first PSN: it sends the message again, whose ACK ends it.
    SeqNak,
    /// The ACK of its last PSN with this MSN (not the 1 it should be): the WR must still
    /// complete one way or another and the target keep serving (the IBTA leaves what a
    /// requester makes of the MSN to it; rxe and ferroce complete by PSN).
    AckMsn(u32),
}

impl ReqKind {
    /// The `ibv_wc_status` the target must report (`None`: any, as long as one comes).
    pub const fn status(self) -> Option<i32> {
        match self {
            ReqKind::Ack | ReqKind::GhostAck(_) | ReqKind::SeqNak => Some(0),
            ReqKind::NakInvalid => Some(9),
            ReqKind::NakAccess => Some(10),
            ReqKind::Silence(_) => Some(12),
            ReqKind::RnrExhaust(_) => Some(13),
            ReqKind::AckMsn(_) => None,
        }
    }

    /// How often the message's first packet must be sent, where the case fixes it.
    pub const fn tries(self) -> Option<u32> {
        match self {
            ReqKind::RnrExhaust(n) | ReqKind::Silence(n) => Some(n as u32 + 1),
            ReqKind::SeqNak => Some(2),
            ReqKind::Ack | ReqKind::NakAccess | ReqKind::NakInvalid | ReqKind::GhostAck(_) => {
                Some(1)
            }
            ReqKind::AckMsn(_) => None,
        }
    }
}

/// The case of `index` for `seed`: how we answer, the WRITE's length, its name and rule.
pub fn generate(seed: u64, index: u32) -> (ReqKind, u32, String, &'static str) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_comes_up_with_its_status_and_tries() {
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..300 {
            let (k, len, what, rule) = generate(2, i);
            assert!((1..=3072).contains(&len) && what.starts_with("requester") && !rule.is_empty());
            seen.insert(what.split('-').nth(1).unwrap_or_default().to_owned());
            assert!(k.tries().is_none_or(|t| t >= 1));
        }
        assert_eq!(seen.len(), 6, "{seen:?}");
        assert!((0..300).any(|i| matches!(generate(2, i).0, ReqKind::AckMsn(_))));
        assert_eq!(ReqKind::RnrExhaust(2).tries(), Some(3));
        assert_eq!(ReqKind::Silence(3).status(), Some(12));
        assert_eq!(ReqKind::AckMsn(9).status(), None);
        assert_eq!(generate(9, 4), generate(9, 4));
    }
}
