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
        // Packet lines; a CM MAD's fields follow its packet on indented lines.
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with(' ')).collect();
        assert_eq!(lines.len(), n + 1, "{name}");
        assert_eq!(
            *lines.last().unwrap(),
            format!("{n} packets, {n} icrc ok, 0 icrc bad, 0 malformed")
        );
        assert!(lines[..n].iter().all(|l| l.ends_with("icrc=ok")));
    }
}

/// Every CM MAD of the ucmatose capture, field by field, with the rdma_cm header.
#[test]
fn cm_mads_are_shown_field_by_field() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .args(["pcap", "--strict"])
        .arg(data("rxe-mtu1024-ucmatose.pcap"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "  CM REQ tid=0x00000002ce752314",
        " local_comm_id=0x142375ce ",
        " service_id=0x1061d2f ",
        " starting_psn=0x9bf04a",
        " retry_count=5 ",
        " path_mtu=3 ",
        " primary_local_gid=::ffff:10.77.0.12 ",
        " primary_flow_label=0x612f6 ",
        " primary_local_ack_timeout=19 ",
        "    service: port space 0x0106, port 7471",
        "    rdma_cm header: version 0 IPv4 port 46425 10.77.0.12 -> 10.77.0.11",
        "    user private data: 56 bytes, all zero",
        "  CM REP tid=0x00000002ce752314",
        " target_ack_delay=15 ",
        " rnr_retry_count=7",
        "    private data: 196 bytes, all zero",
        "  CM RTU tid=0x00000002ce752314",
        "  CM DREQ tid=0x00000002a9b878a6",
        " remote_qpn=26",
        "  CM DREP tid=0x00000002a9b878a6",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    assert_eq!(text.matches("  CM ").count(), 5);
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
