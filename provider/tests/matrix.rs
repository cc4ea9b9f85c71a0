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
        // What each region must hold: every transfer updates the model, the targets are
        // compared after each transfer and the whole regions after each opcode (a stray
        // write anywhere is caught there).
        let mut model_a = pattern(MEM, k as u8);
        let mut model_b = pattern(MEM, 0x80 | k as u8);
        a.mr.write(0, &model_a).unwrap();
        b.mr.write(0, &model_b).unwrap();
        let m = mtu.bytes();
        let sizes = [0, 1, m - 1, m, m + 1, 1 << 20, 8 << 20];
        let mut window = vec![0u8; 8 << 20];
        for op in [
            WrOpcode::Send,
            WrOpcode::SendWithImm,
            WrOpcode::RdmaWrite,
            WrOpcode::RdmaWriteWithImm,
            WrOpcode::RdmaRead,
        ] {
            for &size in &sizes {
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
                let n = size as usize;
                let got = &mut window[..n];
                if op == WrOpcode::RdmaRead {
                    model_a[..n].copy_from_slice(&model_b[dst..dst + n]);
                    a.mr.read(0, got).unwrap();
                    assert!(*got == model_a[..n], "{op:?} {size} mtu {m}: READ data");
                } else {
                    model_b[dst..dst + n].copy_from_slice(&model_a[..n]);
                    b.mr.read(dst, got).unwrap();
                    assert!(*got == model_b[dst..dst + n], "{op:?} {size} mtu {m}: data");
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
            assert!(
                a.mr.to_vec() == model_a,
                "{op:?} mtu {m}: the requester's region holds bytes no transfer put there"
            );
            assert!(
                b.mr.to_vec() == model_b,
                "{op:?} mtu {m}: the responder's region holds bytes no transfer put there"
            );
        }
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
