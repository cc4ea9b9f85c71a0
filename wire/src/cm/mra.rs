//! MessageReceiptAcknowledgement, MRA (IBTA §12.6.6 Table 107): "your message arrived, the
//! answer will take longer": the receiver stretches its timeout by the Service Timeout.

cm_message! {
    name: "MRA";
    attribute_id: crate::mad::cm_attr::MRA;
    fields_len: 10;
    private_data: 10, 222;
    fields: {
        /// Local Communication ID: the sender's ID.
        local_comm_id, set_local_comm_id: U32 as u32 @ 0,
        /// Remote Communication ID: the receiver's ID (0 when MRAing a REQ... never: the REQ's).
        remote_comm_id, set_remote_comm_id: U32 as u32 @ 4,
        /// Message MRAed: 0 REQ, 1 REP, 2 LAP.
        message_mraed, set_message_mraed: Bits8<7, 6> as u8 @ 8,
        /// Service Timeout (4.096 µs × 2^t) the sender needs; rdma_cm sends 24.
        service_timeout, set_service_timeout: Bits8<7, 3> as u8 @ 9,
    }
}

#[cfg(test)]
mod tests {
    // The MRA rdma_cm's passive side sends for a duplicate of the captured REQ: MRAed REQ,
    // service timeout 24 (CMA_CM_MRA_SETTING).
    fixed_header_tests! {
        bytes: [0xa6, 0x78, 0xb8, 0xa9, 0x14, 0x23, 0x75, 0xce, 0x00, 0xc0],
        repr: Repr {
            local_comm_id: 0xA678_B8A9,
            remote_comm_id: 0x1423_75CE,
            message_mraed: 0,
            service_timeout: 24,
        },
        arb: crate::cm::golden::arb_bytes(HEADER_LEN)
            .prop_map(|b| Repr::parse(&Packet::new_unchecked(&b[..])).unwrap()),
    }
}
