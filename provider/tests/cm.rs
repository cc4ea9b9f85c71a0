//! The connection manager over real UDP on loopback: a server and a client CM ID in one
//! process (two devices), the whole rdma_cm flow — resolve, listen, connect with private data,
//! accept, traffic on the connected QPs, disconnect — and the refusals: no listener (REJ 8
//! at once), a reject with private data, depths beyond the device's caps, too much private
//! data; and UD service resolution (SIDR).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use ferroce::cm::{CmEvent, CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use ferroce::{RecvWr, SendWr, WcStatus};

const T: Duration = Duration::from_secs(20);

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn next(ch: &EventChannel, want: CmEventType) -> CmEvent {
    let e = ch.get_event_timeout(T).expect("an event in time");
    assert_eq!(e.event, want, "status {} of {:?}", e.status, e.id);
    e
}

/// Active side up to ROUTE_RESOLVED.
fn client(ch: &EventChannel, ps: PortSpace, dst: &str) -> CmId {
    let id = CmId::new(ch, ps).unwrap();
    id.resolve_addr(Some(sa("127.0.64.2:0")), sa(dst), T)
        .unwrap();
    next(ch, CmEventType::AddrResolved);
    id.resolve_route(T).unwrap();
    next(ch, CmEventType::RouteResolved);
    id
}

#[test]
fn connect_accept_traffic_and_disconnect() {
    let sch = EventChannel::new().unwrap();
    let server = CmId::new(&sch, PortSpace::Tcp).unwrap();
    server.bind_addr(sa("127.0.64.1:7471")).unwrap();
    server.listen(4).unwrap();

    let cch = EventChannel::new().unwrap();
    let c = client(&cch, PortSpace::Tcp, "127.0.64.1:7471");
    let cpd = c.context().unwrap().alloc_pd();
    let cqp = c.create_qp(&cpd, None).unwrap();
    let cmr = cpd
        .reg_mr(
            4096,
            ferroce::AccessFlags::LOCAL_WRITE
                | ferroce::AccessFlags::REMOTE_WRITE
                | ferroce::AccessFlags::REMOTE_READ,
        )
        .unwrap();
    c.connect(&ConnParam {
        private_data: b"client hello".to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    })
    .unwrap();

    let req = next(&sch, CmEventType::ConnectRequest);
    assert_eq!(req.listen_id.as_ref(), Some(&server));
    assert_eq!(
        req.param.private_data.len(),
        56,
        "the REQ's user area, whole"
    );
    assert_eq!(&req.param.private_data[..12], b"client hello");
    assert_eq!(
        (req.param.responder_resources, req.param.initiator_depth),
        (1, 1)
    );
    let s = req.id;
    assert_eq!(s.local_addr(), Some(sa("127.0.64.1:7471")));
    assert_eq!(s.peer_addr().unwrap().ip(), sa("127.0.64.2:0").ip());
    assert_eq!(
        s.peer_addr().unwrap().port(),
        c.local_addr().unwrap().port()
    );
    let spd = s.context().unwrap().alloc_pd();
    let sqp = s.create_qp(&spd, None).unwrap();
    let smr = spd
        .reg_mr(
            4096,
            ferroce::AccessFlags::LOCAL_WRITE
                | ferroce::AccessFlags::REMOTE_WRITE
                | ferroce::AccessFlags::REMOTE_READ,
        )
        .unwrap();
    sqp.post_recv(&RecvWr::new(1, smr.sge(0, 1024))).unwrap();
    s.accept(&ConnParam {
        private_data: b"server hello".to_vec(),
        ..ConnParam::defaults()
    })
    .unwrap();

    let est = next(&cch, CmEventType::Established);
    assert_eq!(est.param.private_data.len(), 196);
    assert_eq!(&est.param.private_data[..12], b"server hello");
    next(&sch, CmEventType::Established);

    // The QPs are connected: a SEND and a WRITE go through.
    let q = cqp.query();
    assert_eq!(
        (q.qp_state, q.dest_qp_num, q.min_rnr_timer),
        (ferroce::QpState::Rts, sqp.qp_num(), 0)
    );
    assert_eq!(q.sq_psn, sqp.query().rq_psn);
    cmr.write(0, b"over rdma_cm").unwrap();
    cqp.post_send(&SendWr::send(7, cmr.sge(0, 12))).unwrap();
    let mut got = None;
    for _ in 0..2000 {
        if let Some(wc) = s.recv_cq().unwrap().poll_one() {
            got = Some(wc);
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let wc = got.expect("the SEND arrived");
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 12));
    let mut b = [0u8; 12];
    smr.read(0, &mut b).unwrap();
    assert_eq!(&b, b"over rdma_cm");
    // perftest and libfabric set min_rnr_timer after the connection: RTS→RTS allows it.
    sqp.modify_with(&ferroce::QpModify::new(ferroce::QpState::Rts).min_rnr_timer(12))
        .unwrap();

    c.disconnect().unwrap();
    next(&sch, CmEventType::Disconnected);
    s.disconnect().unwrap();
    next(&cch, CmEventType::Disconnected);
    next(&cch, CmEventType::TimewaitExit);
    next(&sch, CmEventType::TimewaitExit);
}

