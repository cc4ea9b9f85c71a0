//! rsockets' C functions (`rsocket`, `rbind`, `rlisten`, `raccept`, `rconnect`, `rsend`,
//! `rrecv`, ... `rpoll`, `rselect`) over the provider's stream rsockets
//! ([`ferroce::rsocket`]); librdmacm.so.1 forwards its `r*` symbols here. An rsocket's number
//! is an eventfd of its own, so it never equals another descriptor of the process.
//! Stream sockets only: datagram rsockets and `riomap`/`riowrite` are ENOSYS.

use core::ffi::{c_int, c_void};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferroce::rsocket::stream::{Listener, Sizes, Stream};
use parking_lot::Mutex;

use super::abi::sockaddr_any;
use super::addr::{sockaddr_of, write_sockaddr};
use crate::set_errno;

/// What an rsocket number stands for.
enum Sock {
    /// Made by `rsocket`, perhaps bound.
    Fresh { bound: Option<SocketAddr> },
    /// Listening.
    Listening(Listener),
    /// Connected (boxed: the stream's state is large beside the other variants).
    Connected(Box<Stream>),
    /// Closed by the peer or shut down.
    Done,
}

struct Entry {
    sock: Sock,
    nonblock: bool,
    sizes: Sizes,
}

type Table = HashMap<c_int, Arc<Mutex<Entry>>>;

/// `SOL_RDMA` and its options (`<rdma/rsocket.h>`).
const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
const RDMA_ROUTE: c_int = 4;

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn lookup(s: c_int) -> Option<Arc<Mutex<Entry>>> {
    TABLE.lock().as_ref().and_then(|t| t.get(&s).cloned())
}

fn insert(e: Entry) -> c_int {
    // SAFETY: eventfd takes two integers and returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return -1;
    }
    TABLE
        .lock()
        .get_or_insert_with(HashMap::new)
        .insert(fd, Arc::new(Mutex::new(e)));
    fd
}

#[track_caller]
fn fail<T: From<i8>>(e: c_int) -> T {
    let at = std::panic::Location::caller();
    log::debug!(
        "{}:{}: rsocket call refused: {}",
        at.file(),
        at.line(),
        crate::errno_name(e)
    );
    set_errno(e);
    T::from(-1)
}

fn errno(e: &ferroce::Error) -> c_int {
    crate::errno_of(e)
}

/// `rsocket`: a stream rsocket (AF_INET or AF_INET6; `SOCK_NONBLOCK` taken).
#[unsafe(no_mangle)]
pub extern "C" fn ferroce_rdma_rsocket(domain: c_int, kind: c_int, protocol: c_int) -> c_int {
    let _ = protocol;
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return fail(libc::EAFNOSUPPORT);
    }
    if kind & 0xF != libc::SOCK_STREAM {
        log::debug!("rsocket: only SOCK_STREAM rsockets are offered");
        return fail(libc::ENOTSUP);
    }
    let fd = insert(Entry {
        sock: Sock::Fresh { bound: None },
        nonblock: kind & libc::SOCK_NONBLOCK != 0,
        sizes: Sizes::default(),
    });
    if fd < 0 {
        return fail(libc::EMFILE);
    }
    fd
}

/// `rbind`.
///
/// # Safety
/// `addr` points to a sockaddr of its family's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rbind(
    s: c_int,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    let _ = len;
    let Some(e) = lookup(s) else {
        return fail(libc::EBADF);
    };
    // SAFETY: the caller's contract.
    let Some(a) = (unsafe { sockaddr_of(addr) }) else {
        return fail(libc::EAFNOSUPPORT);
    };
    match &mut e.lock().sock {
        Sock::Fresh { bound, .. } if bound.is_none() => {
            *bound = Some(a);
            0
        }
        _ => fail(libc::EINVAL),
    }
}

/// `rlisten`.
#[unsafe(no_mangle)]
pub extern "C" fn ferroce_rdma_rlisten(s: c_int, backlog: c_int) -> c_int {
    let Some(e) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let mut g = e.lock();
    let addr = match &g.sock {
        Sock::Fresh { bound: Some(a), .. } => *a,
        _ => return fail(libc::EINVAL),
    };
    match Listener::bind(addr, backlog, g.sizes) {
        Ok(l) => {
            g.sock = Sock::Listening(l);
            0
        }
        Err(err) => fail(errno(&err)),
    }
}

