//! What the ibverbs tests share: the check for Debian's packages they need.
#![allow(dead_code)] // each test crate uses its part

use std::io::Write;
use std::path::Path;

/// Whether `what` (found by `found`) is installed. If it is not: a loud `SKIPPED` line naming
/// the package to install, and `false`, except under CI (`CI` set, where `.ci/run` installs
/// it), where a missing package fails the test.
pub(crate) fn installed(what: &str, found: bool, package: &str) -> bool {
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "{what} is not installed (apt-get install {package})"
        );
        // Straight to the process's stderr, past the test harness's capture, so the skip
        // shows in a plain `cargo test` run.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {what} is not installed (apt-get install {package})"
        );
    }
    found
}

/// Whether libibverbs-dev's `<infiniband/verbs.h>` is there (the C test programs need it).
pub(crate) fn have_verbs_h() -> bool {
    let found = [
        "/usr/include/infiniband/verbs.h",
        "/usr/local/include/infiniband/verbs.h",
    ]
    .iter()
    .any(|p| Path::new(p).exists());
    installed("<infiniband/verbs.h>", found, "libibverbs-dev")
}

/// Whether a socket listens on TCP `port` (any address), from `/proc/net/tcp{,6}`: how a test
/// knows a server program is ready without connecting to it (which would use up its one
/// accept).
pub(crate) fn tcp_listening(port: u16) -> bool {
    const LISTEN: &str = "0A";
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let mut cols = l.split_whitespace();
                let local = cols.nth(1).unwrap_or("");
                let state = cols.nth(1).unwrap_or("");
                state == LISTEN
                    && local
                        .rsplit(':')
                        .next()
                        .and_then(|p| u16::from_str_radix(p, 16).ok())
                        == Some(port)
            })
        })
    })
}

/// Waits (bounded by `limit`) until [`tcp_listening`]; whether it did.
pub(crate) fn wait_listening(port: u16, limit: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if tcp_listening(port) {
            return true;
        }
        std::thread::yield_now();
    }
    false
}
