//! The opcode × size × MTU matrix again, with the responder in a separate process: this test
//! binary (`harness = false`) re-runs itself as the peer (its `main` sees the environment
//! variable) and drives it over a TCP control channel; data is checked by hashing the peer's
//! memory there.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::hash::{DefaultHasher, Hasher};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use ferroce::transport::{Mtu, QpType, RecvWr, WcStatus, WrOpcode};

const MEM: usize = 17 << 20;
const PEER_ENV: &str = "FERROCE_MATRIX_PEER";

fn hash(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    h.write(bytes);
    h.finish()
}

fn main() {
    match std::env::var(PEER_ENV) {
        Ok(spec) => matrix_peer(&spec),
        Err(_) => {
            let name = "every_opcode_size_and_mtu_across_processes";
            println!("test {name} ...");
            every_opcode_size_and_mtu_across_processes();
            println!("test {name} ... ok");
        }
    }
}

/// The peer: one RC QP and one region, commanded line by line.
fn matrix_peer(spec: &str) {
    let mut it = spec.split(',');
    let addr: IpAddr = it.next().unwrap().parse().unwrap();
    let port: u16 = it.next().unwrap().parse().unwrap();
    let salt: u8 = it.next().unwrap().parse().unwrap();
    let b = side(
        addr.to_string()
            .parse::<std::net::Ipv4Addr>()
            .unwrap()
            .octets(),
        QpType::Rc,
        MEM,
    );
    b.mr.write(0, &pattern(MEM, salt)).unwrap();
    let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
    println!("LISTENING");
    let (s, _) = l.accept().unwrap();
    // One small request, one small reply: Nagle would hold each reply for the delayed ACK.
    s.set_nodelay(true).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let mut line = String::new();
    while r.read_line(&mut line).unwrap() > 0 {
        let f: Vec<&str> = line.split_whitespace().collect();
        let reply = match f[0] {
            "CONNECT" => {
                let (ip, qpn, mtu): (IpAddr, u32, u32) = (
                    f[1].parse().unwrap(),
                    f[2].parse().unwrap(),
                    f[3].parse().unwrap(),
                );
                let mtu = Mtu::ALL.iter().copied().find(|m| m.bytes() == mtu).unwrap();
                connect(&b.qp, ip, qpn, mtu, 200, 100);
                format!("READY {} {} {}", b.qp.qp_num(), b.mr.rkey(), b.mr.addr())
            }
            "RECV" => {
                let (id, off, len): (u64, usize, u32) = (
                    f[1].parse().unwrap(),
                    f[2].parse().unwrap(),
                    f[3].parse().unwrap(),
                );
                b.qp.post_recv(&RecvWr {
                    wr_id: id,
                    sg_list: vec![b.mr.sge(off, len)].into(),
                })
                .unwrap();
                "OK".into()
            }
            "WC" => match wait(&b.cq, 1, Duration::from_secs(60)).first() {
                Some(wc) => format!(
                    "WC {} {} {} {} {}",
                    wc.wr_id, wc.status as u32, wc.opcode as u32, wc.byte_len, wc.imm_data
                ),
                None => "NONE".into(),
            },
            "HASH" => {
                let (off, len): (usize, usize) = (f[1].parse().unwrap(), f[2].parse().unwrap());
                let mut buf = vec![0u8; len];
                b.mr.read(off, &mut buf).unwrap();
                format!("HASH {}", hash(&buf))
            }
            "ATOMIC" => format!(
                "ATOMIC {}",
                b.mr.atomic_load(f[1].parse().unwrap()).unwrap()
            ),
            _ => break,
        };
        writeln!(w, "{reply}").unwrap();
        line.clear();
    }
}