/// `raccept`.
///
/// # Safety
/// `addr` is NULL or writable for `*len` bytes; `len` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_raccept(
    s: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    let Some(e) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let (r, nonblock, sizes) = {
        let g = e.lock();
        let Sock::Listening(l) = &g.sock else {
            return fail(libc::EINVAL);
        };
        (l.accept_with(g.nonblock, g.sizes), g.nonblock, g.sizes)
    };
    match r {
        Ok(Some(stream)) => {
            let peer = stream.peer_addr();
            let fd = insert(Entry {
                sock: Sock::Connected(Box::new(stream)),
                nonblock: false,
                sizes,
            });
            if fd < 0 {
                return fail(libc::EMFILE);
            }
            if let Some(p) = peer {
                // SAFETY: the caller's contract.
                unsafe { put_addr(addr, len, p) };
            }
            let _ = nonblock;
            fd
        }
        Ok(None) => fail(libc::EAGAIN),
        Err(err) => fail(errno(&err)),
    }
}

/// Writes `a` into a caller's (addr, len) pair, truncated to its room.
///
/// # Safety
/// `addr` NULL or writable for `*len` bytes; `len` NULL or valid.
unsafe fn put_addr(addr: *mut libc::sockaddr, len: *mut libc::socklen_t, a: SocketAddr) {
    if addr.is_null() || len.is_null() {
        return;
    }
    let mut area = core::mem::MaybeUninit::<sockaddr_any>::uninit();
    // SAFETY: the area is 128 writable bytes.
    unsafe { write_sockaddr(area.as_mut_ptr(), a) };
    let size = match a {
        SocketAddr::V4(_) => core::mem::size_of::<libc::sockaddr_in>(),
        SocketAddr::V6(_) => core::mem::size_of::<libc::sockaddr_in6>(),
    };
    // SAFETY: `len` is valid (the caller's contract).
    let room = unsafe { *len } as usize;
    // SAFETY: write_sockaddr initialized the area; the caller's buffer holds `room` bytes.
    unsafe {
        core::ptr::copy_nonoverlapping(
            area.as_ptr().cast::<u8>(),
            addr.cast::<u8>(),
            room.min(size),
        );
        *len = size as libc::socklen_t;
    }
}

/// `rconnect` (blocking; a nonblocking socket connects before it returns too).
///
/// # Safety
/// `addr` points to a sockaddr of its family's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rconnect(
    s: c_int,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    let _ = len;
    let Some(e) = lookup(s) else {
        return fail(libc::EBADF);
    };
    // SAFETY: the caller's contract.
    let Some(dst) = (unsafe { sockaddr_of(addr) }) else {
        return fail(libc::EAFNOSUPPORT);
    };
    let mut g = e.lock();
    let bound = match &g.sock {
        Sock::Fresh { bound, .. } => *bound,
        Sock::Connected(_) => return fail(libc::EISCONN),
        _ => return fail(libc::EINVAL),
    };
    match Stream::connect(bound, dst, g.sizes) {
        Ok(mut st) => {
            st.set_nonblocking(g.nonblock);
            g.sock = Sock::Connected(Box::new(st));
            0
        }
        Err(err) => fail(errno(&err)),
    }
}

/// Runs `f` on a connected rsocket.
fn with_stream<R: From<i8>>(s: c_int, f: impl FnOnce(&mut Stream) -> ferroce::Result<R>) -> R {
    let Some(e) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let mut g = e.lock();
    match &mut g.sock {
        Sock::Connected(st) => match f(st) {
            Ok(r) => r,
            Err(err) => fail(errno(&err)),
        },
        Sock::Done => fail(libc::ENOTCONN),
        _ => fail(libc::ENOTCONN),
    }
}

/// `rsend`.
///
/// # Safety
/// `buf` holds `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rsend(
    s: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
) -> isize {
    if len == 0 {
        return 0;
    }
    // SAFETY: the caller's contract.
    let data = unsafe { core::slice::from_raw_parts(buf.cast::<u8>(), len) };
    with_stream(s, |st| {
        st.send(data, flags & libc::MSG_DONTWAIT != 0)
            .map(|n| n as isize)
    })
}

