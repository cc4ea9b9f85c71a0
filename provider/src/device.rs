//! Devices: one per local IP address. A device is what `ibv_get_device_list` lists and
//! `ibv_open_device` opens; here it is an address (and the port 4791) to bind.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use ferroce_transport::Mtu;

use crate::sys;
use crate::{Context, Error, Result};

/// A usable local address, and what ferroce knows about its interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// `ferroce0`, `ferroce1`, ... in the order of [`devices`].
    pub name: String,
    /// The device's address: the source of its packets and its GID.
    pub addr: IpAddr,
    /// The network interface carrying it.
    pub ifname: String,
    /// The interface MTU in bytes.
    pub ip_mtu: u32,
}

/// Every usable local address of the host, as devices: up interfaces, IPv4 and global IPv6
/// (link-local IPv6 needs a scope and is left out), loopback last.
///
/// # Errors
/// The `getifaddrs` failure.
pub fn devices() -> Result<Vec<Device>> {
    Ok(Interfaces::read()?.devices)
}

/// One reading of the host's interfaces (one `getifaddrs`, one MTU read per interface): what
/// [`devices`], [`Device::for_addr`] and [`device_list`] decide from. rdma_cm asks several
/// questions of the host per `rdma_bind_addr` ([`HostDevices`]), and a reading per question
/// made a bind take about 0.4 ms (ten netlink dumps), long enough for perftest's client to
/// send its REQ before the server's re-listen (perftest 4.5's rdma_cm mode, whose retry of the
/// REJ fails: docs/interop.md).
struct Interfaces {
    addrs: Vec<sys::IfAddr>,
    devices: Vec<Device>,
}

impl Interfaces {
    fn read() -> Result<Interfaces> {
        let addrs = sys::interface_addrs()?;
        let mut usable: Vec<&sys::IfAddr> = addrs
            .iter()
            .filter(|a| {
                a.up && !matches!(a.addr, IpAddr::V6(v) if (v.segments()[0] & 0xffc0) == 0xfe80)
            })
            .collect();
        usable.sort_by_key(|a| (a.loopback, a.addr.is_ipv6()));
        let mut devices: Vec<Device> = Vec::with_capacity(usable.len());
        for (i, a) in usable.into_iter().enumerate() {
            // An interface's MTU is read once: a second address on it takes the first's.
            let ip_mtu = devices
                .iter()
                .find(|d| d.ifname == a.ifname)
                .map_or_else(|| interface_mtu(&a.ifname), |d| d.ip_mtu);
            devices.push(Device {
                name: format!("ferroce{i}"),
                ip_mtu,
                addr: a.addr,
                ifname: a.ifname.clone(),
            });
        }
        Ok(Interfaces { addrs, devices })
    }

    /// [`Device::for_addr`] over this reading.
    fn device_for(&self, addr: IpAddr) -> Result<Device> {
        let hit = self.addrs.iter().find(|a| a.addr == addr).or_else(|| {
            self.addrs
                .iter()
                .find(|a| a.loopback && same_subnet(a.addr, addr, a.prefix))
        });
        let a = hit.ok_or_else(|| Error::NoDevice(addr.to_string()))?;
        let index = self.devices.iter().position(|d| d.addr == addr);
        let ip_mtu = self
            .devices
            .iter()
            .find(|d| d.ifname == a.ifname)
            .map_or_else(|| interface_mtu(&a.ifname), |d| d.ip_mtu);
        Ok(Device {
            name: index.map_or_else(|| format!("ferroce-{addr}"), |i| format!("ferroce{i}")),
            addr,
            ifname: a.ifname.clone(),
            ip_mtu,
        })
    }
}

/// The devices verbs lists (`ibv_get_device_list`), named `ferroce0`, `ferroce1`, ... in this
/// order: the addresses in `FERROCE_DEVICES` (comma-separated) if set, else every non-loopback
/// address of the host, else 127.0.0.1. An address of `FERROCE_DEVICES` that no interface
/// carries is listed anyway (opening it fails with [`Error::NoDevice`]) and logged.
pub fn device_list() -> Vec<Device> {
    HostDevices::read().listed
}

