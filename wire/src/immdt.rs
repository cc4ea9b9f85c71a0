//! Immediate Data Extended Transport Header (IBTA §9.3.7, rxe `struct rxe_immdt`): the 32-bit
//! `imm_data` of a SEND or RDMA WRITE with immediate (4 bytes, carried in network order).

fixed_header! {
    name: "ImmDt";
    len: 4;
    fields: {
        /// Immediate data, as the verbs `imm_data` field (big-endian on the wire).
        imm, set_imm: U32 as u32 @ 0,
    }
}

#[cfg(test)]
mod tests {
    fixed_header_tests! {
        bytes: [0xde, 0xad, 0xbe, 0xef],
        repr: Repr { imm: 0xdead_beef },
        arb: any::<u32>().prop_map(|imm| Repr { imm }),
    }
}
