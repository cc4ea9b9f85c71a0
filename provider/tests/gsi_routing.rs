//! The host-wide GSI routing point: two (then three) processes on one address, each with its
//! own QP1, and a sender on another address that sends MADs to *the* QP1 of the shared
//! address. Each MAD must reach exactly the process it is for (CM REQ by ServiceID, other CM
//! messages by comm ID, other classes by TID or class registration), answers from each process
//! must come back, a ServiceID has one owner on the host, and after `kill -9` of the role
//! holder the survivor takes the role and a newcomer can take over the dead one's ServiceID.
//!
//! This binary (`harness = false`) re-runs itself as the member processes.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use ferroce::transport::UdDest;
use ferroce::wire::mad::{MGMT_CLASS_CM, cm_attr};
use ferroce::{
    AccessFlags, AhAttr, CompletionQueue, Context, Device, MemoryRegion, QpCap, QpInitAttr,
    QpModify, QpState, QpType, QueuePair, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus,
};

const CHILD_ENV: &str = "FERROCE_GSI_CHILD";
const SHARED: [u8; 4] = [127, 19, 0, 1];
const SENDER: [u8; 4] = [127, 19, 0, 2];
const GRH: usize = 40;
const MAD: usize = 256;
/// The MAD byte that carries a test's tag, and the one a member writes its slot into.
const TAG: usize = 250;
const ECHO_SLOT: usize = 251;
const RECVS: u64 = 32;

fn main() {
    let _ = env_logger::Builder::from_env(env_logger::Env::new().filter("FERROCE_LOG")).try_init();
    match std::env::var(CHILD_ENV) {
        Ok(spec) => member(&spec),
        Err(_) => {
            let name = "gsi_datagrams_reach_each_process_through_the_routing_point";
            println!("test {name} ...");
            gsi_datagrams_reach_each_process_through_the_routing_point();
            println!("test {name} ... ok");
        }
    }
}

/// A QP1 with receives posted, on its own region of `RECVS` buffers and one send buffer.
struct Gsi {
    ctx: Context,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

const SEND_AT: usize = RECVS as usize * (GRH + MAD);

impl Gsi {
    fn open(addr: [u8; 4]) -> Gsi {
        let ctx = Device::for_addr(IpAddr::from(addr))
            .unwrap()
            .open()
            .unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(256, None).unwrap();
        let cap = QpCap {
            max_send_wr: 64,
            max_recv_wr: RECVS as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd
            .create_gsi_qp(&QpInitAttr {
                qp_type: QpType::Ud,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap,
                sq_sig_all: false,
            })
            .unwrap();
        assert_eq!(qp.qp_num(), 1);
        qp.modify_with(
            &QpModify::new(QpState::Init)
                .pkey_index(0)
                .qkey(ferroce::wire::GSI_QKEY),
        )
        .unwrap();
        qp.modify_with(&QpModify::new(QpState::Rtr)).unwrap();
        qp.modify_with(&QpModify::new(QpState::Rts).sq_psn(0))
            .unwrap();
        let mr = pd.reg_mr(SEND_AT + MAD, AccessFlags::LOCAL_WRITE).unwrap();
        let g = Gsi { ctx, cq, qp, mr };
        for i in 0..RECVS {
            g.post_recv(i);
        }
        g
    }

    fn post_recv(&self, i: u64) {
        let at = i as usize * (GRH + MAD);
        self.qp
            .post_recv(&RecvWr::new(i, self.mr.sge(at, (GRH + MAD) as u32)))
            .unwrap();
    }

    fn send(&self, to: IpAddr, mad: &[u8; MAD]) {
        self.mr.write(SEND_AT, mad).unwrap();
        let mut wr = SendWr::send(1000, self.mr.sge(SEND_AT, MAD as u32));
        wr.send_flags = SendFlags::SIGNALED;
        wr.ud = Some(UdDest {
            ah: AhAttr::new(to),
            remote_qpn: 1,
            remote_qkey: ferroce::wire::GSI_QKEY,
        });
        self.qp.post_send(&wr).unwrap();
    }

    /// The next received MAD, if one comes within `timeout` (send completions are skipped).
    fn recv(&self, timeout: Duration) -> Option<[u8; MAD]> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            match self.cq.poll_one() {
                Some(wc) if wc.opcode == WcOpcode::Recv => {
                    assert_eq!(wc.status, WcStatus::Success);
                    assert_eq!(wc.src_qp, 1, "MADs come from QP1");
                    let mut buf = [0u8; GRH + MAD];
                    let at = wc.wr_id as usize * (GRH + MAD);
                    self.mr.read(at, &mut buf).unwrap();
                    self.post_recv(wc.wr_id);
                    return Some(buf[GRH..].try_into().unwrap());
                }
                Some(wc) => assert_eq!(wc.status, WcStatus::Success, "{wc:?}"),
                None => std::thread::sleep(Duration::from_micros(200)),
            }
        }
        None
    }
}

