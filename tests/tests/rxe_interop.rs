//! The ferroce side of the interop suite's operation matrix against kernel rxe
//! (`tests/interop/suite.sh` runs it inside the lab's namespace; ignored otherwise).
//!
//! It drives `rdma_peer` (a plain libibverbs program on rxe0 in the guest) over TCP and checks
//! every operation in both directions, data and completions on both sides. Each scenario
//! prints `PASS name` or `FAIL name: why`.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpStream};
use std::time::{Duration, Instant};

use ferroce::tools::loopback::{ALL_ACCESS, connect};
use ferroce::transport::{
    Mtu, QpCap, QpType, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use ferroce::{CompletionQueue, Device, QpInitAttr};

const MEM: usize = 9 << 20;

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100000001b3)
    })
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    (0..n)
        .map(|i| ((i as u64 * 31 + seed) & 255) as u8)
        .collect()
}

struct Agent {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Agent {
    fn ask(&mut self, cmd: &str) -> Vec<String> {
        writeln!(self.w, "{cmd}").unwrap();
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        line.split_whitespace().map(str::to_owned).collect()
    }
}

fn wait(cq: &CompletionQueue) -> Option<WorkCompletion> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Some(wc) = cq.poll_one() {
            return Some(wc);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}

#[test]
#[ignore = "needs the kernel-rxe lab: run tests/interop/suite.sh"]
fn rxe_peer_matrix() {
    let peer: std::net::SocketAddr = std::env::var("FERROCE_RXE_PEER").unwrap().parse().unwrap();
    let local: IpAddr = std::env::var("FERROCE_RXE_LOCAL").unwrap().parse().unwrap();
    let mtu_bytes: u32 = std::env::var("FERROCE_RXE_MTU").unwrap().parse().unwrap();
    let mtu = Mtu::ALL
        .iter()
        .copied()
        .find(|m| m.bytes() == mtu_bytes)
        .unwrap();
    // A tag for the scenario names (e.g. "loss=5%") and a size limit (lossy runs skip the MiB ones).
    let tag = std::env::var("FERROCE_RXE_TAG").unwrap_or_default();
    let max: u32 = std::env::var("FERROCE_RXE_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(u32::MAX);
    let ctx = Device::for_addr(local).unwrap().open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None).unwrap();
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap,
            sq_sig_all: false,
        })
        .unwrap();
    let mr = pd.reg_mr(MEM, ALL_ACCESS).unwrap();
    let s = TcpStream::connect_timeout(&peer, Duration::from_secs(30)).unwrap();
    let mut agent = Agent {
        r: BufReader::new(s.try_clone().unwrap()),
        w: s,
    };
    let my_psn = 0x1234;
    let r = agent.ask(&format!(
        "CONNECT {mtu_bytes} {local} {} {my_psn} 7",
        qp.qp_num()
    ));
    assert_eq!(r[0], "QP", "{r:?}");
    let (aqpn, apsn, arkey, aaddr): (u32, u32, u32, u64) = (
        r[1].parse().unwrap(),
        r[2].parse().unwrap(),
        r[3].parse().unwrap(),
        r[4].parse().unwrap(),
    );
    connect(&qp, peer.ip(), aqpn, mtu, my_psn, apsn).unwrap();

    let mut failures = 0;
    let mut report = |name: String, ok: Result<(), String>| match ok {
        Ok(()) => println!("PASS {name}{}{tag}", if tag.is_empty() { "" } else { " " }),
        Err(why) => {
            failures += 1;
            println!(
                "FAIL {name}{}{tag}: {why}",
                if tag.is_empty() { "" } else { " " }
            );
        }
    };
    let m = mtu_bytes;
    let sizes: Vec<u32> = [0u32, 1, m - 1, m, m + 1, 65536, 1 << 20]
        .into_iter()
        .filter(|&s| s <= max)
        .collect();
    // ferroce -> rxe.
    let src = pattern(MEM, 5);
    mr.write(0, &src).unwrap();
    for (op, name) in [
        (WrOpcode::Send, "SEND"),
        (WrOpcode::SendWithImm, "SEND_WITH_IMM"),
        (WrOpcode::RdmaWrite, "RDMA_WRITE"),
        (WrOpcode::RdmaWriteWithImm, "RDMA_WRITE_WITH_IMM"),
        (WrOpcode::RdmaRead, "RDMA_READ"),
    ] {
        let mut list = sizes.to_vec();
        if matches!(op, WrOpcode::RdmaWrite | WrOpcode::RdmaRead) && max >= 8 << 20 {
            list.push(8 << 20);
        }
        for size in list {
            let res = (|| -> Result<(), String> {
                let n = size as usize;
                let recv = matches!(
                    op,
                    WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm
                );
                if recv {
                    let l = if op == WrOpcode::RdmaWriteWithImm {
                        0
                    } else {
                        size
                    };
                    agent.ask(&format!("RECV 0 {l}"));
                }
                if op == WrOpcode::RdmaRead {
                    agent.ask(&format!("FILL 0 {n} {size}"));
                }
                let mut w = SendWr::new(u64::from(size), op);
                w.send_flags = SendFlags::SIGNALED;
                w.sg_list = vec![mr.sge(0, size)];
                w.remote.remote_addr = aaddr;
                w.remote.rkey = arkey;
                w.imm_data = size ^ 0xabcd;
                qp.post_send(&w).map_err(|e| e.to_string())?;
                let wc = wait(&cq).ok_or("no completion")?;
                if wc.status != WcStatus::Success {
                    return Err(format!("ferroce completion {}", wc.status));
                }
                if op == WrOpcode::RdmaRead {
                    let mut got = vec![0u8; n];
                    mr.read(0, &mut got).unwrap();
                    let want = pattern(n, u64::from(size));
                    mr.write(0, &src[..n]).unwrap();
                    return if got == want {
                        Ok(())
                    } else {
                        Err("READ data differs".into())
                    };
                }
                let h = agent.ask(&format!("HASH 0 {n}"));
                if h[1] != format!("{:016x}", fnv(&src[..n])) {
                    return Err("data at rxe differs".into());
                }
                if recv {
                    let wc = agent.ask("WC");
                    if wc[0] != "WC" || wc[2] != "0" {
                        return Err(format!("rxe receive completion {wc:?}"));
                    }
                    if wc[4] != size.to_string() {
                        return Err(format!("rxe byte_len {} for {size}", wc[4]));
                    }
                    if op != WrOpcode::Send && wc[5] != (size ^ 0xabcd).to_string() {
                        return Err(format!("rxe imm_data {}", wc[5]));
                    }
                }
                Ok(())
            })();
            report(format!("ferroce->rxe {name} {size} B mtu {m}"), res);
        }
    }
    for (op, name, ca, swap) in [
        (WrOpcode::AtomicFetchAndAdd, "FETCH_ADD", 7u64, 0u64),
        (WrOpcode::AtomicCmpAndSwp, "CMP_SWAP", 0, 99),
    ] {
        let res = (|| -> Result<(), String> {
            agent.ask("FILL 4096 8 0");
            let before: u64 = agent.ask("LOAD 4096")[1].parse().unwrap();
            let mut w = SendWr::new(1, op);
            w.send_flags = SendFlags::SIGNALED;
            w.sg_list = vec![mr.sge(4096, 8)];
            w.remote.remote_addr = aaddr + 4096;
            w.remote.rkey = arkey;
            w.compare_add = if op == WrOpcode::AtomicCmpAndSwp {
                before
            } else {
                ca
            };
            w.swap = swap;
            qp.post_send(&w).map_err(|e| e.to_string())?;
            let wc = wait(&cq).ok_or("no completion")?;
            if wc.status != WcStatus::Success || wc.opcode != WcOpcode::from(op) {
                return Err(format!("completion {wc:?}"));
            }
            let after: u64 = agent.ask("LOAD 4096")[1].parse().unwrap();
            let want = if op == WrOpcode::AtomicCmpAndSwp {
                swap
            } else {
                before.wrapping_add(ca)
            };
            if mr.atomic_load(4096).unwrap() != before || after != want {
                return Err(format!(
                    "values: orig {} (want {before}), rxe now {after} (want {want})",
                    mr.atomic_load(4096).unwrap()
                ));
            }
            Ok(())
        })();
        report(format!("ferroce->rxe {name} mtu {m}"), res);
    }

    // rxe -> ferroce.
    for (op, name) in [
        ("send", "SEND"),
        ("send_imm", "SEND_WITH_IMM"),
        ("write", "RDMA_WRITE"),
        ("write_imm", "RDMA_WRITE_WITH_IMM"),
        ("read", "RDMA_READ"),
    ] {
        for &size in &sizes {
            let res = (|| -> Result<(), String> {
                let n = size as usize;
                let seed = u64::from(size) + 3;
                let dst = 2 << 20;
                let recv = matches!(op, "send" | "send_imm" | "write_imm");
                if recv {
                    let l = if op == "write_imm" { 0 } else { size };
                    qp.post_recv(&RecvWr {
                        wr_id: 77,
                        sg_list: vec![mr.sge(dst, l)],
                    })
                    .map_err(|e| e.to_string())?;
                }
                if op == "read" {
                    mr.write(dst, &pattern(n, seed)).unwrap();
                } else {
                    agent.ask(&format!("FILL 0 {n} {seed}"));
                }
                let r = agent.ask(&format!(
                    "POST {op} 0 {n} {} {} {} 0 0",
                    mr.addr() + dst as u64,
                    mr.rkey(),
                    size ^ 0x77
                ));
                if r[0] != "OK" {
                    return Err(format!("rxe post {r:?}"));
                }
                let wc = agent.ask("WC");
                if wc[0] != "WC" || wc[2] != "0" {
                    return Err(format!("rxe completion {wc:?}"));
                }
                if op == "read" {
                    let h = agent.ask(&format!("HASH 0 {n}"));
                    return if h[1] == format!("{:016x}", fnv(&pattern(n, seed))) {
                        Ok(())
                    } else {
                        Err("READ data at rxe differs".into())
                    };
                }
                let mut got = vec![0u8; n];
                mr.read(dst, &mut got).unwrap();
                if got != pattern(n, seed) {
                    return Err("data at ferroce differs".into());
                }
                if recv {
                    let wc = wait(&cq).ok_or("no ferroce receive completion")?;
                    if wc.status != WcStatus::Success || wc.byte_len != size {
                        return Err(format!("ferroce receive {wc:?}"));
                    }
                    if op != "send" && wc.imm_data != size ^ 0x77 {
                        return Err(format!("ferroce imm {}", wc.imm_data));
                    }
                }
                Ok(())
            })();
            report(format!("rxe->ferroce {name} {size} B mtu {m}"), res);
        }
    }
    for (op, name) in [("faa", "FETCH_ADD"), ("cas", "CMP_SWAP")] {
        let res = (|| -> Result<(), String> {
            let off = 3 << 20;
            mr.write(off, &41u64.to_ne_bytes()).unwrap();
            let r = agent.ask(&format!(
                "POST {op} 8 8 {} {} 0 41 5",
                mr.addr() + off as u64,
                mr.rkey()
            ));
            if r[0] != "OK" {
                return Err(format!("rxe post {r:?}"));
            }
            let wc = agent.ask("WC");
            if wc[0] != "WC" || wc[2] != "0" {
                return Err(format!("rxe completion {wc:?}"));
            }
            let orig: u64 = agent.ask("LOAD 8")[1].parse().unwrap();
            let now = mr.atomic_load(off).unwrap();
            let want = if op == "faa" { 82 } else { 5 };
            if orig != 41 || now != want {
                return Err(format!(
                    "rxe got {orig} (want 41), ferroce holds {now} (want {want})"
                ));
            }
            Ok(())
        })();
        report(format!("rxe->ferroce {name} mtu {m}"), res);
    }

    // Error path: a bad rkey from ferroce is a remote access error (and ends the connection).
    let res = (|| -> Result<(), String> {
        let mut w = SendWr::new(9, WrOpcode::RdmaWrite);
        w.send_flags = SendFlags::SIGNALED;
        w.sg_list = vec![mr.sge(0, 100)];
        w.remote.remote_addr = aaddr;
        w.remote.rkey = arkey ^ 0x5a5a00;
        qp.post_send(&w).map_err(|e| e.to_string())?;
        let wc = wait(&cq).ok_or("no completion")?;
        if wc.status == WcStatus::RemAccessErr {
            Ok(())
        } else {
            Err(format!("status {}", wc.status))
        }
    })();
    report(
        format!("ferroce->rxe bad rkey gives RemAccessErr mtu {m}"),
        res,
    );
    let _ = agent.ask("QUIT");
    assert_eq!(failures, 0, "{failures} scenario(s) failed");
}
