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
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        let bound = device
            .gsi_services(4791)
            .is_ok_and(|s| s.iter().any(|s| s.pid == pid && s.rdma_cm_port().is_some()));
        if bound {
            return true;
        }
        std::thread::yield_now();
    }
    false
}