/// `rrecv`.
///
/// # Safety
/// `buf` holds `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rrecv(
    s: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
) -> isize {
    if len == 0 {
        return 0;
    }
    // SAFETY: the caller's contract.
    let out = unsafe { core::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
    with_stream(s, |st| {
        let dontwait = flags & libc::MSG_DONTWAIT != 0;
        if flags & libc::MSG_WAITALL != 0 && !dontwait {
            let mut got = 0;
            while got < out.len() {
                let n = st.recv(&mut out[got..], false)?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            return Ok(got as isize);
        }
        st.recv(out, dontwait).map(|n| n as isize)
    })
}

/// `rshutdown`.
#[unsafe(no_mangle)]
pub extern "C" fn ferroce_rdma_rshutdown(s: c_int, how: c_int) -> c_int {
    let _ = how;
    let Some(e) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let mut g = e.lock();
    match std::mem::replace(&mut g.sock, Sock::Done) {
        Sock::Connected(mut st) => {
            st.shutdown();
            0
        }
        other => {
            g.sock = other;
            fail(libc::ENOTCONN)
        }
    }
}

/// `rclose`.
#[unsafe(no_mangle)]
pub extern "C" fn ferroce_rdma_rclose(s: c_int) -> c_int {
    let e = TABLE.lock().as_mut().and_then(|t| t.remove(&s));
    let Some(e) = e else {
        return fail(libc::EBADF);
    };
    drop(e);
    // SAFETY: `s` is the eventfd this module opened for the socket, closed once.
    unsafe { libc::close(s) };
    0
}

/// `rgetpeername` and `rgetsockname`.
///
/// # Safety
/// As `getpeername`.
unsafe fn name(
    s: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
    peer: bool,
) -> c_int {
    let Some(e) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let g = e.lock();
    let a = match (&g.sock, peer) {
        (Sock::Connected(st), true) => st.peer_addr(),
        (Sock::Connected(st), false) => st.local_addr(),
        (Sock::Listening(l), false) => l.local_addr(),
        (Sock::Fresh { bound, .. }, false) => *bound,
        _ => None,
    };
    let Some(a) = a else {
        return fail(libc::ENOTCONN);
    };
    // SAFETY: the caller's contract.
    unsafe { put_addr(addr, len, a) };
    0
}

/// `rgetpeername`.
///
/// # Safety
/// As `getpeername`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rgetpeername(
    s: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { name(s, addr, len, true) }
}

/// `rgetsockname`.
///
/// # Safety
/// As `getsockname`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rgetsockname(
    s: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { name(s, addr, len, false) }
}

/// `rsetsockopt`: SO_RCVBUF/SO_SNDBUF size the buffers of a socket not yet connected;
/// SO_REUSEADDR, SO_KEEPALIVE, SO_LINGER and TCP_NODELAY are taken (rsockets send at once).
///
/// # Safety
/// `val` holds `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rsetsockopt(
    s: c_int,
    level: c_int,
    opt: c_int,
    val: *const c_void,
    len: libc::socklen_t,
) -> c_int {
    let Some(e) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let int = if !val.is_null() && len as usize >= 4 {
        // SAFETY: the caller's contract: at least 4 readable bytes.
        Some(unsafe { val.cast::<c_int>().read_unaligned() })
    } else {
        None
    };
    let mut g = e.lock();
    match (level, opt) {
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
            if let Some(v) = int.filter(|v| *v > 0) {
                g.sizes.rbuf_size = (v as u32).max(ferroce::rsocket::proto::SNDLOWAT * 2);
            }
            0
        }
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
            if let Some(v) = int.filter(|v| *v > 0) {
                g.sizes.sbuf_size = (v as u32).max(ferroce::rsocket::proto::SNDLOWAT * 2);
            }
            0
        }
        (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_LINGER)
        | (libc::IPPROTO_TCP, libc::TCP_NODELAY | libc::TCP_MAXSEG | libc::TCP_KEEPIDLE) => 0,
        (SOL_RDMA, RDMA_SQSIZE) => {
            if let Some(v) = int.filter(|v| *v > 0) {
                g.sizes.sq_size = (v as u32).clamp(16, 0xFFFE);
            }
            0
        }
        (SOL_RDMA, RDMA_RQSIZE) => {
            if let Some(v) = int.filter(|v| *v > 0) {
                g.sizes.rq_size = (v as u32).clamp(16, 0xFFFE);
            }
            0
        }
        (SOL_RDMA, RDMA_INLINE) => {
            if let Some(v) = int.filter(|v| *v >= 0) {
                g.sizes.sq_inline = (v as u32).min(ferroce::context::limits::MAX_INLINE);
            }
            0
        }
        // No iomap area is offered; a route comes from the addresses.
        (SOL_RDMA, RDMA_IOMAPSIZE | RDMA_ROUTE) => 0,
        _ => fail(libc::ENOTSUP),
    }
}

