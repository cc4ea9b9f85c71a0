//! Every opcode × sizes 0, 1, MTU−1, MTU, MTU+1, 1 MiB, 8 MiB × path MTU 256 … 4096, over real
//! UDP sockets on loopback, data verified on both sides.

mod common;

use std::time::Duration;

use common::*;
use ferroce::transport::{Mtu, QpType, RecvWr, WcOpcode, WcStatus, WrOpcode};

const T: Duration = Duration::from_secs(60);
const MEM: usize = 17 << 20;

#[test]
fn every_opcode_size_and_mtu() {
    for (k, mtu) in Mtu::ALL.iter().enumerate() {
        let (a, b) = pair(
            [127, 12, k as u8, 1],
            [127, 12, k as u8, 2],
            QpType::Rc,
            *mtu,
            MEM,
        );
        a.mr.write(0, &pattern(MEM, k as u8)).unwrap();
        b.mr.write(0, &pattern(MEM, 0x80 | k as u8)).unwrap();
        let m = mtu.bytes();
        let sizes = [0, 1, m - 1, m, m + 1, 1 << 20, 8 << 20];
        for op in [
            WrOpcode::Send,
            WrOpcode::SendWithImm,
            WrOpcode::RdmaWrite,
            WrOpcode::RdmaWriteWithImm,
            WrOpcode::RdmaRead,
        ] {
            for &size in &sizes {
                // A's source at 0, B's destination at 8 MiB + 64 (READ: the other way round).
                let before_a = a.mr.to_vec();
                let before_b = b.mr.to_vec();
                let dst = (8 << 20) + 64;
                if matches!(
                    op,
                    WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm
                ) {
                    b.qp.post_recv(&RecvWr {
                        wr_id: 7,
                        sg_list: vec![b.mr.sge(
                            dst,
                            if op == WrOpcode::RdmaWriteWithImm {
                                0
                            } else {
                                size
                            },
                        )]
                        .into(),
                    })
                    .unwrap();
                }
                let mut w = wr(&a, &b, 1, op, 0, size, dst);
                w.imm_data = size ^ 0x5a5a;
                a.qp.post_send(&w).unwrap();
                let s = wait(&a.cq, 1, T);
                assert_eq!(s.len(), 1, "{op:?} {size} mtu {m}: no completion");
                assert_eq!(s[0].status, WcStatus::Success, "{op:?} {size} mtu {m}");
                let (am, bm) = (a.mr.to_vec(), b.mr.to_vec());
                let n = size as usize;
                if op == WrOpcode::RdmaRead {
                    assert!(
                        am[..n] == before_b[dst..dst + n],
                        "{op:?} {size} mtu {m}: READ data"
                    );
                    assert!(bm == before_b, "READ changed the responder's memory");
                } else {
                    assert!(
                        bm[dst..dst + n] == before_a[..n],
                        "{op:?} {size} mtu {m}: data"
                    );
                    assert!(
                        bm[..dst] == before_b[..dst] && bm[dst + n..] == before_b[dst + n..],
                        "{op:?} {size} mtu {m}: bytes outside the target changed"
                    );
                }
                if matches!(
                    op,
                    WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm
                ) {
                    let r = wait(&b.cq, 1, T);
                    assert_eq!(r.len(), 1, "{op:?} {size} mtu {m}: no receive completion");
                    assert_eq!(r[0].status, WcStatus::Success);
                    assert_eq!(r[0].byte_len, size);
                    let want = if op == WrOpcode::RdmaWriteWithImm {
                        WcOpcode::RecvRdmaWithImm
                    } else {
                        WcOpcode::Recv
                    };
                    assert_eq!(r[0].opcode, want);
                    if op != WrOpcode::Send {
                        assert_eq!(r[0].imm_data, size ^ 0x5a5a);
                    }
                }
            }
        }
        // Atomics at this MTU too.
        for (i, op) in [WrOpcode::AtomicFetchAndAdd, WrOpcode::AtomicCmpAndSwp]
            .into_iter()
            .enumerate()
        {
            let off = 16 << 20 | (i * 8);
            let orig = b.mr.atomic_load(off).unwrap();
            let mut w = wr(&a, &b, 2, op, off, 8, off);
            w.compare_add = if op == WrOpcode::AtomicCmpAndSwp {
                orig
            } else {
                5
            };
            w.swap = 99;
            a.qp.post_send(&w).unwrap();
            let c = wait(&a.cq, 1, T);
            assert_eq!(
                c[0].status,
                WcStatus::Success,
                "{op:?} mtu {m}: {:?} / {:?}",
                a.ctx.counters(),
                b.ctx.counters()
            );
            assert_eq!(a.mr.atomic_load(off).unwrap(), orig);
            let want = if op == WrOpcode::AtomicCmpAndSwp {
                99
            } else {
                orig.wrapping_add(5)
            };
            assert_eq!(b.mr.atomic_load(off).unwrap(), want);
        }
    }
}
