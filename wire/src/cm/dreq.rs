//! DisconnectRequest, DREQ (IBTA §12.6.10 Table 112): either side closes the connection; the
//! receiver checks the QPN it names against its own.

cm_message! {
    name: "DREQ";
    attribute_id: crate::mad::cm_attr::DREQ;
    fields_len: 12;
    private_data: 12, 220;
    fields: {
        /// Local Communication ID: the sender's ID.
        local_comm_id, set_local_comm_id: U32 as u32 @ 0,
        /// Remote Communication ID: the receiver's ID.
        remote_comm_id, set_remote_comm_id: U32 as u32 @ 4,
        /// Remote QPN/EECN: the receiver's QP.
        remote_qpn, set_remote_qpn: U24 as u32 @ 8,
    }
}

#[cfg(test)]
mod tests {
    fixed_header_tests! {
        bytes: crate::cm::golden::fields("dreq", HEADER_LEN),
        repr: Repr {
            local_comm_id: 0xA678_B8A9,
            remote_comm_id: 0x1423_75CE,
            remote_qpn: 0x1A,
        },
        arb: (any::<(u32, u32)>(), 0u32..1 << 24).prop_map(|((local_comm_id, remote_comm_id), remote_qpn)| Repr {
            local_comm_id,
            remote_comm_id,
            remote_qpn,
        }),
    }
}
