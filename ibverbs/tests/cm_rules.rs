//! librdmacm's rules as rdma-core and the kernel's rdma_cm keep them, asserted by a C program
//! (`tests/c/cm_rules.c`, against Debian's `<rdma/rdma_cma.h>`) on ferroce's librdmacm.so.1 and
//! libibverbs.so.1 — each a case the middleware of issue 23 tripped on:
//!
//! * `rdma_migrate_id` makes a synchronous ID asynchronous and back, moving its queued events
//!   (librpma);
//! * port 0 gets its port at `rdma_bind_addr`, a bound port is taken (qperf `-cm1`);
//! * a client whose device is another address than the server's resolves onto its own device,
//!   `id->verbs` set (qperf with two addresses);
//! * a passive side that destroys its ID after DISCONNECTED answers the DREQ (qperf's server);
//! * AFONLY wildcards of both families share a port (tgt's iSER target);
//! * binding as the kernel: EADDRNOTAVAIL for no address of the host, ENODEV for one no device
//!   is on (libfabric's interface probe), and a loopback address no device is on binds no
//!   device and listens as the wildcard (libfabric's verbs provider binds `localhost`); ECE's
//!   `rdma_get_remote_ece`/`rdma_set_local_ece` checks (pyverbs' external-QP test);
//! * `rdma_getaddrinfo` from the hints alone (libfabric's verbs provider);
//! * CQs of up to `max_cqe` = 4,194,303 (libfabric's RxM asks for 262,144);
//! * `SYSFS_PATH`;
//! * a child forked while its parent has a device open connects with IDs of its own (Python's
//!   multiprocessing in rdma-core's pyverbs rdma_cm tests);
//! * an SGE array at any address is read (libiscsi's iSER initiator);
//! * a signal sent to the process reaches the program, not the library's threads (tgtd);
//! * a signal without SA_RESTART ends a blocking `ibv_get_cq_event` / `rdma_get_cm_event`
//!   with EINTR, as it ends rdma-core's `read(2)` (qperf's alarm-ended ping-pong loops), and
//!   one with SA_RESTART lets `ibv_get_cq_event` go on.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

mod common;
use common::{compile_c, finish, on_ferroce, start};

/// The case program, compiled once (None, after a loud skip, without librdmacm-dev).
fn program() -> Option<&'static Path> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    EXE.get_or_init(|| {
        compile_c(
            "cm_rules",
            "rdma/rdma_cma.h",
            "librdmacm-dev",
            &["-lrdmacm", "-libverbs", "-lpthread"],
        )
    })
    .as_deref()
}

fn case(devices: &str, args: &[&str]) -> Command {
    on_ferroce(program().unwrap(), args, devices)
}

/// Runs one case to its end and asserts it passed.
fn run(devices: &str, args: &[&str]) {
    let (ok, out) = finish(start(case(devices, args)), Duration::from_secs(60));
    assert!(
        ok && out.contains(&format!("ok {}", args[0])),
        "{args:?}:\n{out}"
    );
}

#[test]
fn migrate_id_switches_sync_and_async() {
    if program().is_none() {
        return;
    }
    run("127.0.73.1", &["migrate", "127.0.73.1", "7500"]);
}

#[test]
fn bind_takes_the_port() {
    if program().is_none() {
        return;
    }
    run("127.0.73.2", &["bind_port0", "127.0.73.2"]);
    run("::1", &["bind_port0", "::1"]);
}

#[test]
fn resolve_onto_the_own_device() {
    if program().is_none() {
        return;
    }
    // The server's address is on this host but not a device of this process.
    run("127.0.73.4", &["resolve_other", "127.0.73.3", "127.0.73.4"]);
}

#[test]
fn destroyed_id_answers_the_dreq() {
    if program().is_none() {
        return;
    }
    let a = "127.0.73.5";
    let server = start(case(a, &["drep_server", a, "7501"]));
    assert!(
        ferroce_tests::wait_cm_bound(a, server.child.id(), Duration::from_secs(60)),
        "the server never bound its port"
    );
    let (ok, text) = finish(
        start(case(a, &["drep_client", a, "7501"])),
        Duration::from_secs(60),
    );
    let (sok, stext) = finish(server, Duration::from_secs(60));
    assert!(ok && sok, "client:\n{text}\nserver:\n{stext}");
}

