//! The connection manager's MADs inside QP1 datagrams, field by field: what `ferroce pcap`
//! prints under a CM packet's line.

use std::fmt::Write as _;

use ferroce_wire::cm::{self, Message, cma_hdr};
use ferroce_wire::mad::MGMT_CLASS_CM;
use ferroce_wire::{FieldValue, PacketRepr};

/// What a QP1 datagram's payload is to the CM decoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmVerdict {
    /// Not a CM MAD (another QP, another management class): nothing to print.
    NotCm,
    /// A CM MAD: the lines to print under the packet.
    Decoded(Vec<String>),
    /// A MAD of the CM class that does not read as one: why.
    Malformed(String),
}

/// Decodes the CM MAD a UD packet to QP1 carries.
pub fn examine(repr: &PacketRepr<'_>) -> CmVerdict {
    if repr.bth.dest_qp != 1 || repr.ext.deth.is_none() {
        return CmVerdict::NotCm;
    }
    let mad = repr.payload;
    if mad.len() < 2 || mad[1] != MGMT_CLASS_CM {
        return CmVerdict::NotCm;
    }
    match Message::parse(mad) {
        Ok((hdr, msg)) => CmVerdict::Decoded(lines(hdr.transaction_id, &msg)),
        Err(e) => CmVerdict::Malformed(format!("CM MAD: {e}")),
    }
}

fn value(v: FieldValue<'_>) -> String {
    match v {
        FieldValue::Int(n) if n < 256 => n.to_string(),
        FieldValue::Int(n) => format!("{n:#x}"),
        FieldValue::Bytes(b) if b.len() == 16 => {
            std::net::Ipv6Addr::from(<[u8; 16]>::try_from(b).unwrap_or([0; 16])).to_string()
        }
        FieldValue::Bytes(b) => b.iter().map(|x| format!("{x:02x}")).collect(),
    }
}

/// `name=value` for every field of a `Repr`, wrapped into lines of a readable width.
macro_rules! field_lines {
    ($out:expr, $repr:expr) => {{
        let mut line = String::from("   ");
        $repr.fields(|name, v| {
            if line.len() > 90 {
                $out.push(std::mem::replace(&mut line, String::from("   ")));
            }
            let _ = write!(line, " {name}={}", value(v));
        });
        if line.len() > 3 {
            $out.push(line);
        }
    }};
}

fn area(out: &mut Vec<String>, what: &str, bytes: &[u8]) {
    let used = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    if used == 0 {
        out.push(format!("    {what}: {} bytes, all zero", bytes.len()));
    } else {
        let hex: String = bytes[..used].iter().map(|b| format!("{b:02x}")).collect();
        out.push(format!(
            "    {what}: {} bytes, {used} up to the last non-zero: {hex}",
            bytes.len()
        ));
    }
}

fn lines(tid: u64, msg: &Message<'_>) -> Vec<String> {
    let mut out = vec![format!("  CM {} tid={tid:#018x}", msg.name())];
    match msg {
        Message::Req(r, pd) => {
            field_lines!(out, r);
            if let Some((ps, port)) = cm::service_port(r.service_id) {
                out.push(format!("    service: port space {ps:#06x}, port {port}"));
            }
            // The IP port spaces start the private data with the rdma_cm header.
            let hdr = cma_hdr::Packet::new_checked(*pd).and_then(|p| cma_hdr::Repr::parse(&p));
            match hdr.map(|h| (h, h.src(), h.dst())) {
                Ok((h, Some(s), Some(d))) => {
                    out.push(format!(
                        "    rdma_cm header: version {} IPv{} port {} {s} -> {d}",
                        h.cma_version, h.ip_version, h.port
                    ));
                    area(&mut out, "user private data", &pd[cma_hdr::HEADER_LEN..]);
                }
                _ => area(&mut out, "private data", pd),
            }
        }
        Message::Rep(r, pd) => {
            field_lines!(out, r);
            area(&mut out, "private data", pd);
        }
        Message::Rtu(r, pd) => {
            field_lines!(out, r);
            area(&mut out, "private data", pd);
        }
        Message::Rej(r, ari, pd) => {
            field_lines!(out, r);
            out.push(format!("    reason: {}", cm::rej_reason_str(r.reason)));
            area(&mut out, "ARI", ari);
            area(&mut out, "private data", pd);
        }
        Message::Mra(r, pd) => {
            field_lines!(out, r);
            area(&mut out, "private data", pd);
        }
        Message::Dreq(r, pd) => {
            field_lines!(out, r);
            area(&mut out, "private data", pd);
        }
        Message::Drep(r, pd) => {
            field_lines!(out, r);
            area(&mut out, "private data", pd);
        }
        Message::SidrReq(r, pd) => {
            field_lines!(out, r);
            area(&mut out, "private data", pd);
        }
        Message::SidrRep(r, info, pd) => {
            field_lines!(out, r);
            area(&mut out, "additional info", info);
            area(&mut out, "private data", pd);
        }
        Message::Other(_) => {}
    }
    out
}