struct Peer {
    child: std::process::Child,
    _out: BufReader<std::process::ChildStdout>,
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Peer {
    fn ask(&mut self, cmd: &str) -> Vec<String> {
        writeln!(self.w, "{cmd}").unwrap();
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        line.split_whitespace().map(str::to_owned).collect()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = writeln!(self.w, "QUIT");
        let _ = self.child.wait();
    }
}

fn spawn_peer(addr: [u8; 4], port: u16, salt: u8) -> Peer {
    let ip = IpAddr::from(addr);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(PEER_ENV, format!("{ip},{port},{salt}"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("LISTENING") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "peer exited");
    }
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_nodelay(true).unwrap();
    Peer {
        child,
        _out: out,
        r: BufReader::new(s.try_clone().unwrap()),
        w: s,
    }
}

fn every_opcode_size_and_mtu_across_processes() {
    for (k, mtu) in Mtu::ALL.iter().enumerate() {
        let (a_addr, b_addr) = ([127, 17, k as u8, 1], [127, 17, k as u8, 2]);
        let salt = 0x40 | k as u8;
        let mut peer = spawn_peer(b_addr, 18700 + k as u16, salt);
        let a = side(a_addr, QpType::Rc, MEM);
        a.mr.write(0, &pattern(MEM, k as u8)).unwrap();
        let r = peer.ask(&format!(
            "CONNECT {} {} {}",
            IpAddr::from(a_addr),
            a.qp.qp_num(),
            mtu.bytes()
        ));
        assert_eq!(r[0], "READY");
        let (bqpn, brkey, baddr): (u32, u32, u64) = (
            r[1].parse().unwrap(),
            r[2].parse().unwrap(),
            r[3].parse().unwrap(),
        );
        connect(&a.qp, IpAddr::from(b_addr), bqpn, *mtu, 100, 200);
        let b_init = pattern(MEM, salt);
        let a_init = a.mr.to_vec();
        let m = mtu.bytes();
        let dst = (8 << 20) + 64;
        for op in [
            WrOpcode::Send,
            WrOpcode::SendWithImm,
            WrOpcode::RdmaWrite,
            WrOpcode::RdmaWriteWithImm,
            WrOpcode::RdmaRead,
        ] {
            for size in [0, 1, m - 1, m, m + 1, 1 << 20, 8 << 20] {
                let recv = matches!(
                    op,
                    WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm
                );
                if recv {
                    let len = if op == WrOpcode::RdmaWriteWithImm {
                        0
                    } else {
                        size
                    };
                    assert_eq!(peer.ask(&format!("RECV 7 {dst} {len}"))[0], "OK");
                }
                let mut w = ferroce::transport::SendWr::new(1, op);
                w.send_flags = ferroce::transport::SendFlags::SIGNALED;
                w.sg_list = vec![a.mr.sge(0, size)].into();
                // WRITEs and SENDs land at `dst`; READs fetch from 0, which nothing writes.
                let target = if op == WrOpcode::RdmaRead { 0 } else { dst };
                w.remote.remote_addr = baddr + target as u64;
                w.remote.rkey = brkey;
                w.imm_data = size ^ 0x5a5a;
                a.qp.post_send(&w).unwrap();
                let s = wait(&a.cq, 1, Duration::from_secs(60));
                assert_eq!(
                    s.first().map(|w| w.status),
                    Some(WcStatus::Success),
                    "{op:?} {size} mtu {m}"
                );
                let n = size as usize;
                if op == WrOpcode::RdmaRead {
                    let got = a.mr.to_vec();
                    assert!(got[..n] == b_init[..n], "{op:?} {size} mtu {m}: READ data");
                    a.mr.write(0, &a_init[..n]).unwrap();
                } else {
                    let want = hash(&a_init[..n]);
                    let h = peer.ask(&format!("HASH {dst} {n}"));
                    assert_eq!(
                        h[1],
                        want.to_string(),
                        "{op:?} {size} mtu {m}: data at the peer"
                    );
                }
                if recv {
                    let wc = peer.ask("WC");
                    assert_eq!(wc[0], "WC", "{op:?} {size} mtu {m}: no receive completion");
                    assert_eq!(wc[2], "0", "receive status");
                    assert_eq!(wc[4], size.to_string(), "byte_len");
                    if op != WrOpcode::Send {
                        assert_eq!(wc[5], (size ^ 0x5a5a).to_string(), "imm_data");
                    }
                }
            }
        }
        // Atomics across processes.
        let off = (16 << 20) + 4096; // past every WRITE target
        let orig = u64::from_ne_bytes(b_init[off..off + 8].try_into().unwrap());
        let mut w = ferroce::transport::SendWr::new(2, WrOpcode::AtomicFetchAndAdd);
        w.send_flags = ferroce::transport::SendFlags::SIGNALED;
        w.sg_list = vec![a.mr.sge(off, 8)].into();
        w.remote.remote_addr = baddr + off as u64;
        w.remote.rkey = brkey;
        w.compare_add = 9;
        a.qp.post_send(&w).unwrap();
        assert_eq!(
            wait(&a.cq, 1, Duration::from_secs(60))[0].status,
            WcStatus::Success
        );
        assert_eq!(a.mr.atomic_load(off).unwrap(), orig);
        assert_eq!(
            peer.ask(&format!("ATOMIC {off}"))[1],
            orig.wrapping_add(9).to_string()
        );
    }
}
