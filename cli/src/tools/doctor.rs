//! `ferroce doctor ADDR [PEER]`: what the verbs checklist says to check before blaming the
//! program — the device's address and interface, the MTU, the GID, who holds UDP 4791 here,
//! the live counters' drops and, with a peer, the route to it, whether a RoCE stack answers on
//! its UDP 4791, and whether a packet of this device's path MTU gets there. One verdict per
//! line: `ok`, `warn` or `FAIL`, then the facts.

use std::io::{ErrorKind, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use ferroce::transport::{InlineData, UdDest};
use ferroce::wire::mad;
use ferroce::{
    AccessFlags, AhAttr, Device, QpCap, QpInitAttr, QpModify, QpState, QpType, RecvWr, SendFlags,
    SendWr, WcOpcode, WcStatus, WrOpcode,
};

/// The RoCEv2 UDP port.
const ROCE_PORT: u16 = ferroce::wire::ROCE_UDP_PORT;
/// A port next to it that nothing should listen on: what draws the peer's ICMP "port
/// unreachable", the echo that the size probes need.
const CLOSED_PORT: u16 = 4790;
/// Headers around a payload of the path MTU in the largest RoCEv2 packet (UDP 8, BTH 12,
/// RETH 16, ICRC 4), without the IP header.
const ROCE_OVERHEAD: usize = 8 + 12 + 16 + 4;
/// How long one probe waits for its answer.
const PROBE_WAIT: Duration = Duration::from_millis(700);

/// The verdict of one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Ok,
    Warn,
    Fail,
}

struct Report<'a> {
    out: &'a mut dyn Write,
    failed: bool,
}

impl Report<'_> {
    fn line(&mut self, v: Verdict, text: &str) {
        let tag = match v {
            Verdict::Ok => "ok  ",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        };
        self.failed |= v == Verdict::Fail;
        let _ = writeln!(self.out, "{tag} {text}");
    }
}

/// Runs every check for the device at `addr` (and `peer`, if given); returns whether none
/// failed (warnings do not fail).
pub fn run(out: &mut dyn Write, addr: IpAddr, peer: Option<IpAddr>) -> bool {
    let mut r = Report { out, failed: false };
    let Some(dev) = device(&mut r, addr) else {
        return false;
    };
    port(&mut r, &dev);
    counters(&mut r, &dev);
    if let Some(peer) = peer {
        reach(&mut r, &dev, peer);
    }
    !r.failed
}

/// The address, its interface, the MTU and the GID.
fn device(r: &mut Report<'_>, addr: IpAddr) -> Option<Device> {
    let dev = match Device::find(&addr.to_string()) {
        Ok(d) => d,
        Err(e) => {
            r.line(
                Verdict::Fail,
                &format!(
                    "no device for {addr}: {e} (a ferroce device is an address of an interface \
                     that is up; `ip -br addr` lists them)"
                ),
            );
            return None;
        }
    };
    r.line(
        Verdict::Ok,
        &format!("device {}: {} on {} (up)", dev.name, dev.addr, dev.ifname),
    );
    let ip_header = if addr.is_ipv4() { 20 } else { 40 };
    let mtu = dev.active_mtu().bytes() as usize;
    let line = format!(
        "interface MTU {}: RoCE path MTU {mtu} (its packets are {} bytes on the wire)",
        dev.ip_mtu,
        mtu + ROCE_OVERHEAD + ip_header
    );
    // Below 1024 the interface cannot carry the MTU every RDMA NIC and rxe use by default.
    r.line(
        if mtu < 1024 {
            Verdict::Warn
        } else {
            Verdict::Ok
        },
        &line,
    );
    let v2 = if addr.is_ipv4() {
        "RoCE v2 over IPv4"
    } else {
        "RoCE v2 over IPv6"
    };
    r.line(
        Verdict::Ok,
        &format!("GID[1] {} ({v2}: use GID index 1)", dev.gid()),
    );
    Some(dev)
}