/// A MAD of `class`/`method`/`attr` with `fields` written at their MAD offsets and `tag`.
fn mad(class: u8, method: u8, attr: u16, fields: &[(usize, &[u8])], tag: u8) -> [u8; MAD] {
    let mut m = [0u8; MAD];
    m[..4].copy_from_slice(&[1, class, 2, method]);
    m[16..18].copy_from_slice(&attr.to_be_bytes());
    for (off, b) in fields {
        m[*off..*off + b.len()].copy_from_slice(b);
    }
    m[TAG] = tag;
    m
}

fn req(service_id: u64, tag: u8) -> [u8; MAD] {
    mad(
        MGMT_CLASS_CM,
        3,
        cm_attr::REQ,
        &[(24, &[0x51, 0, 0, tag]), (32, &service_id.to_be_bytes())],
        tag,
    )
}

/// A CM message answering a connection of the process in `slot` (its comm ID's first byte).
fn cm_to(attr: u16, slot: u8, tag: u8) -> [u8; MAD] {
    mad(
        MGMT_CLASS_CM,
        3,
        attr,
        &[(28, &[slot, 0x23, 0x75, tag])],
        tag,
    )
}

/// A member process: QP1 on the shared address, a listen on its ServiceID (and a class if
/// asked); it reports every MAD it gets (`GOT <tag>`) and echoes it to the sender with its
/// slot in it, and obeys `TRY <service id>` and `QUIT` on stdin.
fn member(spec: &str) {
    let mut it = spec.split(',');
    let sid: u64 = it.next().unwrap().parse().unwrap();
    let class: u8 = it.next().unwrap().parse().unwrap();
    let g = Gsi::open(SHARED);
    let _listen = g.ctx.gsi_listen(sid).unwrap();
    let _class = (class != 0).then(|| g.ctx.gsi_register_class(class).unwrap());
    let slot = g.ctx.gsi_slot();
    println!("READY {slot}");
    let (tx, cmds) = channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    loop {
        if let Some(mut m) = g.recv(Duration::from_millis(5)) {
            println!("GOT {}", m[TAG]);
            m[ECHO_SLOT] = slot;
            // The answer is a response (of another class, TID slot byte 0: the sender is
            // alone on its address, so its own process) to the sender's QP1.
            m[1] = 0x05;
            m[3] = 0x81;
            m[8] = 0;
            g.send(IpAddr::from(SENDER), &m);
        }
        match cmds.try_recv() {
            Ok(c) if c.starts_with("TRY ") => {
                let other: u64 = c[4..].trim().parse().unwrap();
                match g.ctx.gsi_listen(other) {
                    Ok(_) => println!("TRY ok"),
                    Err(e) => println!("TRY refused {e}"),
                }
            }
            Ok(c) if c == "QUIT" => return,
            Ok(_) | Err(std::sync::mpsc::TryRecvError::Empty) => {}
            Err(_) => return,
        }
    }
}

struct Member {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    slot: u8,
    sid: u64,
}

