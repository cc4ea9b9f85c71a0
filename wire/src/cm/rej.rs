//! ConnectReject, REJ (IBTA §12.6.7 Table 108): a REQ or REP refused, with a reason
//! ([`super::rej_reason`]), additional rejection information (ARI) and private data.

cm_message! {
    name: "REJ";
    attribute_id: crate::mad::cm_attr::REJ;
    fields_len: 12;
    private_data: 84, 148;
    fields: {
        /// Local Communication ID: the sender's ID (0 when no connection was made, as for a
        /// REQ nobody listens for).
        local_comm_id, set_local_comm_id: U32 as u32 @ 0,
        /// Remote Communication ID: the receiver's ID.
        remote_comm_id, set_remote_comm_id: U32 as u32 @ 4,
        /// Message Rejected: 0 REQ, 1 REP, 2 other.
        message_rejected, set_message_rejected: Bits8<7, 6> as u8 @ 8,
        /// Rejected Info Length: bytes of the ARI that mean something.
        rejected_info_length, set_rejected_info_length: Bits8<7, 1> as u8 @ 9,
        /// Reason (`ib_cm_rej_reason`).
        reason, set_reason: U16 as u16 @ 10,
    }
}

/// Where the Additional Rejection Information starts, and its size.
pub const ARI_OFFSET: usize = 12;
/// Bytes of Additional Rejection Information.
pub const ARI_LEN: usize = 72;

/// Message Rejected values.
pub mod rejected {
    /// The REQ.
    pub const REQ: u8 = 0;
    /// The REP.
    pub const REP: u8 = 1;
    /// Another message.
    pub const OTHER: u8 = 2;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The Additional Rejection Information area (as much as the buffer holds).
    pub fn ari(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[ARI_OFFSET.min(b.len())..(ARI_OFFSET + ARI_LEN).min(b.len())]
    }
}

#[cfg(test)]
mod tests {
    // A REJ "invalid service ID" answering the captured REQ (built as the kernel's
    // cm_issue_rej does: Local Comm ID 0, Remote the REQ's).
    fixed_header_tests! {
        bytes: [0, 0, 0, 0, 0x14, 0x23, 0x75, 0xce, 0x00, 0x00, 0x00, 0x08],
        repr: Repr {
            local_comm_id: 0,
            remote_comm_id: 0x1423_75CE,
            message_rejected: 0,
            rejected_info_length: 0,
            reason: 8,
        },
        arb: crate::cm::golden::arb_bytes(HEADER_LEN)
            .prop_map(|b| Repr::parse(&Packet::new_unchecked(&b[..])).unwrap()),
    }

    use super::*;

    #[test]
    fn bit_fields_and_areas() {
        let mut b = [0u8; MESSAGE_LEN];
        let mut p = Packet::new_unchecked(&mut b[..]);
        Repr {
            message_rejected: rejected::REP,
            rejected_info_length: 8,
            reason: 28,
            ..Repr::default()
        }
        .emit(&mut p);
        p.set_private_data(b"consumer says no").unwrap();
        assert_eq!((b[8], b[9], b[10], b[11]), (0x40, 0x10, 0, 28));
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(&p.private_data()[..16], b"consumer says no");
        assert_eq!(p.private_data().len(), 148);
        assert_eq!(p.ari().len(), 72);
        assert_eq!(PRIVATE_DATA_OFFSET, ARI_OFFSET + ARI_LEN);
    }
}
