//! `ibv_dereg_mr` semantics over real UDP: once `dereg` returns, the network never touches the
//! memory again, so a program may unmap it at once while a peer keeps writing and reading.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use ferroce::transport::{Mtu, QpCap, QpType, SendFlags, SendWr, WcStatus, WrOpcode};
use ferroce::{QpInitAttr, QueuePair};

const LEN: usize = 1 << 20;
const MSG: u32 = 64 << 10;
const DEPTH: usize = 16;

fn rc_qp(s: &Side) -> QueuePair {
    s.pd.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &s.cq,
        recv_cq: &s.cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 64,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    })
    .unwrap()
}

/// The peer's stream: WRITEs and READs of 64 KiB at the region, DEPTH outstanding, until a
/// completion fails; then every outstanding one is collected. Returns the statuses in order.
fn stream(b: &Side, qp: &QueuePair, raddr: u64, rkey: u32, ok: &AtomicUsize) -> Vec<WcStatus> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut posted, mut statuses) = (0u64, Vec::new());
    let mut failed = false;
    while Instant::now() < deadline {
        while !failed && posted - (statuses.len() as u64) < DEPTH as u64 {
            let op = if posted % 2 == 0 {
                WrOpcode::RdmaWrite
            } else {
                WrOpcode::RdmaRead
            };
            let mut w = SendWr::new(posted, op);
            w.send_flags = SendFlags::SIGNALED;
            let slot = (posted as usize % DEPTH) * MSG as usize;
            w.sg_list = vec![b.mr.sge(slot % (LEN / 2), MSG)].into();
            w.remote.remote_addr = raddr + (slot % (LEN - MSG as usize)) as u64;
            w.remote.rkey = rkey;
            if qp.post_send(&w).is_err() {
                failed = true;
                break;
            }
            posted += 1;
        }
        for wc in wait(&b.cq, 1, Duration::from_millis(50)) {
            if wc.status == WcStatus::Success {
                ok.fetch_add(1, Ordering::SeqCst);
            } else {
                failed = true;
            }
            statuses.push(wc.status);
        }
        if failed && statuses.len() as u64 == posted {
            break;
        }
    }
    statuses
}

#[test]
fn dereg_then_munmap_while_a_peer_streams_writes_and_reads() {
    let a = side([127, 21, 0, 1], QpType::Rc, 4096);
    let b = side([127, 21, 0, 2], QpType::Rc, LEN);
    let (a_ip, b_ip) = (IpAddr::from([127, 21, 0, 1]), IpAddr::from([127, 21, 0, 2]));
    let rounds = 24;
    for round in 0..rounds {
        // Program memory, as a C program's malloc/mmap: mapped here, unmapped right after
        // deregistration.
        let mut map = memmap2::MmapMut::map_anon(LEN).unwrap();
        // SAFETY: the mapping stays valid until it is dropped, which happens only after `dereg` has returned, and this test makes no reference into it meanwhile.
        let mr = unsafe { a.pd.reg_mr_raw(map.as_mut_ptr(), LEN, ALL) }.unwrap();
        let (raddr, rkey) = (mr.addr(), mr.rkey());
        let (qa, qb) = (rc_qp(&a), rc_qp(&b));
        connect(&qa, b_ip, qb.qp_num(), Mtu::Mtu4096, 1, 2);
        connect(&qb, a_ip, qa.qp_num(), Mtu::Mtu4096, 2, 1);
        let ok = Arc::new(AtomicUsize::new(0));
        let out = Arc::new(Mutex::new(Vec::new()));
        std::thread::scope(|s| {
            let peer = s.spawn(|| {
                let st = stream(&b, &qb, raddr, rkey, &ok);
                *out.lock().unwrap() = st;
            });
            // Deregister in the middle of the stream, at a point that moves every round.
            let want = 2 + round % 7;
            let until = Instant::now() + Duration::from_secs(20);
            while ok.load(Ordering::SeqCst) < want && Instant::now() < until {
                std::thread::yield_now();
            }
            mr.dereg();
            drop(map); // munmap: any later copy by the runtime would fault here
            peer.join().unwrap();
        });
        let st = out.lock().unwrap().clone();
        assert!(
            st.iter().take_while(|s| **s == WcStatus::Success).count() >= 2,
            "round {round}: the stream ran before the deregistration: {st:?}"
        );
        let first_err = st.iter().position(|s| *s != WcStatus::Success);
        let Some(i) = first_err else {
            panic!("round {round}: no request failed after the deregistration: {st:?}");
        };
        assert_eq!(
            st[i],
            WcStatus::RemAccessErr,
            "round {round}: the first request after dereg gets the remote-access NAK"
        );
        assert!(
            st[i + 1..].iter().all(|s| *s == WcStatus::WrFlushErr),
            "round {round}: {st:?}"
        );
        drop((qa, qb));
    }
}
