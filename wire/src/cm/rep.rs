//! ConnectReply, REP (IBTA §12.6.8 Table 110, kernel `cm_format_rep`): the passive side's
//! acceptance: its QP, PSN, the depths it chose, its RNR retry count. No rdma_cm header.

cm_message! {
    name: "REP";
    attribute_id: crate::mad::cm_attr::REP;
    fields_len: 36;
    private_data: 36, 196;
    fields: {
        /// Local Communication ID: the passive side's ID.
        local_comm_id, set_local_comm_id: U32 as u32 @ 0,
        /// Remote Communication ID: the REQ's Local Communication ID.
        remote_comm_id, set_remote_comm_id: U32 as u32 @ 4,
        /// Local Q_Key (0 for RC).
        local_qkey, set_local_qkey: U32 as u32 @ 8,
        /// Local QPN: the passive side's QP.
        local_qpn, set_local_qpn: U24 as u32 @ 12,
        /// Vendor ID high byte (ECE; IBTA reserved).
        vendor_id_high, set_vendor_id_high: U8 as u8 @ 15,
        /// Local EECN (0; the QPN for an XRC target).
        local_eecn, set_local_eecn: U24 as u32 @ 16,
        /// Vendor ID middle byte.
        vendor_id_mid, set_vendor_id_mid: U8 as u8 @ 19,
        /// Starting PSN: the PSN the passive side expects first (the active side's `sq_psn`).
        starting_psn, set_starting_psn: U24 as u32 @ 20,
        /// Vendor ID low byte.
        vendor_id_low, set_vendor_id_low: U8 as u8 @ 23,
        /// Responder Resources: READs/atomics the passive side takes at once (the active
        /// side's `max_rd_atomic`).
        responder_resources, set_responder_resources: U8 as u8 @ 24,
        /// Initiator Depth: READs/atomics the passive side issues at once (the active side's
        /// `max_dest_rd_atomic`).
        initiator_depth, set_initiator_depth: U8 as u8 @ 25,
        /// Target ACK Delay: the passive device's `local_ca_ack_delay`.
        target_ack_delay, set_target_ack_delay: Bits8<7, 3> as u8 @ 26,
        /// Failover Accepted.
        failover_accepted, set_failover_accepted: Bits8<2, 1> as u8 @ 26,
        /// End-to-End Flow Control.
        end_to_end_flow_control, set_end_to_end_flow_control: Bits8<0, 0> as u8 @ 26,
        /// RNR Retry Count: the active side's `rnr_retry` (7 = infinite).
        rnr_retry_count, set_rnr_retry_count: Bits8<7, 5> as u8 @ 27,
        /// SRQ: the passive QP receives from a shared receive queue.
        srq, set_srq: Bits8<4, 4> as u8 @ 27,
        /// Local CA GUID: the passive side's node GUID.
        local_ca_guid, set_local_ca_guid: U64 as u64 @ 28,
    }
}

#[cfg(test)]
mod tests {
    fixed_header_tests! {
        bytes: crate::cm::golden::fields("rep", HEADER_LEN),
        repr: Repr {
            local_comm_id: 0xA678_B8A9,
            remote_comm_id: 0x1423_75CE,
            local_qpn: 0x1A,
            starting_psn: 0x24_B9F5,
            responder_resources: 1,
            initiator_depth: 1,
            target_ack_delay: 15,
            rnr_retry_count: 7,
            local_ca_guid: 0x5054_00FF_FE77_000B,
            ..Repr::default()
        },
        arb: crate::cm::golden::arb_bytes(HEADER_LEN)
            .prop_map(|b| Repr::parse(&Packet::new_unchecked(&b[..])).unwrap()),
    }

    use super::*;

    #[test]
    fn private_data_area_is_196_bytes_of_zero_in_the_capture() {
        let m = crate::cm::golden::mad("rep");
        let p = Packet::new_checked(&m[24..]).unwrap();
        assert_eq!(p.private_data(), &[0u8; 196][..]);
        assert_eq!(ATTRIBUTE_ID, 0x0013);
    }
}
