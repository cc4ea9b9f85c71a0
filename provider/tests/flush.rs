//! RDMA FLUSH through the Rust API (`SendWr::flush`, `ibv_wr_flush`'s operation) between two
//! devices of one process: a region registered with `FLUSH_GLOBAL` is flushed by range and
//! whole; `FLUSH_PERSISTENT` is refused at registration (ferroce's regions are ordinary
//! memory, as rxe refuses it for pages that are not pmem), so a persistent flush of a region
//! is refused by the peer with REM_ACCESS_ERR.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ferroce::transport::{
    BringUp, FlushSpec, Mtu, QpCap, QpType, RemoteAddr, SendWr, Service, WcOpcode, WcStatus,
    WorkCompletion,
};
use ferroce::{
    AccessFlags, CompletionQueue, Context, Device, Error, OpenOptions, ProtectionDomain,
    QpInitAttr, QueuePair,
};

fn wait(cq: &CompletionQueue) -> WorkCompletion {
    let end = Instant::now() + Duration::from_secs(20);
    let mut wc = [WorkCompletion::default()];
    while Instant::now() < end {
        if cq.poll(&mut wc) == 1 {
            return wc[0];
        }
        std::thread::yield_now();
    }
    panic!("no completion in 20 s");
}

fn rights() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::FLUSH_GLOBAL
        | AccessFlags::FLUSH_PERSISTENT
}

fn bring_up(q: &QueuePair, peer: [u8; 4], dest: u32) {
    let up = BringUp {
        peer: IpAddr::from(peer),
        dest_qp_num: dest,
        path_mtu: Mtu::Mtu1024,
        sq_psn: 5,
        rq_psn: 5,
        qp_access_flags: rights(),
        qkey: 0,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
    };
    for (attr, mask) in up.steps(Service::Rc) {
        q.modify(&attr, mask).unwrap();
    }
}

/// Two devices of this process at `a` and `b` (opened with `opts`), a PD, a CQ of `cqe`
/// entries and an RC QP on each, connected to each other.
struct Pair {
    pa: ProtectionDomain,
    pb: ProtectionDomain,
    qa: QueuePair,
    qa_cq: CompletionQueue,
    _b: (QueuePair, CompletionQueue, Context, Context),
}

fn pair(a: [u8; 4], b: [u8; 4], opts: impl Fn(usize) -> OpenOptions, cqe: u32) -> Pair {
    let open = |addr: [u8; 4], i| {
        Device::for_addr(IpAddr::from(addr))
            .unwrap()
            .open_with(opts(i))
            .unwrap()
    };
    let (ca, cb) = (open(a, 0), open(b, 1));
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let (qa_cq, qb_cq) = (
        ca.create_cq(cqe, None).unwrap(),
        cb.create_cq(cqe, None).unwrap(),
    );
    let attr = |cq| QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    };
    let qa = pa.create_qp(&attr(&qa_cq)).unwrap();
    let qb = pb.create_qp(&attr(&qb_cq)).unwrap();
    bring_up(&qa, b, qb.qp_num());
    bring_up(&qb, a, qa.qp_num());
    Pair {
        pa,
        pb,
        qa,
        qa_cq,
        _b: (qb, qb_cq, ca, cb),
    }
}

#[test]
fn flushes_of_a_range_and_of_a_region_complete_and_persistence_is_refused() {
    let opts = |_| OpenOptions {
        memory: Some(true),
        ..OpenOptions::default()
    };
    let p = pair([127, 0, 96, 1], [127, 0, 96, 2], opts, 16);

    let persistent = p.pb.reg_mr(
        4096,
        AccessFlags::LOCAL_WRITE | AccessFlags::FLUSH_PERSISTENT,
    );
    assert!(
        matches!(persistent, Err(Error::InvalidArgument(_))),
        "{persistent:?}"
    );
    let mr =
        p.pb.reg_mr(
            1 << 16,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::FLUSH_GLOBAL,
        )
        .unwrap();
    let remote = RemoteAddr {
        remote_addr: mr.addr() + 512,
        rkey: mr.rkey(),
    };
    for (id, len, level) in [
        (1, 4096, FlushSpec::RANGE),
        (2, 0, FlushSpec::RANGE),
        (3, 9_999_999, FlushSpec::MR),
    ] {
        p.qa.post_send(&SendWr::flush(id, remote, len, FlushSpec::GLOBAL, level))
            .unwrap();
        let wc = wait(&p.qa_cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (id, WcStatus::Success, WcOpcode::Flush)
        );
    }
    // Persistence the region does not grant: the peer NAKs remote access.
    p.qa.post_send(&SendWr::flush(
        4,
        remote,
        64,
        FlushSpec::PERSISTENT,
        FlushSpec::RANGE,
    ))
    .unwrap();
    let wc = wait(&p.qa_cq);
    assert_eq!((wc.wr_id, wc.status), (4, WcStatus::RemAccessErr));
}

/// A WRITE and two FLUSHes posted back to back, over UDP with 10 % of the packets lost each
/// way (the lab's lossy matrix does this against rxe): every round completes, in order.
#[test]
fn write_and_flushes_back_to_back_under_loss() {
    let opts = |i| OpenOptions {
        faults: Some(
            ferroce::faults::FaultConfig::parse(&format!("loss=0.1,seed={}", 11 + i)).unwrap(),
        ),
        ..OpenOptions::default()
    };
    let p = pair([127, 0, 96, 5], [127, 0, 96, 6], opts, 64);
    let src = p.pa.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mr =
        p.pb.reg_mr(
            1 << 16,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::FLUSH_GLOBAL,
        )
        .unwrap();
    let remote = RemoteAddr {
        remote_addr: mr.addr() + 8192,
        rkey: mr.rkey(),
    };
    for round in 0..40u64 {
        let mut w = SendWr::write(round * 10, src.sge(0, 4096), remote);
        w.send_flags = ferroce::SendFlags::SIGNALED;
        p.qa.post_send(&w).unwrap();
        p.qa.post_send(&SendWr::flush(
            round * 10 + 1,
            remote,
            4096,
            FlushSpec::GLOBAL,
            FlushSpec::RANGE,
        ))
        .unwrap();
        p.qa.post_send(&SendWr::flush(
            round * 10 + 2,
            remote,
            0,
            FlushSpec::GLOBAL,
            FlushSpec::MR,
        ))
        .unwrap();
        for (k, op) in [WcOpcode::RdmaWrite, WcOpcode::Flush, WcOpcode::Flush]
            .into_iter()
            .enumerate()
        {
            let wc = wait(&p.qa_cq);
            assert_eq!(
                (wc.wr_id, wc.status, wc.opcode),
                (round * 10 + k as u64, WcStatus::Success, op),
                "round {round}"
            );
        }
    }
}