/// `rgetsockopt`: SO_RCVBUF, SO_SNDBUF, SO_ERROR (0), TCP_NODELAY (1).
///
/// # Safety
/// `val` is writable for `*len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rgetsockopt(
    s: c_int,
    level: c_int,
    opt: c_int,
    val: *mut c_void,
    len: *mut libc::socklen_t,
) -> c_int {
    let Some(e) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let g = e.lock();
    let v: c_int = match (level, opt) {
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => g.sizes.rbuf_size as c_int,
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => g.sizes.sbuf_size as c_int,
        (libc::SOL_SOCKET, libc::SO_ERROR | libc::SO_KEEPALIVE) => 0,
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => 1,
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => 7200,
        (SOL_RDMA, RDMA_SQSIZE) => g.sizes.sq_size as c_int,
        (SOL_RDMA, RDMA_RQSIZE) => g.sizes.rq_size as c_int,
        (SOL_RDMA, RDMA_INLINE) => g.sizes.sq_inline as c_int,
        (SOL_RDMA, RDMA_IOMAPSIZE) => 0,
        _ => return fail(libc::ENOTSUP),
    };
    if val.is_null() || len.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's contract: `len` valid, `val` writable for `*len` bytes.
    unsafe {
        if (*len as usize) < 4 {
            return fail(libc::EINVAL);
        }
        val.cast::<c_int>().write_unaligned(v);
        *len = 4;
    }
    0
}

/// `rfcntl`: F_GETFL and F_SETFL (O_NONBLOCK).
#[unsafe(no_mangle)]
pub extern "C" fn ferroce_rdma_rfcntl(s: c_int, cmd: c_int, arg: usize) -> c_int {
    let Some(e) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let mut g = e.lock();
    match cmd {
        libc::F_GETFL => libc::O_RDWR | if g.nonblock { libc::O_NONBLOCK } else { 0 },
        libc::F_SETFL => {
            g.nonblock = arg as c_int & libc::O_NONBLOCK != 0;
            let nb = g.nonblock;
            if let Sock::Connected(st) = &mut g.sock {
                st.set_nonblocking(nb);
            }
            0
        }
        _ => fail(libc::ENOTSUP),
    }
}

/// The readiness of rsocket `s` for `events` (POLLIN/POLLOUT), or `None` if `s` is not one.
fn ready(s: c_int, events: i16) -> Option<i16> {
    let e = lookup(s)?;
    let mut g = e.try_lock()?;
    let mut r = 0;
    match &mut g.sock {
        Sock::Connected(st) => {
            if events & libc::POLLIN != 0 && st.readable() {
                r |= libc::POLLIN;
            }
            if events & libc::POLLOUT != 0 && st.writable() {
                r |= libc::POLLOUT;
            }
        }
        Sock::Listening(l) => {
            if events & libc::POLLIN != 0 && l.pending() {
                r |= libc::POLLIN;
            }
        }
        Sock::Done => r |= libc::POLLHUP,
        Sock::Fresh { .. } => {}
    }
    Some(r)
}

/// `rpoll`: rsockets by their state, other descriptors by `poll(2)`, until something is
/// ready or `timeout` ms pass.
///
/// # Safety
/// `fds` holds `nfds` pollfds.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    if nfds == 0 || fds.is_null() {
        // SAFETY: poll with no descriptors only sleeps.
        return unsafe { libc::poll(fds, nfds, timeout) };
    }
    // SAFETY: the caller's contract.
    let fds = unsafe { core::slice::from_raw_parts_mut(fds, nfds as usize) };
    let is_rs: Vec<bool> = fds.iter().map(|p| lookup(p.fd).is_some()).collect();
    if !is_rs.iter().any(|b| *b) {
        // SAFETY: the caller's pollfds.
        return unsafe { libc::poll(fds.as_mut_ptr(), nfds, timeout) };
    }
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    loop {
        let mut n = 0;
        for (p, rs) in fds.iter_mut().zip(&is_rs) {
            p.revents = 0;
            if *rs {
                p.revents = ready(p.fd, p.events).unwrap_or(0);
            }
        }
        // The other descriptors, without waiting.
        let mut others: Vec<libc::pollfd> = fds
            .iter()
            .zip(&is_rs)
            .filter(|(_, rs)| !**rs)
            .map(|(p, _)| *p)
            .collect();
        if !others.is_empty() {
            // SAFETY: a local array of pollfds.
            unsafe { libc::poll(others.as_mut_ptr(), others.len() as libc::nfds_t, 0) };
            let mut it = others.into_iter();
            for (p, rs) in fds.iter_mut().zip(&is_rs) {
                if !*rs {
                    if let Some(o) = it.next() {
                        p.revents = o.revents;
                    }
                }
            }
        }
        for p in fds.iter() {
            if p.revents != 0 {
                n += 1;
            }
        }
        if n > 0 || deadline.is_some_and(|d| Instant::now() >= d) {
            return n;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// `rwritev`.
///
/// # Safety
/// `iov` holds `n` iovecs of readable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rwritev(
    s: c_int,
    iov: *const libc::iovec,
    n: c_int,
) -> isize {
    if n < 0 || (iov.is_null() && n > 0) {
        return fail(libc::EINVAL);
    }
    let mut data = Vec::new();
    for i in 0..n as usize {
        // SAFETY: the caller's contract: `n` iovecs, each of readable memory.
        let v = unsafe { *iov.add(i) };
        if v.iov_len > 0 {
            // SAFETY: as above.
            data.extend_from_slice(unsafe {
                core::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len)
            });
        }
    }
    // SAFETY: `data` holds its length in bytes.
    unsafe { ferroce_rdma_rsend(s, data.as_ptr().cast(), data.len(), 0) }
}

