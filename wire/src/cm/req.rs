//! ConnectRequest, REQ (IBTA §12.6.5 Table 106, kernel `cm_format_req`): the active side's
//! offer of a connection: its QP, PSN, depths, retry counts and the primary path. rdma_cm puts
//! a 36-byte [`super::cma_hdr`] at the start of the private data.

cm_message! {
    name: "REQ";
    attribute_id: crate::mad::cm_attr::REQ;
    fields_len: 140;
    private_data: 140, 92;
    fields: {
        /// Local Communication ID: the sender's ID of this connection.
        local_comm_id, set_local_comm_id: U32 as u32 @ 0,
        /// Vendor ID (ECE; IBTA reserved), 24 bits.
        vendor_id, set_vendor_id: U24 as u32 @ 5,
        /// ServiceID: whom the connection is for (rdma_cm: port space << 16 | port).
        service_id, set_service_id: U64 as u64 @ 8,
        /// Local CA GUID: the sender's node GUID.
        local_ca_guid, set_local_ca_guid: U64 as u64 @ 16,
        /// Local Q_Key (UD/RD; 0 for RC).
        local_qkey, set_local_qkey: U32 as u32 @ 28,
        /// Local QPN: the active side's QP.
        local_qpn, set_local_qpn: U24 as u32 @ 32,
        /// Responder Resources: READs/atomics the active side lets the passive side have
        /// outstanding at it.
        responder_resources, set_responder_resources: U8 as u8 @ 35,
        /// Local EECN (RD; 0).
        local_eecn, set_local_eecn: U24 as u32 @ 36,
        /// Initiator Depth: READs/atomics the active side wants outstanding at the passive side.
        initiator_depth, set_initiator_depth: U8 as u8 @ 39,
        /// Remote EECN (RD; 0).
        remote_eecn, set_remote_eecn: U24 as u32 @ 40,
        /// Remote CM Response Timeout (4.096 µs × 2^t): how long the passive side may take.
        remote_cm_response_timeout, set_remote_cm_response_timeout: Bits8<7, 3> as u8 @ 43,
        /// Transport Service Type: 0 RC, 1 UC, 2 RD, 3 XRC.
        transport_service_type, set_transport_service_type: Bits8<2, 1> as u8 @ 43,
        /// End-to-End Flow Control.
        end_to_end_flow_control, set_end_to_end_flow_control: Bits8<0, 0> as u8 @ 43,
        /// Starting PSN: the PSN the active side expects first (the passive side's `sq_psn`).
        starting_psn, set_starting_psn: U24 as u32 @ 44,
        /// Local CM Response Timeout: how long the active side may take to answer.
        local_cm_response_timeout, set_local_cm_response_timeout: Bits8<7, 3> as u8 @ 47,
        /// Retry Count: the passive side's `retry_cnt`.
        retry_count, set_retry_count: Bits8<2, 0> as u8 @ 47,
        /// Partition Key.
        partition_key, set_partition_key: U16 as u16 @ 48,
        /// Path Packet Payload MTU (the `ibv_mtu` enum: 1 = 256 … 5 = 4096).
        path_mtu, set_path_mtu: Bits8<7, 4> as u8 @ 50,
        /// RDC Exists (RD).
        rdc_exists, set_rdc_exists: Bits8<3, 3> as u8 @ 50,
        /// RNR Retry Count: the passive side's `rnr_retry` (7 = infinite).
        rnr_retry_count, set_rnr_retry_count: Bits8<2, 0> as u8 @ 50,
        /// Max CM Retries: how often the active side sends each CM message.
        max_cm_retries, set_max_cm_retries: Bits8<7, 4> as u8 @ 51,
        /// SRQ: the active QP receives from a shared receive queue.
        srq, set_srq: Bits8<3, 3> as u8 @ 51,
        /// Extended Transport Type (1 with XRC).
        extended_transport_type, set_extended_transport_type: Bits8<2, 0> as u8 @ 51,
        /// Primary Local Port LID (0xFFFF, permissive, on routed RoCE).
        primary_local_lid, set_primary_local_lid: U16 as u16 @ 52,
        /// Primary Remote Port LID.
        primary_remote_lid, set_primary_remote_lid: U16 as u16 @ 54,
        /// Primary Local Port GID: the active side's address (`::ffff:a.b.c.d` for IPv4).
        primary_local_gid, set_primary_local_gid: Bytes<16> as [u8; 16] @ 56,
        /// Primary Remote Port GID: the passive side's address.
        primary_remote_gid, set_primary_remote_gid: Bytes<16> as [u8; 16] @ 72,
        /// Primary Flow Label (20 bits).
        primary_flow_label, set_primary_flow_label: Bits32<31, 12> as u32 @ 88,
        /// Primary Packet Rate (0: the port's current rate).
        primary_packet_rate, set_primary_packet_rate: Bits8<5, 0> as u8 @ 91,
        /// Primary Traffic Class (the IP TOS).
        primary_traffic_class, set_primary_traffic_class: U8 as u8 @ 92,
        /// Primary Hop Limit (the IP TTL).
        primary_hop_limit, set_primary_hop_limit: U8 as u8 @ 93,
        /// Primary SL.
        primary_sl, set_primary_sl: Bits8<7, 4> as u8 @ 94,
        /// Primary Subnet Local.
        primary_subnet_local, set_primary_subnet_local: Bits8<3, 3> as u8 @ 94,
        /// Primary Local ACK Timeout: the passive side's `timeout` is taken from it.
        primary_local_ack_timeout, set_primary_local_ack_timeout: Bits8<7, 3> as u8 @ 95,
        /// Alternate Local Port LID (RoCE has no alternate path: 0).
        alternate_local_lid, set_alternate_local_lid: U16 as u16 @ 96,
        /// Alternate Remote Port LID.
        alternate_remote_lid, set_alternate_remote_lid: U16 as u16 @ 98,
        /// Alternate Local Port GID.
        alternate_local_gid, set_alternate_local_gid: Bytes<16> as [u8; 16] @ 100,
        /// Alternate Remote Port GID.
        alternate_remote_gid, set_alternate_remote_gid: Bytes<16> as [u8; 16] @ 116,
        /// Alternate Flow Label.
        alternate_flow_label, set_alternate_flow_label: Bits32<31, 12> as u32 @ 132,
        /// Alternate Packet Rate.
        alternate_packet_rate, set_alternate_packet_rate: Bits8<5, 0> as u8 @ 135,
        /// Alternate Traffic Class.
        alternate_traffic_class, set_alternate_traffic_class: U8 as u8 @ 136,
        /// Alternate Hop Limit.
        alternate_hop_limit, set_alternate_hop_limit: U8 as u8 @ 137,
        /// Alternate SL.
        alternate_sl, set_alternate_sl: Bits8<7, 4> as u8 @ 138,
        /// Alternate Subnet Local.
        alternate_subnet_local, set_alternate_subnet_local: Bits8<3, 3> as u8 @ 138,
        /// Alternate Local ACK Timeout.
        alternate_local_ack_timeout, set_alternate_local_ack_timeout: Bits8<7, 3> as u8 @ 139,
        /// SAP Supported.
        sap_supported, set_sap_supported: Bits8<2, 2> as u8 @ 139,
    }
}

