//! `ferroce fuzz --pingpong`: cases against an unmodified `ibv_rc_pingpong -g 1 -n 1 -s SIZE`
//! server, one per server run, with no agent: the client's address exchange, the case's
//! packets, then the run's ping and pong, which must still work.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ferroce_transport::rng::Rng;
use ferroce_wire::{NakCode, Opcode};

use super::packets::step;
use crate::fuzz::case::{Body, CampaignId as Id, Case, Expect, PacketSpec, Packets};
use crate::fuzz::harness::{Agent, Harness, Verdict};
use crate::fuzz::oracle::judge;
use crate::fuzz::packet::{Answer, Conn, PORT, build};
use crate::tools::pingpong::Dest;

/// The case `index` for an unmodified `ibv_rc_pingpong` server (`-n 1 -s size`): one case per
/// server run, made only of what leaves its QP usable (the server's QP allows no remote access
/// and a fatal NAK would end it), since the run's ping must still be answered after it: a SEND
/// past the expected PSN (sequence NAK, once), and SENDs a receiver must drop silently (another
/// P_Key, TVer, DestQP, a wrong ICRC).
pub fn generate(seed: u64, index: u32, size: u32) -> Case {
    let mut rng = Rng::new(seed ^ 0x9199_0000_0000 ^ u64::from(index) << 20);
    let send = |psn_off| PacketSpec {
        payload_len: size,
        ..PacketSpec::new(Opcode::RC_SEND_ONLY, psn_off)
    };
    let mut case = Case {
        campaign: Id::Psn,
        seed,
        index,
        what: String::new(),
        rule: "",
        start_psn: rng.below(1 << 24) as u32,
        body: Body::Packets(Packets::default()),
    };
    let mut steps = Vec::new();
    match rng.below(6) {
        0 => {
            let k = 1 + rng.below(1000) as u32;
            case.what = format!("pingpong-psn-ahead-{k}");
            case.rule =
                "a request past the expected PSN is NAKed (sequence error) with the expected PSN";
            steps.push(step(send(k), Expect::Nak(NakCode::PsnSeqError, 0)));
            steps.push(step(send(k + 1), Expect::Silence));
        }
        1 => {
            case.campaign = Id::Header;
            case.what = "pingpong-header-pkey".into();
            case.rule = "a P_Key of another partition is dropped silently";
            steps.push(step(
                PacketSpec {
                    pkey: Some(0x1234),
                    ..send(0)
                },
                Expect::Silence,
            ));
        }
        2 => {
            case.campaign = Id::Header;
            let tver = 1 + rng.below(15) as u8;
            case.what = format!("pingpong-header-tver-{tver}");
            case.rule = "a transport header version other than 0 is dropped silently";
            steps.push(step(PacketSpec { tver, ..send(0) }, Expect::Silence));
        }
        3 => {
            case.campaign = Id::Header;
            case.what = "pingpong-header-bad-icrc".into();
            case.rule = "a packet whose ICRC is wrong is dropped silently";
            steps.push(step(
                PacketSpec {
                    bad_icrc: true,
                    ..send(0)
                },
                Expect::Silence,
            ));
        }
        4 => {
            case.campaign = Id::Header;
            case.what = "pingpong-header-wrong-qpn".into();
            case.rule = "a packet for a QP that does not exist is dropped silently";
            steps.push(step(
                PacketSpec {
                    qpn_xor: 0x100,
                    ..send(0)
                },
                Expect::Silence,
            ));
        }
        _ => {
            case.what = "pingpong-psn-behind".into();
            case.rule =
                "a request before the expected PSN, never seen, is a duplicate: not executed";
            steps.push(step(send(0xFF_FFF0), Expect::Anything));
        }
    }
    case.body = Body::Packets(Packets {
        steps,
        ..Packets::default()
    });
    case
}

