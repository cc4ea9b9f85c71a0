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
use ferroce::{AccessFlags, CompletionQueue, Device, Error, OpenOptions, QpInitAttr, QueuePair};

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

#[test]
fn flushes_of_a_range_and_of_a_region_complete_and_persistence_is_refused() {
    let open = |a: [u8; 4]| {
        Device::for_addr(IpAddr::from(a))
            .unwrap()
            .open_with(OpenOptions {
                memory: Some(true),
                ..OpenOptions::default()
            })
            .unwrap()
    };
    let (ca, cb) = (open([127, 0, 96, 1]), open([127, 0, 96, 2]));
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let (qa_cq, qb_cq) = (
        ca.create_cq(16, None).unwrap(),
        cb.create_cq(16, None).unwrap(),
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
    bring_up(&qa, [127, 0, 96, 2], qb.qp_num());
    bring_up(&qb, [127, 0, 96, 1], qa.qp_num());

    let persistent = pb.reg_mr(
        4096,
        AccessFlags::LOCAL_WRITE | AccessFlags::FLUSH_PERSISTENT,
    );
    assert!(
        matches!(persistent, Err(Error::InvalidArgument(_))),
        "{persistent:?}"
    );
    let mr = pb
        .reg_mr(
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
        qa.post_send(&SendWr::flush(id, remote, len, FlushSpec::GLOBAL, level))
            .unwrap();
        let wc = wait(&qa_cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (id, WcStatus::Success, WcOpcode::Flush)
        );
    }
    // Persistence the region does not grant: the peer NAKs remote access.
    qa.post_send(&SendWr::flush(
        4,
        remote,
        64,
        FlushSpec::PERSISTENT,
        FlushSpec::RANGE,
    ))
    .unwrap();
    let wc = wait(&qa_cq);
    assert_eq!((wc.wr_id, wc.status), (4, WcStatus::RemAccessErr));
}

/// A WRITE and two FLUSHes posted back to back, over UDP with 10 % of the packets lost each
/// way (the lab's lossy matrix does this against rxe): every round completes, in order.
#[test]
fn write_and_flushes_back_to_back_under_loss() {
    let open = |a: [u8; 4], seed: u64| {
        Device::for_addr(IpAddr::from(a))
            .unwrap()
            .open_with(OpenOptions {
                faults: Some(
                    ferroce::faults::FaultConfig::parse(&format!("loss=0.1,seed={seed}")).unwrap(),
                ),
                ..OpenOptions::default()
            })
            .unwrap()
    };
    let (ca, cb) = (open([127, 0, 96, 5], 11), open([127, 0, 96, 6], 12));
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let (qa_cq, qb_cq) = (
        ca.create_cq(64, None).unwrap(),
        cb.create_cq(64, None).unwrap(),
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
    bring_up(&qa, [127, 0, 96, 6], qb.qp_num());
    bring_up(&qb, [127, 0, 96, 5], qa.qp_num());
    let src = pa.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mr = pb
        .reg_mr(
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
        qa.post_send(&w).unwrap();
        qa.post_send(&SendWr::flush(
            round * 10 + 1,
            remote,
            4096,
            FlushSpec::GLOBAL,
            FlushSpec::RANGE,
        ))
        .unwrap();
        qa.post_send(&SendWr::flush(
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
            let wc = wait(&qa_cq);
            assert_eq!(
                (wc.wr_id, wc.status, wc.opcode),
                (round * 10 + k as u64, WcStatus::Success, op),
                "round {round}"
            );
        }
    }
}
