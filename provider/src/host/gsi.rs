//! The host-wide GSI routing point. Every process of an address has its own QP1, but the
//! network sends every management datagram to DestQP 1, which the group's steering program
//! hands to the *role holder* (the live member with the lowest slot, see `group`). The role
//! holder's receive path reads each QP1 datagram's MAD and sends it on to the process it is
//! for, as the kernel's CM and MAD layers demultiplex one QP1 among their clients:
//!
//! * CM (class 0x07) REQ and SIDR_REQ by their ServiceID, through the registry's table of
//!   listened service IDs (host-wide, so a service ID, and the rdma_cm port in it, has one
//!   owner on the host);
//! * every other CM message by the comm ID the receiver chose (REP, RTU, REJ, MRA, DREQ, DREP,
//!   LAP, APR: Remote Comm ID, MAD byte 28; SIDR_REP: Request ID, MAD byte 24), whose first
//!   byte is the owner's slot (ferroce's CM numbers its comm IDs so);
//! * other classes: responses (method bit 7) by the TransactionID's first byte, the requester's
//!   slot (as the kernel's MAD layer routes responses by the high TID bits it put in requests);
//!   requests by the registry's class table.
//!
//! Anything without an owner stays with the role holder (its QP1 answers it, as the kernel's
//! CM answers a REQ nobody listens for). The forward is one datagram to the group's address
//! that the steering program hands to the target's socket by its byte 1 (opcode 0xFE, another
//! code ferroce never sends), carrying the group's secret and the original source, so the
//! target receives the MAD as if straight from the network. Only management datagrams take
//! this hop on the way; data packets only while the group's steering table changes (a packet
//! the kernel handed another member, or one still queued on a leaving member's socket). A
//! forward goes to its target's own forwarding socket (the address and a port of its own,
//! recorded in its slot), outside the group, so a table that is changing cannot misdirect it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::Ordering;

use ferroce_wire::mad::{METHOD_RESPONSE, MGMT_CLASS_CM, cm_attr};
use ferroce_wire::{BthPacket, MadPacket, deth};

use super::group::{Registry, SLOTS_END};

/// BTH opcode byte of a forwarded MAD (a manufacturer-specific code ferroce never sends).
pub(crate) const FORWARD_OPCODE: u8 = 0xFE;
/// Bytes of the forward's envelope before the original datagram.
pub(crate) const ENVELOPE_LEN: usize = 32;
/// The envelope's byte counting how often a forward was sent on again (a forward that reached
/// another member goes on to its target, at most [`MAX_HOPS`] times, so none circles for good).
pub(crate) const HOPS_AT: usize = 13;
/// Sends of one forward on at most.
pub(crate) const MAX_HOPS: u8 = 4;

/// Service-ID table: entries of (ServiceID u64, owner slot u32 with 0 = free, pad).
const SERVICES_AT: usize = SLOTS_END;
const SERVICES: usize = 512;
const SERVICE_LEN: usize = 16;
/// Class table: one u32 per management class, its owner slot (0 = none).
const CLASSES_AT: usize = SERVICES_AT + SERVICES * SERVICE_LEN;
/// Where the registry's tables end: its file's length.
pub(crate) const TABLES_END: usize = CLASSES_AT + 256 * 4;

/// Where a QP1 datagram goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// To this process's own engine (its QP1, or the engine's drop of a stray packet).
    Local,
    /// To the process in this slot.
    Slot(u8),
}

/// Who owns what on the GSI: the registry, or a test's table.
pub(crate) trait Owners {
    /// The slot listening on `service_id`, if any.
    fn service_owner(&self, service_id: u64) -> Option<u8>;
    /// The slot registered for unsolicited MADs of `class`, if any.
    fn class_owner(&self, class: u8) -> Option<u8>;
}

/// Whether a datagram is for QP1 (the only ones the routing point looks at).
pub(crate) fn is_gsi(bytes: &[u8]) -> bool {
    BthPacket::new_checked(bytes).is_ok_and(|b| b.dest_qp() == 1)
}

