//! The target agent on a ferroce device: the line protocol of the lab's C peer
//! (`tests/interop/peer/rdma_peer.c`) served with ferroce's Rust API, so `ferroce fuzz --self`
//! aims at ferroce exactly as a campaign aims at kernel rxe through the C peer. One RC QP and
//! one region; every command answers one line.
//!
//! `CONNECT MTU IP QPN PSN RNR [RETRY TIMEOUT]` (RTR+RTS towards IP/QPN, `rq_psn` PSN)
//! → `QP qpn psn rkey addr`; `POST write|read|send OFF LEN RADDR RKEY ...` (a signaled work
//! request from the region at OFF) → `OK`; `WC` (≤ 120 s) → `WC wr_id status opcode byte_len
//! 0 0 0` or `NONE`; `RECV OFF LEN` → `OK`; `FILL OFF LEN SEED` (byte i =
//! (i·31 + SEED) & 255) → `OK`; `HASH OFF LEN` → `HASH hex` (FNV-1a 64); `RESET` (a fresh QP)
//! → `OK qpn`; `COUNTERS` → `CNT duplicate_request out_of_seq_request` (the device's
//! counters, as rxe's port hw_counters); `CMLISTEN PORT` (an rdma_cm listener on the device's
//! address that rejects every request, reason 28, for the `cm` campaign) → `OK`; `CMACCEPT
//! PORT` (one that accepts, for `--via-cm`: see `cm_accept`) → `OK`; `QUIT`.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpListener};

use ferroce::transport::{Mtu, QpType, RecvWr, SendFlags, SendWr, WrOpcode};
use ferroce::{AccessFlags, CompletionQueue, Device, MemoryRegion, ProtectionDomain, QueuePair};

/// The PSN this agent's QPs send with (rdma_peer's is clock-derived; any value will do).
const MY_PSN: u32 = 0x5A_A5A5;

