//! Decoding a capture into one line per RoCEv2 packet: what `ferroce pcap` prints.

use std::fmt;
use std::io::{Read, Write};
use std::time::Duration;

use ferroce_wire::PacketRepr;

use crate::cm_decode::CmVerdict;
use crate::frame::{self, Decoded};
use ferroce::pcap::{PcapError, Reader};

/// Counts over a capture's RoCEv2 packets (UDP to port 4791).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// RoCEv2 packets seen: `icrc_ok + icrc_bad + malformed`.
    pub packets: u64,
    /// Packets that parsed and whose ICRC is right.
    pub icrc_ok: u64,
    /// Packets that parsed and whose ICRC is wrong.
    pub icrc_bad: u64,
    /// Packets whose IP/UDP framing or RoCEv2 headers are broken.
    pub malformed: u64,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} packets, {} icrc ok, {} icrc bad, {} malformed",
            self.packets, self.icrc_ok, self.icrc_bad, self.malformed
        )
    }
}

/// Why a capture could not be decoded to the end.
#[derive(Debug)]
#[non_exhaustive]
pub enum DecodeError {
    /// The pcap file is bad.
    Pcap(PcapError),
    /// Writing the output failed.
    Output(std::io::Error),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Pcap(e) => e.fmt(f),
            DecodeError::Output(e) => write!(f, "writing output: {e}"),
        }
    }
}

impl std::error::Error for DecodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DecodeError::Pcap(e) => Some(e),
            DecodeError::Output(e) => Some(e),
        }
    }
}

/// The verdict on one RoCEv2 datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// Headers parsed; whether the ICRC is right.
    Parsed {
        /// The decoded packet.
        repr: PacketRepr<'a>,
        /// ICRC verified over the captured IP and UDP headers.
        icrc_ok: bool,
    },
    /// The packet is broken; why.
    Malformed(String),
}

/// Parses a RoCEv2 datagram and checks its ICRC.
pub fn examine<'a>(d: &frame::RoceDatagram<'a>) -> Verdict<'a> {
    match PacketRepr::parse(d.udp_payload) {
        Ok(repr) => Verdict::Parsed {
            repr,
            icrc_ok: d.icrc_ok(),
        },
        Err(e) => Verdict::Malformed(e.to_string()),
    }
}