/// The slot a QP1 datagram is for (see the module docs); `Local` when nobody owns it or it is
/// too short to tell (the engine drops what is malformed).
pub(crate) fn route(bytes: &[u8], owners: &dyn Owners) -> Route {
    let at = ferroce_wire::bth::HEADER_LEN + deth::HEADER_LEN;
    let Some(mad) = bytes.get(at..) else {
        return Route::Local;
    };
    let Ok(hdr) = MadPacket::new_checked(mad) else {
        return Route::Local;
    };
    let byte = |i: usize| mad.get(i).copied();
    let u64_at = |i: usize| {
        mad.get(i..i + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
    };
    let slot = if hdr.mgmt_class() == MGMT_CLASS_CM {
        match hdr.attribute_id() {
            cm_attr::REQ | cm_attr::SIDR_REQ => {
                u64_at(32).and_then(|sid| owners.service_owner(sid))
            }
            cm_attr::SIDR_REP => byte(24),
            cm_attr::REP
            | cm_attr::RTU
            | cm_attr::REJ
            | cm_attr::MRA
            | cm_attr::DREQ
            | cm_attr::DREP
            | cm_attr::LAP
            | cm_attr::APR => byte(28),
            _ => None,
        }
    } else if hdr.method() & METHOD_RESPONSE != 0 {
        byte(8)
    } else {
        owners.class_owner(hdr.mgmt_class())
    };
    match slot {
        Some(s) if s != 0 => Route::Slot(s),
        _ => Route::Local,
    }
}

/// Writes the forward of `packet` (received from `from`, expected to carry IPv4 ID `ident`:
/// its index in a coalesced train) to `slot` into `out`; returns its length, or `None` if
/// `out` is too small.
pub(crate) fn wrap(
    out: &mut [u8],
    slot: u8,
    nonce: u64,
    from: SocketAddr,
    ident: u16,
    packet: &[u8],
) -> Option<usize> {
    let len = ENVELOPE_LEN + packet.len();
    let out = out.get_mut(..len)?;
    out[..ENVELOPE_LEN].fill(0);
    out[0] = FORWARD_OPCODE;
    out[1] = slot;
    out[2..4].copy_from_slice(&ident.to_be_bytes());
    out[4..12].copy_from_slice(&nonce.to_le_bytes());
    out[14..16].copy_from_slice(&from.port().to_be_bytes());
    match from.ip() {
        IpAddr::V4(a) => {
            out[12] = 4;
            out[16..20].copy_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            out[12] = 6;
            out[16..32].copy_from_slice(&a.octets());
        }
    }
    out[ENVELOPE_LEN..].copy_from_slice(packet);
    Some(len)
}

/// A forward read by [`unwrap`]: (target slot, original source, the IPv4 ID expected of the
/// original, original datagram).
pub(crate) type Unwrapped<'a> = (u8, SocketAddr, u16, &'a [u8]);

/// Reads a forward, or says why it is refused.
pub(crate) fn unwrap(bytes: &[u8], nonce: u64) -> Result<Unwrapped<'_>, &'static str> {
    if bytes.len() < ENVELOPE_LEN || bytes[0] != FORWARD_OPCODE {
        return Err("not a forwarded MAD");
    }
    let theirs = u64::from_le_bytes(bytes[4..12].try_into().map_err(|_| "short envelope")?);
    if theirs != nonce {
        return Err("a forwarded MAD without the group's secret");
    }
    let port = u16::from_be_bytes([bytes[14], bytes[15]]);
    let ip = match bytes[12] {
        4 => IpAddr::V4(Ipv4Addr::new(bytes[16], bytes[17], bytes[18], bytes[19])),
        6 => {
            let o: [u8; 16] = bytes[16..32].try_into().map_err(|_| "short envelope")?;
            IpAddr::V6(Ipv6Addr::from(o))
        }
        _ => return Err("a forwarded MAD with an unknown address family"),
    };
    let ident = u16::from_be_bytes([bytes[2], bytes[3]]);
    Ok((
        bytes[1],
        SocketAddr::new(ip, port),
        ident,
        &bytes[ENVELOPE_LEN..],
    ))
}

/// Why a GSI registration was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// A live process (this pid) holds it.
    By(u32),
    /// The table is full.
    Full,
}

