//! Implicit on-demand paging over real UDP: one region over the whole address space, reached
//! locally and by a peer at any mapped address, and refusing (never faulting on) addresses
//! that are unmapped or read-only.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::*;
use ferroce::transport::{
    AccessFlags, Mtu, QpType, RecvWr, RemoteAddr, SendWr, Sge, WcOpcode, WcStatus, WrOpcode,
};

const T: Duration = Duration::from_secs(20);
const PAGE: usize = 4096;

/// Anonymous pages of the test's own, outside Rust's references: three pages, the middle one
/// made inaccessible, the last one read-only.
struct Pages(*mut u8);

impl Pages {
    fn new() -> Pages {
        // SAFETY: a fresh private anonymous mapping of three pages; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let p = p.cast::<u8>();
        // SAFETY: pages 1 and 2 of the mapping just made.
        unsafe {
            assert_eq!(libc::mprotect(p.add(PAGE).cast(), PAGE, libc::PROT_NONE), 0);
            *p.add(2 * PAGE) = 0x77;
            assert_eq!(
                libc::mprotect(p.add(2 * PAGE).cast(), PAGE, libc::PROT_READ),
                0
            );
        }
        Pages(p)
    }

    fn addr(&self, off: usize) -> u64 {
        self.0 as u64 + off as u64
    }

    fn get(&self, off: usize, len: usize) -> Vec<u8> {
        // SAFETY: readable bytes of the mapping (the caller names page 0 or 2); the network is idle.
        unsafe { std::slice::from_raw_parts(self.0.add(off), len) }.to_vec()
    }

    fn set(&self, off: usize, data: &[u8]) {
        // SAFETY: writable bytes of page 0; the network is idle.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.0.add(off), data.len()) }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer used.
        unsafe { libc::munmap(self.0.cast(), 3 * PAGE) };
    }
}

