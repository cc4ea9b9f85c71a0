//! Atomic Extended Transport Header (IBTA §9.3.4, rxe `struct rxe_atmeth`): address, R_Key and
//! operands of CMP_SWAP / FETCH_ADD (28 bytes).

fixed_header! {
    name: "AtomicETH";
    len: 28;
    fields: {
        /// VA, the remote virtual address (8-byte aligned).
        va, set_va: U64 as u64 @ 0,
        /// R_Key of the remote memory region.
        rkey, set_rkey: U32 as u32 @ 8,
        /// Swap (CMP_SWAP) or Add (FETCH_ADD) data.
        swap_add, set_swap_add: U64 as u64 @ 12,
        /// Compare data (CMP_SWAP only).
        compare, set_compare: U64 as u64 @ 20,
    }
}

#[cfg(test)]
mod tests {
    // The AtomicETH of an RC FETCH_ADD from rxe (ib_atomic_bw capture): add 1.
    fixed_header_tests! {
        bytes: [
            0x00, 0x00, 0x55, 0x66, 0x83, 0x8e, 0x10, 0x00, 0x00, 0x00, 0x08, 0xef, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        ],
        repr: Repr { va: 0x5566_838e_1000, rkey: 0x8ef, swap_add: 1, compare: 0 },
        arb: (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>())
            .prop_map(|(va, rkey, swap_add, compare)| Repr { va, rkey, swap_add, compare }),
    }
}
