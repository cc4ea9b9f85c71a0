//! Memory windows in the engine (IBTA 10.6.7): BIND_MW and LOCAL_INV run in send-queue order
//! without packets, remote accesses go through a window's range and rights, a type 2 window
//! answers only the QP it is bound to, and SEND with invalidate (IETH) kills a key at the
//! responder. Node 1 (B) owns the windows; node 0 (A) uses them.

mod common;

use common::*;
use ferroce_transport::memory::{Memory, VecMr};
use ferroce_transport::sim::LinkConfig;
use ferroce_transport::{
    AccessFlags, MwBind, RemoteAddr, SendWr, WcFlags, WcOpcode, WcQueue, WcStatus,
};

const STEPS: u64 = 200_000;

/// A region on B that windows may be bound to, and a type 2 window on it.
fn window_setup(p: &mut Pair, access: AccessFlags) -> (VecMr, u32) {
    let mem = &p.net.nodes[1].mem;
    let mr = mem.register(PD, vec![0; 8192], access);
    let mw = mem.alloc_mw(PD, 2);
    (mr, mw)
}

fn next_key(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

fn bind(mw: u32, mr: &VecMr, off: u64, len: u64, access: AccessFlags) -> MwBind {
    MwBind {
        mw_rkey: mw,
        new_rkey: next_key(mw),
        mr_lkey: mr.lkey,
        addr: mr.addr + off,
        length: len,
        access,
    }
}

fn b_send_wcs(p: &Pair) -> Vec<ferroce_transport::WorkCompletion> {
    p.net.nodes[1].completions_of(p.qb, WcQueue::Send)
}

fn run_until_b_send_wcs(p: &mut Pair, n: usize) {
    let qb = p.qb;
    assert!(p.net.drive_until(STEPS, |net| {
        net.nodes[1].completions_of(qb, WcQueue::Send).len() >= n
    }));
}

/// A WRITE from A into B's window.
fn write_to(p: &Pair, wr_id: u64, len: u32, addr: u64, rkey: u32) -> SendWr {
    SendWr::write(
        wr_id,
        p.mra.sge(0, len),
        RemoteAddr {
            remote_addr: addr,
            rkey,
        },
    )
}

const WINDOW_MR: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::MW_BIND);

#[test]
fn a_bound_window_takes_writes_in_its_range_only() {
    let mut p = pair(21, lossless(), Opts::default());
    let (mr, mw) = window_setup(&mut p, WINDOW_MR);
    let b = bind(mw, &mr, 1024, 2048, AccessFlags::REMOTE_WRITE);
    p.post_send(1, SendWr::bind_mw(1, b));
    run_until_b_send_wcs(&mut p, 1);
    let wcs = b_send_wcs(&p);
    assert_eq!(
        (wcs[0].status, wcs[0].opcode),
        (WcStatus::Success, WcOpcode::Bind)
    );
    // Inside the window: lands in the region at the window's place.
    p.post_send(0, write_to(&p, 2, 512, mr.addr + 1100, b.new_rkey));
    assert!(p.run_until_send_wcs(1, STEPS));
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::Success);
    let bytes = p.net.nodes[1].mem.bytes(mr.lkey).unwrap();
    assert_eq!(bytes[1100..1612], p.bytes(0)[..512]);
    // A range past the window's end is refused.
    p.post_send(0, write_to(&p, 3, 512, mr.addr + 2900, b.new_rkey));
    assert!(p.run_until_send_wcs(2, STEPS));
    assert_eq!(p.send_wcs(0)[1].status, WcStatus::RemAccessErr);
}

#[test]
fn the_window_key_before_the_bind_is_dead_and_rights_are_the_windows() {
    let mut p = pair(22, lossless(), Opts::default());
    let (mr, mw) = window_setup(&mut p, WINDOW_MR);
    // The window opens for READ only: a WRITE through it is refused.
    let b = bind(mw, &mr, 0, 4096, AccessFlags::REMOTE_READ);
    p.post_send(1, SendWr::bind_mw(1, b));
    run_until_b_send_wcs(&mut p, 1);
    p.post_send(0, write_to(&p, 2, 64, mr.addr, b.new_rkey));
    assert!(p.run_until_send_wcs(1, STEPS));
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::RemAccessErr);
    let mem = &p.net.nodes[1].mem;
    assert!(
        mem.check_remote(PD, mw, mr.addr, 8, AccessFlags::REMOTE_READ)
            .is_err(),
        "the pre-bind key"
    );
    assert!(
        mem.check_remote(PD, b.new_rkey, mr.addr, 8, AccessFlags::REMOTE_READ)
            .is_ok()
    );
}

