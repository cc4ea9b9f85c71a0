//! Datagram Extended Transport Header (IBTA §9.3.2, rxe `struct rxe_deth`): Q_Key and source
//! QP of a UD packet (8 bytes; byte 4 is reserved).

fixed_header! {
    name: "DETH";
    len: 8;
    fields: {
        /// Q_Key; a Q_Key with the high bit set is a controlled Q_Key (GSI uses 0x80010000).
        qkey, set_qkey: U32 as u32 @ 0,
        /// SrcQP, the sender's 24-bit QP number.
        src_qp, set_src_qp: U24 as u32 @ 5,
    }
}

#[cfg(test)]
mod tests {
    // The DETH of a CM MAD to QP1 (ucmatose capture): GSI Q_Key, source QP 1.
    fixed_header_tests! {
        bytes: [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01],
        repr: Repr { qkey: crate::GSI_QKEY, src_qp: 1 },
        arb: (any::<u32>(), 0u32..1 << 24).prop_map(|(qkey, src_qp)| Repr { qkey, src_qp }),
    }
}
