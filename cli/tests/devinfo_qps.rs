//! `ferroce devinfo --qps` and `--why QPN` read the QPs of another process (this test's) from
//! the address's registry: a QP whose SENDs went unanswered is listed in ERR with its peer, its
//! status and the reason the engine gave, and `--why` finds it by number; a QP no process has is
//! a clear error. The peer's `--counters` shows the packets it could not place (`no_qp`) with
//! what that means.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::IpAddr;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use ferroce::transport::{BringUp, Mtu, Service};
use ferroce::{AccessFlags, Device, QpType, SendWr, WcStatus};

fn devinfo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .arg("devinfo")
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn qps_and_why_show_a_failed_qp_with_its_reason() {
    let addr = "127.0.57.1";
    let ctx = Device::for_addr(addr.parse().unwrap())
        .unwrap()
        .open()
        .unwrap();
    // The peer's address has a device of this process, but no QP 0x10099: it counts the
    // packets as no_qp and answers nothing.
    let peer = Device::for_addr("127.0.57.2".parse().unwrap())
        .unwrap()
        .open()
        .unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = pd
        .qp(QpType::Rc, &cq)
        .max_send_wr(4)
        .max_recv_wr(4)
        .build()
        .unwrap();
    // A QP number nobody has; timeout 8 (1 ms) and one retry: the SEND fails at once.
    let up = BringUp {
        peer: IpAddr::from([127, 0, 57, 2]),
        dest_qp_num: 0x10099,
        path_mtu: Mtu::Mtu1024,
        sq_psn: 0x100,
        rq_psn: 0x200,
        qp_access_flags: AccessFlags::EMPTY,
        qkey: 0,
        timeout: 8,
        retry_cnt: 1,
        rnr_retry: 0,
        min_rnr_timer: 1,
        max_rd_atomic: 1,
        max_dest_rd_atomic: 1,
    };
    for (attr, mask) in up.steps(Service::Rc) {
        qp.modify(&attr, mask).unwrap();
    }
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    qp.post_send(&SendWr::send(7, mr.sge(0, 8))).unwrap();
    let wc = cq
        .wait(Duration::from_secs(10))
        .expect("the SEND completes");
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::RetryExcErr));

    // The table is rewritten every 200 ms: wait (bounded) for the QP's ERR to show.
    let line = format!(
        "QPN {:#x} RC ERR mtu 1024 peer 127.0.57.2 dest_qp_num 0x10099",
        qp.qp_num()
    );
    let end = Instant::now() + Duration::from_secs(10);
    let out = loop {
        let o = devinfo(&["-d", addr, "--qps"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = text(&o);
        if out.contains(&line) || Instant::now() > end {
            break out;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(out.contains(&line), "{line} not in:\n{out}");
    assert!(
        out.contains(&format!("process {} (slot ", std::process::id())),
        "{out}"
    );
    assert!(
        out.contains("error transport retry counter exceeded (wr_id 7)"),
        "{out}"
    );
    // The reason, as the engine gave it (one retransmission of the first PSN, no answer).
    let reason = qp.last_error().unwrap().to_string();
    assert!(reason.contains("PSN 0x100"), "{reason}");
    let cut = &reason[..reason.len().min(100)];
    assert!(out.contains(&format!("why: {cut}")), "{cut} not in:\n{out}");

    let qpn = format!("{:#x}", qp.qp_num());
    let o = devinfo(&["-d", addr, "--why", &qpn]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let why = text(&o);
    assert!(why.contains(&line), "{why}");
    assert!(
        why.contains(&format!("why: {reason}")),
        "{reason} not in:\n{why}"
    );

    // The peer's counters say what they counted and what it means.
    let end = Instant::now() + Duration::from_secs(10);
    let counters = loop {
        let o = devinfo(&["-d", "127.0.57.2", "--counters"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = text(&o);
        if out.contains("no_qp:\t2") || Instant::now() > end {
            break out;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        counters.contains("no_qp:\t2\n\t\t\t# packets for a QP number no QP here has"),
        "{counters}"
    );
    assert!(
        !counters.contains("sent_pkts:\t0\n\t\t\t#"),
        "an ordinary counter explained:\n{counters}"
    );
    drop(peer);

    // A QP number no process has.
    let o = devinfo(&["-d", addr, "--why", "0x77"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("QPN 0x77 is not a QP of any process on 127.0.57.1"),
        "{err}"
    );
}