#[test]
fn binding_needs_mw_bind_on_the_region_and_fails_the_qp() {
    let mut p = pair(23, lossless(), Opts::default());
    let (mr, mw) = window_setup(&mut p, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
    p.post_send(
        1,
        SendWr::bind_mw(1, bind(mw, &mr, 0, 64, AccessFlags::REMOTE_WRITE)),
    );
    run_until_b_send_wcs(&mut p, 1);
    assert_eq!(b_send_wcs(&p)[0].status, WcStatus::MwBindErr);
    assert_eq!(p.state(1), ferroce_transport::QpState::Err);
    // Why, with the rule: the region lacks MW_BIND.
    let e = p.net.nodes[1].endpoint.qp_error(p.qb).unwrap();
    assert_eq!(
        e.cause,
        ferroce_transport::ErrorCause::LocalOperation {
            opcode: ferroce_transport::WrOpcode::BindMw,
            error: ferroce_transport::MemError::AccessDenied
        }
    );
    assert!(
        e.to_string().contains(
            "a memory window bind refused: the region does not grant it (a bind needs MW_BIND"
        ),
        "{e}"
    );
}

/// A type 2 window bound to another QP of B refuses A's WRITE arriving on this one.
#[test]
fn a_type2_window_answers_only_the_qp_it_is_bound_to() {
    let mut p = pair(24, lossless(), Opts::default());
    let (mr, mw) = window_setup(&mut p, WINDOW_MR);
    let b = bind(mw, &mr, 0, 4096, AccessFlags::REMOTE_WRITE);
    p.net.nodes[1].mem.bind_mw(PD, 0xdead, &b).unwrap();
    p.post_send(0, write_to(&p, 1, 64, mr.addr, b.new_rkey));
    assert!(p.run_until_send_wcs(1, STEPS));
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn local_invalidate_kills_the_key() {
    let mut p = pair(25, lossless(), Opts::default());
    let (mr, mw) = window_setup(&mut p, WINDOW_MR);
    let b = bind(mw, &mr, 0, 4096, AccessFlags::REMOTE_WRITE);
    p.post_send(1, SendWr::bind_mw(1, b));
    p.post_send(1, SendWr::local_inv(2, b.new_rkey));
    run_until_b_send_wcs(&mut p, 2);
    let wcs = b_send_wcs(&p);
    assert_eq!(
        wcs.iter().map(|w| (w.status, w.opcode)).collect::<Vec<_>>(),
        vec![
            (WcStatus::Success, WcOpcode::Bind),
            (WcStatus::Success, WcOpcode::LocalInv)
        ]
    );
    p.post_send(0, write_to(&p, 3, 64, mr.addr, b.new_rkey));
    assert!(p.run_until_send_wcs(1, STEPS));
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::RemAccessErr);
}

/// SEND with invalidate: B's receive completes with WITH_INV and the key, and the key is dead
/// for the WRITE after it. A second invalidate of the dead key is NAKed invalid request.
#[test]
fn send_with_invalidate_kills_the_key_at_the_responder() {
    let mut p = pair(26, lossless(), Opts::default());
    let (mr, mw) = window_setup(&mut p, WINDOW_MR);
    let b = bind(mw, &mr, 0, 4096, AccessFlags::REMOTE_WRITE);
    p.post_send(1, SendWr::bind_mw(1, b));
    run_until_b_send_wcs(&mut p, 1);
    p.post_recv(1, 10, 0, 4096);
    p.post_send(0, SendWr::send_with_inv(1, p.mra.sge(0, 3000), b.new_rkey));
    p.post_send(0, write_to(&p, 2, 64, mr.addr, b.new_rkey));
    assert!(p.run_until_send_wcs(2, STEPS));
    let r = p.recv_wcs(1);
    assert_eq!(r.len(), 1);
    assert!(r[0].wc_flags.contains(WcFlags::WITH_INV), "{:?}", r[0]);
    assert_eq!((r[0].invalidated_rkey, r[0].byte_len), (b.new_rkey, 3000));
    assert_eq!(
        statuses(&p.send_wcs(0)),
        vec![WcStatus::Success, WcStatus::RemAccessErr]
    );
}

#[test]
fn send_with_invalidate_of_a_dead_key_is_an_invalid_request() {
    let mut p = pair(27, lossless(), Opts::default());
    p.post_recv(1, 10, 0, 4096);
    p.post_send(0, SendWr::send_with_inv(1, p.mra.sge(0, 100), 0x1234_5678));
    assert!(p.run_until_send_wcs(1, STEPS));
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::RemInvReqErr);
    assert_eq!(statuses(&p.recv_wcs(1))[0], WcStatus::RemInvReqErr);
}

