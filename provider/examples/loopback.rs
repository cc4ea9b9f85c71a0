//! Two RDMA endpoints in one process, over UDP on loopback: an RC QP each, connected by
//! exchanging their endpoints, then an RDMA WRITE from A into B's region and an RDMA READ of
//! it back. Run it with `cargo run -p ferroce --example loopback`.

use std::time::Duration;

use ferroce::{AccessFlags, Device, QpCap, QpInitAttr, QpType, SendWr, WcStatus};

fn main() -> Result<(), ferroce::Error> {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut sides = Vec::new();
    for addr in ["127.88.0.1", "127.88.0.2"] {
        let ctx = Device::find(addr)?.open()?;
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(16, None)?;
        let qp = pd.create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 8,
                max_recv_wr: 8,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })?;
        let mr = pd.reg_mr(4096, access)?;
        sides.push((ctx, cq, qp, mr));
    }
    let (a, b) = (&sides[0], &sides[1]);
    // What the two sides would send each other over TCP: QP endpoints and B's region.
    let (ea, eb) = (a.2.endpoint(100), b.2.endpoint(200));
    a.2.connect(100, &eb)?;
    b.2.connect(200, &ea)?;
    let remote = b.3.remote();

    a.3.write(0, b"hello, rdma")?;
    a.2.post_send(&SendWr::write(1, a.3.sge(0, 11), remote.at(0)))?;
    let wc =
        a.1.wait(Duration::from_secs(5))
            .expect("the WRITE completes");
    assert_eq!(wc.status, WcStatus::Success);
    let mut got = [0u8; 11];
    b.3.read(0, &mut got)?;
    println!("B's region now holds {:?}", String::from_utf8_lossy(&got));

    a.2.post_send(&SendWr::read(2, a.3.sge(100, 11), remote.at(0)))?;
    let wc =
        a.1.wait(Duration::from_secs(5))
            .expect("the READ completes");
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 11));
    a.3.read(100, &mut got)?;
    println!("read back {:?}", String::from_utf8_lossy(&got));
    assert_eq!(&got, b"hello, rdma");
    Ok(())
}

#[test]
fn loopback_example_runs() {
    main().unwrap();
}
