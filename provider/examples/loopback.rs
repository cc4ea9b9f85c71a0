//! Two RDMA endpoints in one process, over UDP on loopback: two contexts of the one device at
//! 127.0.0.1 (as two programs on one host would open it), an RC QP each, connected by
//! exchanging their endpoints, then an RDMA WRITE from A into B's region and an RDMA READ of
//! it back. Run it with `cargo run -p ferroce --example loopback`.

use std::time::Duration;

use ferroce::{
    AccessFlags, CompletionQueue, Context, Device, MemoryRegion, QpType, QueuePair, SendWr,
    WcStatus,
};

struct Side {
    _ctx: Context,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn side(addr: &str) -> Result<Side, ferroce::Error> {
    let ctx = Device::find(addr)?.open()?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, None)?;
    let qp = pd
        .qp(QpType::Rc, &cq)
        .max_send_wr(8)
        .max_recv_wr(8)
        .build()?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = pd.reg_mr(4096, access)?;
    Ok(Side {
        _ctx: ctx,
        cq,
        qp,
        mr,
    })
}

fn main() -> Result<(), ferroce::Error> {
    let (a, b) = (side("127.0.0.1")?, side("127.0.0.1")?);
    // What the two programs would send each other over TCP: QP endpoints and B's region.
    let (to_b, to_a) = (a.qp.endpoint(100), b.qp.endpoint(200));
    a.qp.connect(100, &to_a)?;
    b.qp.connect(200, &to_b)?;
    let remote = b.mr.remote();

    a.mr.write(0, b"hello, rdma")?;
    let write = SendWr::write(1, a.mr.sge(0, 11), remote.at(0));
    a.qp.post_send(&write)?;
    let wc =
        a.cq.wait(Duration::from_secs(5))
            .expect("the WRITE completes");
    assert_eq!(wc.status, WcStatus::Success);
    let mut got = [0u8; 11];
    b.mr.read(0, &mut got)?;
    println!("B's region now holds {:?}", String::from_utf8_lossy(&got));

    let read = SendWr::read(2, a.mr.sge(100, 11), remote.at(0));
    a.qp.post_send(&read)?;
    let wc =
        a.cq.wait(Duration::from_secs(5))
            .expect("the READ completes");
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 11));
    a.mr.read(100, &mut got)?;
    println!("read back {:?}", String::from_utf8_lossy(&got));
    assert_eq!(&got, b"hello, rdma");
    Ok(())
}

#[test]
fn loopback_example_runs() {
    main().unwrap();
}
