//! Separate `ferroce` processes on 127.x addresses: `rc-pingpong` against itself in both
//! roles (ibv_rc_pingpong's exchange and output), with events, validation, several sizes and
//! MTUs, and under 10 % injected loss; and the `demo`. Processes sharing one address: on
//! 127.x, and on an interface's address in a namespace of the test's own.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

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
        ferroce_tests::wait_listening(tcp_port, Duration::from_secs(20)),
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
    // A program that is not a ferroce process of this user holds the address and port.
    let _held = std::net::UdpSocket::bind("127.15.8.1:4791").unwrap();
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

/// A child process killed if the test ends without collecting it (a failed assertion must
/// not leave pingpong processes spinning after the test).
struct Proc(Option<std::process::Child>);

impl Proc {
    /// The process's output once it ends; one still running after two minutes (a hang) is
    /// killed, and its output shows how far it got.
    fn output(mut self) -> Output {
        let mut c = self.0.take().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while c.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        c.wait_with_output().unwrap()
    }

    fn kill(mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// How the process ended, if it has; otherwise it is killed (`None`).
    fn stop(mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.0.take()?;
        let ended = c.try_wait().ok().flatten();
        if ended.is_none() {
            let _ = c.kill();
            let _ = c.wait();
        }
        ended
    }
}

impl Proc {
    fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, std::process::Child::id)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn(args: &[&str]) -> Proc {
    Proc(Some(
        ferroce()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ))
}

/// Starts `n` rc-pingpong servers on `addr` (TCP ports from `port`), then `n` clients on the
/// same address: 2n processes sharing one device address, every pair on it at both ends.
fn pairs_on_one_address(addr: &str, port: u16, n: u16, extra: &[&str]) -> Vec<(Proc, Proc)> {
    let servers: Vec<_> = (0..n)
        .map(|i| {
            let p = (port + i).to_string();
            let mut a = vec!["rc-pingpong", "-d", addr, "-g", "1", "-p", &p];
            a.extend_from_slice(extra);
            spawn(&a)
        })
        .collect();
    servers
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let p = port + i as u16;
            assert!(
                ferroce_tests::wait_listening(p, Duration::from_secs(30)),
                "server {i} never listened"
            );
            let ps = p.to_string();
            let mut a = vec!["rc-pingpong", "-d", addr, "-g", "1", "-p", &ps];
            a.extend_from_slice(extra);
            a.push("127.0.0.1");
            (s, spawn(&a))
        })
        .collect()
}

/// Sixteen rc-pingpong pairs at once, all 32 processes on one address (each pair's server and
/// client too), with data validation: the reuseport group steers each QP's packets to its
/// process.
#[test]
fn sixteen_pairs_share_one_address() {
    let addr = "127.94.0.1";
    let pairs = pairs_on_one_address(addr, 18740, 16, &["-n", "50", "-e", "-c", "-s", "2048"]);
    for (i, (s, c)) in pairs.into_iter().enumerate() {
        let (s, c) = (s.output(), c.output());
        check(&s, 50, 2048, addr, addr);
        check(&c, 50, 2048, addr, addr);
        let q = |o: &Output| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_owned()
        };
        assert_ne!(q(&s), q(&c), "pair {i}: both ends reported the same QP");
    }
}