/// One reading of the host's devices: the interfaces and the list verbs shows
/// ([`device_list`]). One rdma_cm call (`rdma_bind_addr`, `rdma_resolve_addr`) asks several
/// questions of it (is the address listed, a device, the wildcard's loopback?) and reads the
/// host once for all of them.
pub(crate) struct HostDevices {
    interfaces: std::result::Result<Interfaces, String>,
    listed: Vec<Device>,
}

impl HostDevices {
    /// Reads the host's interfaces once.
    pub(crate) fn read() -> HostDevices {
        let mut host = HostDevices {
            interfaces: Interfaces::read().map_err(|e| e.to_string()),
            listed: Vec::new(),
        };
        host.listed = host.list();
        host
    }

    /// The devices verbs lists, as [`device_list`].
    pub(crate) fn listed(&self) -> &[Device] {
        &self.listed
    }

    /// Whether `addr` is a listed device's address.
    pub(crate) fn is_listed(&self, addr: IpAddr) -> bool {
        self.listed.iter().any(|d| d.addr == addr)
    }

    /// [`Device::for_addr`] over this reading ([`Error::NoDevice`] if the reading failed).
    pub(crate) fn for_addr(&self, addr: IpAddr) -> Result<Device> {
        match &self.interfaces {
            Ok(i) => i.device_for(addr),
            Err(e) => Err(Error::NoDevice(format!("{addr}: {e}"))),
        }
    }

    /// The devices verbs lists: `FERROCE_DEVICES`'s addresses, or else every non-loopback
    /// interface address (127.0.0.1 if there is none), named `ferroce0`, `ferroce1`… in order.
    fn list(&self) -> Vec<Device> {
        let addrs: Vec<IpAddr> = match std::env::var("FERROCE_DEVICES") {
            Ok(list) => list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .filter_map(|s| match s.parse() {
                    Ok(a) => Some(a),
                    Err(_) => {
                        log::warn!("FERROCE_DEVICES: {s:?} is not an IP address; skipped");
                        None
                    }
                })
                .collect(),
            Err(_) => {
                let mut v: Vec<IpAddr> = self
                    .interfaces
                    .as_ref()
                    .map(|i| i.devices.as_slice())
                    .unwrap_or_default()
                    .iter()
                    .map(|d| d.addr)
                    .filter(|a| !a.is_loopback())
                    .collect();
                if v.is_empty() {
                    v.push(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
                }
                v
            }
        };
        addrs
            .into_iter()
            .enumerate()
            .map(|(i, addr)| {
                let mut d = self.for_addr(addr).unwrap_or_else(|e| {
                    log::warn!("FERROCE_DEVICES: {addr}: {e}; listed, but it cannot be opened");
                    Device {
                        name: String::new(),
                        addr,
                        ifname: String::new(),
                        ip_mtu: 1500,
                    }
                });
                d.name = format!("ferroce{i}");
                d
            })
            .collect()
    }
}

fn interface_mtu(ifname: &str) -> u32 {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1500)
}

impl Device {
    /// The device for `addr`: an address of a local interface, or any address of the loopback
    /// subnet (127.x.y.z), which Linux lets a socket bind.
    ///
    /// # Errors
    /// [`Error::NoDevice`] if no interface carries that address or subnet.
    pub fn for_addr(addr: IpAddr) -> Result<Device> {
        Interfaces::read()?.device_for(addr)
    }

    /// Finds a device by name (`ferroce0`) or address (`127.0.0.2`, `10.77.0.1`).
    ///
    /// # Errors
    /// [`Error::NoDevice`] if nothing matches.
    pub fn find(name_or_addr: &str) -> Result<Device> {
        if let Ok(ip) = name_or_addr.parse::<IpAddr>() {
            return Device::for_addr(ip);
        }
        devices()?
            .into_iter()
            .find(|d| d.name == name_or_addr)
            .ok_or_else(|| Error::NoDevice(name_or_addr.to_owned()))
    }

