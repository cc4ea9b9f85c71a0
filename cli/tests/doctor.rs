//! `ferroce doctor`: a healthy pair and a peer with nothing on UDP 4791 on loopback, and an
//! MTU mismatch between two network namespaces (root).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::process::{Command, Output};

fn doctor(args: &[&str]) -> (bool, String) {
    let o: Output = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .arg("doctor")
        .args(args)
        .output()
        .unwrap();
    let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&o.stderr));
    (o.status.success(), text)
}

/// A peer whose program uses rdma_cm answers the CM MAD probe; every line is `ok`.
#[test]
fn a_healthy_pair() {
    use ferroce::cm::{CmId, EventChannel, PortSpace};
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
    id.bind_addr("127.0.77.2:7477".parse().unwrap()).unwrap();
    id.listen(1).unwrap();
    let (ok, out) = doctor(&["127.0.77.1", "127.0.77.2"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("ok   127.0.77.2 answers on UDP 4791: a RoCE stack"),
        "{out}"
    );
    assert!(
        out.contains("ok   a packet of path MTU 4096 (4156 bytes on the wire) reaches"),
        "{out}"
    );
    assert!(!out.contains("FAIL"), "{out}");
    drop(id);
}

/// A peer whose program uses only verbs (no rdma_cm: no connection manager, no QP1) answers
/// the probe too, as a kernel device's MAD layer answers a Get no agent serves.
#[test]
fn a_verbs_only_peer_answers_the_probe() {
    let peer = ferroce::Device::for_addr("127.0.77.4".parse().unwrap())
        .unwrap()
        .open()
        .unwrap();
    let (ok, out) = doctor(&["127.0.77.3", "127.0.77.4"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("ok   127.0.77.4 answers on UDP 4791: a RoCE stack"),
        "{out}"
    );
    drop(peer);
}

/// Nothing on UDP 4791 at the peer: its ICMP says so, and the doctor fails naming it.
#[test]
fn a_peer_with_nothing_on_the_port() {
    let (ok, out) = doctor(&["127.0.77.5", "127.0.77.6"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("FAIL nothing listens on UDP 4791 at 127.0.77.6"),
        "{out}"
    );
}

/// Not an address of this host: the first line fails and says where to look.
#[test]
fn an_address_that_is_not_here() {
    let (ok, out) = doctor(&["192.0.2.77"]);
    assert!(!ok, "{out}");
    assert!(out.starts_with("FAIL no device for 192.0.2.77"), "{out}");
}

/// Two namespaces whose veth ends disagree on the MTU (9000 here, 1500 at the peer): a
/// packet of this device's path MTU 4096 cannot reach the peer, and the doctor says so.
#[test]
fn an_mtu_mismatch_between_two_namespaces() {
    if !ferroce_tests::may_make_namespaces("doctor MTU mismatch") {
        return;
    }
    let id = std::process::id();
    let (na, nb) = (
        ferroce_tests::Netns::add(&format!("fdoc-a{id}")),
        ferroce_tests::Netns::add(&format!("fdoc-b{id}")),
    );
    let (a, b) = (na.name(), nb.name());
    let steps: Vec<Vec<&str>> = vec![
        vec![
            "link", "add", "fda", "netns", a, "type", "veth", "peer", "name", "fdb", "netns", b,
        ],
        vec!["-n", a, "link", "set", "fda", "mtu", "9000"],
        vec!["-n", b, "link", "set", "fdb", "mtu", "1500"],
        vec!["-n", a, "addr", "add", "10.76.0.1/24", "dev", "fda"],
        vec!["-n", b, "addr", "add", "10.76.0.2/24", "dev", "fdb"],
        vec!["-n", a, "link", "set", "fda", "up"],
        vec!["-n", b, "link", "set", "fdb", "up"],
        vec!["-n", a, "link", "set", "lo", "up"],
        vec!["-n", b, "link", "set", "lo", "up"],
    ];
    for s in steps {
        ferroce_tests::ip(&s);
    }
    let o = Command::new("ip")
        .args(["netns", "exec", a, env!("CARGO_BIN_EXE_ferroce")])
        .args(["doctor", "10.76.0.1", "10.76.0.2"])
        .env("FERROCE_DEVICES", "10.76.0.1")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(!o.status.success(), "{out}");
    assert!(
        out.contains("ok   interface MTU 9000: RoCE path MTU 4096"),
        "{out}"
    );
    assert!(
        out.contains("FAIL 10.76.0.2 answers small datagrams but not one of 4156 bytes"),
        "{out}"
    );
}
