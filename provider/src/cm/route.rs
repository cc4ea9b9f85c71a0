//! Address and route resolution in user space (what the kernel's `rdma_resolve_addr` and
//! `rdma_resolve_route` do on RoCE): the source address a route to the destination takes, the
//! ferroce device on it, the path MTU from the interface's, the flow label of the two rdma_cm
//! ports; and rdma_cm's ephemeral ports.

use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, Ordering};

use ferroce_transport::cm::{Path, param};

use super::PortSpace;
use crate::device::HostDevices;
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
    let s = crate::sys::bind_udp(any)?;
    s.connect(SocketAddr::new(dst, 9))?;
    Ok(s.local_addr()?.ip())
}

static LISTED_ONLY: AtomicBool = AtomicBool::new(false);

/// Makes the connection manager see only the devices verbs lists ([`crate::device_list`],
/// i.e. `FERROCE_DEVICES`), as the kernel's rdma_cm sees only RDMA devices: binding another
/// address is ENODEV, a route whose source is not a listed device resolves to ADDR_ERROR
/// −ENODEV, and a destination on this host with no listed device on the route's source is
/// reached from the first listed device of its family (the kernel's loopback binding). The
/// C ABI turns this on (there `id->verbs` must be one of `ibv_get_device_list`'s); the Rust
/// API's default takes any local address as a device, as [`Device::find`] does.
pub fn set_listed_devices_only(on: bool) {
    LISTED_ONLY.store(on, Ordering::Relaxed);
}

pub(crate) fn listed_only() -> bool {
    LISTED_ONLY.load(Ordering::Relaxed)
}

/// The device the CM binds `addr` to: [`device_for`], restricted to listed devices in
/// [`set_listed_devices_only`]'s mode.
/// An address of no interface of the host is EADDRNOTAVAIL, as the kernel's
/// `rdma_bind_addr` answers.
pub(crate) fn bind_device(host: &HostDevices, addr: IpAddr) -> Result<Device> {
    if listed_only() && !host.is_listed(addr) {
        if host.for_addr(addr).is_err() {
            log::debug!("rdma_cm: {addr} is no address of this host: EADDRNOTAVAIL");
            return Err(Error::AddressNotAvailable(format!(
                "{addr} is no address of this host"
            )));
        }
        log::debug!("rdma_cm: {addr} is not a listed device (FERROCE_DEVICES): ENODEV");
        return Err(Error::NoDevice(format!("{addr} is not a listed device")));
    }
    device_for(host, addr)
}

/// Whether rdma_cm takes `ip` for "any address" (the kernel's `cma_any_addr`): the unspecified
/// address, and a loopback address (127.0.0.0/8, ::1) no device is on — the kernel binds one to
/// no device and listens on it as on the wildcard of its family (libfabric's verbs provider
/// binds `localhost` so). A loopback address that is a ferroce device (`FERROCE_DEVICES=
/// 127.0.0.1`, one host's tests) stays that device.
pub(crate) fn is_any(host: &HostDevices, ip: IpAddr) -> bool {
    if ip.is_unspecified() {
        return true;
    }
    if !ip.is_loopback() {
        return false;
    }
    let device = host.is_listed(ip) || (!listed_only() && host.for_addr(ip).is_ok());
    !device
}

/// The source address `rdma_resolve_addr` picks for `dst` when the ID has none.
pub(crate) fn pick_source(host: &HostDevices, dst: IpAddr) -> Result<IpAddr> {
    let s = source_for(dst)?;
    let dst_local = device_for(host, dst).is_ok();
    let listed = |a: IpAddr| host.is_listed(a);
    if !listed_only() {
        // The route's source; for a destination on this host without a device on that
        // source (127.0.0.1 for 127.x.y.z), the destination's own device, as the kernel
        // maps loopback to the device owning the address.
        let use_dst = (device_for(host, s).is_err() || !listed(s))
            && dst_local
            && (listed(dst) || !listed(s));
        return Ok(if use_dst { dst } else { s });
    }
    if listed(s) {
        return Ok(s);
    }
    if listed(dst) {
        return Ok(dst);
    }
    if dst_local || dst.is_loopback() {
        if let Some(d) = host
            .listed()
            .iter()
            .find(|d| d.addr.is_ipv4() == dst.is_ipv4())
        {
            return Ok(d.addr);
        }
    }
    log::debug!("rdma_cm: the route to {dst} leaves from {s}, which is no listed device");
    Err(Error::NoDevice(format!("on the route to {dst} (from {s})")))
}

/// The device on `addr` (a listed device, else any local address's): ENODEV (rdma_cm's "no
/// RDMA device for the address") if none.
pub(crate) fn device_for(host: &HostDevices, addr: IpAddr) -> Result<Device> {
    if let Some(d) = host.listed().iter().find(|d| d.addr == addr) {
        return Ok(d.clone());
    }
    host.for_addr(addr).map_err(|e| {
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
