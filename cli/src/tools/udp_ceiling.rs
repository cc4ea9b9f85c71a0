//! `ferroce udp-ceiling`: the raw limits of the path ferroce runs on, measured the same way:
//! a sendmmsg/recvmmsg UDP blaster at a given datagram size, plain and as `UDP_SEGMENT` trains
//! read with `UDP_GRO` (what ferroce's own socket does), a 64-byte UDP ping-pong, and a TCP
//! stream, all on loopback.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ferroce::Result;
use ferroce::udp::{GRO_SLOT, RecvBatch, Segmentation, SendBatch};

/// Figures of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ceiling {
    /// Datagram size used.
    pub size: usize,
    /// UDP datagrams received per second.
    pub udp_dgrams_per_s: f64,
    /// UDP payload bytes received per second.
    pub udp_bytes_per_s: f64,
    /// Datagrams received per second when sent as trains and read coalesced.
    pub gso_dgrams_per_s: f64,
    /// UDP payload bytes received per second, trains and coalesced reads.
    pub gso_bytes_per_s: f64,
    /// Median 64-byte UDP round trip, blocking reads.
    pub udp_rtt: Duration,
    /// Median 64-byte UDP round trip, both ends spinning on non-blocking reads.
    pub udp_rtt_spin: Duration,
    /// TCP stream bytes per second.
    pub tcp_bytes_per_s: f64,
    /// CPU seconds (both ends, user and system) per GB the TCP stream moved.
    pub tcp_cpu_s_per_gb: f64,
}

/// Blasts `size`-byte datagrams for `dur`: 32 per `sendmmsg`, or with `trains` as trains of
/// up to [`ferroce::udp::MAX_TRAIN_BYTES`] read with `UDP_GRO`. Returns what arrived per second.
fn udp_blast(size: usize, dur: Duration, trains: bool) -> Result<(f64, f64)> {
    let rx = UdpSocket::bind("127.0.0.1:0")?;
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    rx.set_nonblocking(true)?;
    if trains {
        ferroce::udp::enable_gro(rx.as_raw_fd())?;
    }
    let per_train =
        (ferroce::udp::MAX_TRAIN_BYTES / size.max(1)).clamp(1, ferroce::udp::MAX_SEGMENTS);
    let _ = socket2::SockRef::from(&rx).set_recv_buffer_size(8 << 20);
    let dst: SocketAddr = rx.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let got = Arc::new(AtomicU64::new(0));
    let (s2, g2) = (stop.clone(), got.clone());
    let receiver = std::thread::spawn(move || {
        let mut b = RecvBatch::new(32, if trains { GRO_SLOT } else { size + 64 });
        while !s2.load(Ordering::Relaxed) {
            match b.recv(rx.as_raw_fd()) {
                Ok(0) => {
                    let _ = ferroce::udp::poll_fds(
                        &[rx.as_raw_fd()],
                        libc::POLLIN,
                        Some(Duration::from_millis(10)),
                    );
                }
                Ok(n) => {
                    let segs: usize = (0..n).map(|i| b.segments(i).count()).sum();
                    g2.fetch_add(segs as u64, Ordering::Relaxed);
                }
                Err(_) => break,
            }
        }
    });
    // Two trains per call (as a 64 KiB WRITE's packets go), or 32 datagrams.
    let n = if trains { 2 * per_train } else { 32 };
    let mut batch = SendBatch::new(n, size);
    if trains {
        batch.set_segmentation(Segmentation::Udp);
    }
    let start = Instant::now();
    while start.elapsed() < dur {
        while !batch.is_full() {
            batch.commit(size, dst);
        }
        let _ = batch.flush(tx.as_raw_fd());
    }
    let counted_until = start.elapsed();
    let n = got.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let _ = receiver.join();
    let secs = counted_until.as_secs_f64();
    Ok((n as f64 / secs, n as f64 * size as f64 / secs))
}

