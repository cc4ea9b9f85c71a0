//! `ferroce bw -a` sweeps every size from 2 B to 8 MiB, each on a clean queue pair: a SEND run
//! leaves its receiver's queue full of receives posted for its own size, and the sweep ran its
//! first size and then stopped with "post: queue full".

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::process::Command;

fn sweep(op: &str) -> Vec<u64> {
    let o = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .args(["bw", "--op", op, "-a", "-n", "20", "-t", "8"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{op}: {stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A line per size: its size and its message count.
    stdout
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let size = f.next()?.parse::<u64>().ok()?;
            let msgs = f.next()?.parse::<u64>().ok()?;
            assert_eq!(msgs, 20, "{op}: {l}");
            Some(size)
        })
        .collect()
}

#[test]
fn a_sweep_runs_every_size_for_every_operation() {
    let sizes: Vec<u64> = (1..=23).map(|k| 1u64 << k).collect();
    for op in ["send", "write", "read"] {
        assert_eq!(sweep(op), sizes, "{op}");
    }
}
