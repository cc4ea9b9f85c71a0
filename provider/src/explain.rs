//! What a counter's non-zero value means: every counter that counts a packet dropped, a
//! request refused or work that failed (the engine's [`ferroce_transport::Counters`] and the
//! runtime's [`crate::RuntimeCounters`]) with its causes and what to check, as `ferroce devinfo
//! --counters` and `ferroce doctor` print them beside the numbers.

/// The meaning of counter `name` when it is not zero, if it counts something dropped, refused
/// or failed; `None` for counters of ordinary traffic (`sent_pkts`, `trains`, ...).
pub fn explain_counter(name: &str) -> Option<&'static str> {
    Some(match name {
        "duplicate_request" => {
            "requests this responder had seen already: its answer was lost or late and the \
             requester retried (loss on the path, or a local ACK timeout shorter than the round \
             trip)"
        }
        "out_of_seq_request" => {
            "requests ahead of the expected PSN: a packet before them was lost (each gap is NAKed \
             once and the requester goes back)"
        }
        "rcvd_seq_err" => {
            "PSN sequence NAKs received: the peer missed packets this side sent (loss on the \
             path)"
        }
        "rcvd_rnr_err" => {
            "RNR NAKs received: the peer had no receive posted for a SEND (it posts receives \
             later than this side sends; rnr_retry 7 waits for ever)"
        }
        "send_rnr_err" => {
            "RNR NAKs sent: a SEND came with no receive posted on this side's QP or SRQ"
        }
        "retry_exceeded_err" => {
            "QPs that failed with RETRY_EXC_ERR: retry_cnt retransmissions went unanswered \
             (`ferroce devinfo --qps` gives each one's reason)"
        }
        "retry_rnr_exceeded_err" => {
            "QPs that failed with RNR_RETRY_EXC_ERR: the peer never posted a receive within \
             rnr_retry RNR NAKs"
        }
        "completer_retry_err" => {
            "go-back-N restarts after a timeout or a NAK: packets or their ACKs were lost"
        }
        "implied_naks" => {
            "ACKs past an unanswered READ or atomic: its response was lost and the request went \
             out again"
        }
        "icrc_errors" => {
            "packets dropped because their ICRC was wrong: corrupted on the way, or a sender \
             that computes it otherwise (a packet of another protocol on UDP 4791?)"
        }
        "malformed" => {
            "packets that did not parse: shorter than their headers say, an unknown opcode, or \
             not RoCE at all (another program sending to UDP 4791)"
        }
        "no_qp" => {
            "packets for a QP number no QP here has, a QP of another type, or from another peer \
             than the QP's: a peer with a wrong dest_qp_num or GID, or one still sending to a \
             QP destroyed here"
        }
        "qkey_violations" => {
            "UD datagrams whose Q_Key is not the QP's: the sender's remote_qkey and this QP's \
             qkey differ"
        }
        "pkey_violations" => {
            "packets of another partition (P_Key not 0xffff): only the default partition \
             exists here, as on rxe"
        }
        "ghost_responses" => {
            "responses for PSNs never sent: a peer answering an older connection of the same \
             QP number, or PSNs that disagree (this side's sq_psn is not the peer's rq_psn)"
        }
        "duplicate_responses" => {
            "responses already taken: the peer answered a retry of something that had been \
             answered (its first answer was late, not lost)"
        }
        "dropped" => {
            "packets a QP could not take: not in RTR or RTS yet (the peer sends before this \
             side is ready), no receive posted on UC/UD, or an address family the QP cannot \
             answer"
        }
        "rd_atomic_exceeded" => {
            "READs or atomics beyond this responder's max_dest_rd_atomic: the peer's \
             max_rd_atomic is larger than this side's max_dest_rd_atomic (NAKed invalid request)"
        }
        "msg_too_long" => {
            "SENDs, WRITEs or READs of a message longer than max_msg_sz (8 MiB): NAKed invalid \
             request before any memory is touched"
        }
        "cnp_ignored" => {
            "CNPs for a QP that does not exist or does not take them, or with congestion \
             control off"
        }
        "udp_send_errors" => {
            "datagrams the kernel refused to send: no route to the peer, or longer than the \
             interface allows (see udp_send_too_long; FERROCE_LOG=debug says which)"
        }
        "udp_send_too_long" => {
            "datagrams longer than the interface's MTU (EMSGSIZE): a path_mtu above what the \
             interface carries (the largest is the interface MTU less 80 bytes, rounded down to \
             256, 512, 1024, 2048 or 4096)"
        }
        "injected_losses" => "datagrams dropped by FERROCE_FAULTS, on purpose",
        "cq_overflows" => {
            "completions lost because a CQ was full: poll it sooner or create it with a larger \
             cqe (the CQ goes to error, IBV_EVENT_CQ_ERR)"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every counter whose name says it counts drops, refusals or failures is explained, and
    /// ordinary traffic counters are not.
    #[test]
    fn every_drop_counter_is_explained() {
        let names: Vec<&str> = ferroce_transport::Counters::default()
            .named()
            .into_iter()
            .chain(crate::RuntimeCounters::default().named())
            .map(|(n, _)| n)
            .collect();
        for n in &names {
            let dropish = [
                "drop",
                "err",
                "bad",
                "malformed",
                "no_qp",
                "violation",
                "ghost",
            ]
            .iter()
            .any(|w| n.contains(w))
                || n.starts_with("duplicate")
                || n.ends_with("too_long");
            if dropish {
                assert!(explain_counter(n).is_some(), "{n} has no explanation");
            }
        }
        for n in [
            "sent_pkts",
            "rcvd_pkts",
            "udp_sent",
            "trains",
            "ecn_marked_pkts",
        ] {
            assert!(names.contains(&n));
            assert_eq!(explain_counter(n), None, "{n}");
        }
        assert_eq!(explain_counter("no_such_counter"), None);
    }
}
