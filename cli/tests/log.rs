//! The `ferroce` binary logs as the libraries do: `FERROCE_LOG=debug` (what its messages, the
//! README and `ferroce doctor` tell a user to set) shows the provider's debug lines, and
//! without it a run prints none.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::process::Command;

fn lat_stderr(log: Option<&str>) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferroce"));
    c.args(["lat", "-n", "10"])
        .env_remove("FERROCE_LOG")
        .env_remove("RUST_LOG");
    if let Some(l) = log {
        c.env("FERROCE_LOG", l);
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "{o:?}");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn ferroce_log_sets_the_binary_s_level() {
    let debug = lat_stderr(Some("debug"));
    assert!(
        debug.contains("DEBUG ferroce::host::group")
            && debug.contains("joined the address's group"),
        "{debug}"
    );
    let quiet = lat_stderr(None);
    assert!(!quiet.contains("DEBUG"), "{quiet}");
}
