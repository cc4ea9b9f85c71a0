//! Flush Extended Transport Header (IBTA 1.5 §9.3.9, rxe `struct rxe_feth`): the placement
//! type and selectivity level of an RC FLUSH (4 bytes).
//!
//! The field is kept as one word; the transport's `FlushSpec` builds and reads it.

fixed_header! {
    name: "FETH";
    len: 4;
    fields: {
        /// The whole FETH word: selectivity level in bits 5..4, placement type in bits 1..0.
        bits, set_bits: U32 as u32 @ 0,
    }
}

impl Repr {
    /// Placement type (bit 0: global visibility, bit 1: persistence).
    pub const fn placement_type(&self) -> u8 {
        (self.bits & 0x3) as u8
    }

    /// Selectivity level (0: memory region range, 1: whole memory region).
    pub const fn selectivity_level(&self) -> u8 {
        ((self.bits >> 4) & 0x3) as u8
    }
}

#[cfg(test)]
mod tests {
    fixed_header_tests! {
        bytes: [0x00, 0x00, 0x00, 0x12],
        repr: Repr { bits: 0x12 },
        arb: any::<u32>().prop_map(|bits| Repr { bits }),
    }

    #[test]
    fn fields() {
        let r = super::Repr { bits: 0x12 };
        assert_eq!(r.placement_type(), 2);
        assert_eq!(r.selectivity_level(), 1);
    }
}