impl Member {
    fn spawn(sid: u64, class: u8) -> Member {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(CHILD_ENV, format!("{sid},{class}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in out.lines() {
                if tx.send(l.unwrap_or_default()).is_err() {
                    break;
                }
            }
        });
        let ready = lines.recv_timeout(Duration::from_secs(30)).unwrap();
        let slot = ready.strip_prefix("READY ").unwrap().parse().unwrap();
        Member {
            child,
            stdin,
            lines,
            slot,
            sid,
        }
    }

    /// The tags this member reported within `wait`.
    fn got(&self, wait: Duration) -> BTreeSet<u8> {
        let end = Instant::now() + wait;
        let mut tags = BTreeSet::new();
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    if let Some(t) = l.strip_prefix("GOT ") {
                        tags.insert(t.parse().unwrap());
                    }
                }
                Err(_) => break,
            }
        }
        tags
    }

    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        loop {
            let l = self.lines.recv_timeout(Duration::from_secs(10)).unwrap();
            if !l.starts_with("GOT ") {
                return l;
            }
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "QUIT");
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `mads` and collects the echoes that come back within `wait`: tag → echoing slot.
fn exchange(s: &Gsi, mads: &[[u8; MAD]], wait: Duration) -> Vec<(u8, u8)> {
    for m in mads {
        s.send(IpAddr::from(SHARED), m);
    }
    let mut echoes = Vec::new();
    let end = Instant::now() + wait;
    while echoes.len() < mads.len() {
        let Some(left) = end.checked_duration_since(Instant::now()) else {
            break;
        };
        match s.recv(left) {
            Some(m) => echoes.push((m[TAG], m[ECHO_SLOT])),
            None => break,
        }
    }
    echoes.sort_unstable();
    echoes
}

fn gsi_datagrams_reach_each_process_through_the_routing_point() {
    const S1: u64 = 0x0106_0000_0000_4e21;
    const S2: u64 = 0x0106_0000_0000_4e22;
    let a = Member::spawn(S1, 0x04);
    let mut b = Member::spawn(S2, 0);
    assert_ne!(a.slot, b.slot);
    let sender = Gsi::open(SENDER);
    let wait = Duration::from_secs(5);

    // Every way of routing, both processes; each MAD reaches exactly its owner.
    let mads = [
        req(S1, 1),
        req(S2, 2),
        cm_to(cm_attr::RTU, a.slot, 3),
        cm_to(cm_attr::DREQ, b.slot, 4),
        mad(0x04, 0x01, 0x0010, &[], 5),
        mad(
            0x05,
            0x81,
            0x0010,
            &[(8, &[b.slot, 0, 0, 0, 0, 0, 0, 9])],
            6,
        ),
        mad(
            MGMT_CLASS_CM,
            3,
            cm_attr::SIDR_REP,
            &[(24, &[a.slot, 1, 2, 3])],
            7,
        ),
    ];
    let echoes = exchange(&sender, &mads, wait);
    let expect = vec![
        (1, a.slot),
        (2, b.slot),
        (3, a.slot),
        (4, b.slot),
        (5, a.slot),
        (6, b.slot),
        (7, a.slot),
    ];
    assert_eq!(echoes, expect, "each MAD answered by its owner");
    let short = Duration::from_millis(300);
    assert_eq!(a.got(short), BTreeSet::from([1, 3, 5, 7]));
    assert_eq!(b.got(short), BTreeSet::from([2, 4, 6]));

    // A ServiceID has one owner on the host.
    let r = b.ask(&format!("TRY {S1}"));
    assert!(
        r.starts_with("TRY refused") && r.contains(&a.child.id().to_string()),
        "{r}"
    );

    // kill -9 the role holder (the lowest slot receives every QP1 datagram first).
    let (mut holder, survivor) = if a.slot < b.slot { (a, b) } else { (b, a) };
    holder.child.kill().unwrap();
    holder.child.wait().unwrap();
    let killed = Instant::now();
    let (survivor_sid, dead_sid) = (survivor.sid, holder.sid);
    // The role moves: the survivor's MADs arrive again within a bounded time.
    let mut tag = 20u8;
    let recovered = loop {
        tag += 1;
        let e = exchange(
            &sender,
            &[req(survivor_sid, tag)],
            Duration::from_millis(100),
        );
        if e == [(tag, survivor.slot)] {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "no answer after the kill"
        );
    };
    println!(
        "QP1 traffic back {} ms after kill -9 of the role holder",
        recovered.as_millis()
    );
    survivor.got(short);

    // A newcomer takes the dead process's ServiceID; MADs for it and for the survivor's comm
    // IDs reach each.
    let c = Member::spawn(dead_sid, 0);
    let echoes = exchange(
        &sender,
        &[
            req(dead_sid, 40),
            cm_to(cm_attr::REP, survivor.slot, 41),
            req(survivor_sid, 42),
        ],
        wait,
    );
    assert_eq!(
        echoes,
        vec![(40, c.slot), (41, survivor.slot), (42, survivor.slot)]
    );
    assert_eq!(c.got(short), BTreeSet::from([40]));
    drop(holder);
}