/// The address's CM answers for a port without a listener (here the CM of the process that
/// listens on another port of it).
#[test]
fn a_port_nobody_listens_on_is_rejected_at_once() {
    let ch = EventChannel::new().unwrap();
    let other = CmId::new(&ch, PortSpace::Tcp).unwrap();
    other.bind_addr(sa("127.0.64.1:7476")).unwrap();
    other.listen(1).unwrap();
    let c = client(&ch, PortSpace::Tcp, "127.0.64.1:9");
    let pd = c.context().unwrap().alloc_pd();
    c.create_qp(&pd, None).unwrap();
    let t0 = std::time::Instant::now();
    c.connect(&ConnParam::defaults()).unwrap();
    let e = next(&ch, CmEventType::Rejected);
    assert_eq!(e.status, 8, "invalid service ID");
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "at once, not after the retries"
    );
}

#[test]
fn a_reject_carries_private_data() {
    let sch = EventChannel::new().unwrap();
    let server = CmId::new(&sch, PortSpace::Tcp).unwrap();
    server.bind_addr(sa("127.0.64.1:7472")).unwrap();
    server.listen(4).unwrap();
    let cch = EventChannel::new().unwrap();
    let c = client(&cch, PortSpace::Tcp, "127.0.64.1:7472");
    c.connect(&ConnParam::defaults()).unwrap();
    let req = next(&sch, CmEventType::ConnectRequest);
    assert!(req.id.reject(&[0; 149]).is_err(), "a REJ carries 148 bytes");
    req.id.reject(b"go away").unwrap();
    let e = next(&cch, CmEventType::Rejected);
    assert_eq!(e.status, 28);
    assert_eq!(e.param.private_data.len(), 148);
    assert_eq!(&e.param.private_data[..7], b"go away");
}

#[test]
fn bad_parameters_say_which_and_why() {
    let ch = EventChannel::new().unwrap();
    let c = client(&ch, PortSpace::Tcp, "127.0.64.1:7473");
    let e = c
        .connect(&ConnParam {
            initiator_depth: 200,
            ..ConnParam::default()
        })
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("initiator_depth 200 exceeds the device's max_qp_init_rd_atom"),
        "{e}"
    );
    assert_eq!(e.errno(), libc::EINVAL);
    let e = c
        .connect(&ConnParam {
            private_data: vec![1; 57],
            ..ConnParam::default()
        })
        .unwrap_err();
    assert!(e.to_string().contains("at most 56"), "{e}");
    // No ferroce device on the source: ADDR_ERROR −ENODEV.
    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
    id.resolve_addr(Some(sa("192.0.2.1:0")), sa("127.0.64.1:1"), T)
        .unwrap();
    let e = next(&ch, CmEventType::AddrError);
    assert_eq!(e.status, -libc::ENODEV);
    // A bound port is taken host-wide, from the bind on (the kernel's bind list).
    let a = CmId::new(&ch, PortSpace::Tcp).unwrap();
    a.bind_addr(sa("127.0.64.1:7474")).unwrap();
    let b = CmId::new(&ch, PortSpace::Tcp).unwrap();
    let e = b.bind_addr(sa("127.0.64.1:7474")).unwrap_err();
    assert_eq!(e.errno(), libc::EADDRINUSE, "{e}");
    a.listen(1).unwrap();
    drop(a);
    b.bind_addr(sa("127.0.64.1:7474")).unwrap();
}

