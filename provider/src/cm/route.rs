//! Address and route resolution in user space (what the kernel's `rdma_resolve_addr` and
//! `rdma_resolve_route` do on RoCE): the source address a route to the destination takes, the
//! ferroce device on it, the path MTU from the interface's, the flow label of the two rdma_cm
//! ports; and rdma_cm's ephemeral ports.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::ops::RangeInclusive;

use ferroce_transport::cm::{Path, param};

use super::PortSpace;
use crate::{Device, Error, Result};

/// The ports rdma_cm hands out for port 0 (`net.ipv4.ip_local_port_range`'s default).
pub const PORT_RANGE: RangeInclusive<u16> = 32768..=60999;

/// The port space and port of an rdma_cm ServiceID.
pub fn service_port(service_id: u64) -> Option<(PortSpace, u16)> {
    let (ps, port) = ferroce_wire::cm::service_port(service_id)?;
    Some((PortSpace::from_raw(u32::from(ps))?, port))
}

/// The source address the host's routing picks for `dst` (a connected UDP socket's local
/// address: the kernel's own route lookup, no packet sent).
pub(crate) fn source_for(dst: IpAddr) -> Result<IpAddr> {
    let any: SocketAddr = if dst.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(any)?;
    s.connect(SocketAddr::new(dst, 9))?;
    Ok(s.local_addr()?.ip())
}

/// Whether `addr` is one of the devices verbs lists ([`crate::device_list`]).
pub(crate) fn listed(addr: IpAddr) -> bool {
    crate::device_list().iter().any(|d| d.addr == addr)
}

/// The device on `addr` (a listed device, else any local address's): ENODEV (rdma_cm's "no
/// RDMA device for the address") if none.
pub(crate) fn device_for(addr: IpAddr) -> Result<Device> {
    if let Some(d) = crate::device_list().into_iter().find(|d| d.addr == addr) {
        return Ok(d);
    }
    Device::for_addr(addr).map_err(|e| {
        log::debug!("rdma_cm: no ferroce device on {addr}: {e}");
        Error::NoDevice(format!("for {addr}"))
    })
}

/// A random port of [`PORT_RANGE`].
pub(crate) fn random_port() -> u16 {
    let mut b = [0u8; 2];
    if crate::mr::fill_random(&mut b).is_err() {
        b = (std::process::id() as u16).to_le_bytes();
    }
    let span = u32::from(PORT_RANGE.end() - PORT_RANGE.start()) + 1;
    PORT_RANGE.start() + (u32::from(u16::from_le_bytes(b)) % span) as u16
}

/// The route of a connection from `src` to `dst` on `device` (rdma_cm's RoCE path record:
/// MTU from the interface, hop limit 64, the TOS, the ports' flow label).
pub(crate) fn path(device: &Device, src: SocketAddr, dst: SocketAddr, tos: u8) -> Path {
    Path {
        local: src.ip(),
        remote: dst.ip(),
        mtu: device.active_mtu(),
        hop_limit: 64,
        traffic_class: tos,
        flow_label: param::flow_label(src.port(), dst.port()),
    }
}
