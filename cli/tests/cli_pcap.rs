//! `ferroce pcap` as a user runs it: the summary line for each golden capture, and clear
//! errors (not panics) for missing, truncated and garbage files.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data")
        .join(name)
}

fn ferroce_pcap(path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .arg("pcap")
        .arg(path)
        .output()
        .unwrap()
}

#[test]
fn summary_line_for_each_capture() {
    for (name, n) in [
        ("rxe-mtu1024-ib_atomic_bw.pcap", 40),
        ("rxe-mtu1024-ib_read_bw.pcap", 100),
        ("rxe-mtu1024-ucmatose.pcap", 13),
        ("rxe-mtu1024-rc_pingpong.pcap", 289),
    ] {
        let out = ferroce_pcap(&data(name));
        assert!(out.status.success(), "{name}");
        let text = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), n + 1, "{name}");
        assert_eq!(
            *lines.last().unwrap(),
            format!("{n} packets, {n} icrc ok, 0 icrc bad, 0 malformed")
        );
        assert!(lines[..n].iter().all(|l| l.ends_with("icrc=ok")));
    }
}

#[test]
fn read_response_and_write_lines_show_their_headers() {
    let out = ferroce_pcap(&data("rxe-mtu1024-ib_read_bw.pcap"));
    let text = String::from_utf8(out.stdout).unwrap();
    let req = text
        .lines()
        .find(|l| l.contains("RC_RDMA_READ_REQUEST"))
        .unwrap();
    assert!(
        req.contains("reth(va=0x557a96a70000 rkey=0x60d len=4096)"),
        "{req}"
    );
    let first = text
        .lines()
        .find(|l| l.contains("RC_RDMA_READ_RESPONSE_FIRST"))
        .unwrap();
    assert!(
        first.contains("aeth(syndrome=0x1f ACK msn=") && first.contains("payload=1024"),
        "{first}"
    );
}

#[test]
fn bad_files_give_clear_errors() {
    let dir = std::env::temp_dir().join(format!("ferroce-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = std::fs::read(data("rxe-mtu1024-rc_pingpong_small.pcap")).unwrap();
    let truncated = dir.join("truncated.pcap");
    std::fs::write(&truncated, &good[..good.len() - 7]).unwrap();
    let garbage = dir.join("garbage.pcap");
    std::fs::write(&garbage, b"this is not a capture at all").unwrap();
    for (path, msg) in [
        (truncated.as_path(), "file ends inside record"),
        (garbage.as_path(), "not a pcap file"),
        (dir.join("missing.pcap").as_path(), "No such file"),
    ] {
        let out = ferroce_pcap(path);
        assert_eq!(out.status.code(), Some(1), "{}", path.display());
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.contains(msg), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