/// `rreadv`.
///
/// # Safety
/// `iov` holds `n` iovecs of writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rreadv(s: c_int, iov: *const libc::iovec, n: c_int) -> isize {
    if n < 0 || (iov.is_null() && n > 0) {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's contract: `n` iovecs.
    let vs: Vec<libc::iovec> = (0..n as usize).map(|i| unsafe { *iov.add(i) }).collect();
    let total: usize = vs.iter().map(|v| v.iov_len).sum();
    let mut tmp = vec![0u8; total];
    // SAFETY: `tmp` holds `total` writable bytes.
    let got = unsafe { ferroce_rdma_rrecv(s, tmp.as_mut_ptr().cast(), total, 0) };
    if got <= 0 {
        return got;
    }
    let mut off = 0usize;
    for v in vs {
        let k = v.iov_len.min(got as usize - off);
        if k == 0 {
            break;
        }
        // SAFETY: each iovec is writable for its length (the caller's contract).
        unsafe {
            core::ptr::copy_nonoverlapping(tmp.as_ptr().add(off), v.iov_base.cast::<u8>(), k)
        };
        off += k;
    }
    got
}

/// `rselect`: as `select(2)`, with rsockets among the descriptors (through [`ferroce_rdma_rpoll`]).
///
/// # Safety
/// The sets are NULL or valid `fd_set`s covering `nfds`; `timeout` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    let any_rs = (0..nfds.max(0)).any(|fd| {
        // SAFETY: each set is NULL or a valid fd_set (the caller's contract).
        let set = |s: *mut libc::fd_set| !s.is_null() && unsafe { libc::FD_ISSET(fd, s) };
        (set(r) || set(w) || set(e)) && lookup(fd).is_some()
    });
    if !any_rs {
        // SAFETY: select's contract is rselect's.
        return unsafe { libc::select(nfds, r, w, e, timeout) };
    }
    let mut fds = Vec::new();
    for fd in 0..nfds {
        let mut ev = 0i16;
        // SAFETY: as above.
        let set = |s: *mut libc::fd_set| !s.is_null() && unsafe { libc::FD_ISSET(fd, s) };
        if set(r) {
            ev |= libc::POLLIN;
        }
        if set(w) {
            ev |= libc::POLLOUT;
        }
        if set(e) {
            ev |= libc::POLLPRI;
        }
        if ev != 0 {
            fds.push(libc::pollfd {
                fd,
                events: ev,
                revents: 0,
            });
        }
    }
    let ms = if timeout.is_null() {
        -1
    } else {
        // SAFETY: a non-NULL timeout is valid (the caller's contract).
        let t = unsafe { *timeout };
        (t.tv_sec * 1000 + t.tv_usec / 1000).clamp(0, i64::from(c_int::MAX)) as c_int
    };
    // SAFETY: a local array of pollfds.
    let n = unsafe { ferroce_rdma_rpoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        return n;
    }
    let mut count = 0;
    for s in [r, w, e] {
        if !s.is_null() {
            // SAFETY: a valid fd_set (the caller's contract).
            unsafe { libc::FD_ZERO(s) };
        }
    }
    for p in &fds {
        let mut mark = |s: *mut libc::fd_set, bits: i16| {
            if !s.is_null() && p.revents & bits != 0 {
                // SAFETY: a valid fd_set, `fd` below `nfds` (the caller's contract).
                unsafe { libc::FD_SET(p.fd, s) };
                count += 1;
            }
        };
        mark(r, libc::POLLIN | libc::POLLHUP | libc::POLLERR);
        mark(w, libc::POLLOUT | libc::POLLERR);
        mark(e, libc::POLLPRI);
    }
    count
}
