//! ServiceIDResolutionRequest, SIDR_REQ (IBTA §12.11.1 Table 118): a UD client asks which QP
//! and Q_Key serve a ServiceID (rdma_cm's UDP port space, with a [`super::cma_hdr`]).

cm_message! {
    name: "SIDR_REQ";
    attribute_id: crate::mad::cm_attr::SIDR_REQ;
    fields_len: 16;
    private_data: 16, 216;
    fields: {
        /// Request ID: the sender's number, echoed by the SIDR_REP.
        request_id, set_request_id: U32 as u32 @ 0,
        /// Partition Key.
        partition_key, set_partition_key: U16 as u16 @ 4,
        /// ServiceID asked for.
        service_id, set_service_id: U64 as u64 @ 8,
    }
}

#[cfg(test)]
mod tests {
    // udaddy to port 7174 in the UDP port space (0x0111).
    fixed_header_tests! {
        bytes: [
            0x15, 0x23, 0x75, 0xce, 0xff, 0xff, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x01, 0x11, 0x1c, 0x06,
        ],
        repr: Repr {
            request_id: 0x1523_75CE,
            partition_key: 0xFFFF,
            service_id: 0x0000_0000_0111_1C06,
        },
        arb: crate::cm::golden::arb_bytes(HEADER_LEN)
            .prop_map(|b| Repr::parse(&Packet::new_unchecked(&b[..])).unwrap()),
    }
}