fn new_qp(pd: &ProtectionDomain, cq: &CompletionQueue) -> ferroce::Result<QueuePair> {
    pd.qp(QpType::Rc, cq)
        .max_send_wr(64)
        .max_recv_wr(64)
        .build()
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn mtu_of(n: u32) -> Mtu {
    match n {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        _ => Mtu::Mtu1024,
    }
}

/// An rdma_cm ID listening at `addr`:`port` (TCP port space) and its event channel.
fn listener(
    addr: IpAddr,
    port: u16,
) -> ferroce::Result<(ferroce::cm::EventChannel, ferroce::cm::CmId)> {
    use ferroce::cm::{CmId, EventChannel, PortSpace};
    let ch = EventChannel::new()?;
    let id = CmId::new(&ch, PortSpace::Tcp)?;
    id.bind_addr(std::net::SocketAddr::new(addr, port))?;
    id.listen(16)?;
    Ok((ch, id))
}

/// An rdma_cm listener at `addr`:`port` whose thread rejects every connection request.
fn cm_listen(addr: IpAddr, port: u16) -> ferroce::Result<()> {
    use ferroce::cm::CmEventType;
    let (ch, id) = listener(addr, port)?;
    std::thread::spawn(move || {
        let _listener = id;
        loop {
            let e = ch.get_event();
            if e.event == CmEventType::ConnectRequest {
                let _ = e.id.reject(b"ferroce fuzz-agent");
            }
        }
    });
    Ok(())
}

/// An rdma_cm listener at `addr`:`port` that accepts every connection with a QP of its own
/// and a region of `mem` bytes filled with the pattern of the seed in the request's private
/// data (8 bytes, then 1 if a receive of 4 KiB is to be posted); the REP's private data names
/// the region: R_Key (4 bytes) and address (8), big endian. The connection's objects live
/// until it is disconnected.
fn cm_accept(addr: IpAddr, port: u16, mem: usize) -> ferroce::Result<()> {
    use ferroce::cm::{CmEventType, ConnParam};
    let (ch, id) = listener(addr, port)?;
    std::thread::spawn(move || {
        let _listener = id;
        let mut live = Vec::new();
        loop {
            let e = ch.get_event();
            match e.event {
                CmEventType::ConnectRequest => {
                    let pd8 = &e.param.private_data;
                    let seed = pd8
                        .get(..8)
                        .and_then(|b| b.try_into().ok())
                        .map_or(0, u64::from_be_bytes);
                    let recv = pd8.get(8) == Some(&1);
                    let accepted = (|| -> ferroce::Result<_> {
                        let ctx =
                            e.id.context()
                                .ok_or(ferroce::Error::InvalidArgument("no device"))?;
                        let pd = ctx.alloc_pd();
                        let access = AccessFlags::LOCAL_WRITE
                            | AccessFlags::REMOTE_WRITE
                            | AccessFlags::REMOTE_READ
                            | AccessFlags::REMOTE_ATOMIC;
                        let mr = pd.reg_mr(mem, access)?;
                        let bytes: Vec<u8> = (0..mem as u64)
                            .map(|i| (i.wrapping_mul(31).wrapping_add(seed) & 255) as u8)
                            .collect();
                        mr.write(0, &bytes)?;
                        let qp = e.id.create_qp(&pd, None)?;
                        if recv {
                            qp.post_recv(&RecvWr::new(1, mr.sge(0, 4096)))?;
                        }
                        let r = mr.remote();
                        let mut data = r.rkey.to_be_bytes().to_vec();
                        data.extend_from_slice(&r.addr.to_be_bytes());
                        e.id.accept(&ConnParam {
                            private_data: data,
                            ..ConnParam::defaults()
                        })?;
                        Ok((e.id.clone(), qp, mr, pd))
                    })();
                    match accepted {
                        Ok(objects) => live.push(objects),
                        Err(err) => {
                            log::debug!("fuzz-agent: a connection not accepted: {err}");
                            let _ = e.id.reject(b"");
                        }
                    }
                }
                CmEventType::Disconnected => {
                    let _ = e.id.disconnect();
                    let gone = e.id.qp().map(|q| q.qp_num());
                    live.retain(|(_, qp, ..)| Some(qp.qp_num()) != gone);
                }
                _ => {}
            }
        }
    });
    Ok(())
}

/// Serves one controller on `tcp` (port 0: any; the port is printed as `LISTENING port`),
/// with a region of `mem` bytes on the device at `addr`, until it quits or hangs up.
///
/// # Errors
/// Opening the device or its objects, or the TCP listener.
pub fn serve(addr: IpAddr, tcp: u16, mem: usize) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Device::for_addr(addr)?.open()?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None)?;
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr: MemoryRegion = pd.reg_mr(mem, access)?;
    let mut qp = new_qp(&pd, &cq)?;
    let listener = TcpListener::bind((addr, tcp))?;
    println!("LISTENING {}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    let (stream, _) = listener.accept()?;
    // One reply per command, at once (Nagle would hold each behind the last one's ACK).
    stream.set_nodelay(true)?;
    let mut out = stream.try_clone()?;
    let mut next_id = 1u64;
    for line in BufReader::new(stream).lines() {
        let line = line?;
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| w.get(i).and_then(|s| s.parse::<u64>().ok());
        let reply = match w.first().copied() {
            Some("CONNECT") => match (
                num(1),
                w.get(2).and_then(|s| s.parse().ok()),
                num(3),
                num(4),
            ) {
                (Some(m), Some(ip), Some(qpn), Some(psn)) => {
                    let up = ferroce::transport::BringUp {
                        peer: ip,
                        dest_qp_num: qpn as u32,
                        path_mtu: mtu_of(m as u32),
                        sq_psn: MY_PSN,
                        rq_psn: psn as u32,
                        qp_access_flags: ferroce::transport::AccessFlags::LOCAL_WRITE
                            | ferroce::transport::AccessFlags::REMOTE_WRITE
                            | ferroce::transport::AccessFlags::REMOTE_READ
                            | ferroce::transport::AccessFlags::REMOTE_ATOMIC,
                        qkey: 0x1111_1111,
                        // rdma_peer's: RNR, then retry_cnt 7 and timeout 18 unless given.
                        timeout: num(7).unwrap_or(18) as u8,
                        retry_cnt: num(6).unwrap_or(7) as u8,
                        rnr_retry: num(5).unwrap_or(7) as u8,
                        min_rnr_timer: 12,
                        max_rd_atomic: 16,
                        max_dest_rd_atomic: 16,
                    };
                    let service = ferroce::transport::Service::of(QpType::Rc, qp.qp_num());
                    let r = up
                        .steps(service)
                        .iter()
                        .try_for_each(|(attr, mask)| qp.modify(attr, *mask));
                    match r {
                        Ok(()) => {
                            let r = mr.remote();
                            format!("QP {} {MY_PSN} {} {}", qp.qp_num(), r.rkey, r.addr)
                        }
                        Err(e) => format!("ERR connect {e}"),
                    }
                }
                _ => "ERR usage".to_owned(),
            },
            Some("RECV") => match (num(1), num(2)) {
                (Some(off), Some(n)) => {
                    next_id += 1;
                    let wr = RecvWr::new(next_id, mr.sge(off as usize, n as u32));
                    match qp.post_recv(&wr) {
                        Ok(()) => "OK".to_owned(),
                        Err(e) => format!("ERR recv {e}"),
                    }
                }
                _ => "ERR usage".to_owned(),
            },
            Some("FILL") => match (num(1), num(2), num(3)) {
                (Some(off), Some(n), Some(seed)) => {
                    let bytes: Vec<u8> = (0..n)
                        .map(|i| (i.wrapping_mul(31).wrapping_add(seed) & 255) as u8)
                        .collect();
                    match mr.write(off as usize, &bytes) {
                        Ok(()) => "OK".to_owned(),
                        Err(e) => format!("ERR fill {e}"),
                    }
                }
                _ => "ERR usage".to_owned(),
            },
            Some("HASH") => match (num(1), num(2)) {
                (Some(off), Some(n)) => {
                    let mut b = vec![0u8; n as usize];
                    match mr.read(off as usize, &mut b) {
                        Ok(()) => format!("HASH {:016x}", fnv(&b)),
                        Err(e) => format!("ERR hash {e}"),
                    }
                }
                _ => "ERR usage".to_owned(),
            },
            Some("RESET") => {
                drop(std::mem::replace(&mut qp, new_qp(&pd, &cq)?));
                while cq.poll_one().is_some() {}
                format!("OK {}", qp.qp_num())
            }
            Some("POST") => match (w.get(1).copied(), num(2), num(3), num(4), num(5)) {
                (Some(op), Some(off), Some(n), Some(raddr), Some(rkey)) => {
                    let opcode = match op {
                        "write" => Some(WrOpcode::RdmaWrite),
                        "read" => Some(WrOpcode::RdmaRead),
                        "send" => Some(WrOpcode::Send),
                        _ => None,
                    };
                    match opcode {
                        Some(opcode) => {
                            next_id += 1;
                            let mut wr = SendWr::new(next_id, opcode);
                            wr.send_flags = SendFlags::SIGNALED;
                            wr.sg_list = vec![mr.sge(off as usize, n as u32)].into();
                            wr.remote.remote_addr = raddr;
                            wr.remote.rkey = rkey as u32;
                            match qp.post_send(&wr) {
                                Ok(()) => "OK".to_owned(),
                                Err(e) => format!("ERR post {e}"),
                            }
                        }
                        None => "ERR post: write, read or send".to_owned(),
                    }
                }
                _ => "ERR usage".to_owned(),
            },
            Some("WC") => match cq.wait(std::time::Duration::from_secs(120)) {
                Some(wc) => format!(
                    "WC {} {} {} {} 0 0 0",
                    wc.wr_id, wc.status as i32, wc.opcode as i32, wc.byte_len
                ),
                None => "NONE".to_owned(),
            },
            Some("COUNTERS") => {
                let (e, _) = ctx.counters();
                format!("CNT {} {}", e.duplicate_request, e.out_of_seq_request)
            }
            Some("CMLISTEN") => match num(1) {
                Some(port) => match cm_listen(addr, port as u16) {
                    Ok(()) => "OK".to_owned(),
                    Err(e) => format!("ERR cmlisten {e}"),
                },
                None => "ERR usage".to_owned(),
            },
            Some("CMACCEPT") => match num(1) {
                Some(port) => match cm_accept(addr, port as u16, mem) {
                    Ok(()) => "OK".to_owned(),
                    Err(e) => format!("ERR cmaccept {e}"),
                },
                None => "ERR usage".to_owned(),
            },
            Some("QUIT") => break,
            _ => "ERR unknown command".to_owned(),
        };
        out.write_all(format!("{reply}\n").as_bytes())?;
    }
    Ok(())
}
