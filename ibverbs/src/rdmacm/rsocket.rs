//! rsockets' C functions (`rsocket`, `rbind`, `rlisten`, `raccept`, `rconnect`, `rsend`,
//! `rrecv`, ... `rpoll`, `rselect`) over the provider's stream rsockets
//! ([`ferroce::rsocket`]); librdmacm.so.1 forwards its `r*` symbols here. An rsocket's number
//! is an eventfd of its own, so it never equals another descriptor of the process.
//! Stream sockets, with `riomap`/`riounmap`/`riowrite`, and datagram sockets.

use core::ffi::{c_int, c_void};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferroce::rsocket::dgram::Datagram;
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
    /// A datagram rsocket (shared: a blocking receive runs without the socket's lock).
    Dgram(Arc<Datagram>),
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

/// `rsocket`: a stream or datagram rsocket (AF_INET or AF_INET6; `SOCK_NONBLOCK` taken).
#[unsafe(no_mangle)]
pub extern "C" fn ferroce_rdma_rsocket(domain: c_int, kind: c_int, protocol: c_int) -> c_int {
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return fail(libc::EAFNOSUPPORT);
    }
    let sock = match (kind & 0xF, protocol) {
        (libc::SOCK_STREAM, 0 | libc::IPPROTO_TCP) => Sock::Fresh { bound: None },
        (libc::SOCK_DGRAM, 0 | libc::IPPROTO_UDP) => {
            match Datagram::new(domain == libc::AF_INET6, Sizes::default()) {
                Ok(d) => Sock::Dgram(Arc::new(d)),
                Err(err) => return fail(errno(&err)),
            }
        }
        _ => {
            log::debug!(
                "rsocket: type {kind:#x} protocol {protocol}: stream (TCP) or datagram (UDP) only"
            );
            return fail(libc::ENOTSUP);
        }
    };
    let fd = insert(Entry {
        sock,
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
    // SAFETY: `addr` points to a sockaddr of its family's size (this function's contract).
    let Some(a) = (unsafe { sockaddr_of(addr) }) else {
        return fail(libc::EAFNOSUPPORT);
    };
    match &mut e.lock().sock {
        Sock::Fresh { bound, .. } if bound.is_none() => {
            *bound = Some(a);
            0
        }
        Sock::Dgram(d) => match d.bind(a) {
            Ok(()) => 0,
            Err(err) => fail(errno(&err)),
        },
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
        (l.accept(g.nonblock), g.nonblock, g.sizes)
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
                // raccept's contract covers `addr` and `len`.
                // SAFETY: `addr`/`len` are NULL or a writable sockaddr area and its length.
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
    // SAFETY: `addr` points to a sockaddr of its family's size (this function's contract).
    let Some(dst) = (unsafe { sockaddr_of(addr) }) else {
        return fail(libc::EAFNOSUPPORT);
    };
    let mut g = e.lock();
    let bound = match &g.sock {
        Sock::Fresh { bound, .. } => *bound,
        Sock::Connected(_) => return fail(libc::EISCONN),
        Sock::Dgram(d) => {
            return match d.connect(dst) {
                Ok(()) => 0,
                Err(err) => fail(errno(&err)),
            };
        }
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

/// Moves bytes through a connected rsocket: `step(stream, done)` is one nonblocking attempt
/// from offset `done` that returns the bytes it moved (0: the end of the stream). A nonblocking
/// call (`O_NONBLOCK` or MSG_DONTWAIT) makes one attempt; a blocking one repeats them until
/// `enough(done)`, with the socket's lock released in between (the CPU yielded, as the
/// provider's CQ wait does), so another thread may send while one waits to receive, as
/// rdma-core's separate send and receive locks allow. Returns the bytes moved, or -1 and
/// errno when none were.
fn transfer(
    s: c_int,
    dontwait: bool,
    enough: impl Fn(usize) -> bool,
    mut step: impl FnMut(&mut Stream, usize) -> ferroce::Result<usize>,
) -> isize {
    let Some(e) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let mut done = 0usize;
    loop {
        let mut g = e.lock();
        let nonblock = dontwait || g.nonblock;
        let Sock::Connected(st) = &mut g.sock else {
            return if done > 0 {
                done as isize
            } else {
                fail(libc::ENOTCONN)
            };
        };
        match step(st, done) {
            Ok(n) => {
                done += n;
                if n == 0 || nonblock || enough(done) {
                    return done as isize;
                }
            }
            Err(err) if errno(&err) == libc::EAGAIN && !nonblock => {}
            Err(err) => {
                return if done > 0 {
                    done as isize
                } else {
                    fail(errno(&err))
                };
            }
        }
        drop(g);
        std::thread::yield_now();
    }
}

/// `rsend`: all of `buf` when blocking.
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
    // SAFETY: `buf` holds `len` readable bytes (this function's contract) and `len` > 0.
    let data = unsafe { core::slice::from_raw_parts(buf.cast::<u8>(), len) };
    if let Some((d, nonblock)) = dgram(s) {
        return match d.send_to(data, None, nonblock || flags & libc::MSG_DONTWAIT != 0) {
            Ok(n) => n as isize,
            Err(err) => fail(errno(&err)),
        };
    }
    transfer(
        s,
        flags & libc::MSG_DONTWAIT != 0,
        |done| done == len,
        |st, done| st.send(&data[done..], true),
    )
}

/// The datagram rsocket `s` is, with its O_NONBLOCK, if it is one.
fn dgram(s: c_int) -> Option<(Arc<Datagram>, bool)> {
    let e = lookup(s)?;
    let g = e.lock();
    match &g.sock {
        Sock::Dgram(d) => Some((d.clone(), g.nonblock)),
        _ => None,
    }
}

/// `rsendto`: a datagram rsocket's datagram to `addr` (its connected peer with no address);
/// on a stream rsocket `rsend`, EISCONN with an address, as rdma-core's.
///
/// # Safety
/// `buf` holds `len` readable bytes; `addr` is NULL or a sockaddr of its family's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rsendto(
    s: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    addr: *const libc::sockaddr,
    alen: libc::socklen_t,
) -> isize {
    let Some((d, nonblock)) = dgram(s) else {
        if !addr.is_null() || alen != 0 {
            return fail(libc::EISCONN);
        }
        // SAFETY: `buf` holds `len` readable bytes (our contract), all rsend requires.
        return unsafe { ferroce_rdma_rsend(s, buf, len, flags) };
    };
    let dst = if addr.is_null() {
        None
    } else {
        // SAFETY: `addr` is non-NULL here and a sockaddr of its family's size (our contract).
        match unsafe { sockaddr_of(addr) } {
            Some(a) => Some(a),
            None => return fail(libc::EAFNOSUPPORT),
        }
    };
    let data = if len == 0 {
        &[][..]
    } else {
        // SAFETY: `buf` holds `len` readable bytes (this function's contract) and `len` > 0.
        unsafe { core::slice::from_raw_parts(buf.cast::<u8>(), len) }
    };
    match d.send_to(data, dst, nonblock || flags & libc::MSG_DONTWAIT != 0) {
        Ok(n) => n as isize,
        Err(err) => fail(errno(&err)),
    }
}

/// `rrecvfrom`: a datagram rsocket's next datagram and its sender (MSG_PEEK leaves it); on a
/// stream rsocket `rrecv`, and the peer's address as rdma-core's.
///
/// # Safety
/// `buf` holds `len` writable bytes; `addr`/`alen` NULL or as `recvfrom`'s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rrecvfrom(
    s: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    addr: *mut libc::sockaddr,
    alen: *mut libc::socklen_t,
) -> isize {
    let Some((d, nonblock)) = dgram(s) else {
        // SAFETY: `buf` holds `len` writable bytes (our contract), all rrecv requires.
        let n = unsafe { ferroce_rdma_rrecv(s, buf, len, flags) };
        if n > 0 && !addr.is_null() {
            // SAFETY: non-NULL `addr`/`alen`: a writable sockaddr area and its length.
            unsafe { name(s, addr, alen, true) };
        }
        return n;
    };
    let out = if len == 0 {
        &mut [][..]
    } else {
        // SAFETY: `buf` holds `len` writable bytes (this function's contract) and `len` > 0.
        unsafe { core::slice::from_raw_parts_mut(buf.cast::<u8>(), len) }
    };
    let nb = nonblock || flags & libc::MSG_DONTWAIT != 0;
    match d.recv_from(out, nb, flags & libc::MSG_PEEK != 0) {
        Ok((n, from)) => {
            // SAFETY: `addr`/`alen` are NULL or a writable sockaddr area and its length.
            unsafe { put_addr(addr, alen, from) };
            n as isize
        }
        Err(err) => fail(errno(&err)),
    }
}

/// `riomap`: maps `len` bytes at `buf` for the peer's `riowrite` (`PROT_WRITE`) at `offset`
/// (-1: the buffer's address); returns the offset.
///
/// # Safety
/// `buf` holds `len` bytes that stay valid until `riounmap` of them or `rclose`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_riomap(
    s: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    offset: i64,
) -> i64 {
    let _ = flags;
    if prot & !(libc::PROT_WRITE | libc::PROT_NONE) != 0 {
        log::debug!("riomap: prot {prot:#x}: only PROT_WRITE or PROT_NONE");
        return fail(libc::EINVAL);
    }
    let at = (offset != -1).then_some(offset as u64);
    with_stream(s, |st| {
        // rclose and riounmap deregister the mapping, and the bytes live until then (our
        // contract).
        // SAFETY: `buf..buf+len` stays valid until the mapping is deregistered.
        unsafe { st.iomap(buf.cast(), len, prot & libc::PROT_WRITE != 0, at) }.map(|o| o as i64)
    })
}

