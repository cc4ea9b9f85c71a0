//! ServiceIDResolutionResponse, SIDR_REP (IBTA §12.11.2 Table 119): the QP and Q_Key serving
//! a ServiceID, or a status saying why not ([`status`]).

cm_message! {
    name: "SIDR_REP";
    attribute_id: crate::mad::cm_attr::SIDR_REP;
    fields_len: 24;
    private_data: 96, 136;
    fields: {
        /// Request ID: the SIDR_REQ's.
        request_id, set_request_id: U32 as u32 @ 0,
        /// Status ([`status`]).
        status, set_status: U8 as u8 @ 4,
        /// Additional Information Length.
        additional_info_length, set_additional_info_length: U8 as u8 @ 5,
        /// QPN serving the ServiceID.
        qpn, set_qpn: U24 as u32 @ 8,
        /// Vendor ID high byte (ECE; IBTA reserved).
        vendor_id_high, set_vendor_id_high: U8 as u8 @ 11,
        /// ServiceID answered.
        service_id, set_service_id: U64 as u64 @ 12,
        /// Q_Key of that QP.
        qkey, set_qkey: U32 as u32 @ 20,
    }
}

/// Where the Additional Information starts, and its size.
pub const INFO_OFFSET: usize = 24;
/// Bytes of Additional Information.
pub const INFO_LEN: usize = 72;

/// SIDR_REP status values (`ib_cm_sidr_status`).
pub mod status {
    /// The QP and Q_Key are valid.
    pub const SUCCESS: u8 = 0;
    /// Nobody serves this ServiceID.
    pub const UNSUPPORTED: u8 = 1;
    /// The service refused.
    pub const REJECT: u8 = 2;
    /// No QP for it.
    pub const NO_QP: u8 = 3;
    /// Redirected elsewhere.
    pub const REDIRECT: u8 = 4;
    /// The class version is not supported.
    pub const UNSUPPORTED_VERSION: u8 = 5;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The Additional Information area (as much as the buffer holds).
    pub fn additional_info(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[INFO_OFFSET.min(b.len())..(INFO_OFFSET + INFO_LEN).min(b.len())]
    }
}

#[cfg(test)]
mod tests {
    // The answer to the SIDR_REQ of sidr_req.rs: QP 0x2b, Q_Key RDMA_UDP_QKEY 0x01234567.
    fixed_header_tests! {
        bytes: [
            0x15, 0x23, 0x75, 0xce, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x2b, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x01, 0x11, 0x1c, 0x06, 0x01, 0x23, 0x45, 0x67,
        ],
        repr: Repr {
            request_id: 0x1523_75CE,
            status: crate::cm::sidr_rep::status::SUCCESS,
            qpn: 0x2B,
            service_id: 0x0000_0000_0111_1C06,
            qkey: 0x0123_4567,
            ..Repr::default()
        },
        arb: crate::cm::golden::arb_bytes(HEADER_LEN)
            .prop_map(|b| Repr::parse(&Packet::new_unchecked(&b[..])).unwrap()),
    }
}
