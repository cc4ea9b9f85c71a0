//! Middleware that reaches RDMA through rdma_cm, unmodified as Debian ships it, on ferroce's
//! librdmacm.so.1 and libibverbs.so.1 over loopback:
//!
//! * librpma 1.2 (`librpma-dev`): a client and a server written against its API
//!   (`tests/c/rpma_peer.c`) — read, write, flush, atomic write and a read back, every byte
//!   checked on both sides. librpma connects with an ID it made synchronous and then migrates
//!   to a channel, which must make it asynchronous.
//!
//! * tgt 1.0.85's iSER target (`tgt`) with libiscsi 1.19's iSER initiator: unmodified `tgtd`
//!   (it listens on `0.0.0.0` and `[::]` with AFONLY) serving a file-backed LUN, configured
//!   with `tgtadm` (address and initiator-name ACLs), then unmodified `iscsi-inq` (login and
//!   INQUIRY) and a program on libiscsi's API (`tests/c/iser_peer.c`, `libiscsi-dev`) that
//!   writes 4 KiB and reads the whole 16 MiB LUN back against the backing file.
//!
//! * libfabric 1.17's verbs provider: `fi_pingpong` over MSG endpoints and over RxM, between
//!   two network namespaces joined by a veth pair (libfabric skips interfaces named `lo`).
//!
//! * fio 3.33's `rdma` ioengine, Open MPI 4.1 and MPICH 4.0 over UCX with 4 ranks, and QEMU
//!   7.2's RDMA live migration (guards of what passed before the rdma_cm work).
//!
//! Where a package is missing the test says so and passes, except under CI. tgtd needs root
//! (its control socket is under /var/run), the libfabric test too (network namespaces): run as
//! another user they say so and pass, except under CI.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

mod common;
use common::{compile_c, finish, installed, lib_dir, on_ferroce, start};

/// The librpma peer program, compiled once (None, after a loud skip, without librpma-dev).
fn rpma_peer() -> Option<&'static Path> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    EXE.get_or_init(|| {
        compile_c(
            "rpma_peer",
            "librpma.h",
            "librpma-dev",
            &["-lrpma", "-libverbs"],
        )
    })
    .as_deref()
}

#[test]
fn librpma_read_write_flush_atomic_write() {
    let Some(exe) = rpma_peer() else { return };
    let a = "127.0.77.1";
    let server = start(on_ferroce(exe, &["server", a, "7700"], a));
    assert!(
        ferroce_tests::wait_cm_bound(a, server.child.id(), Duration::from_secs(60)),
        "the librpma server never bound its port"
    );
    let (cok, cout) = finish(
        start(on_ferroce(exe, &["client", a, "7700"], a)),
        Duration::from_secs(60),
    );
    let (sok, sout) = finish(server, Duration::from_secs(60));
    assert!(
        cok && sok && cout.contains("ok client") && sout.contains("ok server"),
        "client:\n{cout}\nserver:\n{sout}"
    );
}

fn have_prog(prog: &str, package: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .output()
        .is_ok_and(|o| o.status.success());
    installed(prog, found, package)
}

/// The iSER peer program, compiled once (None, after a loud skip, without libiscsi-dev).
fn iser_peer() -> Option<&'static Path> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    EXE.get_or_init(|| compile_c("iser_peer", "iscsi/iscsi.h", "libiscsi-dev", &["-liscsi"]))
        .as_deref()
}

/// A tgtd on its own control port, killed when dropped.
struct Tgtd(std::process::Child);