/// Local operations retire in order behind the packets before them, and under loss (go-back-N
/// resends around them) each runs once: a type 2 window bound twice would fail the second time.
#[test]
fn local_ops_run_once_in_order_under_loss() {
    for seed in 0..20 {
        let link = LinkConfig {
            loss: 0.2,
            ..lossless()
        };
        let mut p = pair(100 + seed, link, Opts::default());
        let (mr, mw) = window_setup(&mut p, WINDOW_MR);
        for i in 0..4 {
            p.post_recv(0, 50 + i, 0, 8192);
        }
        let send = |p: &Pair, id| SendWr::send(id, p.mrb.sge(0, 5000));
        p.post_send(1, send(&p, 1));
        p.post_send(
            1,
            SendWr::bind_mw(2, bind(mw, &mr, 0, 4096, AccessFlags::REMOTE_WRITE)),
        );
        p.post_send(1, send(&p, 3));
        p.post_send(1, SendWr::local_inv(4, next_key(mw)));
        p.post_send(1, send(&p, 5));
        run_until_b_send_wcs(&mut p, 5);
        let wcs = b_send_wcs(&p);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            (1..=5).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>(),
            "seed {seed}"
        );
        assert_eq!(p.recv_wcs(0).len(), 3, "seed {seed}");
    }
}

/// Under loss, a SEND with invalidate resent after its ACK was lost is a duplicate: the key is
/// invalidated once (a second invalidation of the dead key would be NAKed and fail the SEND),
/// the receive completes once, and the key is dead after it.
#[test]
fn send_with_invalidate_under_loss_invalidates_once() {
    for seed in 0..20 {
        let link = LinkConfig {
            loss: 0.2,
            ..lossless()
        };
        let mut p = pair(200 + seed, link, Opts::default());
        let (mr, mw) = window_setup(&mut p, WINDOW_MR);
        let b = bind(mw, &mr, 0, 4096, AccessFlags::REMOTE_WRITE);
        p.net.nodes[1].mem.bind_mw(PD, p.qb, &b).unwrap();
        p.post_recv(1, 10, 0, 8192);
        p.post_recv(1, 11, 0, 8192);
        p.post_send(0, SendWr::send_with_inv(1, p.mra.sge(0, 3000), b.new_rkey));
        p.post_send(0, SendWr::send(2, p.mra.sge(0, 100)));
        assert!(p.run_until_send_wcs(2, STEPS), "seed {seed}");
        p.net.drive(STEPS);
        assert_eq!(
            statuses(&p.send_wcs(0)),
            vec![WcStatus::Success; 2],
            "seed {seed}"
        );
        let r = p.recv_wcs(1);
        assert_eq!(statuses(&r), vec![WcStatus::Success; 2], "seed {seed}");
        assert!(
            r[0].wc_flags.contains(WcFlags::WITH_INV) && !r[1].wc_flags.contains(WcFlags::WITH_INV)
        );
        assert_eq!(r[0].invalidated_rkey, b.new_rkey);
        let mem = &p.net.nodes[1].mem;
        assert!(
            mem.check_remote(PD, b.new_rkey, mr.addr, 8, AccessFlags::REMOTE_WRITE)
                .is_err()
        );
    }
}

/// A zero-based type 2 window (`IBV_ACCESS_ZERO_BASED`): peers address it by offset from its
/// first byte; offsets past its length are refused; a type 1 window cannot be zero based.
#[test]
fn a_zero_based_window_is_addressed_by_offset() {
    let mut p = pair(31, lossless(), Opts::default());
    let (mr, mw) = window_setup(&mut p, WINDOW_MR);
    let zb = AccessFlags::REMOTE_WRITE | AccessFlags::ZERO_BASED;
    let b = bind(mw, &mr, 1024, 2048, zb);
    p.post_send(1, SendWr::bind_mw(1, b));
    run_until_b_send_wcs(&mut p, 1);
    assert_eq!(b_send_wcs(&p)[0].status, WcStatus::Success);
    // Offset 100 of the window is byte 1124 of the region.
    p.post_send(0, write_to(&p, 2, 256, 100, b.new_rkey));
    assert!(p.run_until_send_wcs(1, STEPS));
    assert_eq!(p.send_wcs(0)[0].status, WcStatus::Success);
    let bytes = p.net.nodes[1].mem.bytes(mr.lkey).unwrap();
    assert_eq!(bytes[1124..1380], p.bytes(0)[..256]);
    assert!(bytes[..1124].iter().all(|&x| x == 0));
    // The region's own address through the window is past its length now: refused.
    p.post_send(0, write_to(&p, 3, 16, mr.addr + 1100, b.new_rkey));
    assert!(p.run_until_send_wcs(2, STEPS));
    assert_eq!(p.send_wcs(0)[1].status, WcStatus::RemAccessErr);
    // Type 1 windows are never zero based.
    let mem = &p.net.nodes[1].mem;
    let mw1 = mem.alloc_mw(PD, 1);
    assert!(mem.bind_mw(PD, 0, &bind(mw1, &mr, 0, 64, zb)).is_err());
}
