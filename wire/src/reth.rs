//! RDMA Extended Transport Header (IBTA §9.3.3, rxe `struct rxe_reth`): the remote address,
//! R_Key and DMA length of an RDMA WRITE or READ request (16 bytes).

fixed_header! {
    name: "RETH";
    len: 16;
    fields: {
        /// VA, the remote virtual address.
        va, set_va: U64 as u64 @ 0,
        /// R_Key of the remote memory region.
        rkey, set_rkey: U32 as u32 @ 8,
        /// DMALen, the length of the whole RDMA operation in bytes.
        dma_len, set_dma_len: U32 as u32 @ 12,
    }
}

#[cfg(test)]
mod tests {
    // The RETH of an RC RDMA WRITE_ONLY from rxe (ib_write_lat capture).
    fixed_header_tests! {
        bytes: [
            0x00, 0x00, 0x55, 0x6f, 0xdb, 0xe2, 0x70, 0x00, 0x00, 0x00, 0x09, 0x74, 0x00, 0x00,
            0x00, 0x40,
        ],
        repr: Repr { va: 0x556f_dbe2_7000, rkey: 0x974, dma_len: 64 },
        arb: (any::<u64>(), any::<u32>(), any::<u32>())
            .prop_map(|(va, rkey, dma_len)| Repr { va, rkey, dma_len }),
    }

    #[test]
    fn getters_read_their_bytes() {
        let b = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16u8];
        let p = super::Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.va(), 0x0102_0304_0506_0708);
        assert_eq!(p.rkey(), 0x090a_0b0c);
        assert_eq!(p.dma_len(), 0x0d0e_0f10);
    }
}