impl Registry {
    fn service_entry(&self, i: usize) -> (u64, u32) {
        let at = SERVICES_AT + i * SERVICE_LEN;
        // Owner, then ID, then owner again: an entry rewritten meanwhile reads as free.
        let owner = self.word32(at + 8).load(Ordering::Acquire);
        if owner == 0 {
            return (0, 0);
        }
        let sid = self.word64(at).load(Ordering::Acquire);
        if self.word32(at + 8).load(Ordering::Acquire) != owner {
            return (0, 0);
        }
        (sid, owner)
    }

    /// Routes REQ/SIDR_REQ for `service_id` to `slot`, host-wide and exclusive (a CM listen).
    pub(crate) fn listen_service(&self, slot: u8, service_id: u64) -> Result<(), Taken> {
        let _g = self.claim_lock();
        let mut free = None;
        for i in 0..SERVICES {
            let (sid, owner) = self.service_entry(i);
            let owner_live = owner != 0 && self.is_live(owner as u8, slot);
            if owner_live && sid == service_id {
                return Err(Taken::By(self.pid_of(owner as u8)));
            }
            if !owner_live && free.is_none() {
                free = Some(i);
            }
        }
        let i = free.ok_or(Taken::Full)?;
        let at = SERVICES_AT + i * SERVICE_LEN;
        self.word32(at + 8).store(0, Ordering::Release);
        self.word64(at).store(service_id, Ordering::Release);
        self.word32(at + 8)
            .store(u32::from(slot), Ordering::Release);
        Ok(())
    }

    /// Takes a free service ID `base | port` for a port in `ports`, starting at the range's
    /// `start mod len`-th port (`start` random, as the kernel's port allocation) and walking
    /// up; returns the port.
    pub(crate) fn listen_any_service(
        &self,
        slot: u8,
        base: u64,
        ports: std::ops::RangeInclusive<u16>,
        start: u16,
    ) -> Result<u16, Taken> {
        let (lo, hi) = (u32::from(*ports.start()), u32::from(*ports.end()));
        if lo > hi {
            return Err(Taken::Full);
        }
        let n = hi - lo + 1;
        // Spread over the whole range (a clamp sent half of all starts to its first port).
        let first = u32::from(start) % n;
        for k in 0..n {
            let port = (lo + (first + k) % n) as u16;
            match self.listen_service(slot, base | u64::from(port)) {
                Ok(()) => return Ok(port),
                Err(Taken::By(_)) => continue,
                Err(Taken::Full) => return Err(Taken::Full),
            }
        }
        Err(Taken::Full)
    }

    /// Every ServiceID a live process holds, with that process's pid (`mine` is live).
    pub(crate) fn services(&self, mine: u8) -> Vec<(u64, u32)> {
        (0..SERVICES)
            .filter_map(|i| {
                let (sid, owner) = self.service_entry(i);
                let slot = owner as u8;
                (owner != 0 && self.is_live(slot, mine)).then(|| (sid, self.pid_of(slot)))
            })
            .collect()
    }

    /// Gives `service_id` back, if `slot` holds it.
    pub(crate) fn unlisten_service(&self, slot: u8, service_id: u64) {
        let _g = self.claim_lock();
        for i in 0..SERVICES {
            let (sid, owner) = self.service_entry(i);
            if owner == u32::from(slot) && sid == service_id {
                self.word32(SERVICES_AT + i * SERVICE_LEN + 8)
                    .store(0, Ordering::Release);
            }
        }
    }

    /// Routes unsolicited MADs of `class` to `slot`, host-wide and exclusive.
    pub(crate) fn register_class(&self, slot: u8, class: u8) -> Result<(), Taken> {
        let _g = self.claim_lock();
        let w = self.word32(CLASSES_AT + 4 * usize::from(class));
        let owner = w.load(Ordering::Acquire);
        if owner != 0 && self.is_live(owner as u8, slot) {
            return Err(Taken::By(self.pid_of(owner as u8)));
        }
        w.store(u32::from(slot), Ordering::Release);
        Ok(())
    }

