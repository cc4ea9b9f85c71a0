//! One address shared by many processes of a host, around any backend: the address's group
//! and its registry file ([`group`]: slots, membership, the steering table, the keeper's
//! rebalance), the QP1 routing point ([`gsi`]), the per-process counter pages ([`pages`]) and
//! QP tables ([`qptable`]), and the receive path's routing of probes, MADs and forwards ([`route`], [`member`]). The
//! backend underneath is only a socket; the driver sees a [`crate::backend::Receiver`].

pub(crate) mod group;
pub(crate) mod gsi;
pub(crate) mod member;
pub(crate) mod pages;
pub(crate) mod qptable;
pub(crate) mod route;

use std::net::SocketAddr;
use std::sync::Arc;

use crate::backend::{DatapathStats, Receiver};
use group::Membership;
use member::MemberReceiver;

/// Joins `local`'s group with `socket` (bound with `SO_REUSEPORT`, read by `rx`): claims a
/// slot, opens the forwarding socket and records its port, and wraps `rx` so the group's
/// traffic is routed before the engine sees it.
///
/// # Errors
/// As [`Membership::join`], or [`crate::Error::Io`] if the forwarding socket cannot be opened.
pub(crate) fn join<R: Receiver>(
    local: SocketAddr,
    socket: Arc<socket2::Socket>,
    rx: R,
    stats: &Arc<DatapathStats>,
) -> crate::Result<(MemberReceiver<R>, Membership)> {
    // The forwarding socket: the device's address and a port of its own, outside the group,
    // where other members send what the group's steering handed them for this process.
    let fwd = crate::sys::bind_udp(SocketAddr::new(local.ip(), 0))?;
    fwd.set_nonblocking(true)?;
    let fwd_port = fwd.local_addr()?.port();
    let membership = Membership::join(local, socket.clone())?;
    membership
        .registry
        .set_forward_port(membership.slot, fwd_port);
    let member = (membership.registry.clone(), membership.slot);
    Ok((
        MemberReceiver::new(rx, socket, member, fwd, local, stats),
        membership,
    ))
}