#[cfg(test)]
mod tests {
    fixed_header_tests! {
        bytes: crate::cm::golden::fields("req", HEADER_LEN),
        repr: Repr {
            local_comm_id: 0x1423_75CE,
            service_id: 0x0000_0000_0106_1D2F,
            local_ca_guid: 0x5054_00FF_FE77_000C,
            local_qpn: 0x1A,
            responder_resources: 1,
            initiator_depth: 1,
            remote_cm_response_timeout: 20,
            starting_psn: 0x9B_F04A,
            local_cm_response_timeout: 20,
            retry_count: 5,
            partition_key: 0xFFFF,
            path_mtu: 3,
            max_cm_retries: 15,
            primary_local_lid: 0xFFFF,
            primary_remote_lid: 0xFFFF,
            primary_local_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 12],
            primary_remote_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 11],
            primary_flow_label: 0x612F6,
            primary_hop_limit: 64,
            primary_local_ack_timeout: 19,
            ..Repr::default()
        },
        arb: crate::cm::golden::arb_bytes(HEADER_LEN)
            .prop_map(|b| Repr::parse(&Packet::new_unchecked(&b[..])).unwrap()),
    }

    use super::*;

    #[test]
    fn the_capture_field_by_field() {
        let m = super::super::golden::mad("req");
        let p = Packet::new_checked(&m[24..]).unwrap();
        p.check_message_len().unwrap();
        assert_eq!(p.local_comm_id(), 0x1423_75CE);
        assert_eq!(p.service_id(), 0x0000_0000_0106_1D2F);
        assert_eq!(p.local_ca_guid(), 0x5054_00FF_FE77_000C);
        assert_eq!((p.local_qpn(), p.starting_psn()), (0x1A, 0x9B_F04A));
        assert_eq!((p.responder_resources(), p.initiator_depth()), (1, 1));
        assert_eq!(
            (p.remote_cm_response_timeout(), p.transport_service_type()),
            (20, 0)
        );
        assert_eq!((p.local_cm_response_timeout(), p.retry_count()), (20, 5));
        assert_eq!(
            (p.path_mtu(), p.rnr_retry_count(), p.max_cm_retries()),
            (3, 0, 15)
        );
        assert_eq!(
            (p.primary_local_lid(), p.primary_remote_lid()),
            (0xFFFF, 0xFFFF)
        );
        assert_eq!(p.primary_local_gid()[10..], [0xff, 0xff, 10, 77, 0, 12]);
        assert_eq!(p.primary_remote_gid()[12..], [10, 77, 0, 11]);
        // The raw word is 61 2f 60 00: label 0x612F6 (tshark 4.0 misreads it), rate 0.
        assert_eq!(
            (p.primary_flow_label(), p.primary_packet_rate()),
            (0x612F6, 0)
        );
        assert_eq!(
            (p.primary_hop_limit(), p.primary_local_ack_timeout()),
            (64, 19)
        );
        assert_eq!(p.private_data().len(), PRIVATE_DATA_LEN);
        assert_eq!(p.private_data()[..2], [0x00, 0x40]); // the cma_hdr: version 0, IPv4
    }

    #[test]
    fn private_data_is_bounded_and_zero_padded() {
        let mut b = [0xAAu8; MESSAGE_LEN];
        let mut p = Packet::new_unchecked(&mut b[..]);
        assert_eq!(p.set_private_data(&[1; 93]), Err(crate::Error::BadLength));
        p.set_private_data(&[7; 10]).unwrap();
        assert_eq!(p.private_data()[..10], [7; 10]);
        assert!(p.private_data()[10..].iter().all(|&x| x == 0));
        assert_eq!(
            Packet::new_unchecked(&b[..200]).check_message_len(),
            Err(crate::Error::Truncated)
        );
    }
}