    /// Gives `class` back, if `slot` holds it.
    pub(crate) fn unregister_class(&self, slot: u8, class: u8) {
        let _g = self.claim_lock();
        let w = self.word32(CLASSES_AT + 4 * usize::from(class));
        let _ = w.compare_exchange(u32::from(slot), 0, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Drops every route `slot` holds (its owner is gone). The caller holds the claim lock.
    pub(super) fn clear_routes(&self, slot: u8) {
        let s = u32::from(slot);
        for i in 0..SERVICES {
            let w = self.word32(SERVICES_AT + i * SERVICE_LEN + 8);
            let _ = w.compare_exchange(s, 0, Ordering::AcqRel, Ordering::Acquire);
        }
        for c in 0..256 {
            let w = self.word32(CLASSES_AT + 4 * c);
            let _ = w.compare_exchange(s, 0, Ordering::AcqRel, Ordering::Acquire);
        }
    }
}

impl Owners for Registry {
    fn service_owner(&self, service_id: u64) -> Option<u8> {
        (0..SERVICES).find_map(|i| {
            let (sid, owner) = self.service_entry(i);
            (owner != 0 && sid == service_id).then_some(owner as u8)
        })
    }

    fn class_owner(&self, class: u8) -> Option<u8> {
        let owner = self
            .word32(CLASSES_AT + 4 * usize::from(class))
            .load(Ordering::Acquire);
        (owner != 0).then_some(owner as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[derive(Default)]
    struct Table {
        services: HashMap<u64, u8>,
        classes: HashMap<u8, u8>,
    }

    impl Owners for Table {
        fn service_owner(&self, service_id: u64) -> Option<u8> {
            self.services.get(&service_id).copied()
        }
        fn class_owner(&self, class: u8) -> Option<u8> {
            self.classes.get(&class).copied()
        }
    }

    /// A UD SEND to QP1 carrying a 256-byte MAD whose first bytes are `mad`.
    fn gsi_packet(mad: &[(usize, &[u8])]) -> Vec<u8> {
        let mut p = vec![0u8; 12 + 8 + 256 + 4];
        p[0] = 0x64;
        p[7] = 1;
        p[12..16].copy_from_slice(&ferroce_wire::GSI_QKEY.to_be_bytes());
        p[19] = 1;
        for (off, b) in mad {
            p[20 + off..20 + off + b.len()].copy_from_slice(b);
        }
        p
    }

    fn cm(attr: u16, fields: &[(usize, &[u8])]) -> Vec<u8> {
        let a = attr.to_be_bytes();
        let mut all: Vec<(usize, &[u8])> = vec![(0, &[1, MGMT_CLASS_CM, 2, 3]), (16, &a)];
        all.extend_from_slice(fields);
        gsi_packet(&all)
    }

    #[test]
    fn cm_requests_go_by_service_id_and_the_rest_by_comm_id() {
        let mut t = Table::default();
        t.services.insert(0x0106_1C06, 7);
        let sid = 0x0106_1C06u64.to_be_bytes();
        assert!(is_gsi(&cm(cm_attr::REQ, &[])));
        assert_eq!(route(&cm(cm_attr::REQ, &[(32, &sid)]), &t), Route::Slot(7));
        assert_eq!(
            route(&cm(cm_attr::SIDR_REQ, &[(32, &sid)]), &t),
            Route::Slot(7)
        );
        // Nobody listens: the role holder answers (REJ "no listener", later).
        let other = 0x0106_1C07u64.to_be_bytes();
        assert_eq!(route(&cm(cm_attr::REQ, &[(32, &other)]), &t), Route::Local);
        // Replies by the receiver's comm ID: its first byte is the slot.
        for attr in [
            cm_attr::REP,
            cm_attr::RTU,
            cm_attr::REJ,
            cm_attr::MRA,
            cm_attr::DREQ,
            cm_attr::DREP,
        ] {
            let p = cm(attr, &[(24, &[9, 9, 9, 9]), (28, &[3, 0x23, 0x75, 0xCE])]);
            assert_eq!(route(&p, &t), Route::Slot(3), "attr {attr:#x}");
        }
        let p = cm(cm_attr::SIDR_REP, &[(24, &[5, 1, 2, 3])]);
        assert_eq!(route(&p, &t), Route::Slot(5));
        // Slot 0 is nobody's: the role holder.
        let p = cm(cm_attr::RTU, &[(28, &[0, 1, 2, 3])]);
        assert_eq!(route(&p, &t), Route::Local);
    }

    #[test]
    fn other_classes_go_by_tid_or_class_registration() {
        let mut t = Table::default();
        t.classes.insert(0x04, 9);
        let get = gsi_packet(&[(0, &[1, 0x04, 1, 0x01])]);
        assert_eq!(route(&get, &t), Route::Slot(9));
        let unknown = gsi_packet(&[(0, &[1, 0x05, 1, 0x01])]);
        assert_eq!(route(&unknown, &t), Route::Local);
        let resp = gsi_packet(&[(0, &[1, 0x05, 1, 0x81]), (8, &[12, 0, 0, 0, 0, 0, 0, 1])]);
        assert_eq!(route(&resp, &t), Route::Slot(12));
    }

    #[test]
    fn short_or_foreign_datagrams_stay_local() {
        let t = Table::default();
        assert_eq!(route(&[0x64, 0, 0, 0, 0, 0, 0, 1], &t), Route::Local);
        let mut p = cm(cm_attr::RTU, &[(28, &[3, 0, 0, 0])]);
        p.truncate(20 + 20);
        assert_eq!(route(&p, &t), Route::Local);
        assert!(!is_gsi(&[0x04, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0]));
        assert!(!is_gsi(&[0x64, 0]));
    }

    #[test]
    fn envelope_round_trips_both_families_and_checks_the_secret() {
        let pkt = [0x64u8, 1, 2, 3];
        for from in ["10.1.2.3:4791", "[fe80::1:2]:49152"] {
            let from: SocketAddr = from.parse().unwrap();
            let mut out = [0u8; 64];
            let n = wrap(&mut out, 4, 0xABCD, from, 9, &pkt).unwrap();
            assert_eq!(n, ENVELOPE_LEN + pkt.len());
            assert_eq!(unwrap(&out[..n], 0xABCD), Ok((4, from, 9, &pkt[..])));
            assert!(
                unwrap(&out[..n], 0xABCE).is_err(),
                "a wrong secret is refused"
            );
            assert!(unwrap(&out[..ENVELOPE_LEN - 1], 0xABCD).is_err());
        }
        let mut small = [0u8; 8];
        assert_eq!(
            wrap(&mut small, 1, 0, "1.2.3.4:1".parse().unwrap(), 0, &pkt),
            None
        );
    }

    #[test]
    fn service_ids_have_one_owner_and_port_allocation_walks_the_range() {
        let local: SocketAddr = format!("127.250.0.1:{}", 20000 + std::process::id() % 20000)
            .parse()
            .unwrap();
        let reg = Registry::open(local).unwrap();
        let slot = reg.claim().unwrap().unwrap();
        let pid = std::process::id();
        assert_eq!(reg.listen_service(slot, 0x42), Ok(()));
        assert_eq!(reg.listen_service(slot, 0x42), Err(Taken::By(pid)));
        assert_eq!(reg.service_owner(0x42), Some(slot));
        reg.unlisten_service(slot, 0x42);
        assert_eq!(reg.service_owner(0x42), None);
        assert_eq!(reg.listen_service(slot, 0x42), Ok(()));
        let base = 0x0106_0000;
        let ports: Vec<_> = (0..3)
            .map(|_| reg.listen_any_service(slot, base, 5000..=5002, 1))
            .collect();
        assert_eq!(ports, [Ok(5001), Ok(5002), Ok(5000)]);
        assert_eq!(
            reg.listen_any_service(slot, base, 5000..=5002, 1),
            Err(Taken::Full)
        );
        // A start beyond the range wraps into it (a clamp would pile such starts on the ends).
        assert_eq!(
            reg.listen_any_service(slot, base, 7000..=7002, 65534),
            Ok(7000 + 65534 % 3)
        );
        assert_eq!(reg.register_class(slot, 4), Ok(()));
        assert_eq!(reg.class_owner(4), Some(slot));
        reg.unregister_class(slot, 4);
        assert_eq!(reg.class_owner(4), None);
        // A slot's next owner starts with none of its routes.
        let _g = reg.claim_lock();
        reg.clear_routes(slot);
        drop(_g);
        assert_eq!(reg.service_owner(0x42), None);
        reg.release(slot);
    }
}
