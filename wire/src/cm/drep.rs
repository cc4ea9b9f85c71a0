//! DisconnectReply, DREP (IBTA §12.6.11 Table 113): the answer to a DREQ.

cm_message! {
    name: "DREP";
    attribute_id: crate::mad::cm_attr::DREP;
    fields_len: 8;
    private_data: 8, 224;
    fields: {
        /// Local Communication ID: the sender's ID.
        local_comm_id, set_local_comm_id: U32 as u32 @ 0,
        /// Remote Communication ID: the receiver's ID.
        remote_comm_id, set_remote_comm_id: U32 as u32 @ 4,
    }
}

#[cfg(test)]
mod tests {
    fixed_header_tests! {
        bytes: crate::cm::golden::fields("drep", HEADER_LEN),
        repr: Repr {
            local_comm_id: 0x1423_75CE,
            remote_comm_id: 0xA678_B8A9,
        },
        arb: any::<(u32, u32)>().prop_map(|(local_comm_id, remote_comm_id)| Repr {
            local_comm_id,
            remote_comm_id,
        }),
    }
}
