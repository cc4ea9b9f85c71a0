//! The network side of multicast groups: one UDP socket per group a QP of this process is
//! attached to, bound to the group's address and the device's port and joined on the device's
//! interface (IGMP/MLD are the kernel's), all watched by one epoll descriptor the progress
//! thread polls. A datagram sent to a group reaches every socket of every process that joined
//! it (the kernel delivers multicast to each matching socket); the device's own socket, bound
//! to its unicast address, never sees it.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use ferroce_transport::mcast::canonical;

/// The most datagrams one [`McastSockets::drain`] takes from one group's socket (the rest
/// wait for the next pass: one busy group cannot hold the engine).
const DRAIN_PER_GROUP: usize = 64;

/// The groups this process has joined on one device.
pub(crate) struct McastSockets {
    local: SocketAddr,
    /// Made at the first join; lives as long as the device's runtime.
    epoll: Option<OwnedFd>,
    sockets: HashMap<IpAddr, std::net::UdpSocket>,
    buf: Vec<u8>,
}

impl McastSockets {
    pub(crate) fn new(local: SocketAddr) -> McastSockets {
        McastSockets {
            local,
            epoll: None,
            sockets: HashMap::new(),
            buf: vec![0; crate::backend::MAX_PACKET],
        }
    }

    /// The epoll descriptor readable while a group's datagram waits (none before the first
    /// join; valid as long as this lives).
    pub(crate) fn ready_fd(&self) -> Option<RawFd> {
        self.epoll.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Whether a socket is open for `group` (IPv4-mapped groups as IPv4).
    pub(crate) fn has(&self, group: IpAddr) -> bool {
        self.sockets.contains_key(&canonical(group))
    }

    /// The groups with a socket.
    pub(crate) fn groups(&self) -> Vec<IpAddr> {
        self.sockets.keys().copied().collect()
    }

    /// Opens `group`'s socket and joins the group on the device's interface.
    ///
    /// # Errors
    /// What the kernel refuses (binding the group's port: e.g. kernel rxe's own socket on
    /// this host; joining: no multicast route on the interface).
    pub(crate) fn join(&mut self, group: IpAddr) -> io::Result<()> {
        let group = canonical(group);
        if self.sockets.contains_key(&group) {
            return Ok(());
        }
        let epoll = match &self.epoll {
            Some(e) => e.as_raw_fd(),
            None => {
                // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new descriptor this process owns, handed to OwnedFd once.
                let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: `fd` was just returned by epoll_create1 and is owned by nothing else.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                self.epoll.insert(owned).as_raw_fd()
            }
        };
        let socket = open_group_socket(self.local, group)?;
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0,
        };
        let sock = socket.as_raw_fd();
        // SAFETY: both descriptors are open (the epoll's is owned by self, the socket's by `socket`), and `ev` is a valid epoll_event for the call's duration.
        let rc = unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, sock, &mut ev) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        log::debug!("{}: joined multicast group {group}", self.local);
        self.sockets.insert(group, socket);
        Ok(())
    }

    /// Leaves `group` (closing its socket drops the membership and its epoll entry).
    pub(crate) fn leave(&mut self, group: IpAddr) {
        if self.sockets.remove(&canonical(group)).is_some() {
            log::debug!("{}: left multicast group {group}", self.local);
        }
    }

    /// Takes what waits on every group's socket, handing each datagram (source, group,
    /// payload) to `deliver`; returns how many.
    pub(crate) fn drain(&mut self, deliver: &mut dyn FnMut(SocketAddr, IpAddr, &[u8])) -> usize {
        let mut n = 0;
        for (&group, socket) in &self.sockets {
            for _ in 0..DRAIN_PER_GROUP {
                match socket.recv_from(&mut self.buf) {
                    Ok((len, from)) => {
                        n += 1;
                        deliver(from, group, &self.buf[..len]);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        log::debug!("{}: receive on group {group}: {e}", self.local);
                        break;
                    }
                }
            }
        }
        n
    }
}

/// A non-blocking UDP socket bound to `group` and the device's port (address reuse on, so
/// every process of the host joining the group gets each datagram), a member of the group on
/// the interface of `local`.
fn open_group_socket(local: SocketAddr, group: IpAddr) -> io::Result<std::net::UdpSocket> {
    let domain = match group {
        IpAddr::V4(_) => socket2::Domain::IPV4,
        IpAddr::V6(_) => socket2::Domain::IPV6,
    };
    let socket = crate::sys::udp_socket(domain)?;
    socket.set_nonblocking(true)?;
    socket.set_reuse_address(true)?;
    let _ = socket.set_recv_buffer_size(1 << 20);
    match (group, local.ip()) {
        (IpAddr::V4(g), IpAddr::V4(l)) => {
            socket.bind(&SocketAddr::new(group, local.port()).into())?;
            socket.join_multicast_v4(&g, &l)?;
        }
        (IpAddr::V6(g), _) => {
            socket.set_only_v6(true)?;
            socket.bind(&SocketAddr::new(group, local.port()).into())?;
            // Interface 0: the kernel's route to the group picks it.
            socket.join_multicast_v6(&g, 0)?;
        }
        (IpAddr::V4(_), IpAddr::V6(_)) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an IPv4 group on an IPv6 device",
            ));
        }
    }
    Ok(socket.into())
}