    /// The port's active MTU: the largest IB MTU whose packets fit the interface MTU.
    pub fn active_mtu(&self) -> Mtu {
        Mtu::for_ip_mtu(self.ip_mtu).unwrap_or(Mtu::Mtu256)
    }

    /// The node GUID (`ibv_query_device`'s `node_guid`, host order): the OUI 02:00:5e, then
    /// 0xff and the last four bytes of the address, unique per address on a host.
    pub fn node_guid(&self) -> u64 {
        let o = match self.addr {
            IpAddr::V4(v) => v.octets(),
            IpAddr::V6(v) => {
                let s = v.octets();
                [s[12], s[13], s[14], s[15]]
            }
        };
        u64::from_be_bytes([0x02, 0x00, 0x5e, 0xff, o[0], o[1], o[2], o[3]])
    }

    /// The device's GID as verbs shows it: `::ffff:a.b.c.d` for IPv4 (rxe's GID index 1).
    pub fn gid(&self) -> Ipv6Addr {
        match self.addr {
            IpAddr::V4(v) => v.to_ipv6_mapped(),
            IpAddr::V6(v) => v,
        }
    }

    /// `ibv_open_device` on the RoCEv2 port 4791.
    ///
    /// # Errors
    /// [`Error::AddressInUse`] if another process or device has the address and port;
    /// [`Error::Io`] for other socket or thread failures.
    pub fn open(&self) -> Result<Context> {
        self.open_with(crate::OpenOptions::default())
    }

    /// Opens the device with options (another port, for tests; fault injection; a pcap file).
    ///
    /// # Errors
    /// As [`Device::open`].
    pub fn open_with(&self, opts: crate::OpenOptions) -> Result<Context> {
        Context::open(self.clone(), opts)
    }

