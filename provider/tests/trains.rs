//! The datapath's batching over real UDP on loopback: a 64 KiB WRITE's packets leave as
//! `UDP_SEGMENT` trains and arrive as coalesced reads whose every segment passes the full ICRC
//! check; a deep queue of small WRITEs leaves in far fewer system calls than messages (posts
//! behind unacknowledged ones join the next train), while a lone message still goes at once;
//! `FERROCE_TRAINS=0`-style opening turns trains off; a train the kernel refuses goes again as
//! plain datagrams; a train longer than the kernel's `UDP_MAX_SEGMENTS` goes again as shorter
//! trains.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::*;
use ferroce::transport::{Mtu, QpType, WcStatus, WrOpcode};
use ferroce::{Device, OpenOptions};

const T: Duration = Duration::from_secs(20);

#[test]
fn a_large_write_leaves_in_trains_and_every_segment_checks() {
    let (x, y) = pair(
        [127, 0, 81, 1],
        [127, 0, 81, 2],
        QpType::Rc,
        Mtu::Mtu4096,
        1 << 20,
    );
    let data = pattern(1 << 20, 3);
    x.mr.write(0, &data).unwrap();
    for i in 0..16u64 {
        let off = (i as usize) << 16;
        x.qp.post_send(&wr(&x, &y, i, WrOpcode::RdmaWrite, off, 1 << 16, off))
            .unwrap();
    }
    let wcs = wait(&x.cq, 16, T);
    assert_eq!(wcs.len(), 16);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    let mut got = vec![0u8; 1 << 20];
    y.mr.read(0, &mut got).unwrap();
    assert_eq!(got, data);
    let (_, rx) = x.ctx.counters();
    assert!(rx.trains >= 16, "one train per WRITE at least: {rx:?}");
    let (engine, _) = y.ctx.counters();
    assert_eq!(engine.icrc_errors, 0);
    assert_eq!(
        engine.icrc_partial, 0,
        "every segment checked with all 32 bits"
    );
}

#[test]
fn a_deep_queue_of_small_writes_shares_system_calls_and_a_lone_one_goes_at_once() {
    let (x, y) = pair(
        [127, 0, 82, 1],
        [127, 0, 82, 2],
        QpType::Rc,
        Mtu::Mtu4096,
        1 << 16,
    );
    // A lone WRITE: nothing in flight, so it leaves in the posting call.
    let before = x.ctx.counters().1.send_calls;
    x.qp.post_send(&wr(&x, &y, 0, WrOpcode::RdmaWrite, 0, 8, 0))
        .unwrap();
    assert_eq!(x.ctx.counters().1.send_calls, before + 1);
    assert_eq!(wait(&x.cq, 1, T).len(), 1);

    // 4,000 WRITEs of 8 bytes, up to 128 outstanding.
    let (n, depth) = (4000u64, 128u64);
    let before = x.ctx.counters().1.send_calls;
    let (mut posted, mut done) = (0u64, 0u64);
    let deadline = std::time::Instant::now() + T;
    while done < n && std::time::Instant::now() < deadline {
        while posted < n && posted - done < depth {
            let off = (posted as usize % 1000) * 8;
            x.qp.post_send(&wr(&x, &y, posted, WrOpcode::RdmaWrite, off, 8, off))
                .unwrap();
            posted += 1;
        }
        while let Some(wc) = x.cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success);
            done += 1;
        }
    }
    assert_eq!(done, n);
    let calls = x.ctx.counters().1.send_calls - before;
    assert!(
        calls * 4 < n,
        "{calls} sendmmsg calls for {n} messages: posts behind outstanding ones should share them"
    );
}

#[test]
fn trains_can_be_turned_off() {
    let open = |a: [u8; 4]| {
        Device::for_addr(IpAddr::from(a))
            .unwrap()
            .open_with(OpenOptions {
                trains: Some(false),
                ..OpenOptions::default()
            })
            .unwrap()
    };
    let cx = open([127, 0, 83, 1]);
    let cy = open([127, 0, 83, 2]);
    // The sides below share the runtimes just opened (the first opener's options).
    let (x, y) = pair(
        [127, 0, 83, 1],
        [127, 0, 83, 2],
        QpType::Rc,
        Mtu::Mtu4096,
        1 << 18,
    );
    x.qp.post_send(&wr(&x, &y, 1, WrOpcode::RdmaWrite, 0, 1 << 18, 0))
        .unwrap();
    assert_eq!(wait(&x.cq, 1, T)[0].status, WcStatus::Success);
    assert_eq!(x.ctx.counters().1.trains, 0);
    assert!(x.ctx.counters().1.udp_sent >= 64);
    drop((cx, cy));
}

