//! The communication manager's MADs (IBTA Vol. 1 ch. 12; kernel `cm_msgs.h`,
//! `ibta_vol1_c12.h`) and the rdma_cm header inside them: each message a zero-copy view and a
//! `Repr` of its fields, with its private data area; [`Message`] reads any of them from a
//! MAD and writes one back.
//!
//! Offsets in the message modules are CM offsets: from the start of the CM data, the 232
//! bytes after the 24-byte MAD common header ([`crate::mad`]).

pub mod cma_hdr;
pub mod drep;
pub mod dreq;
pub mod mra;
pub mod rej;
pub mod rep;
pub mod req;
pub mod rtu;
pub mod sidr_rep;
pub mod sidr_req;

#[cfg(test)]
mod golden;

use crate::mad::{self, MAD_LEN, MGMT_CLASS_CM};
use crate::{Error, Result};

/// Bytes of CM data in a MAD: everything after the common header.
pub const CM_DATA_LEN: usize = MAD_LEN - mad::HEADER_LEN;

/// The CM's ClassVersion (IBTA 1.2 and later).
pub const CM_CLASS_VERSION: u8 = 2;

/// Method of every CM message: Send (the CM matches messages by comm ID, not TID).
pub const METHOD_SEND: u8 = 0x03;

/// rdma_cm port spaces (`enum rdma_port_space`): the ServiceID of an IP port is
/// `ps << 16 | port`.
pub mod port_space {
    /// `RDMA_PS_IPOIB`.
    pub const IPOIB: u16 = 0x0002;
    /// `RDMA_PS_IB`.
    pub const IB: u16 = 0x013F;
    /// `RDMA_PS_TCP`: connected (RC/UC) services.
    pub const TCP: u16 = 0x0106;
    /// `RDMA_PS_UDP`: datagram (UD) services, resolved by SIDR.
    pub const UDP: u16 = 0x0111;
}

/// The ServiceID rdma_cm uses for `port` of port space `ps` (`rdma_get_service_id`).
pub const fn service_id(ps: u16, port: u16) -> u64 {
    ((ps as u64) << 16) | port as u64
}

/// The port space and port of an rdma_cm ServiceID, if it is one (bits 63:32 zero).
pub const fn service_port(service_id: u64) -> Option<(u16, u16)> {
    if service_id >> 32 != 0 {
        return None;
    }
    Some(((service_id >> 16) as u16, service_id as u16))
}

/// REJ reasons (`enum ib_cm_rej_reason`), the ones an RoCE CM sends or a user sees.
pub mod rej_reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No resources.
    pub const NO_RESOURCES: u16 = 3;
    /// A timeout (the ARI holds the sender's CA GUID).
    pub const TIMEOUT: u16 = 4;
    /// Unsupported request.
    pub const UNSUPPORTED: u16 = 5;
    /// Invalid comm ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid comm instance.
    pub const INVALID_COMM_INSTANCE: u16 = 7;
    /// Invalid ServiceID: nobody listens for it.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// Stale connection: the (QPN, CA GUID) is already connected, or in timewait.
    pub const STALE_CONN: u16 = 10;
    /// Invalid GID: no route back to the sender.
    pub const INVALID_GID: u16 = 12;
    /// Invalid MTU.
    pub const INVALID_MTU: u16 = 26;
    /// Insufficient responder resources.
    pub const INSUFFICIENT_RESP_RES: u16 = 27;
    /// Consumer defined: the application said no (`rdma_reject`).
    pub const CONSUMER_DEFINED: u16 = 28;
    /// Invalid RNR retry.
    pub const INVALID_RNR_RETRY: u16 = 29;
    /// Duplicate local comm ID.
    pub const DUPLICATE_LOCAL_COMM_ID: u16 = 30;
    /// Invalid class version.
    pub const INVALID_CLASS_VERSION: u16 = 31;
    /// Vendor option not supported (ECE).
    pub const VENDOR_OPTION_NOT_SUPPORTED: u16 = 35;
}