/// A process of the group killed mid-transfer: its peer fails, the other pairs finish with
/// exact data, and a new pair joins the address afterwards and works.
#[test]
fn sigkill_of_a_member_leaves_the_others_working() {
    let addr = "127.94.1.1";
    // The victim pair runs far longer than the others: it is still transferring when killed.
    let mut victim = pairs_on_one_address(addr, 18769, 1, &["-n", "1000000", "-c", "-s", "1024"]);
    let pairs = pairs_on_one_address(addr, 18770, 3, &["-n", "2000", "-c", "-s", "1024"]);
    let (ks, kc) = victim.pop().unwrap();
    // Mid-transfer: the victim's server has sent (its live counters say so).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while sent_pkts(&devinfo_counters(addr), ks.id()).unwrap_or(0) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the victim never sent"
        );
        std::thread::yield_now();
    }
    // SIGKILL (std sends it) of the victim's server.
    ks.kill();
    for (s, c) in pairs {
        let (s, c) = (s.output(), c.output());
        check(&s, 2000, 1024, addr, addr);
        check(&c, 2000, 1024, addr, addr);
    }
    // The victim's client never completes its million iterations: a SEND of its in flight
    // fails (RetryExcErr), or, its SEND acknowledged just before the kill, it waits for a
    // receive that cannot come, as it would on a NIC (killed here).
    let status = kc.stop();
    assert!(
        status.is_none_or(|s| !s.success()),
        "the victim's client finished a million iterations: the kill did not land mid-transfer"
    );
    let late = pairs_on_one_address(addr, 18790, 1, &["-n", "200", "-c"]);
    for (s, c) in late {
        let (s, c) = (s.output(), c.output());
        check(&s, 200, 4096, addr, addr);
        check(&c, 200, 4096, addr, addr);
    }
}

