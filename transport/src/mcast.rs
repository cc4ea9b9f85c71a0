//! Multicast groups of UD QPs (`ibv_attach_mcast`/`ibv_detach_mcast`). On RoCEv2 a group is
//! an IP multicast address (its MGID is the IPv6 address, or the IPv4-mapped IPv4 one), and a
//! packet sent to it carries destination QPN 0xFFFFFF; the endpoint delivers such a packet to
//! every QP attached to the group its IP destination names (IBTA §10.5.2.1, rxe's
//! `rxe_rcv_mcast_pkt`).

use std::collections::HashMap;
use std::net::IpAddr;

/// The destination QPN of multicast packets (IBTA's "permissive" QPN 0xFFFFFF).
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;
/// `max_mcast_grp`: groups one device can have QPs attached to (rxe's limit).
pub const MAX_MCAST_GRP: u32 = 8192;
/// `max_mcast_qp_attach`: QPs one group can have attached (rxe's limit).
pub const MAX_MCAST_QP_ATTACH: u32 = 56;
/// `max_total_mcast_qp_attach`: attachments over all groups.
pub const MAX_TOTAL_MCAST_QP_ATTACH: u32 = MAX_MCAST_GRP * MAX_MCAST_QP_ATTACH;

/// Why an attach or detach was refused (`ibv_attach_mcast`'s errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum McastError {
    /// Only UD QPs join groups (EINVAL, as the kernel's `ib_attach_mcast`).
    NotUd,
    /// The GID is not a multicast address (EINVAL).
    NotMulticast(IpAddr),
    /// The group already has [`MAX_MCAST_QP_ATTACH`] QPs, or the device
    /// [`MAX_MCAST_GRP`] groups (ENOMEM).
    Full,
    /// `ibv_detach_mcast` of a QP that is not attached to the group (EINVAL).
    NotAttached(IpAddr),
}

impl core::fmt::Display for McastError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            McastError::NotUd => f.write_str("only UD QPs attach to multicast groups"),
            McastError::NotMulticast(a) => write!(f, "{a} is not a multicast address"),
            McastError::Full => write!(
                f,
                "multicast limits reached ({MAX_MCAST_QP_ATTACH} QPs per group, \
                 {MAX_MCAST_GRP} groups)"
            ),
            McastError::NotAttached(a) => write!(f, "the QP is not attached to {a}"),
        }
    }
}

/// Whether `ip` is a multicast group address: 224.0.0.0/4, ff00::/8, or an IPv4-mapped
/// IPv6 address of the first (what the kernel's `rdma_is_multicast_addr` accepts).
pub fn is_group(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_multicast(),
        IpAddr::V6(v6) => {
            v6.is_multicast() || v6.to_ipv4_mapped().is_some_and(|v| v.is_multicast())
        }
    }
}

/// The group of an address as packets carry it: an IPv4-mapped MGID (`::ffff:a.b.c.d`, as
/// rdma_cm makes it) becomes the IPv4 address; anything else is itself.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The groups of one device and the QPs attached to each.
#[derive(Debug, Default)]
pub struct McastTable {
    groups: HashMap<IpAddr, Vec<u32>>,
}

impl McastTable {
    /// Attaches `qpn` to `group`; attaching a QP twice is not an error (the kernel's rule).
    /// Returns whether the group is new on the device (the caller joins it on the network).
    ///
    /// # Errors
    /// [`McastError::NotMulticast`] or [`McastError::Full`].
    pub fn attach(&mut self, qpn: u32, group: IpAddr) -> Result<bool, McastError> {
        if !is_group(group) {
            return Err(McastError::NotMulticast(group));
        }
        let group = canonical(group);
        let new = !self.groups.contains_key(&group);
        if new && self.groups.len() >= MAX_MCAST_GRP as usize {
            return Err(McastError::Full);
        }
        let qps = self.groups.entry(group).or_default();
        if !qps.contains(&qpn) {
            if qps.len() >= MAX_MCAST_QP_ATTACH as usize {
                return Err(McastError::Full);
            }
            qps.push(qpn);
        }
        Ok(new)
    }

