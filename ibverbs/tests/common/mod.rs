//! What the ibverbs tests share: the check for Debian's packages they need, and the C
//! programs that print a header's layout.
#![allow(dead_code)] // each test crate uses its part

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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

/// The directory holding both libraries, linked once per test run.
pub(crate) fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().unwrap().parent().unwrap();
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cargo
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args([
                "build",
                "-q",
                "-p",
                "ferroce-ibverbs",
                "-p",
                "ferroce-librdmacm",
                "--lib",
            ])
            .env("CARGO_TARGET_DIR", profile_dir.parent().unwrap());
        if release {
            cargo.arg("--release");
        }
        assert!(
            cargo.status().unwrap().success(),
            "building the static libraries"
        );
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ferroce-rdmacm");
        std::fs::create_dir_all(&dir).unwrap();
        let verbs = dir.join("libibverbs.so.1");
        let st = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/link.sh"))
            .arg(profile_dir.join("libferroce_ibverbs.a"))
            .arg(&verbs)
            .status()
            .unwrap();
        assert!(st.success(), "linking libibverbs.so.1");
        let st = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../librdmacm/link.sh"))
            .arg(profile_dir.join("libferroce_librdmacm.a"))
            .arg(&verbs)
            .arg(dir.join("librdmacm.so.1"))
            .status()
            .unwrap();
        assert!(st.success(), "linking librdmacm.so.1");
        dir
    })
}

pub(crate) fn have(prog: &str, package: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .output()
        .is_ok_and(|o| o.status.success());
    installed(prog, found, package)
}

/// A started program whose output is read as it comes (a verbose program would block on a
/// full pipe).
pub(crate) struct Running {
    pub(crate) child: Child,
    out: std::thread::JoinHandle<String>,
    err: std::thread::JoinHandle<String>,
}

pub(crate) fn start(mut c: Command) -> Running {
    watch(c.spawn().unwrap())
}

/// Reads a spawned `child`'s stdout and stderr as they come.
pub(crate) fn watch(mut child: Child) -> Running {
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    Running { child, out, err }
}

/// Waits at most `limit` for `r` (killing it after); returns (success, stdout + stderr).
pub(crate) fn finish(mut r: Running, limit: Duration) -> (bool, String) {
    let t0 = Instant::now();
    let ok = loop {
        if let Some(st) = r.child.try_wait().unwrap() {
            break st.success();
        }
        if t0.elapsed() > limit {
            let _ = r.child.kill();
            let _ = r.child.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut text = r.out.join().unwrap();
    text.push_str(&r.err.join().unwrap());
    (ok, text)
}

/// Compiles the C test program `tests/c/<name>.c` with `libs` into the test's temporary
/// directory; None (after a loud skip, or a failure under CI) when `header` — from
/// `package` — is missing.
pub(crate) fn compile_c(name: &str, header: &str, package: &str, libs: &[&str]) -> Option<PathBuf> {
    let found = Path::new("/usr/include").join(header).exists();
    if !installed(&format!("<{header}>"), found, package) {
        return None;
    }
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let src = format!("{}/tests/c/{name}.c", env!("CARGO_MANIFEST_DIR"));
    let st = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-Wall", "-Werror", "-Wno-unused-result", &src, "-o"])
        .arg(&exe)
        .args(libs)
        .status()
        .unwrap_or_else(|e| panic!("a C compiler (cc): {e}"));
    assert!(st.success(), "compiling {src}");
    Some(exe)
}

/// A program of the test's run on ferroce's libraries and devices `devices`, its output piped.
pub(crate) fn on_ferroce(exe: &Path, args: &[&str], devices: &str) -> Command {
    let mut c = Command::new(exe);
    c.args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("FERROCE_DEVICES", devices)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c
}

/// The stand-in uverbs node UCX checks for (`ferroce devnode`): made here when running as root,
/// otherwise a loud skip (a failure under CI, which runs as root).
pub(crate) fn have_uverbs_node() -> bool {
    if Path::new(ferroce::UVERBS_NODE).exists() {
        return true;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return ferroce::create_uverbs_node().is_ok();
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} is missing and this is not root (CI runs as root)",
        ferroce::UVERBS_NODE
    );
    // Straight to the process's stderr, past the harness's capture, so the skip shows.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {} is missing (run `sudo ferroce devnode` once: UCX looks for it)",
        ferroce::UVERBS_NODE
    );
    false
}