/// `riounmap`: ends the mapping of exactly `buf`/`len`.
#[unsafe(no_mangle)]
pub extern "C" fn ferroce_rdma_riounmap(s: c_int, buf: *mut c_void, len: usize) -> c_int {
    with_stream(s, |st| st.iounmap(buf.cast_const().cast(), len).map(|()| 0))
}

/// `riowrite`: writes `len` bytes of `buf` into the peer's mapping at `offset`; the bytes
/// taken, or `(size_t)-1` with errno.
///
/// # Safety
/// `buf` holds `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_riowrite(
    s: c_int,
    buf: *const c_void,
    len: usize,
    offset: i64,
    flags: c_int,
) -> usize {
    if len == 0 {
        return 0;
    }
    // SAFETY: `buf` holds `len` readable bytes (this function's contract) and `len` > 0.
    let data = unsafe { core::slice::from_raw_parts(buf.cast::<u8>(), len) };
    transfer(
        s,
        flags & libc::MSG_DONTWAIT != 0,
        |done| done == len,
        |st, done| st.iowrite(&data[done..], offset as u64 + done as u64, true),
    ) as usize
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
    if dgram(s).is_some() {
        // SAFETY: `buf` holds `len` writable bytes (our contract); NULL address: none written.
        return unsafe {
            ferroce_rdma_rrecvfrom(
                s,
                buf,
                len,
                flags,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
            )
        };
    }
    if len == 0 {
        return 0;
    }
    // SAFETY: `buf` holds `len` writable bytes (this function's contract) and `len` > 0.
    let out = unsafe { core::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
    let waitall = flags & libc::MSG_WAITALL != 0;
    transfer(
        s,
        flags & libc::MSG_DONTWAIT != 0,
        |done| done == len || (!waitall && done > 0),
        |st, done| st.recv(&mut out[done..], true),
    )
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
        (Sock::Dgram(d), true) => d.peer_addr(),
        (Sock::Dgram(d), false) => d.local_addr(),
        _ => None,
    };
    let Some(a) = a else {
        return fail(libc::ENOTCONN);
    };
    // This function's contract covers `addr` and `len`.
    // SAFETY: `addr`/`len` are NULL or a writable sockaddr area and its length.
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
    // SAFETY: `addr`/`len` are NULL or a writable sockaddr area and its length, as name needs.
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
    // SAFETY: `addr`/`len` are NULL or a writable sockaddr area and its length, as name needs.
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
        // SAFETY: `val` is non-NULL and the option's value it points to is `len` >= 4 readable bytes; read unaligned.
        Some(unsafe { val.cast::<c_int>().read_unaligned() })
    } else {
        None
    };
    let mut g = e.lock();
    let r = match (level, opt) {
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
        (SOL_RDMA, RDMA_IOMAPSIZE) => {
            if let Some(v) = int.filter(|v| *v >= 0) {
                // rdma-core keeps what its 8-bit scale can carry.
                use ferroce::rsocket::proto::{scale_to_value, value_to_scale};
                g.sizes.iomap_size = scale_to_value(value_to_scale(v as u32, 8) & 0xFF, 8);
            }
            0
        }
        // A route comes from the addresses.
        (SOL_RDMA, RDMA_ROUTE) => 0,
        _ => fail(libc::ENOTSUP),
    };
    match &g.sock {
        Sock::Listening(l) => l.set_sizes(g.sizes),
        Sock::Dgram(d) => d.set_sizes(g.sizes),
        _ => {}
    }
    r
}