/// Who holds UDP 4791 on the address: nobody, ferroce processes, or something else (kernel
/// rxe binds it on every address of the host).
fn port(r: &mut Report<'_>, dev: &Device) {
    let rxe = std::path::Path::new("/sys/module/rdma_rxe").exists();
    match UdpSocket::bind(SocketAddr::new(dev.addr, ROCE_PORT)) {
        Ok(_) => r.line(
            Verdict::Ok,
            &format!(
                "UDP {ROCE_PORT} on {} is free (the first ferroce program takes it)",
                dev.addr
            ),
        ),
        Err(e) if e.kind() == ErrorKind::AddrInUse => {
            let live = dev.live_counters(ROCE_PORT).unwrap_or_default();
            if live.is_empty() {
                let who = if rxe {
                    " (kernel rxe is loaded: it binds UDP 4791 on every address; use rxe or \
                     ferroce on a host, not both)"
                } else {
                    " (`ss -ulpn sport = 4791` names it)"
                };
                r.line(
                    Verdict::Fail,
                    &format!(
                        "UDP {ROCE_PORT} on {} is taken by a program that is not ferroce{who}",
                        dev.addr
                    ),
                );
            } else {
                let pids: Vec<String> = live.iter().map(|p| p.pid.to_string()).collect();
                r.line(
                    Verdict::Ok,
                    &format!(
                        "UDP {ROCE_PORT} on {} is ferroce's: {} process(es) share it (pids {})",
                        dev.addr,
                        live.len(),
                        pids.join(", ")
                    ),
                );
            }
        }
        Err(e) => r.line(
            Verdict::Fail,
            &format!("UDP {ROCE_PORT} on {}: {e}", dev.addr),
        ),
    }
    if rxe {
        r.line(
            Verdict::Warn,
            "kernel rxe (rdma_rxe) is loaded: its UDP 4791 socket takes RoCE packets on every \
             address, so ferroce and rxe devices cannot share this host",
        );
    }
}

