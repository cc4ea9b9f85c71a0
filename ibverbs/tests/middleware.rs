//! Middleware that reaches RDMA through rdma_cm, unmodified as Debian ships it, on ferroce's
//! librdmacm.so.1 and libibverbs.so.1 over loopback:
//!
//! * librpma 1.2 (`librpma-dev`): a client and a server written against its API
//!   (`tests/c/rpma_peer.c`) — read, write, flush, atomic write and a read back, every byte
//!   checked on both sides. librpma connects with an ID it made synchronous and then migrates
//!   to a channel, which must make it asynchronous.
//!
//! Where a package is missing the test says so and passes, except under CI.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

mod common;
use common::{finish, installed, lib_dir, start};

/// The librpma peer program, compiled once (None, after a loud skip, without librpma-dev).
fn rpma_peer() -> Option<&'static Path> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    EXE.get_or_init(|| {
        let found = Path::new("/usr/include/librpma.h").exists();
        if !installed("<librpma.h>", found, "librpma-dev") {
            return None;
        }
        let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rpma_peer");
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/rpma_peer.c");
        let st = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-Wall", "-Werror", src, "-o"])
            .arg(&exe)
            .args(["-lrpma", "-libverbs"])
            .status()
            .unwrap();
        assert!(st.success(), "compiling {src}");
        Some(exe)
    })
    .as_deref()
}

fn peer(exe: &Path, args: &[&str], devices: &str) -> Command {
    let mut c = Command::new(exe);
    c.args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("FERROCE_DEVICES", devices)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

#[test]
fn librpma_read_write_flush_atomic_write() {
    let Some(exe) = rpma_peer() else { return };
    let a = "127.0.77.1";
    let server = start(peer(exe, &["server", a, "7700"], a));
    let mut tries = 0;
    let (cok, cout) = loop {
        std::thread::sleep(Duration::from_millis(200));
        let (ok, out) = finish(
            start(peer(exe, &["client", a, "7700"], a)),
            Duration::from_secs(60),
        );
        tries += 1;
        // The server may not listen yet: the connect is refused (REJ 8).
        if ok || !out.contains("ev == RPMA_CONN_ESTABLISHED") || tries == 20 {
            break (ok, out);
        }
    };
    let (sok, sout) = finish(server, Duration::from_secs(60));
    assert!(
        cok && sok && cout.contains("ok client") && sout.contains("ok server"),
        "client:\n{cout}\nserver:\n{sout}"
    );
}