/// `rgetsockopt`: the options rdma-core's answers (SO_RCVBUF, SO_SNDBUF, SO_ERROR,
/// SO_LINGER, IP_TOS, TCP_NODELAY, TCP_MAXSEG as the path MTU, TCP_INFO with the state and
/// the send queue as its window, the keepalive values, the `SOL_RDMA` sizes).
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
    let mut g = e.lock();
    let int = |v: c_int| v.to_ne_bytes().to_vec();
    let v: Vec<u8> = match (level, opt) {
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => int(g.sizes.rbuf_size as c_int),
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => int(g.sizes.sbuf_size as c_int),
        (libc::SOL_SOCKET, libc::SO_ERROR | libc::SO_KEEPALIVE | libc::SO_REUSEADDR) => int(0),
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            // rdma-core's default: on, no time.
            let l = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            [l.l_onoff.to_ne_bytes(), l.l_linger.to_ne_bytes()].concat()
        }
        (libc::IPPROTO_IP, libc::IP_TOS) => int(0),
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => int(1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => int(7200),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => int(1),
        // rdma-core's: the path MTU of a connection, 2048 before one.
        (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => int(match &mut g.sock {
            Sock::Connected(st) => st.path_mtu() as c_int,
            _ => 2048,
        }),
        // rdma-core's: all zero but the state and, as the congestion window, the send
        // queue's size.
        (libc::IPPROTO_TCP, libc::TCP_INFO) => {
            let mut info = [0u8; core::mem::size_of::<libc::tcp_info>()];
            info[0] = if matches!(g.sock, Sock::Connected(_)) {
                1 // TCP_ESTABLISHED
            } else {
                7 // TCP_CLOSE
            };
            let cwnd = core::mem::offset_of!(libc::tcp_info, tcpi_snd_cwnd);
            info[cwnd..cwnd + 4].copy_from_slice(&g.sizes.sq_size.to_ne_bytes());
            info.to_vec()
        }
        (SOL_RDMA, RDMA_SQSIZE) => int(g.sizes.sq_size as c_int),
        (SOL_RDMA, RDMA_RQSIZE) => int(g.sizes.rq_size as c_int),
        (SOL_RDMA, RDMA_INLINE) => int(g.sizes.sq_inline as c_int),
        (SOL_RDMA, RDMA_IOMAPSIZE) => int(g.sizes.iomap_size as c_int),
        _ => {
            log::debug!("rgetsockopt: level {level} option {opt} is not offered");
            return fail(libc::ENOTSUP);
        }
    };
    if val.is_null() || len.is_null() {
        return fail(libc::EINVAL);
    }
    // The caller's contract: `len` valid, `val` writable for `*len` bytes.
    // SAFETY: both are non-NULL (checked above); at most `*len` bytes are written to `val`.
    unsafe {
        let n = (*len as usize).min(v.len());
        if n < v.len().min(4) {
            return fail(libc::EINVAL);
        }
        core::ptr::copy_nonoverlapping(v.as_ptr(), val.cast::<u8>(), n);
        *len = n as libc::socklen_t;
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
        Sock::Dgram(d) => {
            if events & libc::POLLIN != 0 && d.readable() {
                r |= libc::POLLIN;
            }
            if events & libc::POLLOUT != 0 && d.writable() {
                r |= libc::POLLOUT;
            }
        }
        Sock::Done => r |= libc::POLLHUP,
        Sock::Fresh { .. } => {}
    }
    Some(r)
}