#[test]
fn ud_service_resolution() {
    let sch = EventChannel::new().unwrap();
    let server = CmId::new(&sch, PortSpace::Udp).unwrap();
    server.bind_addr(sa("127.0.64.1:7475")).unwrap();
    server.listen(4).unwrap();
    let cch = EventChannel::new().unwrap();
    let c = client(&cch, PortSpace::Udp, "127.0.64.1:7475");
    c.connect(&ConnParam {
        private_data: b"udaddy".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    let req = next(&sch, CmEventType::ConnectRequest);
    assert_eq!(&req.param.private_data[..6], b"udaddy");
    let pd = req.id.context().unwrap().alloc_pd();
    let qp = req.id.create_qp(&pd, None).unwrap();
    req.id.accept(&ConnParam::default()).unwrap();
    let e = next(&cch, CmEventType::Established);
    let ud = e.ud.expect("the UD peer");
    assert_eq!(
        (ud.qp_num, ud.qkey),
        (qp.qp_num(), ferroce::cm::RDMA_UDP_QKEY)
    );
    assert_eq!(ud.ah_attr.dest, sa("127.0.64.1:0").ip());
}

/// Listens on `bind` (port 0: rdma_cm picks one), connects a client from `src` to the port
/// the listener got, accepts, sends one message over the connected QPs and disconnects.
/// Returns the listener's port.
fn listen_connect_send(bind: &str, src: Option<&str>) -> u16 {
    let sch = EventChannel::new().unwrap();
    let server = CmId::new(&sch, PortSpace::Tcp).unwrap();
    server.bind_addr(sa(bind)).unwrap();
    server.listen(1).unwrap();
    let at = server
        .local_addr()
        .expect("a bound listener has an address");
    assert_eq!(at.ip(), sa(bind).ip());
    assert_ne!(at.port(), 0, "port 0 is replaced by the port given");

    let cch = EventChannel::new().unwrap();
    let c = CmId::new(&cch, PortSpace::Tcp).unwrap();
    c.resolve_addr(src.map(sa), at, T).unwrap();
    next(&cch, CmEventType::AddrResolved);
    c.resolve_route(T).unwrap();
    next(&cch, CmEventType::RouteResolved);
    let cpd = c.context().unwrap().alloc_pd();
    let cqp = c.create_qp(&cpd, None).unwrap();
    let cmr = cpd.reg_mr(64, ferroce::AccessFlags::LOCAL_WRITE).unwrap();
    c.connect(&ConnParam::defaults()).unwrap();

    let req = next(&sch, CmEventType::ConnectRequest);
    let s = req.id;
    assert_eq!(s.local_addr(), Some(at));
    let spd = s.context().unwrap().alloc_pd();
    let sqp = s.create_qp(&spd, None).unwrap();
    let smr = spd.reg_mr(64, ferroce::AccessFlags::LOCAL_WRITE).unwrap();
    sqp.post_recv(&RecvWr::new(1, smr.sge(0, 64))).unwrap();
    s.accept(&ConnParam::defaults()).unwrap();
    next(&cch, CmEventType::Established);
    next(&sch, CmEventType::Established);
    assert_eq!(cqp.query().dest_qp_num, sqp.qp_num());

    cmr.write(0, b"port and family").unwrap();
    cqp.post_send(&SendWr::send(2, cmr.sge(0, 15))).unwrap();
    let wc = (0..2000)
        .find_map(|_| {
            let wc = s.recv_cq().unwrap().poll_one();
            if wc.is_none() {
                std::thread::sleep(Duration::from_millis(1));
            }
            wc
        })
        .expect("the SEND arrived");
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 15));
    let mut b = [0u8; 15];
    smr.read(0, &mut b).unwrap();
    assert_eq!(&b, b"port and family");

    c.disconnect().unwrap();
    next(&sch, CmEventType::Disconnected);
    at.port()
}

#[test]
fn listen_on_port_zero_takes_an_ephemeral_port() {
    let a = listen_connect_send("127.0.64.1:0", Some("127.0.64.2:0"));
    let b = listen_connect_send("127.0.64.1:0", Some("127.0.64.2:0"));
    assert!(ferroce::cm::PORT_RANGE.contains(&a), "{a}");
    assert!(ferroce::cm::PORT_RANGE.contains(&b), "{b}");
}

#[test]
fn ipv6_loopback() {
    assert_eq!(listen_connect_send("[::1]:7477", None), 7477);
    // Port 0 over IPv6 too; the client's source picked by the host's routing (::1).
    assert!(ferroce::cm::PORT_RANGE.contains(&listen_connect_send("[::1]:0", None)));
}

/// `rdma_listen`'s backlog bounds the requests a listener holds for a program that does not
/// take them, as the kernel's ucma: with a backlog of 2, two of four REQs are queued and two
/// dropped unanswered (counted); once the program takes the queued ones, the dropped clients'
/// REQ retransmissions come through as new requests.
#[test]
fn the_listen_backlog_bounds_the_requests_held() {
    let sch = EventChannel::new().unwrap();
    let server = CmId::new(&sch, PortSpace::Tcp).unwrap();
    server.bind_addr(sa("127.0.64.1:7479")).unwrap();
    server.listen(2).unwrap();
    let cch = EventChannel::new().unwrap();
    let clients: Vec<CmId> = (0..4)
        .map(|_| {
            let c = client(&cch, PortSpace::Tcp, "127.0.64.1:7479");
            let pd = c.context().unwrap().alloc_pd();
            c.create_qp(&pd, None).unwrap();
            c.connect(&ConnParam::defaults()).unwrap();
            c
        })
        .collect();
    let t0 = std::time::Instant::now();
    while (sch.pending() < 2 || server.backlog_drops() < 2) && t0.elapsed() < T {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        (sch.pending(), server.backlog_drops()),
        (2, 2),
        "two requests queued, two dropped"
    );
    // The program takes the two (and refuses them); the other two come again.
    for _ in 0..4 {
        let req = next(&sch, CmEventType::ConnectRequest);
        req.id.reject(b"busy").unwrap();
    }
    assert_eq!(server.backlog_drops(), 2, "the retries found room");
    let rejected = (0..4)
        .filter(|_| {
            cch.get_event_timeout(T)
                .is_some_and(|e| e.event == CmEventType::Rejected)
        })
        .count();
    assert_eq!(rejected, 4);
    drop(clients);
}
