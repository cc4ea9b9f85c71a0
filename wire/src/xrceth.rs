//! XRC Extended Transport Header (IBTA §9.3.5 / Annex A14, "XRCETH"): the XRC SRQ a request
//! of an XRC send QP is for (4 bytes: one reserved byte, then the 24-bit XRCSRQ number). Every
//! XRC request carries it right behind the BTH; XRC responses do not.

fixed_header! {
    name: "XRCETH";
    len: 4;
    fields: {
        /// XRCSRQ: the number of the XRC SRQ at the target (`ibv_get_srq_num`; verbs'
        /// `wr.qp_type.xrc.remote_srqn`).
        xrcsrq, set_xrcsrq: U24 as u32 @ 1,
    }
}

#[cfg(test)]
mod tests {
    fixed_header_tests! {
        bytes: [0x00, 0x12, 0x34, 0x56],
        repr: Repr { xrcsrq: 0x12_3456 },
        arb: (0u32..1 << 24).prop_map(|xrcsrq| Repr { xrcsrq }),
    }
}
