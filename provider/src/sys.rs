//! The few system calls the standard library and socket2 do not offer: batched UDP send and
//! receive, socket options for RoCEv2, an eventfd for wake-ups and completion channels, `poll`,
//! and the host's interface addresses. Each `unsafe` block here states its `SAFETY:` argument;
//! the provider's other unsafe code is region memory (`dma.rs`, `mr.rs`) and `reg_mr_raw`.

use std::io;
use std::mem::{MaybeUninit, size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A new UDP socket of `domain` (close-on-exec), made by the `socket` system call itself
/// rather than libc's `socket`: a program run under rdma-core's librspreload.so has every
/// `socket()` call of the process turned into an rsocket, and ferroce's own sockets (the
/// device's, the route probes', the multicast ones) must stay kernel UDP sockets.
pub(crate) fn udp_socket(domain: socket2::Domain) -> io::Result<socket2::Socket> {
    // SAFETY: the socket system call takes three integers and returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_socket,
            libc::c_int::from(domain),
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is the descriptor the call just returned, open and owned by nobody else.
    Ok(unsafe { socket2::Socket::from_raw_fd(fd as RawFd) })
}

/// [`udp_socket`] bound to `addr`, as `UdpSocket::bind` (which would go through libc's
/// `socket`).
pub(crate) fn bind_udp(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let domain = if addr.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    let s = udp_socket(domain)?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

/// Sets an integer socket option.
pub(crate) fn setsockopt_int(fd: RawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: `value` lives for the call and its size is passed; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const value).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `IP_MTU_DISCOVER = IP_PMTUDISC_DO` (DF set; with an unconnected socket Linux sends IP ID 0).
pub fn set_dont_fragment(fd: RawFd, v6: bool) -> io::Result<()> {
    if v6 {
        setsockopt_int(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    } else {
        setsockopt_int(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    }
}

/// `UDP_NO_CHECK6_RX`: accept IPv6 UDP with checksum 0, as rxe sends it.
pub(crate) fn set_no_check6_rx(fd: RawFd) -> io::Result<()> {
    const UDP_NO_CHECK6_RX: i32 = 102;
    setsockopt_int(fd, libc::IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)
}

pub(crate) fn sockaddr_from(sa: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(sa.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which is smaller.
            let a: &libc::sockaddr_in = unsafe { &*(sa as *const libc::sockaddr_storage).cast() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6, which is smaller.
            let a: &libc::sockaddr_in6 = unsafe { &*(sa as *const libc::sockaddr_storage).cast() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

pub(crate) fn sockaddr_into(addr: SocketAddr, out: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match addr {
        SocketAddr::V4(a) => {
            let p = (out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>();
            // SAFETY: `p` is `out`, a live exclusive sockaddr_storage, large and aligned enough for a sockaddr_in.
            let s = unsafe { &mut *p };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = a.port().to_be();
            s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(a) => {
            let p = (out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
            // SAFETY: `p` is `out`, a live exclusive sockaddr_storage, large and aligned enough for a sockaddr_in6.
            let s = unsafe { &mut *p };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = a.port().to_be();
            s.sin6_addr.s6_addr = a.ip().octets();
            s.sin6_flowinfo = a.flowinfo();
            s.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// Waits until one of `fds` is ready for `events` or the timeout passes; returns whether any
/// is ready. Negative descriptors are skipped (poll's rule): a slot may stand empty.
pub fn poll_fds(fds: &[RawFd], events: i16, timeout: Option<Duration>) -> io::Result<bool> {
    match poll_masked(fds, events, timeout, None) {
        Ok(ready) => Ok(ready != 0),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
        Err(e) => Err(e),
    }
}

/// As [`poll_fds`], returning which are ready: bit `i` for `fds[i]` (the first 32), or
/// `Interrupted` when a signal handler ran; with `mask`, the thread's signal mask is `mask`
/// for the wait only (`ppoll`'s atomic swap: see [`SignalsHeld`]).
pub(crate) fn poll_masked(
    fds: &[RawFd],
    events: i16,
    timeout: Option<Duration>,
    mask: Option<&libc::sigset_t>,
) -> io::Result<u32> {
    // The progress thread polls two descriptors on every wake-up: no allocation for few.
    const IN_PLACE: usize = 4;
    let unused = libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    };
    let mut few = [unused; IN_PLACE];
    let mut many = Vec::new();
    let p: &mut [libc::pollfd] = if fds.len() <= IN_PLACE {
        &mut few[..fds.len()]
    } else {
        many.resize(fds.len(), unused);
        &mut many
    };
    for (slot, &fd) in p.iter_mut().zip(fds) {
        *slot = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
    }
    // ppoll, not poll: a timeout of microseconds (the progress thread's short sleeps beside a
    // polling program) must not round up to a millisecond.
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(d.subsec_nanos() as i32),
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    let maskp = mask.map_or(std::ptr::null(), |m| m as *const libc::sigset_t);
    // SAFETY: `p` is a valid array of `p.len()` pollfds; `tsp` is null or points to `ts`, and `maskp` null or to the caller's set, both alive across the call; a null sigmask keeps the thread's.
    let r = unsafe { libc::ppoll(p.as_mut_ptr(), p.len() as libc::nfds_t, tsp, maskp) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut ready = 0u32;
    for (i, slot) in p.iter().enumerate().take(32) {
        if slot.revents != 0 {
            ready |= 1 << i;
        }
    }
    Ok(ready)
}

/// An eventfd: a counter the kernel makes pollable.
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    /// A non-blocking eventfd (the runtime's own wake-up).
    pub(crate) fn new() -> io::Result<EventFd> {
        EventFd::with_flags(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)
    }

    /// A blocking eventfd handed to programs (completion channels, async events): a program
    /// that wants non-blocking `ibv_get_cq_event` sets O_NONBLOCK on it itself, as with
    /// libibverbs, and the C ABI reads that flag to choose. [`EventFd::drain`] never blocks on
    /// it.
    pub(crate) fn new_blocking() -> io::Result<EventFd> {
        EventFd::with_flags(libc::EFD_CLOEXEC)
    }

    fn with_flags(flags: libc::c_int) -> io::Result<EventFd> {
        // SAFETY: plain system call; a non-negative result is a new descriptor we own.
        let fd = unsafe { libc::eventfd(0, flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adds one to the counter (makes the fd readable).
    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own descriptor.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Resets the counter to zero (makes the fd unreadable).
    pub(crate) fn drain(&self) {
        let mut p = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polls one live pollfd of our own descriptor without waiting.
        if unsafe { libc::poll(&raw mut p, 1, 0) } != 1 {
            return; // already zero: a read would block on a blocking eventfd
        }
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64 from our own descriptor, which poll just found readable (only ferroce reads it), so this does not block.
        let _ = unsafe { libc::read(self.0.as_raw_fd(), (&raw mut v).cast(), 8) };
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Every asynchronous signal blocked in the calling thread (the faults, SIGSEGV, SIGBUS,
/// SIGFPE, SIGILL and SIGTRAP, stay deliverable) until dropped, which restores the mask it
/// found. A wait that must end as rdma-core's blocking `read(2)` does when a signal comes (the
/// handler runs, then EINTR or a restart) works with them held and waits in `ppoll` with
/// [`SignalsHeld::waiting`], the mask it found: a signal that comes while the thread works
/// between waits is delivered at the next wait, so it always ends one.
pub(crate) struct SignalsHeld {
    old: libc::sigset_t,
}

impl SignalsHeld {
    pub(crate) fn new() -> SignalsHeld {
        // SAFETY: sigset_t is plain data; sigfillset and sigdelset initialise and edit the local set.
        let mut block: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `block` and `old` are live local sets; pthread_sigmask changes only this thread's mask, restored by Drop.
        unsafe {
            libc::sigfillset(&raw mut block);
            for sig in FAULTS {
                libc::sigdelset(&raw mut block, sig);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &raw const block, &raw mut old);
        }
        SignalsHeld { old }
    }

    /// The mask the thread had: the one to wait with.
    pub(crate) fn waiting(&self) -> &libc::sigset_t {
        &self.old
    }
}

impl Drop for SignalsHeld {
    fn drop(&mut self) {
        // SAFETY: restores this thread's own mask saved by `new` (on the same thread: the value is not Send).
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &raw const self.old, std::ptr::null_mut());
        }
    }
}

/// The signals a fault raises synchronously: never blocked (blocked, a fault kills at once).
const FAULTS: [libc::c_int; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGTRAP,
];

/// Whether a `read(2)` interrupted by a signal handler just now would have been restarted:
/// true when every handler the process has installed has SA_RESTART. `ppoll` reports
/// which of them ran no more than that one did, so a process whose handlers differ gets the
/// EINTR its handlers without SA_RESTART call for (one of them may have been the one).
pub(crate) fn restarts_after_signal() -> bool {
    (1..=libc::SIGRTMAX()).all(|sig| {
        // SAFETY: sigaction is plain data; a null new action only reads the disposition into `old`.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above; SIGKILL, SIGSTOP and numbers the C library keeps fail with EINVAL and count as restarting.
        let r = unsafe { libc::sigaction(sig, std::ptr::null(), &raw mut old) };
        r != 0
            || old.sa_sigaction == libc::SIG_DFL
            || old.sa_sigaction == libc::SIG_IGN
            || old.sa_flags & libc::SA_RESTART != 0
    })
}

/// Where threads wait for a queue's next event the way rdma-core waits for one of a channel:
/// in a blocking `read(2)` of a descriptor, so that a signal whose handler lacks SA_RESTART
/// ends the wait with EINTR and one with it lets the kernel restart it (qperf ends its loops
/// with an alarm that way). The descriptor is a second eventfd, read only by waiters, so the
/// one programs poll keeps exact readability; it is written only while someone waits.
#[derive(Debug)]
pub(crate) struct ReadWaiter {
    fd: EventFd,
    waiters: std::sync::atomic::AtomicUsize,
}

impl ReadWaiter {
    pub(crate) fn new() -> io::Result<ReadWaiter> {
        Ok(ReadWaiter {
            fd: EventFd::new_blocking()?,
            waiters: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Wakes the waiters, if any (call after queueing an event, outside the queue's lock or
    /// not: a waiter checks the queue after registering, so no wake-up is lost).
    pub(crate) fn wake(&self) {
        if self.waiters.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            self.fd.signal();
        }
    }

    /// Runs `take` until it gives something, blocking in `read(2)` between tries; the
    /// read's errno (EINTR for a signal without SA_RESTART) ends the wait.
    pub(crate) fn wait<T>(&self, mut take: impl FnMut() -> Option<T>) -> Result<T, i32> {
        use std::sync::atomic::Ordering::SeqCst;
        self.waiters.fetch_add(1, SeqCst);
        let r = loop {
            if let Some(t) = take() {
                break Ok(t);
            }
            let mut v: u64 = 0;
            // SAFETY: reads at most 8 bytes into a live u64 from our own blocking eventfd, which lives as long as `self`.
            let n = unsafe { libc::read(self.fd.raw(), (&raw mut v).cast(), 8) };
            if n < 0 {
                break Err(io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO));
            }
        };
        self.waiters.fetch_sub(1, SeqCst);
        r
    }
}

/// Spawns one of the provider's threads (progress, keeper, CM agent) with every asynchronous
/// signal blocked, so that a signal sent to the process reaches the program's own threads,
/// as if ferroce had none — libibverbs creates no threads, and programs rely on that: tgtd
/// blocks its completion signal and reads it from a signalfd (a thread of ours with it
/// unblocked would take it and the program would wait forever), qperf ends its tests with an
/// alarm. Faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP) stay deliverable. The mask is set
/// around the spawn, so the thread starts with it.
///
/// # Errors
/// What spawning the thread returns.
pub(crate) fn spawn_quiet<F, T>(name: String, f: F) -> io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // The new thread starts with the mask the spawning thread has during the spawn.
    let held = SignalsHeld::new();
    let r = std::thread::Builder::new().name(name).spawn(f);
    drop(held);
    r
}

/// One address of a host interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IfAddr {
    pub(crate) ifname: String,
    pub(crate) addr: IpAddr,
    pub(crate) prefix: u8,
    pub(crate) up: bool,
    pub(crate) loopback: bool,
}

/// The host's interface addresses (`getifaddrs`).
pub(crate) fn interface_addrs() -> io::Result<Vec<IfAddr>> {
    let mut head = MaybeUninit::<*mut libc::ifaddrs>::uninit();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(head.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getifaddrs succeeded, so `head` is initialised.
    let head = unsafe { head.assume_init() };
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr points at a sockaddr at least as large as its family says.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let mut storage: libc::sockaddr_storage = unsafe_zeroed_storage();
        let len = match family {
            libc::AF_INET => size_of::<libc::sockaddr_in>(),
            libc::AF_INET6 => size_of::<libc::sockaddr_in6>(),
            _ => continue,
        };
        // SAFETY: copies `len` bytes of the family's sockaddr into storage, which is larger.
        unsafe {
            std::ptr::copy_nonoverlapping(
                ifa.ifa_addr.cast::<u8>(),
                (&raw mut storage).cast::<u8>(),
                len,
            )
        };
        let Some(sa) = sockaddr_from(&storage) else {
            continue;
        };
        let prefix = if ifa.ifa_netmask.is_null() {
            0
        } else {
            let mut m: libc::sockaddr_storage = unsafe_zeroed_storage();
            // SAFETY: the netmask has the same family and size as the address.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    ifa.ifa_netmask.cast::<u8>(),
                    (&raw mut m).cast::<u8>(),
                    len,
                )
            };
            m.ss_family = family as libc::sa_family_t;
            match sockaddr_from(&m).map(|s| s.ip()) {
                Some(IpAddr::V4(v)) => u32::from(v).count_ones() as u8,
                Some(IpAddr::V6(v)) => u128::from(v).count_ones() as u8,
                None => 0,
            }
        };
        out.push(IfAddr {
            ifname: name,
            addr: sa.ip(),
            prefix,
            up: ifa.ifa_flags & libc::IFF_UP as u32 != 0,
            loopback: ifa.ifa_flags & libc::IFF_LOOPBACK as u32 != 0,
        });
    }
    // SAFETY: frees the list getifaddrs allocated; no reference into it survives.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

fn unsafe_zeroed_storage() -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    unsafe { zeroed() }
}

/// `clock` now, in ns (0 if the clock cannot be read, which Linux's clocks never fail to).
pub(crate) fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write for the call.
    if unsafe { libc::clock_gettime(clock, &raw mut t) } != 0 {
        return 0;
    }
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// CPU time this process has used so far, all its threads, user and system
/// (`CLOCK_PROCESS_CPUTIME_ID`): what a benchmark divides by the bytes it moved for a CPU
/// cost per byte.
pub fn process_cpu_time() -> Duration {
    Duration::from_nanos(clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID))
}

/// `struct sched_attr` as `sched_setattr(2)` takes it (its first version, 48 bytes).
#[repr(C)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

/// Asks the scheduler for a short time slice for the calling thread (`sched_setattr` with
/// `sched_runtime` under `SCHED_OTHER`, which needs no privilege; Linux 6.12's EEVDF honours
/// it, older kernels ignore it): a woken thread with a short slice preempts a busy one on its
/// core at once instead of waiting for the busy thread's slice (0.75–3 ms) to end. For the
/// progress thread, which must run while the program spins on memory on every core.
///
/// # Errors
/// The system call's, e.g. `EINVAL` on a kernel without custom slices (harmless).
pub(crate) fn short_slice(slice: Duration) -> io::Result<()> {
    // SAFETY: __errno_location returns this thread's errno slot; getpriority only reads the thread's nice value.
    let nice = unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, 0)
    };
    let attr = SchedAttr {
        size: size_of::<SchedAttr>() as u32,
        sched_policy: libc::SCHED_OTHER as u32,
        sched_flags: 0,
        sched_nice: nice,
        sched_priority: 0,
        sched_runtime: slice.as_nanos() as u64,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: `attr` is a valid sched_attr of the size it states, alive across the call; pid 0 is this thread.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_slice_is_what_the_scheduler_then_reports() {
        std::thread::spawn(|| {
            match short_slice(Duration::from_micros(100)) {
                Ok(()) => {
                    // Kernels with custom slices (6.12+) show the thread's slice here; older
                    // ones accept the call and ignore the slice.
                    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
                    let mut v = release
                        .split(['.', '-'])
                        .map(|x| x.parse::<u32>().unwrap_or(0));
                    let version = (v.next().unwrap_or(0), v.next().unwrap_or(0));
                    let sched = std::fs::read_to_string("/proc/thread-self/sched").unwrap();
                    let line = sched.lines().find(|l| l.starts_with("se.slice"));
                    if let (true, Some(line)) = (version >= (6, 12), line) {
                        let ns: u64 = line.rsplit(' ').next().unwrap().trim().parse().unwrap();
                        assert_eq!(ns, 100_000, "{line}");
                    }
                }
                // An older kernel refuses the attribute: the call says so, nothing else.
                Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}"),
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn loopback_is_listed() {
        let addrs = interface_addrs().unwrap();
        assert!(
            addrs
                .iter()
                .any(|a| a.addr == IpAddr::V4(Ipv4Addr::LOCALHOST) && a.loopback && a.prefix == 8)
        );
    }

    #[test]
    fn eventfd_signals() {
        let e = EventFd::new().unwrap();
        assert!(!poll_fds(&[e.raw()], libc::POLLIN, Some(Duration::ZERO)).unwrap());
        e.signal();
        assert!(poll_fds(&[e.raw()], libc::POLLIN, Some(Duration::ZERO)).unwrap());
        e.drain();
        assert!(!poll_fds(&[e.raw()], libc::POLLIN, Some(Duration::ZERO)).unwrap());
    }

    /// The blocking eventfd programs get: drain on a zero counter returns at once (a plain
    /// read would hang this test), and signal/drain work as on the non-blocking one.
    #[test]
    fn blocking_eventfd_drains_without_blocking() {
        let e = EventFd::new_blocking().unwrap();
        // SAFETY: F_GETFL on our own descriptor.
        let fl = unsafe { libc::fcntl(e.raw(), libc::F_GETFL) };
        assert_eq!(fl & libc::O_NONBLOCK, 0, "programs see a blocking fd");
        e.drain();
        e.signal();
        e.signal();
        assert!(poll_fds(&[e.raw()], libc::POLLIN, Some(Duration::ZERO)).unwrap());
        e.drain();
        assert!(!poll_fds(&[e.raw()], libc::POLLIN, Some(Duration::ZERO)).unwrap());
        e.drain();
    }
}