    /// Detaches `qpn` from `group`. Returns whether the group is left with no QP (the caller
    /// leaves it on the network).
    ///
    /// # Errors
    /// [`McastError::NotAttached`] if it was not attached.
    pub fn detach(&mut self, qpn: u32, group: IpAddr) -> Result<bool, McastError> {
        let group = canonical(group);
        let qps = self
            .groups
            .get_mut(&group)
            .ok_or(McastError::NotAttached(group))?;
        let i = qps
            .iter()
            .position(|&q| q == qpn)
            .ok_or(McastError::NotAttached(group))?;
        qps.swap_remove(i);
        let empty = qps.is_empty();
        if empty {
            self.groups.remove(&group);
        }
        Ok(empty)
    }

    /// Detaches `qpn` from every group (its destruction); returns the groups left empty.
    pub fn detach_all(&mut self, qpn: u32) -> Vec<IpAddr> {
        let mut emptied = Vec::new();
        self.groups.retain(|g, qps| {
            qps.retain(|&q| q != qpn);
            if qps.is_empty() {
                emptied.push(*g);
            }
            !qps.is_empty()
        });
        emptied
    }

    /// The QPs attached to the group a packet was sent to (its IP destination).
    pub fn members(&self, dst: IpAddr) -> &[u32] {
        self.groups.get(&canonical(dst)).map_or(&[], Vec::as_slice)
    }

    /// Whether no QP is attached anywhere (the receive path's quick test).
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn groups_are_ip_multicast_addresses_in_either_form() {
        assert!(is_group(g("239.1.2.3")));
        assert!(is_group(g("::ffff:239.1.2.3")));
        assert!(is_group(g("ff0e::1")));
        assert!(!is_group(g("10.0.0.1")));
        assert!(!is_group(g("::ffff:10.0.0.1")));
        assert!(!is_group(g("fe80::1")));
    }

    #[test]
    fn attach_detach_follow_the_kernels_rules() {
        let mut t = McastTable::default();
        assert_eq!(t.attach(5, g("::ffff:239.1.2.3")), Ok(true));
        // The mapped and plain forms name one group; a second attach is not an error.
        assert_eq!(t.attach(5, g("239.1.2.3")), Ok(false));
        assert_eq!(t.attach(6, g("239.1.2.3")), Ok(false));
        assert_eq!(t.members(g("239.1.2.3")), &[5, 6]);
        assert_eq!(
            t.attach(5, g("10.0.0.1")),
            Err(McastError::NotMulticast(g("10.0.0.1")))
        );
        assert_eq!(t.detach(5, g("239.1.2.3")), Ok(false));
        assert_eq!(
            t.detach(5, g("239.1.2.3")),
            Err(McastError::NotAttached(g("239.1.2.3")))
        );
        assert_eq!(t.detach(6, g("::ffff:239.1.2.3")), Ok(true));
        assert!(t.is_empty());
        assert!(t.members(g("239.1.2.3")).is_empty());
    }

    #[test]
    fn a_group_holds_at_most_max_mcast_qp_attach_qps() {
        let mut t = McastTable::default();
        for q in 0..MAX_MCAST_QP_ATTACH {
            t.attach(q + 2, g("239.0.0.1")).unwrap();
        }
        assert_eq!(t.attach(1000, g("239.0.0.1")), Err(McastError::Full));
        // Another group still takes it.
        assert_eq!(t.attach(1000, g("239.0.0.2")), Ok(true));
        let emptied = t.detach_all(1000);
        assert_eq!(emptied, vec![g("239.0.0.2")]);
        assert_eq!(
            t.members(g("239.0.0.1")).len(),
            MAX_MCAST_QP_ATTACH as usize
        );
    }
}
