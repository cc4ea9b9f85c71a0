//! Separate `ferroce` processes on 127.x addresses: `rc-pingpong` against itself in both
//! roles (ibv_rc_pingpong's exchange and output), with events, validation, several sizes and
//! MTUs, and under 10 % injected loss; and the `demo`.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn ferroce() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferroce"))
}

fn pingpong(
    server: &str,
    client: &str,
    tcp_port: u16,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Output, Output) {
    let mut s = ferroce();
    s.args([
        "rc-pingpong",
        "-d",
        server,
        "-g",
        "1",
        "-p",
        &tcp_port.to_string(),
    ])
    .args(extra);
    for (k, v) in env {
        s.env(k, v);
    }
    let srv = s
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        common::wait_listening(tcp_port, Duration::from_secs(20)),
        "the rc-pingpong server never listened on {tcp_port}"
    );
    let mut c = ferroce();
    c.args([
        "rc-pingpong",
        "-d",
        client,
        "-g",
        "1",
        "-p",
        &tcp_port.to_string(),
    ])
    .args(extra)
    .arg("127.0.0.1");
    for (k, v) in env {
        c.env(k, v);
    }
    let cli = c.output().unwrap();
    let srv = srv.wait_with_output().unwrap();
    (srv, cli)
}

fn check(out: &Output, iters: u32, size: u32, local: &str, remote: &str) {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[0].starts_with("  local address:  LID 0x0000, QPN 0x"),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].ends_with(&format!("GID ::ffff:{local}")),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].starts_with("  remote address: LID 0x0000, QPN 0x")
            && lines[1].ends_with(&format!("GID ::ffff:{remote}"))
    );
    let bytes = u64::from(size) * u64::from(iters) * 2;
    assert!(
        lines[2].starts_with(&format!("{bytes} bytes in ")) && lines[2].ends_with(" Mbit/sec"),
        "{}",
        lines[2]
    );
    assert!(
        lines[3].starts_with(&format!("{iters} iters in ")) && lines[3].ends_with(" usec/iter"),
        "{}",
        lines[3]
    );
}

#[test]
fn rc_pingpong_against_itself_both_roles() {
    let (s, c) = pingpong("127.0.0.21", "127.0.0.22", 18601, &[], &[]);
    check(&s, 1000, 4096, "127.0.0.21", "127.0.0.22");
    check(&c, 1000, 4096, "127.0.0.22", "127.0.0.21");
}

#[test]
fn rc_pingpong_sizes_mtus_events_and_validation() {
    for (i, (size, mtu, events)) in [
        (1u32, 256u32, true),
        (65536, 4096, false),
        (1025, 1024, true),
    ]
    .into_iter()
    .enumerate()
    {
        let (a, b) = (format!("127.15.{i}.1"), format!("127.15.{i}.2"));
        let sz = size.to_string();
        let m = mtu.to_string();
        let mut extra = vec!["-s", &sz, "-m", &m, "-n", "200", "-c"];
        if events {
            extra.push("-e");
        }
        let (s, c) = pingpong(&a, &b, 18610 + i as u16, &extra, &[]);
        check(&s, 200, size, &a, &b);
        check(&c, 200, size, &b, &a);
    }
}

#[test]
fn rc_pingpong_under_ten_percent_loss() {
    let env = [("FERROCE_FAULTS", "loss=0.1,seed=5")];
    let (s, c) = pingpong(
        "127.15.9.1",
        "127.15.9.2",
        18620,
        &["-n", "200", "-c", "-s", "8192"],
        &env,
    );
    check(&s, 200, 8192, "127.15.9.1", "127.15.9.2");
    check(&c, 200, 8192, "127.15.9.2", "127.15.9.1");
}

#[test]
fn bad_device_and_busy_address_are_clear_errors() {
    let out = ferroce()
        .args(["rc-pingpong", "-d", "198.51.100.9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no device 198.51.100.9"));
    let _held = ferroce::Device::for_addr([127, 15, 8, 1].into())
        .unwrap()
        .open()
        .unwrap();
    let out = ferroce()
        .args(["rc-pingpong", "-d", "127.15.8.1", "-p", "18630"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("127.15.8.1:4791 is already in use"));
}

#[test]
fn demo_runs_and_verifies() {
    let out = ferroce().arg("demo").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.lines().last().unwrap() == "demo OK: every byte verified",
        "{text}"
    );
    for step in [
        "1. SEND ping-pong",
        "2. RDMA WRITE 8 MiB A -> B: verified",
        "3. RDMA READ 8 MiB B -> A: verified",
        "4. 1000 FETCH_ADD",
        "5. RDMA WRITE 64 KiB streamed",
    ] {
        assert!(text.contains(step), "{step} missing:\n{text}");
    }
}

/// `FERROCE_PCAP` records every packet sent and received; `ferroce pcap` decodes the file with
/// every ICRC right.
#[test]
fn pcap_recording_decodes_with_every_icrc_ok() {
    let dir = std::env::temp_dir().join(format!("ferroce-pcap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("server.pcap");
    let env = [("FERROCE_PCAP", file.to_str().unwrap())];
    let (s, c) = pingpong(
        "127.15.7.1",
        "127.15.7.2",
        18640,
        &["-n", "20", "-s", "3000"],
        &env,
    );
    check(&s, 20, 3000, "127.15.7.1", "127.15.7.2");
    check(&c, 20, 3000, "127.15.7.2", "127.15.7.1");
    let out = ferroce()
        .args(["pcap", "--strict"])
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = text.lines().last().unwrap();
    let n: u64 = last.split(' ').next().unwrap().parse().unwrap();
    // 20 SENDs of 3 packets (MTU 1024) each way, plus an ACK for each.
    assert!(n >= 160, "{last}");
    assert_eq!(
        last,
        format!("{n} packets, {n} icrc ok, 0 icrc bad, 0 malformed")
    );
    assert!(text.contains("RC_SEND_FIRST") && text.contains("RC_ACKNOWLEDGE"));
    std::fs::remove_dir_all(&dir).unwrap();
}