/// How long `rpoll` polls before it sleeps between polls.
const POLL_SPIN: Duration = Duration::from_micros(200);

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
    // This function's contract: `fds` holds `nfds` pollfds.
    // SAFETY: `fds` is not NULL (checked above) and holds `nfds` initialized pollfds.
    let fds = unsafe { core::slice::from_raw_parts_mut(fds, nfds as usize) };
    let is_rs: Vec<bool> = fds.iter().map(|p| lookup(p.fd).is_some()).collect();
    if !is_rs.iter().any(|b| *b) {
        // SAFETY: the caller's pollfds.
        return unsafe { libc::poll(fds.as_mut_ptr(), nfds, timeout) };
    }
    let start = Instant::now();
    let deadline = (timeout >= 0).then(|| start + Duration::from_millis(timeout as u64));
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
        let now = Instant::now();
        if n > 0 || deadline.is_some_and(|d| now >= d) {
            return n;
        }
        // As rdma-core's rpoll polls a while before it sleeps: a reply that comes within
        // POLL_SPIN is seen at once; a longer wait sleeps in short steps.
        if now - start < POLL_SPIN {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Gathers `n` iovecs and sends them as one `rsend` with `flags`.
///
/// # Safety
/// `iov` holds `n` iovecs of readable memory.
unsafe fn send_iov(s: c_int, iov: *const libc::iovec, n: usize, flags: c_int) -> isize {
    if iov.is_null() && n > 0 {
        return fail(libc::EINVAL);
    }
    let mut data = Vec::new();
    for i in 0..n {
        // SAFETY: `iov` is non-NULL here (n > 0) and points to `n` iovecs; i < n.
        let v = unsafe { *iov.add(i) };
        if v.iov_len > 0 {
            // SAFETY: the iovec's base holds `iov_len` readable bytes (our contract).
            data.extend_from_slice(unsafe {
                core::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len)
            });
        }
    }
    // SAFETY: `data` is a live Vec: its pointer holds `data.len()` readable bytes.
    unsafe { ferroce_rdma_rsend(s, data.as_ptr().cast(), data.len(), flags) }
}

