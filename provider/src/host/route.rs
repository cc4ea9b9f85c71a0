//! Where a datagram that reached this member's socket goes: its own engine, another live
//! member (a QP1 MAD its routing rules name, a data packet the kernel's steering handed the
//! wrong member while the group's table changed, a forward on its way), or nowhere; and the
//! forwards themselves (an envelope sent to the target's forwarding socket, see [`super::gsi`]),
//! including what a leaving member drains from its socket for the others.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use super::group::Registry;
use super::gsi;
use crate::backend::udp::BATCH;
use crate::mmsg::{GRO_SLOT, RecvBatch};

/// What becomes of a datagram that reached this member's socket.
pub(super) enum Fate<'a> {
    /// This process's engine takes it as it came.
    Here,
    /// A forward for this process: its engine takes the original (source, IPv4 ID, bytes).
    Unwrapped(SocketAddr, u16, &'a [u8]),
    /// On to the live process in this slot, wrapped in a forward.
    Forward(u8),
    /// A forward for another live slot: sent on once more.
    Reforward(u8),
    /// Nobody can take it (the reason is logged).
    Drop,
}

/// Where a datagram received by the member in `slot` goes: a forward to its target; a QP1 MAD
/// to the process its routing rules name (see `gsi`); a data packet to the process whose slot
/// is its DestQP's high byte, which the kernel's steering hands another member while the
/// group's table changes.
pub(super) fn route<'a>(
    bytes: &'a [u8],
    registry: &Registry,
    slot: u8,
    local: SocketAddr,
    from: SocketAddr,
) -> Fate<'a> {
    match bytes.first() {
        Some(&gsi::FORWARD_OPCODE) => match gsi::unwrap(bytes, registry.nonce()) {
            Ok((to, from, ident, inner)) if to == slot => Fate::Unwrapped(from, ident, inner),
            Ok((to, ..))
                if registry.is_live(to, slot)
                    && bytes.get(gsi::HOPS_AT).is_some_and(|&h| h < gsi::MAX_HOPS) =>
            {
                log::trace!(
                    "{local}: a forwarded packet for slot {to} reached slot {slot}: sent on"
                );
                Fate::Reforward(to)
            }
            Ok((to, ..)) => {
                log::debug!(
                    "{local}: a forwarded packet for slot {to} reached slot {slot}: dropped \
                     (no live process holds slot {to}, or it was sent on {} times)",
                    gsi::MAX_HOPS
                );
                Fate::Drop
            }
            Err(why) => {
                log::debug!("{local}: {why} from {from}: dropped");
                Fate::Drop
            }
        },
        _ if gsi::is_gsi(bytes) => match gsi::route(bytes, registry) {
            gsi::Route::Slot(to) if to != slot && registry.is_live(to, slot) => Fate::Forward(to),
            gsi::Route::Slot(to) if to != slot => {
                // Its owner is gone: like anything without an owner, the MAD goes to this role
                // holder's QP1, whose CM answers for the address as the kernel's outlives a
                // process (a DREQ for a dead process's connection gets its DREP).
                log::debug!(
                    "{local}: a MAD from {from} for slot {to}, which no live process holds: to \
                     this role holder's QP1"
                );
                Fate::Here
            }
            _ => Fate::Here,
        },
        // A data packet for another process's QP (DestQP's high byte is its slot) that the
        // kernel's steering sent here, while the group's table changes: on to its owner, not
        // lost to a retransmission.
        _ => match bytes.get(5) {
            Some(&to) if to != slot && registry.is_live(to, slot) => Fate::Forward(to),
            Some(&to) if to != slot => {
                log::debug!(
                    "{local}: a data packet from {from} for slot {to}, which no live process \
                     holds, reached slot {slot}: to this engine (which drops it as for an \
                     unknown QP)"
                );
                Fate::Here
            }
            _ => Fate::Here,
        },
    }
}

