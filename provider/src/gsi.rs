//! Host-wide routes of QP1, the General Services QP. Every process on a device's address has
//! its own QP1 ([`ProtectionDomain::create_gsi_qp`](crate::ProtectionDomain::create_gsi_qp)),
//! but the network addresses management datagrams (MADs) to *the* QP1 of the address. One
//! process (the live one with the lowest slot; the role moves when it goes) receives them all
//! and forwards each to the process it is for, as the kernel's CM and MAD layers share one
//! QP1 among their clients:
//!
//! * a CM REQ or SIDR_REQ goes to the process that holds its ServiceID (bound or listening)
//!   ([`Context::gsi_listen`]; one process per ServiceID on the host, which makes rdma_cm's
//!   port space host-wide);
//! * every other CM message goes by the receiver's comm ID, whose first byte must be the
//!   receiver's [`Context::gsi_slot`];
//! * other classes: a response (method bit 7 set) by its TransactionID's first byte, the
//!   requester's slot; a request to the process registered for its class
//!   ([`Context::gsi_register_class`]).
//!
//! Whatever has no owner goes to the role holder's QP1. A route lasts as long as its
//! [`GsiRoute`] handle, and a dead process's routes go with it.

use crate::host::gsi::Taken;
use crate::{Context, Error, Result};

/// A host-wide route of QP1 traffic to this process, removed when dropped.
#[derive(Debug)]
pub struct GsiRoute {
    ctx: Context,
    kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Service(u64),
    Class(u8),
}

impl GsiRoute {
    /// The ServiceID routed here, for a [`Context::gsi_listen`] route.
    pub fn service_id(&self) -> Option<u64> {
        match self.kind {
            Kind::Service(s) => Some(s),
            Kind::Class(_) => None,
        }
    }

    /// The management class routed here, for a [`Context::gsi_register_class`] route.
    pub fn mgmt_class(&self) -> Option<u8> {
        match self.kind {
            Kind::Class(c) => Some(c),
            Kind::Service(_) => None,
        }
    }
}

impl Drop for GsiRoute {
    fn drop(&mut self) {
        // A route exists only on a device with a group (`gsi()` was Ok when it was made).
        let Ok((reg, slot)) = self.ctx.shared.gsi() else {
            return;
        };
        match self.kind {
            Kind::Service(s) => reg.unlisten_service(slot, s),
            Kind::Class(c) => reg.unregister_class(slot, c),
        }
    }
}

fn refused(what: String, t: Taken) -> Error {
    match t {
        Taken::By(pid) => {
            log::debug!("{what} is taken by process {pid} on this address");
            Error::Taken(format!("{what} is taken by process {pid} on this address"))
        }
        Taken::Full => {
            log::debug!("{what}: the address's GSI route table is full");
            Error::Busy("the address's GSI route table is full")
        }
    }
}

impl Context {
    /// This process's slot on the device's address: the first byte of the comm IDs and
    /// TransactionIDs of MADs it expects answers to, and bits 23:16 of its QP numbers (0 on
    /// an in-memory device, which no other process shares).
    pub fn gsi_slot(&self) -> u8 {
        self.shared.gsi().map_or(0, |(_, slot)| slot)
    }

    /// Routes CM REQ and SIDR_REQ MADs for `service_id` that reach the address's QP1 to this
    /// process's QP1 (the host-wide half of a CM listen, kernel `ib_cm_listen`).
    ///
    /// # Errors
    /// [`Error::Taken`] (EADDRINUSE) if a live process on the address listens on it already,
    /// [`Error::Busy`] if the table is full.
    pub fn gsi_listen(&self, service_id: u64) -> Result<GsiRoute> {
        let (reg, slot) = self.shared.gsi()?;
        reg.listen_service(slot, service_id)
            .map_err(|t| refused(format!("service ID {service_id:#018x}"), t))?;
        log::debug!(
            "{}: service ID {service_id:#018x} routed to slot {slot}",
            self.shared.local()
        );
        Ok(GsiRoute {
            ctx: self.clone(),
            kind: Kind::Service(service_id),
        })
    }

    /// As [`Context::gsi_listen`] for the first free ServiceID `base | port` with `port` in
    /// `ports`, searched from a random point (rdma_cm's port allocation for port 0). The route's
    /// [`GsiRoute::service_id`] tells which.
    ///
    /// # Errors
    /// [`Error::Busy`] if every port in the range is taken, [`Error::InvalidArgument`] if the
    /// range's ports would spill out of `base`'s low 16 bits.
    pub fn gsi_listen_any(
        &self,
        base: u64,
        ports: std::ops::RangeInclusive<u16>,
    ) -> Result<GsiRoute> {
        if base & 0xFFFF != 0 {
            return Err(Error::InvalidArgument(
                "a port-space base with its low 16 bits set",
            ));
        }
        let (reg, slot) = self.shared.gsi()?;
        let mut r = [0u8; 2];
        crate::mr::fill_random(&mut r)?;
        let port = reg
            .listen_any_service(slot, base, ports, u16::from_le_bytes(r))
            .map_err(|_| {
                log::debug!("{}: no free port under {base:#x}", self.shared.local());
                Error::Busy("every port of the range is taken on this address")
            })?;
        Ok(GsiRoute {
            ctx: self.clone(),
            kind: Kind::Service(base | u64::from(port)),
        })
    }

    /// Routes unsolicited MADs (requests) of management class `mgmt_class` that reach the
    /// address's QP1 to this process (umad's agent registration, `ib_register_mad_agent`).
    ///
    /// # Errors
    /// [`Error::Taken`] if a live process on the address holds the class,
    /// [`Error::InvalidArgument`] for the CM class (routed by service and comm IDs).
    pub fn gsi_register_class(&self, mgmt_class: u8) -> Result<GsiRoute> {
        if mgmt_class == ferroce_wire::mad::MGMT_CLASS_CM {
            return Err(Error::InvalidArgument(
                "the CM class is routed by service and comm IDs (gsi_listen)",
            ));
        }
        let (reg, slot) = self.shared.gsi()?;
        reg.register_class(slot, mgmt_class)
            .map_err(|t| refused(format!("management class {mgmt_class:#04x}"), t))?;
        Ok(GsiRoute {
            ctx: self.clone(),
            kind: Kind::Class(mgmt_class),
        })
    }
}
