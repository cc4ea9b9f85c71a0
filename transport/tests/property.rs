//! Property tests over seeded random workloads and link faults: every WR completes exactly
//! once, in posting order, with the right status, and every byte lands exactly as sent.
//! A failure prints its seed; `ROCE_SIM_SEED=<n>` replays it.

mod common;

use common::workload::{Shape, Stats, run};
use ferroce_transport::sim::run_seeds;

fn run_all(seeds: std::ops::Range<u64>, shape: Shape) -> Stats {
    let mut total = Stats::default();
    run_seeds(seeds, |seed| {
        total.add(run(seed, shape)?);
        Ok(())
    });
    eprintln!("{total:?}");
    total
}

/// 2,000 seeds of small and medium messages (0 B … 64 KiB), loss up to 30 %, duplication,
/// reordering and corruption.
#[test]
fn random_workloads_over_lossy_links() {
    let s = run_all(
        0..2000,
        Shape {
            max_ops: 12,
            max_len: 64 << 10,
            max_loss: 0.3,
            faults: true,
            large: false,
        },
    );
    // The faults really happened and were recovered from.
    assert!(
        s.retries > 1000 && s.seq_naks > 1000 && s.duplicates > 1000 && s.icrc_errors > 100,
        "{s:?}"
    );
}

/// The same on a perfect link, where nothing may ever be retried.
#[test]
fn random_workloads_over_perfect_links() {
    let s = run_all(
        10_000..10_300,
        Shape {
            max_ops: 20,
            max_len: 64 << 10,
            max_loss: 0.0,
            faults: false,
            large: false,
        },
    );
    assert_eq!(
        (s.retries, s.seq_naks, s.duplicates, s.retry_exceeded),
        (0, 0, 0, 0),
        "{s:?}"
    );
}

/// Large messages (up to 8 MiB) over lossy links, a few seeds.
#[test]
fn large_messages_over_lossy_links() {
    let s = run_all(
        20_000..20_004,
        Shape {
            max_ops: 3,
            max_len: 8 << 20,
            max_loss: 0.05,
            faults: true,
            large: true,
        },
    );
    assert!(s.packets > 10_000, "{s:?}");
}

/// The soak: many more seeds. `cargo test -p ferroce-transport --release -- --ignored soak`.
#[test]
#[ignore = "soak: run on demand"]
fn soak() {
    run_all(
        100_000..120_000,
        Shape {
            max_ops: 16,
            max_len: 256 << 10,
            max_loss: 0.3,
            faults: true,
            large: false,
        },
    );
}