/// The name of a REJ reason, for logs and `ferroce pcap`.
pub const fn rej_reason_str(reason: u16) -> &'static str {
    match reason {
        1 => "no QP",
        2 => "no EEC",
        3 => "no resources",
        4 => "timeout",
        5 => "unsupported",
        6 => "invalid comm ID",
        7 => "invalid comm instance",
        8 => "invalid service ID",
        9 => "invalid transport type",
        10 => "stale connection",
        11 => "RDC does not exist",
        12 => "invalid GID",
        13 => "invalid LID",
        14 => "invalid SL",
        15 => "invalid traffic class",
        16 => "invalid hop limit",
        17 => "invalid packet rate",
        18..=23 => "invalid alternate path",
        24 => "port CM redirect",
        25 => "port redirect",
        26 => "invalid MTU",
        27 => "insufficient responder resources",
        28 => "consumer defined",
        29 => "invalid RNR retry",
        30 => "duplicate local comm ID",
        31 => "invalid class version",
        32 => "invalid flow label",
        33 => "invalid alternate flow label",
        35 => "vendor option not supported",
        _ => "unknown reason",
    }
}

/// One CM message read from a MAD: its fields, and (borrowed from the MAD) its private data
/// area, whole. LAP and APR, which RoCE does not use, are [`Message::Other`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    /// ConnectRequest.
    Req(req::Repr, &'a [u8]),
    /// MessageReceiptAcknowledgement.
    Mra(mra::Repr, &'a [u8]),
    /// ConnectReject; the third field is the ARI area.
    Rej(rej::Repr, &'a [u8], &'a [u8]),
    /// ConnectReply.
    Rep(rep::Repr, &'a [u8]),
    /// ReadyToUse.
    Rtu(rtu::Repr, &'a [u8]),
    /// DisconnectRequest.
    Dreq(dreq::Repr, &'a [u8]),
    /// DisconnectReply.
    Drep(drep::Repr, &'a [u8]),
    /// ServiceIDResolutionRequest.
    SidrReq(sidr_req::Repr, &'a [u8]),
    /// ServiceIDResolutionResponse; the third field is the additional information area.
    SidrRep(sidr_rep::Repr, &'a [u8], &'a [u8]),
    /// Another AttributeID (LAP, APR, or unknown), kept by value.
    Other(u16),
}

impl<'a> Message<'a> {
    /// Reads a CM MAD: the common header must say BaseVersion 1, class CM, ClassVersion 2,
    /// method Send, and the MAD must be whole (256 bytes).
    ///
    /// # Errors
    /// [`Error::Truncated`] for fewer than 256 bytes, [`Error::BadMadHeader`] for another
    /// base or class version, class or method.
    pub fn parse(mad_bytes: &'a [u8]) -> Result<(mad::Repr, Message<'a>)> {
        if mad_bytes.len() < MAD_LEN {
            return Err(Error::Truncated);
        }
        let hdr = mad::Repr::parse(&mad::Packet::new_checked(mad_bytes)?)?;
        if hdr.base_version != 1
            || hdr.mgmt_class != MGMT_CLASS_CM
            || hdr.class_version != CM_CLASS_VERSION
            || hdr.method != METHOD_SEND
        {
            return Err(Error::BadMadHeader);
        }
        let d = &mad_bytes[mad::HEADER_LEN..MAD_LEN];
        macro_rules! read {
            ($m:ident) => {{
                let p = $m::Packet::new_checked(d)?;
                ($m::Repr::parse(&p)?, &d[$m::PRIVATE_DATA_OFFSET..])
            }};
        }
        let m = match hdr.attribute_id {
            req::ATTRIBUTE_ID => {
                let (r, pd) = read!(req);
                Message::Req(r, pd)
            }
            mra::ATTRIBUTE_ID => {
                let (r, pd) = read!(mra);
                Message::Mra(r, pd)
            }
            rej::ATTRIBUTE_ID => {
                let (r, pd) = read!(rej);
                Message::Rej(r, &d[rej::ARI_OFFSET..rej::ARI_OFFSET + rej::ARI_LEN], pd)
            }
            rep::ATTRIBUTE_ID => {
                let (r, pd) = read!(rep);
                Message::Rep(r, pd)
            }
            rtu::ATTRIBUTE_ID => {
                let (r, pd) = read!(rtu);
                Message::Rtu(r, pd)
            }
            dreq::ATTRIBUTE_ID => {
                let (r, pd) = read!(dreq);
                Message::Dreq(r, pd)
            }
            drep::ATTRIBUTE_ID => {
                let (r, pd) = read!(drep);
                Message::Drep(r, pd)
            }
            sidr_req::ATTRIBUTE_ID => {
                let (r, pd) = read!(sidr_req);
                Message::SidrReq(r, pd)
            }
            sidr_rep::ATTRIBUTE_ID => {
                let (r, pd) = read!(sidr_rep);
                let info = &d[sidr_rep::INFO_OFFSET..sidr_rep::INFO_OFFSET + sidr_rep::INFO_LEN];
                Message::SidrRep(r, info, pd)
            }
            other => Message::Other(other),
        };
        Ok((hdr, m))
    }

    /// The AttributeID of this message.
    pub const fn attribute_id(&self) -> u16 {
        match self {
            Message::Req(..) => req::ATTRIBUTE_ID,
            Message::Mra(..) => mra::ATTRIBUTE_ID,
            Message::Rej(..) => rej::ATTRIBUTE_ID,
            Message::Rep(..) => rep::ATTRIBUTE_ID,
            Message::Rtu(..) => rtu::ATTRIBUTE_ID,
            Message::Dreq(..) => dreq::ATTRIBUTE_ID,
            Message::Drep(..) => drep::ATTRIBUTE_ID,
            Message::SidrReq(..) => sidr_req::ATTRIBUTE_ID,
            Message::SidrRep(..) => sidr_rep::ATTRIBUTE_ID,
            Message::Other(a) => *a,
        }
    }

    /// The message's name (REQ, REP, ...).
    pub const fn name(&self) -> &'static str {
        match self {
            Message::Req(..) => "REQ",
            Message::Mra(..) => "MRA",
            Message::Rej(..) => "REJ",
            Message::Rep(..) => "REP",
            Message::Rtu(..) => "RTU",
            Message::Dreq(..) => "DREQ",
            Message::Drep(..) => "DREP",
            Message::SidrReq(..) => "SIDR_REQ",
            Message::SidrRep(..) => "SIDR_REP",
            Message::Other(0x0019) => "LAP",
            Message::Other(0x001A) => "APR",
            Message::Other(_) => "unknown CM attribute",
        }
    }

    /// Writes the whole MAD (256 bytes into `buf`): a CM common header with `transaction_id`,
    /// the message's fields, its info area and private data (each zero-padded); every
    /// reserved byte zero.
    ///
    /// # Errors
    /// [`Error::Truncated`] if `buf` is shorter than 256 bytes; [`Error::BadLength`] if a
    /// private data or info area is longer than the message's, or for
    /// [`Message::Other`] (nothing to write).
    pub fn emit(&self, transaction_id: u64, buf: &mut [u8]) -> Result<()> {
        if buf.len() < MAD_LEN {
            return Err(Error::Truncated);
        }
        if matches!(self, Message::Other(_)) {
            return Err(Error::BadLength);
        }
        let buf = &mut buf[..MAD_LEN];
        buf.fill(0);
        mad::Repr {
            base_version: 1,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id: self.attribute_id(),
            attribute_modifier: 0,
        }
        .emit(&mut mad::Packet::new_unchecked(&mut buf[..mad::HEADER_LEN]));
        let d = &mut buf[mad::HEADER_LEN..];
        macro_rules! write {
            ($m:ident, $r:expr, $pd:expr) => {{
                let mut p = $m::Packet::new_unchecked(&mut *d);
                $r.emit(&mut p);
                p.set_private_data($pd)?;
            }};
        }
        fn area(d: &mut [u8], off: usize, len: usize, data: &[u8]) -> Result<()> {
            if data.len() > len {
                return Err(Error::BadLength);
            }
            d[off..off + data.len()].copy_from_slice(data);
            Ok(())
        }
        match self {
            Message::Req(r, pd) => write!(req, r, pd),
            Message::Mra(r, pd) => write!(mra, r, pd),
            Message::Rej(r, ari, pd) => {
                write!(rej, r, pd);
                area(d, rej::ARI_OFFSET, rej::ARI_LEN, ari)?;
            }
            Message::Rep(r, pd) => write!(rep, r, pd),
            Message::Rtu(r, pd) => write!(rtu, r, pd),
            Message::Dreq(r, pd) => write!(dreq, r, pd),
            Message::Drep(r, pd) => write!(drep, r, pd),
            Message::SidrReq(r, pd) => write!(sidr_req, r, pd),
            Message::SidrRep(r, info, pd) => {
                write!(sidr_rep, r, pd);
                area(d, sidr_rep::INFO_OFFSET, sidr_rep::INFO_LEN, info)?;
            }
            Message::Other(_) => {}
        }
        Ok(())
    }
}

/// A CM time value (4.096 µs × 2^t, IBTA 12.6) in milliseconds as the kernel approximates it
/// (`cm_convert_to_ms`: 2^(t−8), at least 1).
pub const fn timeout_ms(t: u8) -> u64 {
    let t = if t > 31 { 31 } else { t };
    1 << t.saturating_sub(8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_captured_mad_reads_and_writes_back_byte_for_byte() {
        for name in ["req", "rep", "rtu", "dreq", "drep"] {
            let m = golden::mad(name);
            let (hdr, msg) = Message::parse(&m).unwrap();
            assert_eq!(msg.name().to_ascii_lowercase(), name);
            let mut out = [0xEEu8; MAD_LEN];
            msg.emit(hdr.transaction_id, &mut out).unwrap();
            assert_eq!(out, m, "{name}");
        }
    }

    #[test]
    fn rdma_cm_values_of_the_capture() {
        let m = golden::mad("req");
        let (hdr, Message::Req(r, pd)) = Message::parse(&m).unwrap() else {
            panic!("a REQ");
        };
        assert_eq!(hdr.transaction_id, 0x0000_0002_CE75_2314);
        assert_eq!(service_port(r.service_id), Some((port_space::TCP, 7471)));
        let h = cma_hdr::Repr::parse(&cma_hdr::Packet::new_checked(pd).unwrap()).unwrap();
        assert_eq!(h.src(), Some(core::net::IpAddr::from([10, 77, 0, 12])));
        assert_eq!(h.dst(), Some(core::net::IpAddr::from([10, 77, 0, 11])));
        assert_eq!(h.port, 46425);
        assert_eq!(pd.len(), 92);
    }

    #[test]
    fn malformed_mads_are_errors() {
        let m = golden::mad("rtu");
        assert_eq!(Message::parse(&m[..255]), Err(Error::Truncated));
        for (at, v) in [(0, 2u8), (1, 0x04), (2, 1), (3, 0x83)] {
            let mut bad = m;
            bad[at] = v;
            assert_eq!(Message::parse(&bad), Err(Error::BadMadHeader), "byte {at}");
        }
        let mut lap = m;
        lap[17] = 0x19;
        assert_eq!(Message::parse(&lap).unwrap().1, Message::Other(0x19));
        let mut out = [0u8; MAD_LEN];
        assert_eq!(
            Message::Other(0x19).emit(1, &mut out),
            Err(Error::BadLength)
        );
        assert_eq!(
            Message::Rtu(rtu::Repr::default(), &[0; 225]).emit(1, &mut out),
            Err(Error::BadLength)
        );
        assert_eq!(
            Message::Rtu(rtu::Repr::default(), &[]).emit(1, &mut out[..255]),
            Err(Error::Truncated)
        );
    }

    #[test]
    fn service_ids_and_times() {
        assert_eq!(service_id(port_space::TCP, 7174), 0x0000_0000_0106_1C06);
        assert_eq!(service_port(0x0200_0000_0000_0001), None);
        assert_eq!(
            (timeout_ms(20), timeout_ms(19), timeout_ms(3)),
            (4096, 2048, 1)
        );
        assert_eq!(timeout_ms(255), 1 << 23);
        assert_eq!(
            rej_reason_str(rej_reason::INVALID_SERVICE_ID),
            "invalid service ID"
        );
    }

    proptest! {
        #[test]
        fn any_mad_reads_without_panic_and_writes_back_to_what_it_read(
            b in proptest::collection::vec(any::<u8>(), MAD_LEN),
            attr in 0x10u16..0x1b,
        ) {
            let mut b = b;
            b[..4].copy_from_slice(&[1, MGMT_CLASS_CM, CM_CLASS_VERSION, METHOD_SEND]);
            b[16..18].copy_from_slice(&attr.to_be_bytes());
            let (hdr, msg) = Message::parse(&b).unwrap();
            let mut out = [0u8; MAD_LEN];
            if msg.emit(hdr.transaction_id, &mut out).is_ok() {
                let (hdr2, msg2) = Message::parse(&out).unwrap();
                prop_assert_eq!(hdr2.transaction_id, hdr.transaction_id);
                prop_assert_eq!(msg2, msg);
            }
        }
    }
}