/// One `rrecv` with `flags` into a buffer, then scattered over `n` iovecs.
///
/// # Safety
/// `iov` holds `n` iovecs of writable memory.
unsafe fn recv_iov(s: c_int, iov: *const libc::iovec, n: usize, flags: c_int) -> isize {
    if iov.is_null() && n > 0 {
        return fail(libc::EINVAL);
    }
    // SAFETY: `iov` points to `n` iovecs (non-NULL when n > 0, checked above); i < n.
    let vs: Vec<libc::iovec> = (0..n).map(|i| unsafe { *iov.add(i) }).collect();
    let total: usize = vs.iter().map(|v| v.iov_len).sum();
    let mut tmp = vec![0u8; total];
    // SAFETY: `tmp` is a live Vec of `total` bytes: its pointer is valid for writing `total` bytes during the call, all rrecv requires.
    let got = unsafe { ferroce_rdma_rrecv(s, tmp.as_mut_ptr().cast(), total, flags) };
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
    let Ok(n) = usize::try_from(n) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: `iov` is NULL with n == 0 (refused otherwise) or points to `n` iovecs of readable memory, all send_iov requires.
    unsafe { send_iov(s, iov, n, 0) }
}

/// `rreadv`.
///
/// # Safety
/// `iov` holds `n` iovecs of writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rreadv(s: c_int, iov: *const libc::iovec, n: c_int) -> isize {
    let Ok(n) = usize::try_from(n) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: `iov` is NULL with n == 0 (refused otherwise) or points to `n` iovecs of writable memory, all recv_iov requires.
    unsafe { recv_iov(s, iov, n, 0) }
}

/// Refuses (ENOTSUP, said at debug as `call`'s) a msghdr with control data, which rsockets
/// do not carry (as rdma-core's).
fn without_control(m: &libc::msghdr, call: &str) -> Result<(), isize> {
    if !m.msg_control.is_null() && m.msg_controllen > 0 {
        log::debug!("{call}: control data is not carried by rsockets");
        return Err(fail(libc::ENOTSUP));
    }
    Ok(())
}

/// `rsendmsg`: the message's iovecs as one send (ENOTSUP with control data, as rdma-core's).
///
/// # Safety
/// `msg` is a valid msghdr whose iovecs are readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rsendmsg(
    s: c_int,
    msg: *const libc::msghdr,
    flags: c_int,
) -> isize {
    // SAFETY: `msg` is NULL (refused by as_ref/as_mut) or points to a valid, aligned msghdr.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return fail(libc::EINVAL);
    };
    if let Err(e) = without_control(m, "rsendmsg") {
        return e;
    }
    // SAFETY: `msg_iov` points to `msg_iovlen` iovecs of readable memory (a valid msghdr), all send_iov requires.
    unsafe { send_iov(s, m.msg_iov, m.msg_iovlen, flags) }
}

/// `rrecvmsg`: received bytes scattered over the message's iovecs (ENOTSUP with a control
/// buffer, as rdma-core's). `flags` (MSG_DONTWAIT, MSG_WAITALL) are taken as `rrecv` takes
/// them; rdma-core's reads the message's `msg_flags` instead, which a caller leaves 0.
///
/// # Safety
/// `msg` is a valid msghdr whose iovecs are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_rrecvmsg(
    s: c_int,
    msg: *mut libc::msghdr,
    flags: c_int,
) -> isize {
    // SAFETY: `msg` is NULL (refused by as_ref/as_mut) or points to a valid, aligned msghdr.
    let Some(m) = (unsafe { msg.as_mut() }) else {
        return fail(libc::EINVAL);
    };
    if let Err(e) = without_control(m, "rrecvmsg") {
        return e;
    }
    m.msg_flags = 0;
    // SAFETY: `msg_iov` points to `msg_iovlen` iovecs of writable memory (a valid msghdr), all recv_iov requires.
    unsafe { recv_iov(s, m.msg_iov, m.msg_iovlen, flags) }
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