/// One case against an unmodified `ibv_rc_pingpong -g 1 -n 1 -s SIZE` server at `server`
/// (its TCP port): the client's address exchange, the case's packets, then the run's ping
/// (which must be ACKed), the server's pong (which we ACK, so its run ends as a client's
/// would). A server that does not take the ping is a hang.
///
/// # Errors
/// A server that cannot be reached or breaks the exchange (the caller's crash).
pub fn run(
    server: SocketAddr,
    local: Ipv4Addr,
    case: &Case,
    size: u32,
    window: Duration,
    pcap: Option<&std::path::Path>,
) -> io::Result<Verdict> {
    let std::net::IpAddr::V4(target) = server.ip() else {
        return Err(io::Error::other("an IPv4 server"));
    };
    // The server listens again between runs: wait for it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tcp = loop {
        match TcpStream::connect_timeout(&server, Duration::from_secs(2)) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut rng = Rng::new(case.seed ^ u64::from(case.index).rotate_left(40));
    let qpn = 0x100 + rng.below(0xFF_FE00) as u32;
    let me = Dest {
        lid: 0,
        qpn,
        psn: case.start_psn,
        gid: local.to_ipv6_mapped(),
    };
    tcp.write_all(&me.to_wire())?;
    let mut buf = [0u8; 52];
    tcp.read_exact(&mut buf)?;
    let rem = Dest::from_wire(&buf).map_err(|e| io::Error::other(e.to_string()))?;
    tcp.write_all(b"done\0")?;
    // The server's QP is connected now; its region grants no remote access (no R_Key).
    let mut r = Harness::new(Agent::over(tcp)?, local, target, window, pcap)?;
    let conn = Conn {
        local,
        target,
        local_qpn: qpn,
        target_qpn: rem.qpn,
        start_psn: case.start_psn,
        rkey: 0,
        addr: 0,
    };
    for (i, s) in case.steps().iter().enumerate() {
        r.send(&build(&s.packet, &conn))?;
        let answers = r.collect(&conn, window)?;
        if let Err(why) = judge(s.expect, &answers, 0) {
            r.flush();
            return Ok(Verdict::Deviates { step: i, why });
        }
    }
    // The run's ping at the expected PSN: ACKed, then the pong comes.
    let ping = PacketSpec {
        payload_len: size,
        ..PacketSpec::new(ferroce_wire::Opcode::RC_SEND_ONLY, 0)
    };
    r.send(&build(&ping, &conn))?;
    let is_pong = |x: &Answer| x.opcode == ferroce_wire::Opcode::RC_SEND_ONLY;
    let answers = r.collect_until(&conn, window.max(Duration::from_secs(5)), |a| {
        a.iter().any(Answer::is_ack) && a.iter().any(is_pong)
    })?;
    let acks: Vec<Answer> = answers.iter().filter(|a| !is_pong(a)).cloned().collect();
    if judge(Expect::Ack(0), &acks, 0).is_err() {
        r.flush();
        return Ok(Verdict::Hang(format!(
            "after {}, the run's ping got no ACK",
            case.what
        )));
    }
    // The pong: a SEND ONLY from the server's PSN; ACK it so the server's run completes.
    let Some(pong) = answers.iter().find(|x| is_pong(x)) else {
        r.flush();
        return Ok(Verdict::Hang(format!(
            "after {}, the server sent no pong",
            case.what
        )));
    };
    let pong_psn = case.start_psn.wrapping_add(pong.psn_off) & 0xFF_FFFF;
    if pong_psn != rem.psn {
        r.flush();
        return Ok(Verdict::Deviates {
            step: case.steps().len(),
            why: format!(
                "the pong's PSN {pong_psn:#x} is not the server's first, {:#x}",
                rem.psn
            ),
        });
    }
    let ack = ferroce_wire::PacketRepr {
        bth: ferroce_wire::BthRepr::new(
            ferroce_wire::Opcode::RC_ACKNOWLEDGE,
            rem.qpn,
            ferroce_wire::Psn::new(pong_psn),
        ),
        ext: ferroce_wire::ExtHeaders {
            aeth: Some(ferroce_wire::AethRepr {
                syndrome: ferroce_wire::Syndrome::ACK_UNLIMITED.0,
                msn: 1,
            }),
            ..Default::default()
        },
        payload: &[],
    };
    let mut b = vec![0u8; ack.buffer_len()];
    ack.emit(&mut b);
    ferroce_wire::IcrcContext::v4(local, target, 0, PORT, PORT).fill(&mut b);
    r.send(&b)?;
    r.flush();
    Ok(Verdict::Conforms)
}
