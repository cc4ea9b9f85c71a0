//! The MAD common header (IBTA §13.4.2, kernel `struct ib_mad_hdr`): the first 24 bytes of
//! every management datagram on QP1. The connection manager's messages (class 0x07) follow it;
//! their bodies come with the CM.

fixed_header! {
    name: "MAD common header";
    len: 24;
    fields: {
        /// BaseVersion: 1 for every MAD a RoCE stack sends.
        base_version, set_base_version: U8 as u8 @ 0,
        /// MgmtClass: which management class the MAD belongs to ([`MGMT_CLASS_CM`], ...).
        mgmt_class, set_mgmt_class: U8 as u8 @ 1,
        /// ClassVersion: the class's format version (2 for the CM).
        class_version, set_class_version: U8 as u8 @ 2,
        /// Method: Get, Set, Send, ...; bit 7 ([`METHOD_RESPONSE`]) marks a response.
        method, set_method: U8 as u8 @ 3,
        /// Status of a response (0 in requests).
        status, set_status: U16 as u16 @ 4,
        /// ClassSpecific: the class's own 16 bits (0 for the CM).
        class_specific, set_class_specific: U16 as u16 @ 6,
        /// TransactionID: the requester's number, echoed by responses.
        transaction_id, set_transaction_id: U64 as u64 @ 8,
        /// AttributeID: the message within the class (the CM's REQ, REP, ...).
        attribute_id, set_attribute_id: U16 as u16 @ 16,
        /// AttributeModifier (the CM carries ECE bits here; rxe sends 0).
        attribute_modifier, set_attribute_modifier: U32 as u32 @ 20,
    }
}

/// Bytes of a MAD on QP1: header and data, always 256 (IBTA §13.4.1).
pub const MAD_LEN: usize = 256;

/// Method bit 7: the MAD answers a request (GetResp, ...) and echoes its TransactionID.
pub const METHOD_RESPONSE: u8 = 0x80;

/// MgmtClass of the communication manager (IBTA §12.6), `IB_MGMT_CLASS_CM`.
pub const MGMT_CLASS_CM: u8 = 0x07;

/// MgmtClass of directed-route subnet management (`IB_MGMT_CLASS_SUBN_DIRECTED_ROUTE`).
pub const MGMT_CLASS_SUBN_DIRECTED_ROUTE: u8 = 0x81;

/// Method Get (`IB_MGMT_METHOD_GET`): read an attribute.
pub const METHOD_GET: u8 = 0x01;
/// Method Set (`IB_MGMT_METHOD_SET`): write an attribute.
pub const METHOD_SET: u8 = 0x02;
/// Method GetResp (`IB_MGMT_METHOD_GET_RESP`): the answer to a Get or Set.
pub const METHOD_GET_RESP: u8 = 0x81;

/// AttributeID ClassPortInfo (`IB_MGMT_CLASSPORTINFO_ATTR_ID`), which every class defines.
pub const ATTR_CLASS_PORT_INFO: u16 = 0x0001;

/// Status "unsupported method/attribute combination"
/// (`IB_MGMT_MAD_STATUS_UNSUPPORTED_METHOD_ATTRIB`, IBTA Table 106).
pub const STATUS_UNSUPPORTED_METHOD_ATTRIBUTE: u16 = 0x000C;
/// Status bit D of a directed-route SMP's response (`IB_SMP_DIRECTION`).
pub const STATUS_DIRECTION: u16 = 0x8000;

/// The CM's AttributeIDs (IBTA Table 104, kernel `ib_cm.h`).
pub mod cm_attr {
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MessageReceiptAcknowledgement.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResolutionRequest.
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResolutionResponse.
    pub const SIDR_REP: u16 = 0x0018;
    /// LoadAlternatePath (ignored on RoCE).
    pub const LAP: u16 = 0x0019;
    /// AlternatePathResponse (ignored on RoCE).
    pub const APR: u16 = 0x001A;
}

#[cfg(test)]
mod tests {
    // The header of the REQ in the ucmatose capture (`rxe-mtu1024-ucmatose.pcap`, frame 1):
    // CM class version 2, Send, TID hi 2 | byte-swapped comm ID 0x142375CE.
    fixed_header_tests! {
        bytes: [
            0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x02, 0xce, 0x75, 0x23, 0x14,
            0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        ],
        repr: Repr {
            base_version: 1,
            mgmt_class: super::super::MGMT_CLASS_CM,
            class_version: 2,
            method: 3,
            status: 0,
            class_specific: 0,
            transaction_id: 0x0000_0002_ce75_2314,
            attribute_id: super::super::cm_attr::REQ,
            attribute_modifier: 0,
        },
        arb: (
            any::<[u8; 4]>(),
            any::<(u16, u16, u64, u16, u32)>(),
        )
            .prop_map(|(b, (status, class_specific, transaction_id, attribute_id, attribute_modifier))| Repr {
                base_version: b[0],
                mgmt_class: b[1],
                class_version: b[2],
                method: b[3],
                status,
                class_specific,
                transaction_id,
                attribute_id,
                attribute_modifier,
            }),
    }

    use super::*;

    #[test]
    fn dreq_header_from_the_capture() {
        // Frame 12: the DREQ the server sent, TID hi 2 | its own swapped comm ID.
        let b: [u8; 24] = [
            0x01, 0x07, 0x02, 0x03, 0, 0, 0, 0, 0, 0, 0, 0x02, 0xa9, 0xb8, 0x78, 0xa6, 0x00, 0x15,
            0, 0, 0, 0, 0, 0,
        ];
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.attribute_id(), cm_attr::DREQ);
        assert_eq!(p.transaction_id() & 0xFFFF_FFFF, 0xa9b8_78a6);
        assert_eq!(p.method() & METHOD_RESPONSE, 0);
    }
}
