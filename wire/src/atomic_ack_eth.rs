//! Atomic Acknowledge Extended Transport Header (IBTA §9.3.6, rxe `struct rxe_atmack`): the
//! original remote data returned by an atomic operation (8 bytes).

fixed_header! {
    name: "AtomicAckETH";
    len: 8;
    fields: {
        /// OrigRemDt, the value at the remote address before the atomic executed.
        orig, set_orig: U64 as u64 @ 0,
    }
}

#[cfg(test)]
mod tests {
    // The AtomicAckETH of an rxe ATOMIC_ACK (ib_atomic_bw capture).
    fixed_header_tests! {
        bytes: [0xc6, 0x9e, 0xe1, 0xa5, 0x19, 0xcc, 0xe9, 0xa8],
        repr: Repr { orig: 0xc69e_e1a5_19cc_e9a8 },
        arb: any::<u64>().prop_map(|orig| Repr { orig }),
    }
}
