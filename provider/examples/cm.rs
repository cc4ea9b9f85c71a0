//! A connection through the RDMA connection manager, both ends in one process on loopback:
//! the server listens on 127.0.0.1:7471, the client resolves the address and route, connects
//! with private data; the server accepts; each side gets a connected RC QP (rdma_cm programs
//! it) and the client SENDs a message. Run it with `cargo run -p ferroce --example cm`.

use std::time::Duration;

use ferroce::cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use ferroce::{RecvWr, SendWr};

fn main() -> Result<(), ferroce::Error> {
    let t = Duration::from_secs(10);
    let next = |ch: &EventChannel, want| {
        let e = ch.get_event_timeout(t).expect("a CM event");
        assert_eq!(e.event, want, "status {}", e.status);
        e
    };
    let (sch, cch) = (EventChannel::new()?, EventChannel::new()?);
    let server = CmId::new(&sch, PortSpace::Tcp)?;
    server.bind_addr("127.0.0.1:7471".parse().expect("an address"))?;
    server.listen(1)?;

    let client = CmId::new(&cch, PortSpace::Tcp)?;
    client.resolve_addr(None, "127.0.0.1:7471".parse().expect("an address"), t)?;
    next(&cch, CmEventType::AddrResolved);
    client.resolve_route(t)?;
    next(&cch, CmEventType::RouteResolved);
    let cpd = client.context().expect("a device").alloc_pd();
    client.create_qp(&cpd, None)?;
    let hello = ConnParam {
        private_data: b"hello".to_vec(),
        ..ConnParam::defaults()
    };
    client.connect(&hello)?;

    // The server's side: a new ID for the request, with the client's private data.
    let req = next(&sch, CmEventType::ConnectRequest);
    println!(
        "request with {:?}",
        String::from_utf8_lossy(&req.param.private_data[..5])
    );
    let conn = req.id;
    let spd = conn.context().expect("a device").alloc_pd();
    let sqp = conn.create_qp(&spd, None)?;
    let smr = spd.reg_mr(64, ferroce::AccessFlags::LOCAL_WRITE)?;
    sqp.post_recv(&RecvWr::new(1, smr.sge(0, 64)))?;
    conn.accept(&ConnParam::defaults())?;
    next(&cch, CmEventType::Established);
    next(&sch, CmEventType::Established);

    // The client's QP is connected: a SEND reaches the server's receive.
    let cmr = cpd.reg_mr(64, ferroce::AccessFlags::LOCAL_WRITE)?;
    cmr.write(0, b"over rdma_cm")?;
    client
        .qp()
        .expect("its QP")
        .post_send(&SendWr::send(2, cmr.sge(0, 12)))?;
    let wc = conn
        .recv_cq()
        .expect("its CQ")
        .wait(t)
        .expect("the SEND arrives");
    let mut got = [0u8; 12];
    smr.read(0, &mut got)?;
    println!(
        "received {:?} ({} bytes)",
        String::from_utf8_lossy(&got),
        wc.byte_len
    );
    assert_eq!(&got, b"over rdma_cm");

    client.disconnect()?;
    next(&sch, CmEventType::Disconnected);
    conn.disconnect()?;
    next(&cch, CmEventType::Disconnected);
    Ok(())
}

#[test]
fn cm_example_runs() {
    main().unwrap();
}