/// Reads a classic pcap and writes one line per RoCEv2 packet and the [`Summary`] line.
///
/// # Errors
/// [`DecodeError`] if the file is not a readable pcap (the lines before the fault are written)
/// or the output cannot be written.
pub fn decode_pcap<R: Read, W: Write>(input: R, out: &mut W) -> Result<Summary, DecodeError> {
    let mut reader = Reader::new(input).map_err(DecodeError::Pcap)?;
    let link = reader.link_type();
    let mut sum = Summary::default();
    let mut first: Option<Duration> = None;
    let mut index = 0u64;
    while let Some(rec) = reader.next_record().map_err(DecodeError::Pcap)? {
        index += 1;
        let t0 = *first.get_or_insert(rec.timestamp);
        let t = rec.timestamp.saturating_sub(t0).as_secs_f64();
        let line = match frame::decode(link, &rec.data) {
            Decoded::Other => continue,
            Decoded::Malformed(why) => {
                sum.malformed += 1;
                format!("{index} {t:.6} MALFORMED {why}")
            }
            Decoded::Roce(d) => {
                let head = format!("{index} {t:.6} {} → {}", d.src.ip(), d.dst.ip());
                match examine(&d) {
                    Verdict::Parsed { repr, icrc_ok } => {
                        let icrc = match (icrc_ok, d.rxe_flush_icrc()) {
                            (true, true) => "ok(rxe FLUSH form)",
                            (true, false) => "ok",
                            (false, _) => "BAD",
                        };
                        let mut line = format!("{head} {repr} icrc={icrc}");
                        match crate::cm_decode::examine(&repr) {
                            CmVerdict::NotCm => {}
                            CmVerdict::Decoded(lines) => {
                                for l in lines {
                                    line.push('\n');
                                    line.push_str(&l);
                                }
                            }
                            CmVerdict::Malformed(why) => {
                                // Counted once: as malformed, not as an ICRC verdict.
                                sum.malformed += 1;
                                sum.packets += 1;
                                writeln!(out, "{line} MALFORMED {why}")
                                    .map_err(DecodeError::Output)?;
                                continue;
                            }
                        }
                        if icrc_ok {
                            sum.icrc_ok += 1;
                        } else {
                            sum.icrc_bad += 1;
                        }
                        line
                    }
                    Verdict::Malformed(why) => {
                        sum.malformed += 1;
                        format!("{head} MALFORMED {why} ({} bytes)", d.udp_payload.len())
                    }
                }
            }
        };
        sum.packets += 1;
        writeln!(out, "{line}").map_err(DecodeError::Output)?;
    }
    writeln!(out, "{sum}").map_err(DecodeError::Output)?;
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroce::pcap::{LINKTYPE_ETHERNET, Writer};
    use ferroce_wire::{BthRepr, ExtHeaders, IcrcContext, Opcode, Psn};
    use std::net::{IpAddr, SocketAddr};

    fn roce_frame(src: SocketAddr, dst: SocketAddr, corrupt: bool) -> Vec<u8> {
        let repr = PacketRepr {
            bth: BthRepr::new(Opcode::RC_SEND_ONLY, 0x11, Psn::new(9)).with_ack_req(true),
            ext: ExtHeaders::default(),
            payload: b"ferroce!",
        };
        let mut p = vec![0u8; repr.buffer_len()];
        repr.emit(&mut p);
        let ctx = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => IcrcContext::v4(s, d, 0x42, src.port(), dst.port()),
            (IpAddr::V6(s), IpAddr::V6(d)) => IcrcContext::v6(s, d, src.port(), dst.port()),
            _ => unreachable!(),
        };
        ctx.fill(&mut p);
        if corrupt {
            p[13] ^= 1;
        }
        ferroce::pcap::encapsulate(src, dst, 0x42, &p)
    }

    #[test]
    fn ipv4_ipv6_good_bad_and_malformed() {
        let v4s: SocketAddr = "10.1.0.1:49152".parse().unwrap();
        let v4d: SocketAddr = "10.1.0.2:4791".parse().unwrap();
        let v6s: SocketAddr = "[fd00::1]:49152".parse().unwrap();
        let v6d: SocketAddr = "[fd00::2]:4791".parse().unwrap();
        let mut w = Writer::new(Vec::new(), LINKTYPE_ETHERNET).unwrap();
        w.write_record(Duration::from_secs(10), &roce_frame(v4s, v4d, false))
            .unwrap();
        w.write_record(Duration::from_millis(10_500), &roce_frame(v6s, v6d, false))
            .unwrap();
        w.write_record(Duration::from_secs(11), &roce_frame(v6s, v6d, true))
            .unwrap();
        // Not RoCE: skipped entirely.
        w.write_record(
            Duration::from_secs(12),
            &ferroce::pcap::encapsulate(v4s, "10.1.0.2:53".parse().unwrap(), 0, &[0; 12]),
        )
        .unwrap();
        // RoCE port, unknown opcode.
        w.write_record(
            Duration::from_secs(13),
            &ferroce::pcap::encapsulate(
                v4s,
                v4d,
                0,
                &[0x15, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0],
            ),
        )
        .unwrap();
        let file = w.into_inner().unwrap();
        let mut out = Vec::new();
        let sum = decode_pcap(&file[..], &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert_eq!(
            lines[0],
            "1 0.000000 10.1.0.1 → 10.1.0.2 RC_SEND_ONLY qp=0x000011 psn=0x000009 ack_req=1 payload=8 icrc=ok"
        );
        assert!(
            lines[1].starts_with("2 0.500000 fd00::1 → fd00::2 RC_SEND_ONLY")
                && lines[1].ends_with("icrc=ok")
        );
        assert!(lines[2].ends_with("icrc=BAD"), "{}", lines[2]);
        assert!(
            lines[3].starts_with("5 3.000000")
                && lines[3].contains("MALFORMED unknown BTH opcode 0x15"),
            "{}",
            lines[3]
        );
        assert_eq!(lines[4], "4 packets, 2 icrc ok, 1 icrc bad, 1 malformed");
        assert_eq!(
            sum,
            Summary {
                packets: 4,
                icrc_ok: 2,
                icrc_bad: 1,
                malformed: 1
            }
        );
    }

    /// A QP1 datagram whose MAD says class CM but is not one (ClassVersion 1) is malformed,
    /// counted once; a MAD of another class is only a packet.
    #[test]
    fn a_broken_cm_mad_is_malformed() {
        use ferroce_wire::DethRepr;
        let frame = |class: u8, version: u8| {
            let mut mad = [0u8; 256];
            mad[..4].copy_from_slice(&[1, class, version, 3]);
            mad[17] = 0x14;
            let repr = PacketRepr {
                bth: BthRepr::new(Opcode::UD_SEND_ONLY, 1, Psn::new(1)).with_ack_req(true),
                ext: ExtHeaders {
                    deth: Some(DethRepr {
                        qkey: ferroce_wire::GSI_QKEY,
                        src_qp: 1,
                    }),
                    ..Default::default()
                },
                payload: &mad,
            };
            let mut p = vec![0u8; repr.buffer_len()];
            repr.emit(&mut p);
            let (s, d): (SocketAddr, SocketAddr) = (
                "10.1.0.1:49152".parse().unwrap(),
                "10.1.0.2:4791".parse().unwrap(),
            );
            let (IpAddr::V4(sv), IpAddr::V4(dv)) = (s.ip(), d.ip()) else {
                unreachable!()
            };
            IcrcContext::v4(sv, dv, 0x42, s.port(), d.port()).fill(&mut p);
            ferroce::pcap::encapsulate(s, d, 0x42, &p)
        };
        let mut w = Writer::new(Vec::new(), LINKTYPE_ETHERNET).unwrap();
        w.write_record(Duration::ZERO, &frame(7, 2)).unwrap();
        w.write_record(Duration::ZERO, &frame(7, 1)).unwrap();
        w.write_record(Duration::ZERO, &frame(4, 1)).unwrap();
        let file = w.into_inner().unwrap();
        let mut out = Vec::new();
        let sum = decode_pcap(&file[..], &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("  CM RTU tid=0x0000000000000000"), "{text}");
        assert!(
            text.contains("MALFORMED CM MAD: MAD header is not a CM message"),
            "{text}"
        );
        assert_eq!(
            sum,
            Summary {
                packets: 3,
                icrc_ok: 2,
                icrc_bad: 0,
                malformed: 1
            }
        );
    }

    #[test]
    fn truncated_file_is_an_error() {
        let mut w = Writer::new(Vec::new(), LINKTYPE_ETHERNET).unwrap();
        let f = roce_frame(
            "10.1.0.1:1".parse().unwrap(),
            "10.1.0.2:4791".parse().unwrap(),
            false,
        );
        w.write_record(Duration::ZERO, &f).unwrap();
        w.write_record(Duration::ZERO, &f).unwrap();
        let file = w.into_inner().unwrap();
        let mut out = Vec::new();
        let err = decode_pcap(&file[..file.len() - 5], &mut out).unwrap_err();
        assert_eq!(err.to_string(), "file ends inside record 2");
        assert_eq!(String::from_utf8(out).unwrap().lines().count(), 1);
        assert!(decode_pcap(&b"garbage, not a capture"[..], &mut Vec::new()).is_err());
    }
}
