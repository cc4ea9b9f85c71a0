//! What the ibverbs tests share: the check for Debian's packages they need, and the C
//! programs that print a header's layout.
#![allow(dead_code)] // each test crate uses its part

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;

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

/// Compiles `tests/c/<src>` (which includes `header`) into `exe` under the test's temporary
/// directory, runs it and reads its lines `kind name value`: every size and offset the C
/// compiler gives the header's structures, by name.
pub(crate) fn c_layout(src: &str, exe: &str, header: &str) -> HashMap<String, usize> {
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(exe);
    let src = format!("{}/tests/c/{src}", env!("CARGO_MANIFEST_DIR"));
    let st = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args([&src, "-o"])
        .arg(&exe)
        .status()
        .unwrap_or_else(|e| panic!("a C compiler (cc) and {header}: {e}"));
    assert!(st.success(), "compiling {src}");
    let out = Command::new(&exe)
        .output()
        .expect("the layout program runs");
    String::from_utf8(out.stdout)
        .expect("the layout program prints text")
        .lines()
        .map(|l| {
            let mut w = l.split_whitespace();
            let (_, name, v) = (w.next(), w.next(), w.next());
            let (name, v) = name
                .zip(v)
                .unwrap_or_else(|| panic!("a layout line: {l:?}"));
            (
                name.to_string(),
                v.parse().unwrap_or_else(|_| panic!("a number in {l:?}")),
            )
        })
        .collect()
}