    /// The socket address the device binds.
    pub fn socket_addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.addr, port)
    }

    /// The registry of this device's address and UDP `port`, and this process's slot in it (0
    /// if it is no member): this process's own (its descriptors hold its slot's locks), else
    /// opened for reading; `None` if no process uses the address.
    fn registry(
        &self,
        port: u16,
    ) -> crate::Result<Option<(std::sync::Arc<crate::host::group::Registry>, u8)>> {
        let local = self.socket_addr(port);
        if let Some(r) = crate::driver::member_registry(local) {
            return Ok(Some(r));
        }
        Ok(
            crate::host::group::Registry::open_existing(local)?
                .map(|r| (std::sync::Arc::new(r), 0)),
        )
    }

    /// The ServiceIDs processes on this device's address and UDP `port` (4791) hold: rdma_cm
    /// IDs bound or listening ([`GsiService::rdma_cm_port`]) and [`Context::gsi_listen`]
    /// routes, read from the address's registry without opening the device (what `rdma res
    /// show cm_id` lists on a kernel device). Empty if no process uses the device.
    ///
    /// # Errors
    /// [`Error::Io`] if the registry belongs to another user or cannot be read.
    ///
    /// [`Context::gsi_listen`]: crate::Context::gsi_listen
    pub fn gsi_services(&self, port: u16) -> crate::Result<Vec<GsiService>> {
        let Some((reg, mine)) = self.registry(port)? else {
            return Ok(Vec::new());
        };
        Ok(reg
            .services(mine)
            .into_iter()
            .map(|(service_id, pid)| GsiService { service_id, pid })
            .collect())
    }

    /// The QPs of every process using this device on `port` (4791), as each process last
    /// published them (every 200 ms while it runs), read from the address's registry without
    /// opening the device: what `rdma res show qp` lists for a kernel device, and for a QP that
    /// failed, its first error and why ([`crate::transport::QpError`]). Each process lists at
    /// most 31 QPs per shard (each shard publishes in its own slot; they are merged here), its
    /// failed ones first; [`ProcessQps::total`] says how many it has. Empty if no process uses
    /// the device.
    ///
    /// # Errors
    /// [`Error::Io`] if the registry belongs to another user or cannot be read.
    pub fn live_qps(&self, port: u16) -> crate::Result<Vec<ProcessQps>> {
        let Some((reg, mine)) = self.registry(port)? else {
            return Ok(Vec::new());
        };
        let tables = reg.qp_tables(mine).into_iter().map(|t| ProcessQps {
            pid: t.pid,
            slot: t.slot,
            total: t.total,
            qps: t
                .qps
                .into_iter()
                .map(|q| LiveQp {
                    qp_num: q.qpn,
                    qp_type: ferroce_transport::QpType::from_raw(u32::from(q.qp_type)),
                    qp_state: ferroce_transport::QpState::from_raw(u32::from(q.state)),
                    path_mtu: Mtu::from_raw(u32::from(q.path_mtu)),
                    dest_qp_num: q.dest_qp_num,
                    sq_psn: q.sq_psn,
                    rq_psn: q.rq_psn,
                    peer: q.peer,
                    error: q.error.map(|(status, wr_id, reason)| LiveQpError {
                        status: ferroce_transport::WcStatus::from_raw(u32::from(status)),
                        wr_id,
                        reason,
                    }),
                })
                .collect(),
        });
        // A process of several shards has a slot (and a table) per shard: one entry each.
        Ok(by_process(
            tables,
            |p| p.pid,
            |into, p| {
                into.slot = into.slot.min(p.slot);
                into.total += p.total;
                into.qps.extend(p.qps);
            },
        ))
    }

    /// The live counters of every process using this device on `port` (4791 unless a program
    /// chose another), read from their shared-memory pages without opening the device: what
    /// `/sys/class/infiniband/<dev>/ports/1/hw_counters/` shows for a kernel device, per
    /// process. Empty if no process uses the device.
    ///
    /// # Errors
    /// [`Error::Io`] if the pages belong to another user or cannot be read.
    pub fn live_counters(&self, port: u16) -> crate::Result<Vec<ProcessCounters>> {
        let Some((reg, mine)) = self.registry(port)? else {
            return Ok(Vec::new());
        };
        let names: Vec<&'static str> = ferroce_transport::Counters::default()
            .named()
            .into_iter()
            .chain(crate::RuntimeCounters::default().named())
            .map(|(n, _)| n)
            .collect();
        let pages = reg
            .pages(names.len(), mine)
            .into_iter()
            .map(|p| ProcessCounters {
                pid: p.pid,
                slot: p.slot,
                published: std::time::UNIX_EPOCH + std::time::Duration::from_nanos(p.published_ns),
                counters: names.iter().copied().zip(p.values).collect(),
            });
        // A process of several shards has a page per shard: their counters summed.
        Ok(by_process(
            pages,
            |p| p.pid,
            |into, p| {
                into.slot = into.slot.min(p.slot);
                into.published = into.published.max(p.published);
                for ((_, v), (_, w)) in into.counters.iter_mut().zip(p.counters) {
                    *v += w;
                }
            },
        ))
    }
}

/// `items` with those of one process (`pid`) merged into its first by `merge`, in order.
fn by_process<T>(
    items: impl Iterator<Item = T>,
    pid: impl Fn(&T) -> u32,
    merge: impl Fn(&mut T, T),
) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for item in items {
        match out.iter_mut().find(|o| pid(o) == pid(&item)) {
            Some(into) => merge(into, item),
            None => out.push(item),
        }
    }
    out
}

