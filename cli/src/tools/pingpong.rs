//! `ferroce rc-pingpong`: rdma-core's `ibv_rc_pingpong`, on ferroce, wire-compatible with it:
//! the same options, the same TCP exchange on port 18515 (`LID:QPN:PSN:GID` as
//! `"%04x:%06x:%06x:%s"`, 52 bytes with the NUL, then `"done"`), the same QP attributes
//! (path MTU `-m`, timeout 14, retry_cnt 7, rnr_retry 7, min_rnr_timer 12,
//! max_dest_rd_atomic 1, hop limit 1) and the same output lines.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Instant;

use ferroce::transport::{
    AccessFlags, AhAttr, BringUp, Mtu, QpCap, QpModify, QpState, QpType, RecvWr, SendFlags, SendWr,
    Service, WcStatus, WorkCompletion, WrOpcode,
};
use ferroce::{CompletionChannel, Device, Error, QpInitAttr, Result};

const SEND_WRID: u64 = 1;
const RECV_WRID: u64 = 2;
const MSG_LEN: usize = 52;

/// The options of `ibv_rc_pingpong`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `-p`: TCP port of the exchange.
    pub port: u16,
    /// `-d`: device name or address.
    pub device: Option<String>,
    /// `-i`: port number (only 1).
    pub ib_port: u8,
    /// `-s`: message size.
    pub size: u32,
    /// `-m`: path MTU in bytes.
    pub mtu: u32,
    /// `-r`: receives posted ahead.
    pub rx_depth: u32,
    /// `-n`: iterations.
    pub iters: u32,
    /// `-l`: service level (accepted, unused on RoCE).
    pub sl: u8,
    /// `-e`: sleep on completion channel events instead of polling.
    pub use_events: bool,
    /// `-g`: local GID index (1 is the IPv4-mapped GID, as on rxe).
    pub gidx: Option<u32>,
    /// `-c`: validate received buffers.
    pub validate: bool,
    /// The server to connect to (client mode); none means server mode.
    pub server: Option<String>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            port: 18515,
            device: None,
            ib_port: 1,
            size: 4096,
            mtu: 1024,
            rx_depth: 500,
            iters: 1000,
            sl: 0,
            use_events: false,
            gidx: None,
            validate: false,
            server: None,
        }
    }
}

/// One side's address as exchanged over TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// Initial PSN.
    pub psn: u32,
    /// GID.
    pub gid: Ipv6Addr,
}