fn udp_rtt(iters: usize) -> Result<Duration> {
    let a = UdpSocket::bind("127.0.0.1:0")?;
    let b = UdpSocket::bind("127.0.0.1:0")?;
    let (aa, ba) = (a.local_addr()?, b.local_addr()?);
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        for _ in 0..iters {
            if b.recv(&mut buf).is_err() || b.send_to(&buf, aa).is_err() {
                break;
            }
        }
    });
    let mut buf = [0u8; 64];
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        a.send_to(&buf, ba)?;
        a.recv(&mut buf)?;
        samples.push(t.elapsed());
    }
    let _ = echo.join();
    samples.sort_unstable();
    Ok(samples[samples.len() / 2])
}

/// The round trip with both ends busy-polling their non-blocking sockets (what a poll-mode
/// RDMA program does to its CQ).
fn udp_rtt_spin(iters: usize) -> Result<Duration> {
    let a = UdpSocket::bind("127.0.0.1:0")?;
    let b = UdpSocket::bind("127.0.0.1:0")?;
    a.set_nonblocking(true)?;
    b.set_nonblocking(true)?;
    let (aa, ba) = (a.local_addr()?, b.local_addr()?);
    let spin_recv = |s: &UdpSocket, buf: &mut [u8], until: Instant| -> bool {
        loop {
            match s.recv(buf) {
                Ok(_) => return true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > until {
                        return false;
                    }
                    std::hint::spin_loop();
                }
                Err(_) => return false,
            }
        }
    };
    let until = Instant::now() + Duration::from_secs(10);
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        for _ in 0..iters {
            if !spin_recv(&b, &mut buf, until) || b.send_to(&buf, aa).is_err() {
                break;
            }
        }
    });
    let mut buf = [0u8; 64];
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        a.send_to(&buf, ba)?;
        if !spin_recv(&a, &mut buf, until) {
            break;
        }
        samples.push(t.elapsed());
    }
    let _ = echo.join();
    samples.sort_unstable();
    Ok(samples.get(samples.len() / 2).copied().unwrap_or_default())
}

/// A TCP stream over loopback for `dur`: bytes per second, and CPU seconds (the process's,
/// both ends being its threads) per GB.
fn tcp_stream(dur: Duration) -> Result<(f64, f64)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let sink = std::thread::spawn(move || -> u64 {
        let Ok((mut s, _)) = l.accept() else { return 0 };
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        total
    });
    let mut s = TcpStream::connect(addr)?;
    let buf = vec![0u8; 1 << 20];
    let cpu = ferroce::udp::process_cpu_time();
    let start = Instant::now();
    while start.elapsed() < dur {
        s.write_all(&buf)?;
    }
    drop(s);
    let total = sink.join().unwrap_or(0);
    let cpu = ferroce::udp::process_cpu_time().saturating_sub(cpu);
    Ok((
        total as f64 / start.elapsed().as_secs_f64(),
        crate::tools::perf::cpu_per_gb(cpu, total as f64),
    ))
}

/// Measures all three for `dur` each (the ping-pong runs 2,000 round trips).
///
/// # Errors
/// Socket failures.
pub fn measure(size: usize, dur: Duration) -> Result<Ceiling> {
    let (dps, bps) = udp_blast(size, dur, false)?;
    let (gdps, gbps) = udp_blast(size, dur, true)?;
    let (tcp_bytes_per_s, tcp_cpu_s_per_gb) = tcp_stream(dur)?;
    Ok(Ceiling {
        size,
        udp_dgrams_per_s: dps,
        udp_bytes_per_s: bps,
        gso_dgrams_per_s: gdps,
        gso_bytes_per_s: gbps,
        udp_rtt: udp_rtt(2000)?,
        udp_rtt_spin: udp_rtt_spin(2000)?,
        tcp_bytes_per_s,
        tcp_cpu_s_per_gb,
    })
}