fn same_subnet(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix.min(32)))
            };
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix.min(128)))
            };
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses_map_to_lo() {
        let d = Device::for_addr("127.0.0.21".parse().unwrap()).unwrap();
        assert_eq!(d.ifname, "lo");
        assert_eq!(d.active_mtu(), Mtu::Mtu4096);
        assert_eq!(d.gid().to_string(), "::ffff:127.0.0.21");
        assert!(
            devices()
                .unwrap()
                .iter()
                .any(|d| d.addr == IpAddr::from([127, 0, 0, 1]))
        );
        assert!(matches!(
            Device::find("192.0.2.77"),
            Err(Error::NoDevice(_))
        ));
        assert!(Device::find("ferroce0").is_ok());
    }

    #[test]
    fn one_reading_answers_as_a_reading_per_question() {
        // The device list, and each device looked up by its address, agree with a fresh
        // reading for every question (the names, interfaces and MTUs of [`devices`]).
        let listed = devices().unwrap();
        assert!(!listed.is_empty());
        for (i, d) in listed.iter().enumerate() {
            assert_eq!(d.name, format!("ferroce{i}"));
            assert_eq!(&Device::for_addr(d.addr).unwrap(), d);
            assert_eq!(d.ip_mtu, interface_mtu(&d.ifname));
        }
        // Loopback last, and an address of the loopback subnet no interface carries is lo's,
        // unnamed in the list.
        assert!(listed.last().unwrap().addr.is_loopback());
        let other = Device::for_addr("127.0.0.77".parse().unwrap()).unwrap();
        assert_eq!(
            (other.name.as_str(), other.ifname.as_str()),
            ("ferroce-127.0.0.77", "lo")
        );
        for d in device_list() {
            let l = listed.iter().find(|l| l.addr == d.addr).unwrap();
            assert_eq!((&d.ifname, d.ip_mtu), (&l.ifname, l.ip_mtu));
        }
    }

    #[test]
    fn one_host_reading_answers_as_the_separate_questions() {
        // What rdma_cm asks of one reading during a bind (the list, whether an address is
        // listed, its device) is what the separate readings answer.
        let host = HostDevices::read();
        assert_eq!(host.listed(), device_list().as_slice());
        for d in devices().unwrap() {
            assert_eq!(
                host.for_addr(d.addr).unwrap(),
                Device::for_addr(d.addr).unwrap()
            );
            assert_eq!(
                host.is_listed(d.addr),
                device_list().iter().any(|l| l.addr == d.addr)
            );
        }
        let lo_other: IpAddr = "127.0.0.77".parse().unwrap();
        assert_eq!(
            host.for_addr(lo_other).unwrap(),
            Device::for_addr(lo_other).unwrap()
        );
        assert!(!host.is_listed(lo_other));
        // An address of no interface is no device, in either.
        let nowhere: IpAddr = "192.0.2.77".parse().unwrap();
        assert!(matches!(host.for_addr(nowhere), Err(Error::NoDevice(_))));
        assert!(Device::for_addr(nowhere).is_err());
    }

    #[test]
    fn mtu_rule_matches_rxe() {
        assert_eq!(Mtu::for_ip_mtu(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::for_ip_mtu(9000), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::for_ip_mtu(4200), Some(Mtu::Mtu4096));
    }
}

/// A ServiceID a process on a device's address holds ([`Device::gsi_services`]): CM REQs for
/// it are routed to that process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GsiService {
    /// The ServiceID (IBTA 12.7.3; rdma_cm's are `0x0000_0000_01PP_pppp`: port space, port).
    pub service_id: u64,
    /// The process holding it.
    pub pid: u32,
}

impl GsiService {
    /// The rdma_cm port space (`RDMA_PS_TCP` 0x0106, `RDMA_PS_UDP` 0x0111, ...) and port of an
    /// rdma_cm ServiceID (what `rdma_bind_addr` took), or `None` for another ServiceID.
    pub fn rdma_cm_port(&self) -> Option<(u16, u16)> {
        let sid = self.service_id;
        (sid >> 32 == 0 && (sid >> 24) & 0xff == 0x01).then_some(((sid >> 16) as u16, sid as u16))
    }
}

/// One process's counters on a device ([`Device::live_counters`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessCounters {
    /// The process.
    pub pid: u32,
    /// Its slot on the address (bits 23:16 of its QP numbers; of a device of several
    /// shards, the lowest of their slots, whose counters are summed here).
    pub slot: u8,
    /// When it last wrote them (it does so every 20 ms while it runs).
    pub published: std::time::SystemTime,
    /// The engine's counters (named as rxe's `hw_counters`), then the runtime's.
    pub counters: Vec<(&'static str, u64)>,
}