/// The drops the live processes of the device counted, by cause.
fn counters(r: &mut Report<'_>, dev: &Device) {
    let live = dev.live_counters(ROCE_PORT).unwrap_or_default();
    if live.is_empty() {
        r.line(Verdict::Ok, "counters: no process uses the device now");
        return;
    }
    let mut drops: Vec<(&'static str, u64)> = Vec::new();
    for p in &live {
        for &(k, v) in &p.counters {
            let dropish = [
                "drop",
                "bad",
                "err",
                "malformed",
                "unknown",
                "no_qp",
                "violation",
                "ghost",
                "too_long",
            ]
            .iter()
            .any(|w| k.contains(w));
            if dropish && v > 0 {
                match drops.iter_mut().find(|(n, _)| *n == k) {
                    Some(d) => d.1 += v,
                    None => drops.push((k, v)),
                }
            }
        }
    }
    if drops.is_empty() {
        r.line(
            Verdict::Ok,
            &format!(
                "counters of {} live process(es): nothing dropped or refused",
                live.len()
            ),
        );
    } else {
        let list: Vec<String> = drops.iter().map(|(k, v)| format!("{k} {v}")).collect();
        r.line(
            Verdict::Warn,
            &format!(
                "counters of {} live process(es): {} (`ferroce devinfo -d {} --counters`; \
                 FERROCE_LOG=debug says why each)",
                live.len(),
                list.join(", "),
                dev.addr
            ),
        );
        for (k, _) in &drops {
            if let Some(why) = ferroce::explain_counter(k) {
                r.line(Verdict::Warn, &format!("  {k}: {why}"));
            }
        }
    }
}

/// The route to the peer, a RoCE stack's answer on its UDP 4791, and the path MTU.
fn reach(r: &mut Report<'_>, dev: &Device, peer: IpAddr) {
    let probe = match UdpSocket::bind(SocketAddr::new(dev.addr, 0))
        .and_then(|s| s.connect(SocketAddr::new(peer, CLOSED_PORT)).map(|()| s))
    {
        Ok(s) => s,
        Err(e) => {
            r.line(
                Verdict::Fail,
                &format!("no route from {} to {peer}: {e}", dev.addr),
            );
            return;
        }
    };
    r.line(Verdict::Ok, &format!("route from {} to {peer}", dev.addr));
    match mad_probe(dev, peer) {
        Ok(Some((status, took))) => r.line(
            Verdict::Ok,
            &format!(
                "{peer} answers on UDP {ROCE_PORT}: a RoCE stack (a CM ClassPortInfo Get drew \
                 GetResp status {status:#06x}, as the kernel's MAD layer answers, in {} µs)",
                took.as_micros()
            ),
        ),
        Ok(None) => {
            // Why not: nothing bound there (ICMP port unreachable), or something silent.
            let verdict = match echo(&probe, peer, ROCE_PORT, 16) {
                Echo::Refused => format!(
                    "nothing listens on UDP {ROCE_PORT} at {peer} (its ICMP says port \
                     unreachable): no RoCE device there — start the peer's program, or load \
                     rxe (`rdma link add`) on it"
                ),
                _ => format!(
                    "{peer} did not answer a CM MAD on UDP {ROCE_PORT}: a firewall drops UDP \
                     {ROCE_PORT} (or the answers), the host is down, or whatever holds the \
                     port there is not a RoCE stack"
                ),
            };
            r.line(Verdict::Fail, &verdict);
        }
        Err(e) => r.line(
            Verdict::Fail,
            &format!("the MAD probe could not run on {}: {e}", dev.addr),
        ),
    }
    // The size probes: a small datagram to a closed port draws ICMP; one of this device's
    // largest packet must too, or something on the way cannot carry it.
    let ip_header = if peer.is_ipv4() { 20 } else { 40 };
    let mtu = dev.active_mtu().bytes() as usize;
    let big = mtu + ROCE_OVERHEAD - 8;
    match echo(&probe, peer, CLOSED_PORT, 16) {
        Echo::Refused => match echo(&probe, peer, CLOSED_PORT, big) {
            Echo::Refused => r.line(
                Verdict::Ok,
                &format!(
                    "a packet of path MTU {mtu} ({} bytes on the wire) reaches {peer}",
                    big + 8 + ip_header
                ),
            ),
            Echo::TooBig(m) => r.line(
                Verdict::Fail,
                &format!(
                    "the route to {peer} takes {m} bytes, less than this device's packets of \
                     path MTU {mtu}: lower path_mtu (ibv_modify_qp) or raise the MTU on the way"
                ),
            ),
            _ => r.line(
                Verdict::Fail,
                &format!(
                    "{peer} answers small datagrams but not one of {} bytes: its interface, or \
                     a link on the way, has a smaller MTU than this device's path MTU {mtu} \
                     needs; its packets would be dropped (lower path_mtu, or match the MTUs)",
                    big + 8 + ip_header
                ),
            ),
        },
        _ => r.line(
            Verdict::Warn,
            &format!(
                "{peer} sends no ICMP for a closed port ({CLOSED_PORT}): the path MTU cannot be \
                 checked from here"
            ),
        ),
    }
}

/// What a datagram to a port drew.
enum Echo {
    /// ICMP port unreachable: it arrived, and nothing listens there.
    Refused,
    /// It was too big to leave (the route's MTU, when known).
    TooBig(usize),
    /// Nothing within the wait.
    Silence,
}

/// Sends `len` bytes to `port` of `peer` from `sock` and waits for an ICMP answer.
fn echo(sock: &UdpSocket, peer: IpAddr, port: u16, len: usize) -> Echo {
    // Linux's default path-MTU discovery sets don't-fragment on a datagram that fits the
    // route's MTU: one the way cannot carry is lost, not split.
    let _ = sock.connect(SocketAddr::new(peer, port));
    // A pending error from an earlier probe is not this one's.
    let _ = sock.take_error();
    if let Err(e) = sock.send(&vec![0u8; len]) {
        return match e.raw_os_error() {
            Some(libc::EMSGSIZE) => Echo::TooBig(len),
            _ if e.kind() == ErrorKind::ConnectionRefused => Echo::Refused,
            _ => Echo::Silence,
        };
    }
    let _ = sock.set_read_timeout(Some(PROBE_WAIT));
    let mut buf = [0u8; 64];
    match sock.recv(&mut buf) {
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Echo::Refused,
        Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => Echo::TooBig(len),
        _ => Echo::Silence,
    }
}

/// Sends a CM ClassPortInfo Get to `peer`'s QP1 from a UD QP of `dev` (three tries) and waits
/// for the GetResp; its status and the time it took, or `None` for no answer.
fn mad_probe(dev: &Device, peer: IpAddr) -> ferroce::Result<Option<(u16, Duration)>> {
    const SLOT: usize = ferroce::wire::GRH_LEN + mad::MAD_LEN;
    let ctx = dev.open()?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, None)?;
    let qp = pd.create_qp(&QpInitAttr {
        qp_type: QpType::Ud,
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: mad::MAD_LEN as u32,
        },
        sq_sig_all: false,
    })?;
    qp.modify_with(
        &QpModify::new(QpState::Init)
            .pkey_index(0)
            .port_num(1)
            .qkey(ferroce::wire::GSI_QKEY),
    )?;
    qp.modify_with(&QpModify::new(QpState::Rtr))?;
    qp.modify_with(&QpModify::new(QpState::Rts).sq_psn(0))?;
    let mr = pd.reg_mr(4 * SLOT, AccessFlags::LOCAL_WRITE)?;
    for i in 0..4 {
        qp.post_recv(&RecvWr::new(i as u64, mr.sge(i * SLOT, SLOT as u32)))?;
    }
    let tid = (u64::from(std::process::id()) << 32) | 0x00d0_c700;
    let mut get = [0u8; mad::MAD_LEN];
    get[..4].copy_from_slice(&[1, mad::MGMT_CLASS_CM, 2, mad::METHOD_GET]);
    get[8..16].copy_from_slice(&tid.to_be_bytes());
    get[16..18].copy_from_slice(&mad::ATTR_CLASS_PORT_INFO.to_be_bytes());
    for _ in 0..3 {
        let mut wr = SendWr::new(0, WrOpcode::Send);
        wr.send_flags = SendFlags::INLINE | SendFlags::SIGNALED;
        wr.inline_data = Some(InlineData::from_slice(&get));
        wr.ud = Some(UdDest {
            ah: AhAttr::new(peer),
            remote_qpn: 1,
            remote_qkey: ferroce::wire::GSI_QKEY,
        });
        let sent = Instant::now();
        qp.post_send(&wr)?;
        while sent.elapsed() < PROBE_WAIT {
            let Some(wc) = cq.poll_one() else {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            if wc.opcode != WcOpcode::Recv {
                continue;
            }
            let i = wc.wr_id as usize % 4;
            if wc.status == WcStatus::Success {
                let mut buf = [0u8; SLOT];
                mr.read(i * SLOT, &mut buf)?;
                let m = &buf[ferroce::wire::GRH_LEN..];
                let answered = m[3] == mad::METHOD_GET_RESP && m[8..16] == tid.to_be_bytes();
                if answered {
                    return Ok(Some((u16::from_be_bytes([m[4], m[5]]), sent.elapsed())));
                }
            }
            qp.post_recv(&RecvWr::new(i as u64, mr.sge(i * SLOT, SLOT as u32)))?;
        }
    }
    Ok(None)
}
