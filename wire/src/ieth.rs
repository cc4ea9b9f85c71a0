//! Invalidate Extended Transport Header (IBTA §9.3.8, rxe `struct rxe_ieth`): the R_Key a
//! SEND_WITH_INV asks the responder to invalidate (4 bytes).

fixed_header! {
    name: "IETH";
    len: 4;
    fields: {
        /// The R_Key to invalidate.
        rkey, set_rkey: U32 as u32 @ 0,
    }
}

#[cfg(test)]
mod tests {
    fixed_header_tests! {
        bytes: [0x00, 0x00, 0x12, 0x34],
        repr: Repr { rkey: 0x1234 },
        arb: any::<u32>().prop_map(|rkey| Repr { rkey }),
    }
}
