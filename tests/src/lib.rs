//! Cross-crate tests of ferroce live in `tests/`; this library gives them a crate, and holds
//! what the test suites of several crates share.

/// Whether a socket listens on TCP `port` (any address), from `/proc/net/tcp{,6}`: how a test
/// knows a server program is ready without connecting to it (which would use up its one
/// accept).
pub fn tcp_listening(port: u16) -> bool {
    listening_in("/proc/net", port)
}

/// [`tcp_listening`] in the network namespace of process `pid` (`/proc/PID/net`): a server
/// started in a namespace the test made.
pub fn tcp_listening_in_ns_of(pid: u32, port: u16) -> bool {
    listening_in(&format!("/proc/{pid}/net"), port)
}

fn listening_in(net: &str, port: u16) -> bool {
    const LISTEN: &str = "0A";
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("{net}/{f}")).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let mut cols = l.split_whitespace();
                let local = cols.nth(1).unwrap_or("");
                let state = cols.nth(1).unwrap_or("");
                state == LISTEN
                    && local
                        .rsplit(':')
                        .next()
                        .and_then(|p| u16::from_str_radix(p, 16).ok())
                        == Some(port)
            })
        })
    })
}

/// Waits (bounded by `limit`) until [`tcp_listening`]; whether it did.
pub fn wait_listening(port: u16, limit: std::time::Duration) -> bool {
    wait_for(limit, || tcp_listening(port))
}

/// Waits (bounded by `limit`) until [`tcp_listening_in_ns_of`]; whether it did.
pub fn wait_listening_in_ns_of(pid: u32, port: u16, limit: std::time::Duration) -> bool {
    wait_for(limit, || tcp_listening_in_ns_of(pid, port))
}

fn wait_for(limit: std::time::Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::yield_now();
    }
    false
}

/// Waits (bounded by `limit`) until process `pid` holds an rdma_cm port on the ferroce device
/// at `addr` (its `rdma_bind_addr` or `rdma_listen` is done: a REQ for the port now reaches
/// it, and waits for a listen that comes within a second); whether it did. How a test knows
/// an rdma_cm server is ready without a REQ that would be rejected, or a sleep.
pub fn wait_cm_bound(addr: &str, pid: u32, limit: std::time::Duration) -> bool {
    let Ok(ip) = addr.parse::<std::net::IpAddr>() else {
        return false;
    };
    let Ok(device) = ferroce::Device::for_addr(ip) else {
        return false;
    };
    wait_for(limit, || {
        device
            .gsi_services(4791)
            .is_ok_and(|s| s.iter().any(|s| s.pid == pid && s.rdma_cm_port().is_some()))
    })
}

/// Whether this test may make network namespaces (it runs as root). When it may not, the test
/// is skipped loudly (`SKIPPED: what: not root`) outside CI and fails under `CI=true`, which
/// runs as root.
pub fn may_make_namespaces(what: &str) -> bool {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if !root {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI runs as root: {what} must run"
        );
        eprintln!("SKIPPED: {what}: not root (network namespaces)");
    }
    root
}

/// Runs `ip` with `args`; a failure fails the test with `ip`'s message.
pub fn ip(args: &[&str]) {
    let o = std::process::Command::new("ip").args(args).output();
    match o {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("ip {args:?}: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => panic!("ip {args:?}: {e}"),
    }
}

/// A network namespace a test made (`ip netns add`), deleted when dropped.
pub struct Netns(String);

impl Netns {
    /// Makes namespace `name`.
    pub fn add(name: &str) -> Netns {
        ip(&["netns", "add", name]);
        Netns(name.to_owned())
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}