/// `ferroce devinfo -d ADDR --counters`: every process's live counters on the device.
fn devinfo_counters(addr: &str) -> String {
    let o = ferroce()
        .args(["devinfo", "-d", addr, "--counters"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A process's `sent_pkts` in `devinfo --counters` output, if the process is shown.
fn sent_pkts(text: &str, pid: u32) -> Option<u64> {
    process_counter(text, pid, "sent_pkts")
}

/// A process's counter `name` in `devinfo --counters` output, if the process is shown.
fn process_counter(text: &str, pid: u32, name: &str) -> Option<u64> {
    let mut lines = text
        .lines()
        .skip_while(|l| !l.contains(&format!("process {pid} ")));
    lines.next()?;
    let key = format!("{name}:");
    lines
        .take_while(|l| !l.contains("process "))
        .find_map(|l| l.trim().strip_prefix(key.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

/// `ferroce devinfo --counters` shows the live counters of every process on the device, read
/// from their pages while they run, and none once they are gone.
#[test]
fn devinfo_counters_show_every_process_on_the_device() {
    let addr = "127.94.2.1";
    let pairs = pairs_on_one_address(addr, 18800, 2, &["-n", "1000000", "-s", "64"]);
    let pids: Vec<u32> = pairs.iter().flat_map(|(s, c)| [s.id(), c.id()]).collect();
    let devinfo = || devinfo_counters(addr);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (first, text) = loop {
        let text = devinfo();
        let counts: Vec<Option<u64>> = pids.iter().map(|&p| sent_pkts(&text, p)).collect();
        if counts.iter().all(|c| c.is_some_and(|n| n > 0)) {
            break (counts, text);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every process shown:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(text.matches("process ").count(), 4, "{text}");
    assert!(
        text.contains("rcvd_pkts:") && text.contains("udp_sent:"),
        "{text}"
    );
    // The counters are live: every process's count moves past the first reading while the
    // programs run.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let later = devinfo();
        let moved = pids
            .iter()
            .zip(&first)
            .all(|(pid, n)| sent_pkts(&later, *pid) > *n);
        if moved {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a process's sent_pkts did not move from {first:?}:\n{later}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(pairs);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = devinfo();
        if text.contains("no process uses the device") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "dead processes still shown:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Another user cannot join this user's group on an address (the kernel's reuseport groups are
/// per user): a clear error saying why and what to do. Needs root (to run as `nobody`) and
/// util-linux's `setpriv`; skipped loudly otherwise, failed under CI.
#[test]
fn another_user_cannot_join_the_address() {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let setpriv = std::path::Path::new("/usr/bin/setpriv").exists();
    if !(root && setpriv) {
        assert!(
            std::env::var_os("CI").is_none(),
            "the cross-user test needs root and setpriv under CI"
        );
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"SKIPPED: another_user_cannot_join_the_address needs root and setpriv (apt-get install util-linux)\n",
        );
        return;
    }
    let _mine = ferroce::Device::for_addr([127, 15, 9, 1].into())
        .unwrap()
        .open()
        .unwrap();
    let out = std::process::Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_ferroce"))
        .args(["rc-pingpong", "-d", "127.15.9.1", "-p", "18631"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("127.15.9.1:4791 is already in use by another user's ferroce processes")
            && err.contains("need their own"),
        "{err}"
    );
}

/// `ferroce devinfo -d ADDR --services` names the rdma_cm ports listened on the address and
/// the process listening (how a script knows an rdma_cm server is ready), and none once it
/// stopped.
#[test]
fn devinfo_services_lists_listened_rdma_cm_ports() {
    use ferroce::cm::{CmId, EventChannel, PortSpace};
    let addr = "127.0.76.1";
    let services = || {
        let o = ferroce()
            .args(["devinfo", "-d", addr, "--services"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
    id.bind_addr(format!("{addr}:7476").parse().unwrap())
        .unwrap();
    id.listen(4).unwrap();
    let want = format!(
        "pid {} rdma_cm port space 0x106 port 7476",
        std::process::id()
    );
    let out = services();
    assert!(out.contains(&want), "{want} not in:\n{out}");
    drop(id);
    let out = services();
    assert!(
        !out.contains("port 7476"),
        "a destroyed listener still shown:\n{out}"
    );
}

/// Two processes sharing an interface's address that is not a loopback one (a veth end in a
/// namespace this test makes) reach each other through the loopback device (the kernel's
/// local route), as on 127.x: in their ping-pong each answer leaves with the ACK held for it
/// behind it, one `UDP_SEGMENT` train (`SendBatch::set_own_address`), which the `trains`
/// counter of each shows. Needs root (a network namespace); skipped loudly otherwise, failed
/// under CI.
#[test]
fn processes_sharing_an_interface_address_send_each_answer_and_its_ack_in_one_train() {
    if !ferroce_tests::may_make_namespaces("shared interface address") {
        return;
    }
    let netns = ferroce_tests::Netns::add(&format!("fown{}", std::process::id()));
    let ns = netns.name();
    let addr = "10.78.0.1";
    for s in [
        &[
            "-n", ns, "link", "add", "fva", "type", "veth", "peer", "name", "fvb",
        ][..],
        &["-n", ns, "addr", "add", "10.78.0.1/24", "dev", "fva"],
        &["-n", ns, "link", "set", "fva", "up"],
        &["-n", ns, "link", "set", "fvb", "up"],
        &["-n", ns, "link", "set", "lo", "up"],
    ] {
        ferroce_tests::ip(s);
    }
    let in_ns = |args: &[&str]| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_ferroce")])
            .args(args);
        c
    };
    let run = |args: &[&str]| {
        Proc(Some(
            in_ns(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        ))
    };
    let pingpong = [
        "rc-pingpong",
        "-d",
        addr,
        "-g",
        "1",
        "-p",
        "18930",
        "-s",
        "64",
    ];
    let pingpong = [&pingpong[..], &["-n", "100000000"]].concat();
    let server = run(&pingpong);
    assert!(
        ferroce_tests::wait_listening_in_ns_of(server.id(), 18930, Duration::from_secs(30)),
        "the server never listened"
    );
    let client = run(&[&pingpong[..], &["127.0.0.1"]].concat());
    let pids = [server.id(), client.id()];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let o = in_ns(&["devinfo", "-d", addr, "--counters"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let trains = pids.map(|p| process_counter(&text, p, "trains"));
        let sent = pids.map(|p| process_counter(&text, p, "udp_sent"));
        // A few hundred rounds each way, each answer in a train with its ACK.
        if trains.iter().all(|t| t.is_some_and(|n| n >= 200)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "answers did not leave with their ACKs in trains: trains {trains:?}, datagrams {sent:?}\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop((server, client));
}