/// A train the kernel refuses (EIO: a kernel without `UDP_SEGMENT`, a path through IPsec, or
/// here a UDP-Lite socket, which Linux never lets send one) turns trains off, and the same
/// datagrams go plain, each with its ICRC restored for ID 0.
#[test]
fn trains_fall_back_to_plain_datagrams_where_the_kernel_refuses_them() {
    use ferroce::udp::{Segmentation, SendBatch};
    use socket2::{Domain, Protocol, Socket, Type};
    use std::os::fd::AsRawFd;

    const UDPLITE: i32 = 136;
    let lite = || {
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::from(UDPLITE))).unwrap();
        s.bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
        std::net::UdpSocket::from(s)
    };
    let (a, b) = (lite(), lite());
    b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (src, dst) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    let ctx = |id| lo_icrc(src, dst, id);
    let mut s = SendBatch::new(8, 1500);
    s.set_segmentation(Segmentation::RoceV2);
    for i in 0..5u8 {
        let buf = &mut s.next_buf()[..1400];
        buf.fill(i);
        ctx(0).fill(buf);
        s.commit(1400, dst);
    }
    assert_eq!(s.flush(a.as_raw_fd()).unwrap(), 0, "nothing lost");
    assert_eq!(s.segmentation(), Segmentation::Off, "trains turned off");
    let mut buf = [0u8; 2000];
    for i in 0..5u8 {
        let n = b.recv(&mut buf).unwrap();
        assert_eq!((n, buf[0]), (1400, i));
        assert!(
            ctx(0).verify(&buf[..n]),
            "datagram {i}: its ICRC restored for ID 0"
        );
    }
}

/// A train longer than the kernel takes (`UDP_MAX_SEGMENTS`: 64 before Linux raised it to 128;
/// here a batch told to try 200) is refused with EINVAL: the batch falls back to trains of 64
/// and sends the same datagrams again, segment k of each train carrying IPv4 ID k, so every
/// ICRC is right for its ID.
#[test]
fn trains_longer_than_the_kernel_takes_go_again_in_trains_of_64() {
    use ferroce::udp::{FALLBACK_SEGMENTS, Segmentation, SendBatch, set_dont_fragment};
    use std::os::fd::AsRawFd;

    let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    set_dont_fragment(a.as_raw_fd(), false).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (src, dst) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    let ctx = |id| lo_icrc(src, dst, id);
    let n = 150usize;
    let mut s = SendBatch::new(n, 64);
    s.set_segmentation(Segmentation::RoceV2);
    s.set_max_segments(200);
    // Byte 0 (the opcode) a WRITE's: a FLUSH would start a message of its own.
    let body = |i: usize| [0x0A, i as u8];
    for i in 0..n {
        let buf = &mut s.next_buf()[..40];
        buf.fill(i as u8);
        buf[..2].copy_from_slice(&body(i));
        ctx(0).fill(buf);
        s.commit(40, dst);
    }
    assert_eq!(s.flush(a.as_raw_fd()).unwrap(), 0, "nothing lost");
    assert_eq!(s.max_segments(), FALLBACK_SEGMENTS);
    assert_eq!(s.segmentation(), Segmentation::RoceV2, "trains stay on");
    let mut buf = [0u8; 100];
    for i in 0..n {
        let got = b.recv(&mut buf).unwrap();
        assert_eq!((got, [buf[0], buf[1]]), (40, body(i)));
        let id = (i % FALLBACK_SEGMENTS) as u16;
        assert!(
            ctx(id).verify(&buf[..got]),
            "datagram {i}: its ICRC is right for IPv4 ID {id}"
        );
    }
}

/// The ICRC context of a datagram from `src` to `dst` on 127.0.0.1 carrying IPv4 ID `id`.
fn lo_icrc(
    src: std::net::SocketAddr,
    dst: std::net::SocketAddr,
    id: u16,
) -> ferroce_wire::icrc::IcrcContext {
    ferroce_wire::icrc::IcrcContext::v4(
        [127, 0, 0, 1].into(),
        [127, 0, 0, 1].into(),
        id,
        src.port(),
        dst.port(),
    )
}