impl Drop for Tgtd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn tgt_iser_target_and_libiscsi_initiator() {
    if !have_prog("tgtd", "tgt") || !have_prog("iscsi-inq", "libiscsi-bin") {
        return;
    }
    let Some(peer_exe) = iser_peer() else { return };
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "tgtd needs root (its control socket is under /var/run)"
        );
        eprintln!(
            "SKIPPED: tgt's iSER target needs root (tgtd's control socket is under /var/run)"
        );
        return;
    }
    let a = "127.0.78.1";
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tgt-iser");
    std::fs::create_dir_all(&dir).unwrap();
    let lun = dir.join("lun.img");
    let bytes: Vec<u8> = (0..16u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(&lun, &bytes).unwrap();
    // Control port 7, iSER on 3261 and iSCSI/TCP on 3262: clear of a system tgtd's.
    let _tgtd = Tgtd(
        Command::new("tgtd")
            .args(["-f", "-C", "7", "--iser", "port=3261", "--iscsi"])
            .arg(format!("portal={a}:3262"))
            .env("LD_LIBRARY_PATH", lib_dir())
            .env("FERROCE_DEVICES", a)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let target = "iqn.2026-12.org.ferroce:t1";
    let ours = "iqn.2026-12.org.ferroce:initiator";
    let inq = "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-inq";
    let lun_path = lun.to_str().unwrap();
    let steps: [&[&str]; 5] = [
        &[
            "--op", "new", "--mode", "target", "--tid", "1", "-T", target,
        ],
        &[
            "--op",
            "new",
            "--mode",
            "logicalunit",
            "--tid",
            "1",
            "--lun",
            "1",
            "-b",
            lun_path,
        ],
        &[
            "--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL",
        ],
        &["--op", "bind", "--mode", "target", "--tid", "1", "-Q", ours],
        &["--op", "bind", "--mode", "target", "--tid", "1", "-Q", inq],
    ];
    for (i, step) in steps.iter().enumerate() {
        // The first waits for tgtd to come up.
        let mut tries = 0;
        loop {
            let out = Command::new("tgtadm")
                .args(["-C", "7", "--lld", "iser"])
                .args(*step)
                .output()
                .unwrap();
            if out.status.success() {
                break;
            }
            tries += 1;
            assert!(
                i == 0 && tries < 100,
                "tgtadm {step:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let url = format!("iser://{a}:3261/{target}/1");
    let mut c = Command::new("iscsi-inq");
    c.arg(&url)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("FERROCE_DEVICES", a)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (ok, out) = finish(start(c), Duration::from_secs(60));
    assert!(
        ok && out.contains("Product:VIRTUAL-DISK"),
        "iscsi-inq:\n{out}"
    );
    let (ok, out) = finish(
        start(on_ferroce(peer_exe, &[&url, ours, lun_path], a)),
        Duration::from_secs(120),
    );
    assert!(
        ok && out.contains("ok iser (16777216 bytes"),
        "iser_peer:\n{out}"
    );
}

/// Two network namespaces joined by a veth pair, `10.78.0.1/24` in the first and `10.78.0.2/24`
/// in the second, deleted when dropped (libfabric skips interfaces named `lo`, so its MSG
/// endpoints need an address of another interface).
struct VethPair {
    names: [String; 2],
}

impl VethPair {
    fn new() -> VethPair {
        let id = std::process::id();
        let names = [format!("ferroce-fa{id}"), format!("ferroce-fb{id}")];
        let pair = VethPair {
            names: names.clone(),
        };
        let (a, b) = (&names[0], &names[1]);
        let steps: Vec<Vec<&str>> = vec![
            vec!["netns", "add", a],
            vec!["netns", "add", b],
            vec!["-n", a, "link", "set", "lo", "up"],
            vec!["-n", b, "link", "set", "lo", "up"],
            vec![
                "link", "add", "fva", "netns", a, "type", "veth", "peer", "name", "fvb", "netns", b,
            ],
            vec!["-n", a, "addr", "add", "10.78.0.1/24", "dev", "fva"],
            vec!["-n", b, "addr", "add", "10.78.0.2/24", "dev", "fvb"],
            vec!["-n", a, "link", "set", "fva", "up"],
            vec!["-n", b, "link", "set", "fvb", "up"],
        ];
        for s in steps {
            let out = Command::new("ip").args(&s).output().unwrap();
            assert!(
                out.status.success(),
                "ip {s:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        pair
    }

    /// `prog args` in namespace `i` (0 or 1) on ferroce's libraries, with no
    /// `FERROCE_DEVICES`: the namespace's veth address is the one device.
    fn command(&self, i: usize, prog: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.names[i], prog])
            .args(args)
            .env("LD_LIBRARY_PATH", lib_dir())
            .env_remove("FERROCE_DEVICES")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Waits (at most `limit`) until a TCP socket listens on `port` in namespace `i`.
    fn wait_tcp_listen(&self, i: usize, port: u16, limit: Duration) -> bool {
        let want = format!(":{port:04X} 00000000:0000 0A");
        let until = std::time::Instant::now() + limit;
        while std::time::Instant::now() < until {
            let out = Command::new("ip")
                .args(["netns", "exec", &self.names[i], "cat", "/proc/net/tcp"])
                .output()
                .unwrap();
            if String::from_utf8_lossy(&out.stdout).contains(&want) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// Whether the test may make network namespaces (root); outside CI a loud skip otherwise.
fn can_make_namespaces(what: &str) -> bool {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{what} needs root (network namespaces)"
    );
    eprintln!("SKIPPED: {what} needs root (network namespaces)");
    false
}

/// libfabric 1.17's verbs provider over rdma_cm, as its users reach it: `fi_pingpong` on MSG
/// endpoints (`-p verbs -e msg`: the server's `fi_getinfo` binds `localhost`, which rdma_cm
/// takes for any address) and on RxM's RDM endpoints (`-p "verbs;ofi_rxm" -e rdm`: RC QPs made
/// through rdma_cm, CQs of 262,144 entries), every size of its default run with its data checks
/// (`-c`), between two network namespaces.
#[test]
fn libfabric_verbs_msg_and_rxm() {
    if !have_prog("fi_pingpong", "libfabric-bin")
        || !have_prog("ip", "iproute2")
        || !can_make_namespaces("libfabric's MSG test")
    {
        return;
    }
    let pair = VethPair::new();
    for (prov, ep) in [("verbs", "msg"), ("verbs;ofi_rxm", "rdm")] {
        let args = ["-p", prov, "-e", ep, "-c"];
        let server = start(pair.command(0, "fi_pingpong", &args));
        assert!(
            pair.wait_tcp_listen(0, 47592, Duration::from_secs(30)),
            "fi_pingpong {prov} server: no control socket"
        );
        let mut cargs = args.to_vec();
        cargs.push("10.78.0.1");
        let (cok, cout) = finish(
            start(pair.command(1, "fi_pingpong", &cargs)),
            Duration::from_secs(120),
        );
        let (sok, sout) = finish(server, Duration::from_secs(60));
        // Its default sizes go up to 1 MiB; the last line is that size's.
        let done = |o: &str| o.lines().any(|l| l.starts_with("1m "));
        assert!(
            cok && sok && done(&cout) && done(&sout),
            "fi_pingpong {prov} {ep}: client ok {cok}, server ok {sok}\n--- client\n{cout}\n--- server\n{sout}"
        );
    }
}

/// A fio killed when dropped.
struct Fio(std::process::Child);

impl Drop for Fio {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// fio 3.33's `rdma` ioengine (a server job reading, a client job writing) with its RDMA WRITE
/// and RDMA READ modes, 16 MiB in 64 KiB blocks: both jobs end without error, the client having
/// moved it all. (Its SEND mode posts one receive at a time and connects with `rnr_retry_count` 0, so a
/// SEND that outruns the repost fails with RNR_RETRY_EXC_ERR, as the spec says for a retry
/// count of 0; on loopback that race is lost at once.)
#[test]
fn fio_rdma_engine_write_and_read() {
    if !have_prog("fio", "fio") {
        return;
    }
    let a = "127.0.78.5";
    for (verb, port) in [("write", "7790"), ("read", "7791")] {
        let fio = |args: &[&str]| {
            let mut c = Command::new("fio");
            c.args(["--ioengine=rdma", "--bs=64k", "--size=16m", "--port"])
                .arg(port)
                .args(args)
                .env("LD_LIBRARY_PATH", lib_dir())
                .env("FERROCE_DEVICES", a)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c
        };
        // The server says when it listens ("waiting for connection"): its output goes to a
        // file read until then, so the client never comes before the listen.
        let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fio-server-{verb}.txt"));
        let mut sc = fio(&["--name=server", "--rw=read"]);
        sc.stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::null());
        let mut server = Fio(sc.spawn().unwrap());
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("waiting for connection")
        {
            assert!(
                std::time::Instant::now() < until && server.0.try_wait().unwrap().is_none(),
                "fio server never listened:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let (cok, cout) = finish(
            start(fio(&[
                "--name=client",
                "--rw=write",
                "--hostname",
                a,
                &format!("--verb={verb}"),
            ])),
            Duration::from_secs(120),
        );
        let until = std::time::Instant::now() + Duration::from_secs(60);
        let sok = loop {
            if let Some(st) = server.0.try_wait().unwrap() {
                break st.success();
            }
            if std::time::Instant::now() > until {
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let sout = std::fs::read_to_string(&log).unwrap_or_default();
        // The client moves the bytes (the server's memory is only the target or source).
        assert!(
            cok && sok
                && cout.contains("err= 0")
                && cout.contains("(16.0MiB/")
                && sout.contains("err= 0"),
            "fio --verb={verb}: client ok {cok}, server ok {sok}\n--- client\n{cout}\n--- server\n{sout}"
        );
    }
}

/// Open MPI 4.1 and MPICH 4.0 over UCX's verbs transports (`UCX_TLS=self,rc_verbs,ud_verbs`: no
/// shared memory, so every byte between ranks goes through ferroce), 4 ranks on this host:
/// `tests/c/mpi_peer.c` checks every byte of a ping-pong from 1 byte to 4 MiB, Allreduce, Bcast,
/// Alltoall and one-sided Put and Get. Debian's Open MPI turns its UCX PML off by default
/// (`/etc/openmpi/openmpi-mca-params.conf`), so it is asked for, as its users do.
#[test]
fn mpi_over_ucx_four_ranks() {
    let mpis = [
        ("openmpi", "openmpi-bin", "libopenmpi-dev"),
        ("mpich", "mpich", "libmpich-dev"),
    ];
    for (mpi, bin_pkg, dev_pkg) in mpis {
        if !have_prog(&format!("mpirun.{mpi}"), bin_pkg)
            || !have_prog(&format!("mpicc.{mpi}"), dev_pkg)
        {
            continue;
        }
        // UCX takes a verbs device only beside its uverbs node.
        if !common::have_uverbs_node() {
            return;
        }
        let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("mpi_peer_{mpi}"));
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/mpi_peer.c");
        let st = Command::new(format!("mpicc.{mpi}"))
            .args(["-O2", "-o"])
            .arg(&exe)
            .arg(src)
            .status()
            .unwrap();
        assert!(st.success(), "mpicc.{mpi} {src}");
        let a = "127.0.78.6";
        let mut c = Command::new(format!("mpirun.{mpi}"));
        if mpi == "openmpi" {
            c.args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
                .args(["--mca", "pml", "ucx", "--mca", "osc", "ucx"])
                .args(["-x", "LD_LIBRARY_PATH", "-x", "FERROCE_DEVICES"])
                .args(["-x", "FERROCE_LOG", "-x", "UCX_TLS"]);
        } else {
            c.args(["-np", "4"]);
        }
        c.arg(&exe)
            .env("LD_LIBRARY_PATH", lib_dir())
            .env("FERROCE_DEVICES", a)
            .env("FERROCE_LOG", "debug")
            .env("UCX_TLS", "self,rc_verbs,ud_verbs")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let (ok, out) = finish(start(c), Duration::from_secs(300));
        // ferroce's QPs carried it (its debug log names each QP reaching RTS).
        let qps = out.matches("Rtr -> Rts").count();
        assert!(
            ok && out.contains("ok mpi 4 ranks") && qps > 0,
            "{mpi} over UCX on ferroce ({qps} QPs to RTS):\n{}",
            out.lines()
                .filter(|l| !l.starts_with("ferroce "))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// A QEMU monitor (QMP) connection: one command at a time, its answer as text.
struct Qmp(std::io::BufReader<std::os::unix::net::UnixStream>);

impl Qmp {
    /// Connects to the monitor socket (waiting for QEMU to make it) and leaves the greeting's
    /// negotiation mode.
    fn connect(path: &Path) -> Qmp {
        let until = std::time::Instant::now() + Duration::from_secs(30);
        let s = loop {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) => {
                    assert!(std::time::Instant::now() < until, "QMP {path:?}: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut q = Qmp(std::io::BufReader::new(s));
        let mut greeting = String::new();
        std::io::BufRead::read_line(&mut q.0, &mut greeting).unwrap();
        assert!(greeting.contains("QMP"), "QMP greeting: {greeting}");
        q.cmd(r#"{"execute":"qmp_capabilities"}"#);
        q
    }

    /// Sends `json` and returns its answer (events before it are skipped); an error answer
    /// fails the test.
    fn cmd(&mut self, json: &str) -> String {
        use std::io::{BufRead, Write};
        self.0.get_mut().write_all(json.as_bytes()).unwrap();
        self.0.get_mut().write_all(b"\n").unwrap();
        loop {
            let mut line = String::new();
            assert!(
                self.0.read_line(&mut line).unwrap() > 0,
                "QMP closed after {json}"
            );
            assert!(!line.contains("\"error\""), "QMP {json}: {line}");
            if line.contains("\"return\"") {
                return line;
            }
        }
    }
}

/// A QEMU killed when dropped.
struct Qemu(std::process::Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// QEMU 7.2's RDMA live migration (`migrate rdma:ADDR:PORT`, librdmacm and libibverbs from
/// ferroce): a paused 64 MiB machine whose RAM holds a 4 MiB pattern at 16 MiB moves to one
/// that holds zeros there; the migration completes and the destination's whole RAM equals the
/// source's, byte for byte (`pmemsave` of both).
#[test]
fn qemu_rdma_migration_memory_identical() {
    if !have_prog("qemu-system-x86_64", "qemu-system-x86") {
        return;
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("qemu-rdma");
    std::fs::create_dir_all(&dir).unwrap();
    let n = 4usize << 20;
    let pattern: Vec<u8> = (0..n).map(|i| ((i * 131 + (i >> 9)) & 255) as u8).collect();
    std::fs::write(dir.join("pattern.bin"), &pattern).unwrap();
    std::fs::write(dir.join("zeros.bin"), vec![0u8; n]).unwrap();
    let a = "127.0.78.7";
    let qemu = |blob: &str, sock: &str, incoming: Option<&str>| {
        let _ = std::fs::remove_file(dir.join(sock));
        let mut c = Command::new("qemu-system-x86_64");
        c.args(["-machine", "q35,accel=tcg", "-m", "64", "-display", "none"])
            .args(["-nodefaults", "-S", "-device"])
            .arg(format!(
                "loader,file={},addr=0x1000000",
                dir.join(blob).display()
            ))
            .arg("-qmp")
            .arg(format!(
                "unix:{},server=on,wait=off",
                dir.join(sock).display()
            ));
        if let Some(uri) = incoming {
            c.args(["-incoming", uri]);
        }
        c.env("LD_LIBRARY_PATH", lib_dir())
            .env("FERROCE_DEVICES", a)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        Qemu(c.spawn().unwrap())
    };
    let uri = format!("rdma:{a}:7796");
    let _src = qemu("pattern.bin", "src.sock", None);
    let _dst = qemu("zeros.bin", "dst.sock", Some(&uri));
    let mut src = Qmp::connect(&dir.join("src.sock"));
    let mut dst = Qmp::connect(&dir.join("dst.sock"));
    // The destination listens once its monitor answers (QEMU sets the incoming side up first).
    dst.cmd(r#"{"execute":"query-status"}"#);
    src.cmd(&format!(
        r#"{{"execute":"migrate","arguments":{{"uri":"{uri}"}}}}"#
    ));
    let until = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let r = src.cmd(r#"{"execute":"query-migrate"}"#);
        if r.contains("\"completed\"") {
            break;
        }
        assert!(!r.contains("\"failed\""), "migration failed: {r}");
        assert!(std::time::Instant::now() < until, "migration: {r}");
        std::thread::sleep(Duration::from_millis(100));
    }
    while dst
        .cmd(r#"{"execute":"query-status"}"#)
        .contains("inmigrate")
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let save = |q: &mut Qmp, file: &str| {
        let path = dir.join(file);
        let _ = std::fs::remove_file(&path);
        q.cmd(&format!(
            r#"{{"execute":"pmemsave","arguments":{{"val":0,"size":{},"filename":"{}"}}}}"#,
            64u64 << 20,
            path.display()
        ));
        std::fs::read(&path).unwrap()
    };
    let before = save(&mut src, "src.ram");
    let after = save(&mut dst, "dst.ram");
    assert_eq!(
        &before[16 << 20..(16 << 20) + n],
        &pattern[..],
        "the source's RAM holds the pattern"
    );
    if let Some(i) = (0..before.len()).find(|&i| before.get(i) != after.get(i)) {
        panic!(
            "RAM differs after migration first at {i:#x}: source {:?}, destination {:?}",
            before.get(i),
            after.get(i)
        );
    }
    assert_eq!(before.len(), after.len());
}