/// Sends a datagram (from `from`, expected to carry IPv4 ID `ident`) on to the process in
/// slot `to`, wrapped in a forward: a QP1 MAD (the routing point, see `gsi`) or a data packet
/// steered to the wrong member.
pub(super) fn forward(
    socket: &socket2::Socket,
    registry: &Registry,
    to: u8,
    (from, ident): (SocketAddr, u16),
    bytes: &[u8],
    local: SocketAddr,
) {
    let Some(out) = envelope(registry, to, (from, ident), bytes) else {
        return;
    };
    match socket.send_to(&out, &forward_to(registry, to, local).into()) {
        Ok(_) => log::trace!("{local}: a datagram from {from} forwarded to slot {to}"),
        Err(e) => log::debug!("{local}: forwarding a datagram to slot {to}: {e}"),
    }
}

/// `bytes` (from `from`, expected to carry IPv4 ID `ident`) wrapped as a forward to slot `to`.
fn envelope(
    registry: &Registry,
    to: u8,
    (from, ident): (SocketAddr, u16),
    bytes: &[u8],
) -> Option<Vec<u8>> {
    let mut out = vec![0u8; gsi::ENVELOPE_LEN + bytes.len()];
    let n = gsi::wrap(&mut out, to, registry.nonce(), from, ident, bytes)?;
    out.truncate(n);
    Some(out)
}

/// Where a forward to slot `to` goes: its forwarding socket, or the group's address (steered
/// by the forward's slot byte) if it has none.
fn forward_to(registry: &Registry, to: u8, local: SocketAddr) -> SocketAddr {
    registry
        .forward_port(to)
        .map_or(local, |p| SocketAddr::new(local.ip(), p))
}

/// Sends a forward that reached the wrong member on to slot `to` once more, its hop count up.
pub(super) fn reforward(
    socket: &socket2::Socket,
    registry: &Registry,
    to: u8,
    envelope: &[u8],
    local: SocketAddr,
) {
    let mut out = envelope.to_vec();
    if let Some(h) = out.get_mut(gsi::HOPS_AT) {
        *h = h.saturating_add(1);
    }
    if let Err(e) = socket.send_to(&out, &forward_to(registry, to, local).into()) {
        log::debug!("{local}: sending a forward on to slot {to}: {e}");
    }
}

/// A leaving member's last read before its socket closes: every datagram still queued on the
/// socket that belongs to another live process (the kernel steered it here before the group's
/// table changed), wrapped as a forward to its owner, for [`send_forwards`] once the socket is
/// closed. Bounded: at most `limit` reads.
pub(crate) fn drain(
    socket: &socket2::Socket,
    registry: &Registry,
    slot: u8,
    local: SocketAddr,
    limit: usize,
) -> Vec<Vec<u8>> {
    let mut batch = RecvBatch::new(BATCH, GRO_SLOT);
    let mut out = Vec::new();
    for _ in 0..limit {
        let n = match batch.recv(socket.as_raw_fd()) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for i in 0..n {
            for (from, bytes, ident) in batch.segments(i) {
                // This process's own packets die with its QPs; probes are for live members.
                match route(bytes, registry, slot, local, from) {
                    Fate::Forward(to) => {
                        out.extend(envelope(registry, to, (from, ident), bytes));
                    }
                    Fate::Reforward(_) => out.push(bytes.to_vec()),
                    Fate::Here | Fate::Unwrapped(..) | Fate::Drop => {}
                }
            }
        }
    }
    out
}

/// Sends forwards (each to the slot in its byte 1) to their targets' forwarding sockets from a
/// socket of its own; returns how many went.
pub(crate) fn send_forwards(local: SocketAddr, registry: &Registry, forwards: &[Vec<u8>]) -> usize {
    let any: SocketAddr = if local.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0))
    };
    let Ok(s) = crate::sys::bind_udp(any) else {
        return 0;
    };
    forwards
        .iter()
        .filter(|f| {
            let to = f.get(1).copied().unwrap_or(0);
            s.send_to(f, forward_to(registry, to, local)).is_ok()
        })
        .count()
}