/// One process's QPs on a device ([`Device::live_qps`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessQps {
    /// The process.
    pub pid: u32,
    /// Its slot on the address (bits 23:16 of its QP numbers).
    pub slot: u8,
    /// How many QPs it has (QP1 aside); `qps` lists at most 31 of them per shard.
    pub total: u32,
    /// Its QPs, the failed ones first, then by QP number.
    pub qps: Vec<LiveQp>,
}

/// A QP as its process last published it: `ibv_query_qp`'s main attributes and, if it failed,
/// its first error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveQp {
    /// `qp_num`.
    pub qp_num: u32,
    /// `qp_type` (`None`: a value this build does not know).
    pub qp_type: Option<ferroce_transport::QpType>,
    /// `qp_state`.
    pub qp_state: Option<ferroce_transport::QpState>,
    /// `path_mtu`.
    pub path_mtu: Option<Mtu>,
    /// `dest_qp_num` (connected QPs).
    pub dest_qp_num: u32,
    /// `sq_psn`: the next PSN it sends.
    pub sq_psn: u32,
    /// `rq_psn`: the next PSN it expects.
    pub rq_psn: u32,
    /// The peer's address (connected QPs from RTR on).
    pub peer: Option<IpAddr>,
    /// The first error of its work, if any.
    pub error: Option<LiveQpError>,
}

/// A QP's first error as its process published it ([`crate::transport::QpError`] as text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveQpError {
    /// The failed completion's `status`.
    pub status: Option<ferroce_transport::WcStatus>,
    /// Its `wr_id`.
    pub wr_id: u64,
    /// Why, with the facts that decide it (at most 456 bytes).
    pub reason: String,
}

/// The character-device node middleware looks for before it uses a verbs device: UCX lists a
/// device only if `/dev/infiniband/<dev_name>` is a character device it may read and write
/// (`stat` + `access`; it never opens it). On a kernel device that is the uverbs command file;
/// ferroce has no kernel device, so its C ABI names every device's `dev_name` `ferroce` and
/// this node stands in for it: a character device with `/dev/null`'s numbers (1:3), mode 0666.
pub const UVERBS_NODE: &str = "/dev/infiniband/ferroce";

/// Creates [`UVERBS_NODE`] if it is missing (`ferroce devnode`; once per host, as root):
/// returns whether it had to.
///
/// # Errors
/// [`crate::Error::Io`] if the directory or node cannot be made (EPERM without root).
pub fn create_uverbs_node() -> crate::Result<bool> {
    use std::os::unix::fs::FileTypeExt;
    let path = std::path::Path::new(UVERBS_NODE);
    if let Ok(m) = std::fs::metadata(path) {
        if m.file_type().is_char_device() {
            return Ok(false);
        }
        return Err(crate::Error::Io(std::io::Error::other(format!(
            "{UVERBS_NODE} exists and is not a character device"
        ))));
    }
    let io = |what: &str, e: std::io::Error| {
        crate::Error::Io(std::io::Error::new(
            e.kind(),
            format!("{what}: {e} (creating {UVERBS_NODE} needs root, once per host)"),
        ))
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io("mkdir /dev/infiniband", e))?;
    }
    let c = std::ffi::CString::new(UVERBS_NODE).map_err(std::io::Error::other)?;
    // SAFETY: `c` is a valid NUL-terminated path; makedev and mknod take no other pointers.
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    if r != 0 {
        return Err(io("mknod", std::io::Error::last_os_error()));
    }
    // The umask may have narrowed the mode: UCX wants read and write for everyone who uses it.
    // SAFETY: as above, a valid path.
    if unsafe { libc::chmod(c.as_ptr(), 0o666) } != 0 {
        return Err(io("chmod", std::io::Error::last_os_error()));
    }
    Ok(true)
}
