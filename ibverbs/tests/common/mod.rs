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