#[test]
fn afonly_wildcards_of_both_families() {
    if program().is_none() {
        return;
    }
    run("127.0.73.6,::1", &["afonly", "7502"]);
}

/// An IPv4 address of one of the host's interfaces other than loopback, if it has one.
fn host_ipv4() -> Option<String> {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next()?;
    let cidr = line
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)?;
    Some(cidr.split('/').next()?.to_string())
}

#[test]
fn bind_as_the_kernel_outside_the_devices() {
    if program().is_none() {
        return;
    }
    let local = host_ipv4();
    if local.is_none() {
        eprintln!("bind_nodev: the host has no address besides loopback; ENODEV not checked");
    }
    let local = local.as_deref().unwrap_or("-");
    run(
        "127.0.73.7",
        &[
            "bind_nodev",
            "127.0.73.7",
            "127.0.0.1",
            "198.51.100.77",
            local,
        ],
    );
}

#[test]
fn a_forked_child_has_devices_of_its_own() {
    if program().is_none() {
        return;
    }
    run("127.0.73.10", &["fork_child", "127.0.73.10", "7503"]);
}

#[test]
fn getaddrinfo_from_hints() {
    if program().is_none() {
        return;
    }
    run("127.0.73.8", &["getaddrinfo", "127.0.73.8"]);
}

#[test]
fn cq_up_to_max_cqe() {
    if program().is_none() {
        return;
    }
    run("127.0.73.9", &["big_cq"]);
}

#[test]
fn sysfs_path_from_the_environment() {
    if program().is_none() {
        return;
    }
    // A tree as `ferroce sysfs` lays it out (its own test checks the whole of it).
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sysfs-tree");
    let dev = root.join("class/infiniband/ferroce0");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("node_type"), "1: CA\n").unwrap();
    let root_s = root.to_str().unwrap();
    let mut c = case("127.0.73.10", &["sysfs_path", root_s]);
    c.env("SYSFS_PATH", format!("{root_s}//"));
    let (ok, out) = finish(start(c), Duration::from_secs(30));
    assert!(ok, "{out}");
    let mut c = case("127.0.73.10", &["sysfs_path", "/sys"]);
    c.env_remove("SYSFS_PATH");
    let (ok, out) = finish(start(c), Duration::from_secs(30));
    assert!(ok, "{out}");
}

#[test]
fn a_signal_interrupts_the_event_waits() {
    if program().is_none() {
        return;
    }
    run("127.0.73.11", &["eintr"]);
}

/// A signal whose handler has SA_RESTART lets a blocking `ibv_get_cq_event` go on to the
/// event that comes later, as it lets rdma-core's `read(2)` restart.
#[test]
fn a_restarting_signal_lets_the_event_wait_go_on() {
    if program().is_none() {
        return;
    }
    run("127.0.73.19", &["restart"]);
}

/// libiscsi's iSER initiator posts an SGE array that is not 8-byte aligned.
#[test]
fn an_unaligned_sge_array_is_read() {
    if program().is_none() {
        return;
    }
    run("127.0.73.12", &["unaligned_sge"]);
}

/// tgtd's backing-store threads signal its main loop through a signalfd: a signal sent to the
/// process must never land on one of the library's threads.
#[test]
fn a_process_signal_reaches_the_program() {
    if program().is_none() {
        return;
    }
    run("127.0.73.13", &["process_signal"]);
}

/// Calls with an ID the program destroyed fail with EINVAL without reading it; a second
/// destroy too.
#[test]
fn calls_with_a_destroyed_id_are_refused() {
    if program().is_none() {
        return;
    }
    run("127.0.73.15", &["freed_id", "127.0.73.15", "7515"]);
}

/// rping's main thread destroys the event channel while its event thread waits in
/// rdma_get_cm_event (a crash of rping's server at exit in the soak): the wait goes on without
/// touching the freed channel, and an event of an ID still on it reaches the waiter.
#[test]
fn a_channel_destroyed_under_a_waiting_thread() {
    if program().is_none() {
        return;
    }
    run(
        "127.0.73.14",
        &["destroy_while_waiting", "127.0.73.14", "7514"],
    );
}