impl Dest {
    /// The 52-byte wire form: `"%04x:%06x:%06x:%s\0"` with the GID as 32 hex digits.
    pub fn to_wire(&self) -> [u8; MSG_LEN] {
        let gid: String = self
            .gid
            .octets()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let s = format!("{:04x}:{:06x}:{:06x}:{}", self.lid, self.qpn, self.psn, gid);
        let mut out = [0u8; MSG_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// Parses the wire form.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a malformed message.
    pub fn from_wire(b: &[u8]) -> Result<Dest> {
        let bad = || Error::InvalidArgument("malformed pingpong address message");
        let s = std::str::from_utf8(b.split(|&c| c == 0).next().unwrap_or(b)).map_err(|_| bad())?;
        let mut it = s.split(':');
        let lid = u16::from_str_radix(it.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
        let qpn = u32::from_str_radix(it.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
        let psn = u32::from_str_radix(it.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
        let g = it.next().ok_or_else(bad)?;
        if g.len() != 32 {
            return Err(bad());
        }
        let mut o = [0u8; 16];
        for (i, byte) in o.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&g[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Dest {
            lid,
            qpn,
            psn,
            gid: Ipv6Addr::from(o),
        })
    }

    fn line(&self) -> String {
        format!(
            "LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            self.lid, self.qpn, self.psn, self.gid
        )
    }
}

fn gid_to_ip(gid: Ipv6Addr) -> Result<IpAddr> {
    if gid.is_unspecified() {
        return Err(Error::InvalidArgument(
            "the peer sent no GID (run it with -g 1)",
        ));
    }
    Ok(match gid.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(gid),
    })
}

fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    (h.finish() as u32) & 0xFF_FFFF
}

fn io_err(what: &str, e: std::io::Error) -> Error {
    Error::Io(std::io::Error::new(e.kind(), format!("{what}: {e}")))
}

/// Runs `ibv_rc_pingpong`'s exchange and loop, printing its lines to `out`.
///
/// # Errors
/// Any set-up failure; a failed completion ("Failed status ...").
pub fn run(opts: &Options, out: &mut dyn Write) -> Result<()> {
    if opts.ib_port != 1 {
        return Err(Error::InvalidArgument("the device has one port, 1"));
    }
    let mtu = Mtu::ALL
        .iter()
        .copied()
        .find(|m| m.bytes() == opts.mtu)
        .ok_or(Error::InvalidArgument(
            "-m must be 256, 512, 1024, 2048 or 4096",
        ))?;
    let dev = match &opts.device {
        Some(d) => Device::find(d)?,
        None => ferroce::devices()?
            .into_iter()
            .next()
            .ok_or_else(|| Error::NoDevice("(none)".into()))?,
    };
    let ctx = dev.open()?;
    let pd = ctx.alloc_pd();
    let size = opts.size.max(1);
    let mr = pd.reg_mr(size as usize, AccessFlags::LOCAL_WRITE)?;
    let channel = if opts.use_events {
        Some(ctx.create_comp_channel()?)
    } else {
        None
    };
    let cq = ctx.create_cq(opts.rx_depth + 1, channel.as_ref())?;
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: opts.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        cap,
        sq_sig_all: false,
    })?;
    qp.modify_with(
        &QpModify::new(QpState::Init)
            .pkey_index(0)
            .port_num(1)
            .qp_access_flags(AccessFlags::EMPTY),
    )?;
    let recv = RecvWr {
        wr_id: RECV_WRID,
        sg_list: [mr.sge(0, size)].into(),
    };
    let mut routs = 0;
    for _ in 0..opts.rx_depth {
        qp.post_recv(&recv)?;
        routs += 1;
    }
    if let Some(ch) = &channel {
        let _ = ch;
        cq.req_notify(false)?;
    }
    let gidx = opts.gidx.unwrap_or(1);
    let me = Dest {
        lid: 0,
        qpn: qp.qp_num(),
        psn: random_psn(),
        gid: ctx.query_gid(gidx)?,
    };
    let _ = writeln!(out, "  local address:  {}", me.line());

    // RTR and RTS with ibv_rc_pingpong's values (INIT was done above, as it does).
    let connect = |rem: &Dest| -> Result<()> {
        let up = BringUp {
            peer: gid_to_ip(rem.gid)?,
            dest_qp_num: rem.qpn,
            path_mtu: mtu,
            sq_psn: me.psn,
            rq_psn: rem.psn,
            qp_access_flags: AccessFlags::EMPTY,
            qkey: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
        };
        for (mut attr, mask) in up.steps(Service::Rc).into_iter().skip(1) {
            attr.ah_attr = attr.ah_attr.map(|ah| AhAttr {
                hop_limit: 1,
                sgid_index: gidx as u8,
                ..ah
            });
            qp.modify(&attr, mask)?;
        }
        Ok(())
    };

    let mut buf = [0u8; MSG_LEN];
    let rem = match &opts.server {
        Some(server) => {
            let addr = (server.as_str(), opts.port)
                .to_socket_addrs()
                .map_err(|e| io_err("resolving the server", e))?
                .next()
                .ok_or(Error::InvalidArgument("server address"))?;
            let mut s = TcpStream::connect(addr)
                .map_err(|e| io_err(&format!("Couldn't connect to {server}:{}", opts.port), e))?;
            s.write_all(&me.to_wire())
                .map_err(|e| io_err("sending the address", e))?;
            s.read_exact(&mut buf)
                .map_err(|e| io_err("reading the remote address", e))?;
            let rem = Dest::from_wire(&buf)?;
            s.write_all(b"done\0")
                .map_err(|e| io_err("sending done", e))?;
            connect(&rem)?;
            rem
        }
        None => {
            let l = TcpListener::bind(("0.0.0.0", opts.port))
                .map_err(|e| io_err(&format!("Couldn't listen to port {}", opts.port), e))?;
            let (mut s, _) = l.accept().map_err(|e| io_err("accept", e))?;
            s.read_exact(&mut buf)
                .map_err(|e| io_err("reading the remote address", e))?;
            let rem = Dest::from_wire(&buf)?;
            connect(&rem)?;
            s.write_all(&me.to_wire())
                .map_err(|e| io_err("sending the address", e))?;
            let mut done = [0u8; 5];
            let _ = s.read_exact(&mut done);
            rem
        }
    };
    let _ = writeln!(out, "  remote address: {}", rem.line());

    let page = 4096usize;
    let fill = |mr: &ferroce::MemoryRegion| {
        for i in (0..size as usize).step_by(page) {
            let _ = mr.write(i, &[(i / page) as u8]);
        }
    };
    let send = SendWr {
        send_flags: SendFlags::SIGNALED,
        sg_list: [mr.sge(0, size)].into(),
        ..SendWr::new(SEND_WRID, WrOpcode::Send)
    };
    let mut pending = RECV_WRID;
    if opts.server.is_some() {
        if opts.validate {
            fill(&mr);
        }
        qp.post_send(&send)?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let mut wcs = [WorkCompletion::default(); 2];
    while rcnt < opts.iters || scnt < opts.iters {
        if let Some(ch) = &channel {
            let ev_cq = ch.get_event();
            ev_cq.ack_events(1);
            cq.req_notify(false)?;
        }
        let n = loop {
            let n = cq.poll(&mut wcs);
            if n > 0 || channel.is_some() {
                break n;
            }
            std::hint::spin_loop();
        };
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                let _ = writeln!(
                    out,
                    "Failed status {} ({}) for wr_id {}",
                    wc.status, wc.status as u32, wc.wr_id
                );
                return Err(Error::Io(std::io::Error::other(format!(
                    "completion failed: {}",
                    wc.status
                ))));
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        while routs < opts.rx_depth {
                            qp.post_recv(&recv)?;
                            routs += 1;
                        }
                    }
                    if opts.validate {
                        let mut b = [0u8; 1];
                        for i in (0..size as usize).step_by(page) {
                            mr.read(i, &mut b)?;
                            if b[0] != (i / page) as u8 {
                                return Err(Error::Io(std::io::Error::other(format!(
                                    "invalid data at offset {i}"
                                ))));
                            }
                        }
                    }
                    rcnt += 1;
                }
                other => {
                    let _ = writeln!(out, "Completion for unknown wr_id {other}");
                    return Err(Error::InvalidArgument("unknown wr_id"));
                }
            }
            pending &= !wc.wr_id;
            if scnt < opts.iters && pending == 0 {
                if opts.validate {
                    fill(&mr);
                }
                qp.post_send(&send)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    // Linger like TCP's TIME_WAIT: the peer may not have the ACK of its last message yet, and
    // an RC peer retransmits it (rxe for ever) until someone answers. The progress thread keeps
    // answering duplicates for a moment before the QP goes away.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let bytes = u64::from(size) * u64::from(opts.iters) * 2;
    let _ = writeln!(
        out,
        "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
        bytes,
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    let _ = writeln!(
        out,
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        opts.iters,
        usec / 1e6,
        usec / f64::from(opts.iters)
    );
    drop(channel.map(|c: CompletionChannel| c));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format_matches_rdma_core() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0x3b6d7d,
            gid: "::ffff:10.77.0.12".parse().unwrap(),
        };
        let w = d.to_wire();
        assert_eq!(
            &w[..51],
            b"0000:000011:3b6d7d:00000000000000000000ffff0a4d000c"
        );
        assert_eq!(w[51], 0);
        assert_eq!(Dest::from_wire(&w).unwrap(), d);
        assert!(Dest::from_wire(b"garbage").is_err());
        assert_eq!(
            d.line(),
            "LID 0x0000, QPN 0x000011, PSN 0x3b6d7d, GID ::ffff:10.77.0.12"
        );
        assert_eq!(gid_to_ip(d.gid).unwrap(), IpAddr::from([10, 77, 0, 12]));
        assert!(gid_to_ip(Ipv6Addr::UNSPECIFIED).is_err());
    }
}