#[test]
fn an_implicit_region_reaches_any_mapped_address_and_refuses_the_rest() {
    let (a, b) = pair(
        [127, 0, 63, 1],
        [127, 0, 63, 2],
        QpType::Rc,
        Mtu::Mtu1024,
        1 << 16,
    );
    let pages = Pages::new();
    // SAFETY: the only memory named through the region below is `pages` (outside Rust's references, unmapped only at the end of the test) and b's own region.
    let imr = unsafe { a.pd.reg_mr_implicit(common::ALL) }.unwrap();
    assert!(imr.is_implicit());
    assert_eq!((imr.addr(), imr.len()), (0, usize::MAX));
    let remote = |off: usize| RemoteAddr {
        remote_addr: pages.addr(off),
        rkey: imr.rkey(),
    };

    // The peer writes, reads, adds and atomic-writes at addresses of a's pages.
    let data = pattern(3000, 5);
    b.mr.write(0, &data).unwrap();
    b.qp.post_send(&SendWr::write(1, b.mr.sge(0, 3000), remote(100)))
        .unwrap();
    b.qp.post_send(&SendWr::read(2, b.mr.sge(8192, 3000), remote(100)))
        .unwrap();
    pages.set(3200, &7u64.to_ne_bytes());
    b.qp.post_send(&SendWr::fetch_add(3, b.mr.sge(16384, 8), remote(3200), 5))
        .unwrap();
    b.qp.post_send(&SendWr::atomic_write(4, remote(3208), *b"implicit"))
        .unwrap();
    let wcs = wait(&b.cq, 4, T);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (1..=4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    assert_eq!(pages.get(100, 3000), data);
    let mut back = vec![0; 3000];
    b.mr.read(8192, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(b.mr.atomic_load(16384).unwrap(), 7);
    assert_eq!(pages.get(3200, 8), 12u64.to_ne_bytes());
    assert_eq!(pages.get(3208, 8), b"implicit");

    // a sends from and receives into its pages through the implicit lkey.
    let local = |off: usize, length: u32| Sge {
        addr: pages.addr(off),
        length,
        lkey: imr.lkey(),
    };
    b.qp.post_recv(&RecvWr {
        wr_id: 10,
        sg_list: vec![b.mr.sge(20000, 500)].into(),
    })
    .unwrap();
    a.qp.post_recv(&RecvWr {
        wr_id: 11,
        sg_list: vec![local(3500, 200)].into(),
    })
    .unwrap();
    a.qp.post_send(&SendWr::send(12, local(100, 500))).unwrap();
    b.mr.write(30000, &[0xab; 200]).unwrap();
    b.qp.post_send(&SendWr::send(13, b.mr.sge(30000, 200)))
        .unwrap();
    let mut got = wait(&a.cq, 2, T);
    got.sort_by_key(|w| w.wr_id);
    assert_eq!(
        got.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(11, WcStatus::Success), (12, WcStatus::Success)]
    );
    assert_eq!(pages.get(3500, 200), vec![0xab; 200]);
    let got = wait(&b.cq, 2, T);
    assert!(got.iter().all(|w| w.status == WcStatus::Success), "{got:?}");
    let mut sent = vec![0; 500];
    b.mr.read(20000, &mut sent).unwrap();
    assert_eq!(sent, data[..500]);

    // Prefetch (ibv_advise_mr) over mapped pages works, over the inaccessible one it is refused.
    use ferroce::MrAdvice;
    a.pd.advise_mr(MrAdvice::PrefetchWrite, &[local(0, 4096)])
        .unwrap();
    assert!(
        a.pd.advise_mr(MrAdvice::Prefetch, &[local(PAGE, 16)])
            .is_err()
    );

    // A WRITE by the peer into the read-only page: NAK remote access, nothing stored, no crash.
    b.qp.post_send(&SendWr::write(20, b.mr.sge(0, 16), remote(2 * PAGE)))
        .unwrap();
    let wc = wait(&b.cq, 1, T);
    assert_eq!(wc[0].status, WcStatus::RemAccessErr, "{wc:?}");
    assert_eq!(pages.get(2 * PAGE, 1), [0x77]);
}

#[test]
fn unmapped_addresses_through_an_implicit_region_are_errors_not_faults() {
    let (a, b) = pair(
        [127, 0, 63, 3],
        [127, 0, 63, 4],
        QpType::Rc,
        Mtu::Mtu1024,
        1 << 16,
    );
    let pages = Pages::new();
    // SAFETY: the only memory named through the region is `pages` (outside Rust's references).
    let imr = unsafe { a.pd.reg_mr_implicit(common::ALL) }.unwrap();
    // A peer READ of the inaccessible page: NAK remote access.
    let remote = RemoteAddr {
        remote_addr: pages.addr(PAGE + 8),
        rkey: imr.rkey(),
    };
    b.qp.post_send(&SendWr::read(1, b.mr.sge(0, 64), remote))
        .unwrap();
    let wc = wait(&b.cq, 1, T);
    assert_eq!(wc[0].status, WcStatus::RemAccessErr, "{wc:?}");
    // A local SEND from the inaccessible page: a local protection error.
    let (c, d) = pair(
        [127, 0, 63, 5],
        [127, 0, 63, 6],
        QpType::Rc,
        Mtu::Mtu1024,
        1 << 16,
    );
    // SAFETY: as above: only `pages` is named.
    let cmr = unsafe { c.pd.reg_mr_implicit(AccessFlags::LOCAL_WRITE) }.unwrap();
    d.qp.post_recv(&RecvWr {
        wr_id: 5,
        sg_list: vec![d.mr.sge(0, 100)].into(),
    })
    .unwrap();
    let mut w = SendWr::new(6, WrOpcode::Send).with_flags(ferroce::transport::SendFlags::SIGNALED);
    w.sg_list = vec![Sge {
        addr: pages.addr(PAGE),
        length: 100,
        lkey: cmr.lkey(),
    }]
    .into();
    c.qp.post_send(&w).unwrap();
    let wc = wait(&c.cq, 1, T);
    assert_eq!(
        (wc[0].status, wc[0].opcode),
        (WcStatus::LocProtErr, WcOpcode::Send),
        "{wc:?}"
    );
}
