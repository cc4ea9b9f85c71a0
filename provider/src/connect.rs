//! What two programs exchange to talk RDMA: a QP's address ([`QpEndpoint`], what
//! `ibv_rc_pingpong` sends: QPN, PSN, GID, MTU) and a region a peer may reach
//! ([`RemoteMemory`]: address, rkey, length), each with a fixed byte form to send over any
//! channel (TCP, a file, a pipe), and [`QueuePair::connect`], the bring-up towards a peer.

use std::net::{IpAddr, Ipv6Addr};

use ferroce_transport::{Mtu, RemoteAddr};

use crate::{Error, MemoryRegion, QueuePair, Result};

/// The address of a QP as its peer needs it (verbs programs exchange these out of band).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpEndpoint {
    /// `qp_num` (the peer's `dest_qp_num`).
    pub qp_num: u32,
    /// The first PSN this QP sends (the peer's `rq_psn`).
    pub psn: u32,
    /// The GID of the QP's port (an IPv4-mapped address for IPv4 devices).
    pub gid: Ipv6Addr,
    /// The largest path MTU this side can use (its port's `active_mtu`).
    pub mtu: Mtu,
}

impl QpEndpoint {
    /// Bytes of [`QpEndpoint::to_bytes`].
    pub const LEN: usize = 25;

    /// The fixed byte form: QPN and PSN (big-endian u32 each), the 16-byte GID, the MTU's verbs
    /// value (`IBV_MTU_*`).
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&self.qp_num.to_be_bytes());
        b[4..8].copy_from_slice(&self.psn.to_be_bytes());
        b[8..24].copy_from_slice(&self.gid.octets());
        b[24] = self.mtu as u8;
        b
    }

    /// Reads [`QpEndpoint::to_bytes`]'s form.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a short buffer, a QPN or PSN above 24 bits, or an
    /// MTU value that is not one of verbs' five.
    pub fn from_bytes(b: &[u8]) -> Result<QpEndpoint> {
        let b: &[u8; Self::LEN] = b
            .get(..Self::LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(Error::InvalidArgument("QP endpoint: too short"))?;
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let (qp_num, psn) = (u32_at(0), u32_at(4));
        if qp_num > 0xFF_FFFF || psn > 0xFF_FFFF {
            return Err(Error::InvalidArgument(
                "QP endpoint: QPN or PSN above 24 bits",
            ));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..24]);
        let mtu = Mtu::from_raw(u32::from(b[24]))
            .ok_or(Error::InvalidArgument("QP endpoint: not an IBV_MTU value"))?;
        Ok(QpEndpoint {
            qp_num,
            psn,
            gid: Ipv6Addr::from(gid),
            mtu,
        })
    }

    /// The IP address the GID stands for.
    pub fn addr(&self) -> IpAddr {
        match self.gid.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(self.gid),
        }
    }
}

/// A registered region as a peer's RDMA WRITE, READ or atomic names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteMemory {
    /// `remote_addr` of the region's first byte.
    pub addr: u64,
    /// `rkey`.
    pub rkey: u32,
    /// Its length in bytes.
    pub len: u64,
}

impl RemoteMemory {
    /// Bytes of [`RemoteMemory::to_bytes`].
    pub const LEN: usize = 20;

    /// The fixed byte form: address (u64), rkey (u32), length (u64), big-endian.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..20].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Reads [`RemoteMemory::to_bytes`]'s form.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a short buffer.
    pub fn from_bytes(b: &[u8]) -> Result<RemoteMemory> {
        let b: &[u8; Self::LEN] = b
            .get(..Self::LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(Error::InvalidArgument("remote memory: too short"))?;
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[0..8]);
        let mut l = [0u8; 8];
        l.copy_from_slice(&b[12..20]);
        Ok(RemoteMemory {
            addr: u64::from_be_bytes(a),
            rkey: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
            len: u64::from_be_bytes(l),
        })
    }

    /// The remote address `offset` bytes into the region, for a work request.
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            remote_addr: self.addr.wrapping_add(offset),
            rkey: self.rkey,
        }
    }
}

impl MemoryRegion {
    /// What a peer needs to reach this region ([`RemoteMemory`]).
    pub fn remote(&self) -> RemoteMemory {
        RemoteMemory {
            addr: self.addr(),
            rkey: self.rkey(),
            len: self.len() as u64,
        }
    }
}

impl QueuePair {
    /// This QP's [`QpEndpoint`], with `psn` as its first send PSN.
    pub fn endpoint(&self, psn: u32) -> QpEndpoint {
        let dev = self.context().device();
        QpEndpoint {
            qp_num: self.qp_num(),
            psn: psn & 0xFF_FFFF,
            gid: dev.gid(),
            mtu: dev.active_mtu(),
        }
    }

    /// RESET → INIT → RTR → RTS towards `remote`, sending from `local_psn` (the PSN given to
    /// [`QueuePair::endpoint`]) at the smaller of the two MTUs, with the values of
    /// [`QueuePair::connect_to`].
    ///
    /// # Errors
    /// [`Error::Modify`] if the device refuses an attribute.
    pub fn connect(&self, local_psn: u32, remote: &QpEndpoint) -> Result<()> {
        let local = self.context().device().active_mtu();
        let mtu = if (remote.mtu as u32) < (local as u32) {
            remote.mtu
        } else {
            local
        };
        self.connect_to(
            remote.addr(),
            remote.qp_num,
            mtu,
            local_psn & 0xFF_FFFF,
            remote.psn,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_bytes_round_trip_and_refuse_garbage() {
        let e = QpEndpoint {
            qp_num: 0x11,
            psn: 0x3b_6d7d,
            gid: "::ffff:10.77.0.12".parse().unwrap(),
            mtu: Mtu::Mtu1024,
        };
        let b = e.to_bytes();
        assert_eq!(
            b,
            [
                0, 0, 0, 0x11, 0, 0x3b, 0x6d, 0x7d, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10,
                77, 0, 12, 3
            ]
        );
        assert_eq!(QpEndpoint::from_bytes(&b).unwrap(), e);
        assert_eq!(e.addr(), IpAddr::from([10, 77, 0, 12]));
        assert!(QpEndpoint::from_bytes(&b[..24]).is_err());
        let mut bad = b;
        bad[24] = 9;
        assert!(QpEndpoint::from_bytes(&bad).is_err());
        bad = b;
        bad[0] = 1;
        assert!(QpEndpoint::from_bytes(&bad).is_err(), "QPN above 24 bits");
    }

    #[test]
    fn remote_memory_bytes_round_trip() {
        let r = RemoteMemory {
            addr: 0x7f00_1234_5000,
            rkey: 0xdead_beef,
            len: 4096,
        };
        assert_eq!(RemoteMemory::from_bytes(&r.to_bytes()).unwrap(), r);
        assert!(RemoteMemory::from_bytes(&[0; 19]).is_err());
        assert_eq!(r.at(8).remote_addr, 0x7f00_1234_5008);
    }
}
