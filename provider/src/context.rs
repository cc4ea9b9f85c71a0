//! The device context (`ibv_context`), protection domains (`ibv_pd`), memory regions
//! (`ibv_mr`) and address handles (`ibv_ah`).

use std::net::Ipv6Addr;
use std::sync::Arc;
use std::time::Duration;

use ferroce_transport::{
    AccessFlags, AhAttr, CongestionConfig, EndpointConfig, ModifyLimits, Mtu, Sge,
};

use crate::cq::{CompletionChannel, CompletionQueue};
use crate::driver::{Runtime, RuntimeConfig, RuntimeCounters, Shared};
use crate::events::AsyncEventRecord;
use crate::events::{EventQueue, Owned};
use crate::faults::FaultConfig;
use crate::mr::MrInner;
use crate::{Device, Error, Result};

/// Limits ferroce advertises (`ibv_query_device`), rxe's where rxe has them.
pub mod limits {
    /// `max_qp`.
    pub const MAX_QP: u32 = 1 << 16;
    /// `max_qp_wr`.
    pub const MAX_QP_WR: u32 = 1 << 14;
    /// `max_sge`.
    pub const MAX_SGE: u32 = 32;
    /// `max_cqe`.
    pub const MAX_CQE: u32 = 4_194_303;
    /// `max_mr_size`.
    pub const MAX_MR_SIZE: u64 = 1 << 40;
    /// `max_qp_rd_atom` and `max_qp_init_rd_atom`.
    pub const MAX_RD_ATOM: u32 = 128;
    /// `max_inline_data`.
    pub const MAX_INLINE: u32 = 400;
    /// `max_srq_wr`.
    pub const MAX_SRQ_WR: u32 = 1 << 14;
}

/// `enum ibv_advise_mr_advice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MrAdvice {
    /// `IBV_ADVICE_MR_ADVICE_PREFETCH`: fault the pages in for reading.
    Prefetch = 0,
    /// `IBV_ADVICE_MR_ADVICE_PREFETCH_WRITE`: fault them in for writing.
    PrefetchWrite = 1,
    /// `IBV_ADVICE_MR_ADVICE_PREFETCH_NO_FAULT`: only pages already present (nothing to do).
    PrefetchNoFault = 2,
}

/// `enum ibv_atomic_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum AtomicCap {
    /// `IBV_ATOMIC_NONE`.
    None = 0,
    /// `IBV_ATOMIC_HCA`: atomic with respect to this device's operations.
    Hca = 1,
    /// `IBV_ATOMIC_GLOB`.
    Glob = 2,
}

/// `struct ibv_device_attr` (the fields ferroce fills).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    /// `fw_ver` as a string's worth of version.
    pub fw_ver: &'static str,
    /// `node_guid`: EUI-64 derived from the address.
    pub node_guid: u64,
    /// `sys_image_guid`.
    pub sys_image_guid: u64,
    /// `max_mr_size`.
    pub max_mr_size: u64,
    /// `vendor_id`.
    pub vendor_id: u32,
    /// `max_qp`.
    pub max_qp: u32,
    /// `max_qp_wr`.
    pub max_qp_wr: u32,
    /// `max_sge`.
    pub max_sge: u32,
    /// `max_cq`.
    pub max_cq: u32,
    /// `max_cqe`.
    pub max_cqe: u32,
    /// `max_mr`.
    pub max_mr: u32,
    /// `max_pd`.
    pub max_pd: u32,
    /// `max_qp_rd_atom`.
    pub max_qp_rd_atom: u32,
    /// `max_qp_init_rd_atom`.
    pub max_qp_init_rd_atom: u32,
    /// `atomic_cap`.
    pub atomic_cap: AtomicCap,
    /// `max_srq`.
    pub max_srq: u32,
    /// `max_srq_wr`.
    pub max_srq_wr: u32,
    /// `max_srq_sge`.
    pub max_srq_sge: u32,
    /// `max_mcast_grp`: multicast groups the device's QPs can attach to.
    pub max_mcast_grp: u32,
    /// `max_mcast_qp_attach`: QPs one group can have attached.
    pub max_mcast_qp_attach: u32,
    /// `max_total_mcast_qp_attach`.
    pub max_total_mcast_qp_attach: u32,
    /// `max_pkeys`.
    pub max_pkeys: u16,
    /// `local_ca_ack_delay`.
    pub local_ca_ack_delay: u8,
    /// `phys_port_cnt`.
    pub phys_port_cnt: u8,
    /// `max_msg_sz` (from `ibv_port_attr`, as rxe).
    pub max_msg_sz: u64,
    /// `max_inline_data` ferroce accepts.
    pub max_inline_data: u32,
}

/// `enum ibv_port_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum PortState {
    /// `IBV_PORT_DOWN`.
    Down = 1,
    /// `IBV_PORT_ACTIVE`.
    Active = 4,
}

/// `struct ibv_port_attr` (the fields ferroce fills).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// `state`.
    pub state: PortState,
    /// `max_mtu`.
    pub max_mtu: Mtu,
    /// `active_mtu`: the largest IB MTU ≤ interface MTU − 80.
    pub active_mtu: Mtu,
    /// `gid_tbl_len`.
    pub gid_tbl_len: u32,
    /// `pkey_tbl_len`.
    pub pkey_tbl_len: u16,
    /// `lid` (0 on RoCE).
    pub lid: u16,
    /// `link_layer`: Ethernet.
    pub link_layer_ethernet: bool,
    /// `max_msg_sz`.
    pub max_msg_sz: u64,
}

/// How to open a device.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// UDP port to bind and send to (default 4791; another only for tests).
    pub port: Option<u16>,
    /// Fault injection (default: `FERROCE_FAULTS`).
    pub faults: Option<FaultConfig>,
    /// Write every packet to this pcap file (default: `FERROCE_PCAP`).
    pub pcap: Option<std::path::PathBuf>,
    /// Spin instead of sleeping (default: `FERROCE_BUSY_POLL=1`).
    pub busy_poll: Option<bool>,
    /// Send runs of equal packets as `UDP_SEGMENT` trains and read coalesced trains with
    /// `UDP_GRO` (default: on, unless `FERROCE_TRAINS=0`).
    pub trains: Option<bool>,
    /// ECN and CNPs, DCQCN's notification and reaction points (default: on, unless
    /// `FERROCE_ECN=0`): packets leave ECN-capable, a CE-marked one is answered with a CNP,
    /// and a CNP slows its QP down (see `ferroce_transport::congestion`).
    pub ecn: Option<bool>,
    /// An in-memory network of this process instead of a UDP socket (default: off): devices
    /// opened this way reach only each other, with no socket, no other process on the address
    /// and no host-wide GSI routing (so no rdma_cm). For testing and fuzzing the runtime.
    pub memory: Option<bool>,
    /// The ICRC form of the RC FLUSHes this device sends (default: kernel rxe's, unless
    /// `FERROCE_FLUSH_ICRC=ibta`); received ones are taken in either form. See
    /// [`ferroce_transport::FlushIcrc`].
    pub flush_icrc: Option<ferroce_transport::FlushIcrc>,
    /// Shards of the device: engines, each with a socket of its own in the address's group,
    /// a QPN slot and a progress thread; RC and UC QPs without an SRQ are spread over them,
    /// everything else is on the first. Each shard takes one of the address's 255 slots.
    /// Default: `FERROCE_SHARDS`, a number, or unset or `auto` for one per core this process
    /// may run on (its CPU affinity) as long as the address is not crowded: a process whose
    /// first slot is above 64 runs one. At most 8; one with a capture or the in-memory
    /// backend.
    pub shards: Option<usize>,
}

/// `FERROCE_SHARDS`: (shards, whether they were chosen for the process rather than asked
/// for). A number is taken as asked; unset, `auto` or anything else (said at debug) is one
/// per core this process may run on (its CPU affinity).
fn shards_from_env() -> (usize, bool) {
    let cores = || std::thread::available_parallelism().map_or(1, usize::from);
    match std::env::var("FERROCE_SHARDS") {
        Err(_) => (cores(), true),
        Ok(v) if v == "auto" => (cores(), true),
        Ok(v) => match v.parse() {
            Ok(n) => (n, false),
            Err(_) => {
                log::debug!("FERROCE_SHARDS={v:?} is neither a number nor \"auto\": auto");
                (cores(), true)
            }
        },
    }
}

pub(crate) struct ContextInner {
    pub(crate) device: Device,
    pub(crate) port: u16,
    /// The device's runtime, shared by every context of the device in this process.
    runtime: Arc<Runtime>,
    /// This context's async events.
    pub(crate) events: Arc<EventQueue>,
}

/// An open device (`ibv_context`). Cheap to clone; every child keeps it alive. Every
/// [`Device::open`] of a device gives a new context, and the contexts of one device share its
/// runtime (one socket, one progress thread), as contexts share a NIC; their resources stay
/// apart (a PD, CQ or channel of one context is refused by another) and each gets the async
/// events of its own objects.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.inner.device.name)
            .field("addr", &self.shared.local())
            .finish()
    }
}

impl Context {
    pub(crate) fn open(device: Device, opts: OpenOptions) -> Result<Context> {
        let port = opts.port.unwrap_or(ferroce_wire::ROCE_UDP_PORT);
        let faults = match opts.faults {
            Some(f) => Some(f),
            None => FaultConfig::from_env()
                .map_err(|e| Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?,
        };
        let pcap_path = opts
            .pcap
            .or_else(|| std::env::var_os("FERROCE_PCAP").map(Into::into));
        let busy_poll = opts
            .busy_poll
            .unwrap_or_else(|| std::env::var("FERROCE_BUSY_POLL").is_ok_and(|v| v == "1"));
        let trains = opts
            .trains
            .unwrap_or_else(|| std::env::var("FERROCE_TRAINS").map_or(true, |v| v != "0"));
        let ecn = opts
            .ecn
            .unwrap_or_else(|| std::env::var("FERROCE_ECN").map_or(true, |v| v != "0"));
        let local = device.socket_addr(port);
        let mut engine = EndpointConfig::new(device.addr);
        if !ecn {
            engine.congestion = CongestionConfig::off();
        }
        engine.flush_icrc = opts.flush_icrc.unwrap_or_else(|| {
            if std::env::var("FERROCE_FLUSH_ICRC").is_ok_and(|v| v == "ibta") {
                ferroce_transport::FlushIcrc::Ibta
            } else {
                ferroce_transport::FlushIcrc::Rxe
            }
        });
        engine.src_port = port;
        engine.dst_port = port;
        // Split WRITEs pay only in trains (`SendWqe::split` in the engine).
        engine.split_writes =
            trains && std::env::var("FERROCE_SPLIT_WRITES").map_or(true, |v| v != "0");
        // So do paired READs (`SendWqe::split` again): their responses leave in trains.
        engine.pair_reads =
            trains && std::env::var("FERROCE_PAIR_READS").map_or(true, |v| v != "0");
        engine.limits = ModifyLimits {
            active_mtu: device.active_mtu(),
            ..ModifyLimits::default()
        };
        let (shards, shards_auto) = opts.shards.map_or_else(shards_from_env, |n| (n, false));
        let runtime = Runtime::get_or_start(RuntimeConfig {
            local,
            engine,
            faults,
            pcap_path,
            busy_poll,
            trains,
            ecn,
            memory: opts.memory.unwrap_or(false),
            shards,
            shards_auto,
            dropped_rx: Arc::default(),
        })?;
        log::debug!(
            "opened {} on {local} (active MTU {})",
            device.name,
            device.active_mtu().bytes()
        );
        let shared = runtime.shared.clone();
        Ok(Context {
            inner: Arc::new(ContextInner {
                device,
                port,
                runtime,
                events: Arc::new(EventQueue::new()?),
            }),
            shared,
        })
    }

    /// Whether `other` is this very context (or a clone of its handle).
    pub(crate) fn same(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether `other` is a context of the same device (sharing its runtime).
    pub fn same_device(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner.runtime, &other.inner.runtime)
    }

    /// The events of objects of this context go here.
    pub(crate) fn register_events(&self, what: Owned) {
        self.shared.register_events(what, &self.inner.events);
    }

    /// Whether PDs, CQs or completion channels (or other clones of this handle) still hold the
    /// context: what a verbs program must release before `ibv_close_device`.
    pub fn in_use(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }

    /// The socket address the context's device is bound to (its address, port 4791 unless
    /// opened otherwise).
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.shared.local()
    }

    /// The device this context was opened on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The UDP port in use (4791 unless opened otherwise).
    pub fn port(&self) -> u16 {
        self.inner.port
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        let guid = self.inner.device.node_guid();
        DeviceAttr {
            fw_ver: env!("CARGO_PKG_VERSION"),
            node_guid: guid,
            sys_image_guid: guid,
            max_mr_size: limits::MAX_MR_SIZE,
            vendor_id: 0xffffff,
            max_qp: limits::MAX_QP,
            max_qp_wr: limits::MAX_QP_WR,
            max_sge: limits::MAX_SGE,
            max_cq: 1 << 16,
            max_cqe: limits::MAX_CQE,
            max_mr: 1 << 20,
            max_pd: 1 << 16,
            max_qp_rd_atom: limits::MAX_RD_ATOM,
            max_qp_init_rd_atom: limits::MAX_RD_ATOM,
            atomic_cap: AtomicCap::Hca,
            max_srq: 1 << 12,
            max_srq_wr: limits::MAX_SRQ_WR,
            max_srq_sge: limits::MAX_SGE,
            max_mcast_grp: ferroce_transport::mcast::MAX_MCAST_GRP,
            max_mcast_qp_attach: ferroce_transport::mcast::MAX_MCAST_QP_ATTACH,
            max_total_mcast_qp_attach: ferroce_transport::mcast::MAX_TOTAL_MCAST_QP_ATTACH,
            max_pkeys: 1,
            local_ca_ack_delay: 15,
            phys_port_cnt: 1,
            max_msg_sz: ferroce_transport::MAX_MSG_SZ,
            max_inline_data: limits::MAX_INLINE,
        }
    }

    /// `ibv_query_port` (port 1, the only one).
    pub fn query_port(&self) -> PortAttr {
        PortAttr {
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.inner.device.active_mtu(),
            gid_tbl_len: 2,
            pkey_tbl_len: 1,
            lid: 0,
            link_layer_ethernet: true,
            max_msg_sz: ferroce_transport::MAX_MSG_SZ,
        }
    }

    /// `ibv_query_gid`: the device's two GIDs, both its address (`::ffff:a.b.c.d` for IPv4),
    /// both RoCE v2. rxe lists the interface's IPv6 link-local address first when it has one
    /// and the IPv4-mapped address after it (so `-g 1` is the habit); ferroce sends only from
    /// the device's address, so index 0 is that address too, and programs that default to GID
    /// 0 work.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another index.
    pub fn query_gid(&self, index: u32) -> Result<Ipv6Addr> {
        match index {
            0 | 1 => Ok(self.inner.device.gid()),
            _ => {
                log::debug!("query_gid: index {index}: the GID table has indexes 0 and 1");
                Err(Error::InvalidArgument("GID index (the table has 0 and 1)"))
            }
        }
    }

    /// Checks a path (an AH or a QP's primary path) against the device: a source GID index
    /// of its table and a destination of its address family.
    pub(crate) fn check_path(&self, ah: &AhAttr) -> Result<()> {
        if ah.sgid_index > 1 {
            return Err(Error::InvalidArgument(
                "sgid_index (the GID table has indexes 0 and 1)",
            ));
        }
        if ah.dest.is_ipv4() != self.inner.device.addr.is_ipv4() {
            return Err(Error::InvalidArgument(
                "the destination GID is not of the device's address family (an IPv4 device \
                 reaches ::ffff:a.b.c.d GIDs, an IPv6 device IPv6 ones)",
            ));
        }
        Ok(())
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain {
            inner: Arc::new(PdInner {
                handle: self.shared.next_pd_number(),
            }),
            ctx: self.clone(),
        }
    }

    /// `ibv_create_comp_channel`.
    ///
    /// # Errors
    /// [`Error::Io`] if an eventfd cannot be made.
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        CompletionChannel::new(self)
    }

    /// `ibv_create_cq` with room for `cqe` completions.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 or more than `max_cqe`; [`Error::WrongParent`] for a
    /// channel of another context.
    pub fn create_cq(
        &self,
        cqe: u32,
        channel: Option<&CompletionChannel>,
    ) -> Result<CompletionQueue> {
        if cqe == 0 || cqe > limits::MAX_CQE {
            return Err(Error::InvalidArgument("cqe"));
        }
        if let Some(ch) = channel {
            if !ch.ctx.same(self) {
                return Err(Error::WrongParent("completion channel of another context"));
            }
        }
        Ok(CompletionQueue::new(self, cqe as usize, channel))
    }

    /// `ibv_get_async_event`, waiting at most `timeout`: the next event of one of this
    /// context's objects.
    pub fn get_async_event(&self, timeout: Duration) -> Option<AsyncEventRecord> {
        self.inner.events.get(timeout)
    }

    /// What an event of this context means, with its facts, in a sentence: an SRQ's limit and
    /// the receives left, the first error of a QP whose LAST_WQE_REACHED it is, a CQ's size
    /// (a ferroce extension: `ibv_async_event` carries only the object).
    pub fn async_event_reason(&self, e: &AsyncEventRecord) -> String {
        match *e {
            AsyncEventRecord::Engine(ev) => {
                let qp_error = match ev {
                    ferroce_transport::AsyncEvent::QpLastWqeReached { qpn } => {
                        self.shared.qp_error(qpn)
                    }
                    _ => None,
                };
                ev.explain(qp_error.as_ref())
            }
            AsyncEventRecord::CqErr { cq } => format!(
                "CQ {cq}: a completion found it full (IBV_EVENT_CQ_ERR): the program polls it \
                 more slowly than its QPs complete work, or its cqe is smaller than the work \
                 those QPs can have outstanding; the CQ and its QPs are in error"
            ),
        }
    }

    /// `ibv_get_async_event` as rdma-core blocks in it: in a `read(2)`, so a signal whose
    /// handler lacks SA_RESTART ends the wait (the errno, EINTR), as the C ABI must.
    ///
    /// # Errors
    /// The read's errno.
    pub fn wait_async_event(&self) -> std::result::Result<AsyncEventRecord, i32> {
        self.inner.events.wait()
    }

    /// The async event file descriptor (readable while an event of this context is pending).
    pub fn async_fd(&self) -> std::os::fd::RawFd {
        self.inner.events.raw_fd()
    }

    /// The async event descriptor, borrowed (for `tokio::io::unix::AsyncFd`, mio or epoll).
    pub fn async_fd_borrowed(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the eventfd lives in this context's EventQueue, which the context holds an Arc of, so the descriptor stays open for the borrow's lifetime.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.async_fd()) }
    }

    /// The device's counters: the engine's (named as rxe's hw_counters) and the runtime's,
    /// summed over its shards.
    pub fn counters(&self) -> (ferroce_transport::Counters, RuntimeCounters) {
        self.shared.all_counters()
    }

    /// Each shard's counters, in shard order ([`OpenOptions::shards`]; the first holds QP1,
    /// SRQs, UD and XRC QPs): its QPN slot (bits 23:16 of its QPs' numbers; `None` on the
    /// in-memory backend), the engine's counters and the runtime's. [`Context::counters`] is
    /// their sum.
    pub fn shard_counters(
        &self,
    ) -> Vec<(Option<u8>, ferroce_transport::Counters, RuntimeCounters)> {
        self.shared.shard_counters()
    }
}

pub(crate) struct PdInner {
    pub(crate) handle: u32,
}

/// A protection domain (`ibv_pd`): memory regions and QPs of one PD can only reach each other.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
    pub(crate) ctx: Context,
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProtectionDomain({})", self.inner.handle)
    }
}

impl ProtectionDomain {
    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    pub(crate) fn handle(&self) -> u32 {
        self.inner.handle
    }

    /// `ibv_reg_mr` over `len` fresh zeroed bytes that ferroce owns (an anonymous mapping).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE (as
    /// verbs requires), or a length beyond `max_mr_size`; [`Error::Io`] if mapping fails.
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion> {
        self.reg_mr_pages(len, access, false)
    }

    /// `ibv_reg_mr` over `len` bytes of 2 MiB huge pages (fewer TLB misses on large regions).
    ///
    /// # Errors
    /// As [`ProtectionDomain::reg_mr`]; [`Error::Io`] (ENOMEM) when the host has no free huge
    /// pages (`/proc/sys/vm/nr_hugepages`).
    pub fn reg_mr_huge(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion> {
        self.reg_mr_pages(len, access, true)
    }

    fn reg_mr_pages(&self, len: usize, access: AccessFlags, huge: bool) -> Result<MemoryRegion> {
        check_access(access, len as u64)?;
        let inner =
            self.ctx
                .shared
                .mrs()
                .register(MrInner::owned(self.handle(), len, access, huge)?)?;
        Ok(MemoryRegion {
            inner,
            pd: self.clone(),
        })
    }

    /// `ibv_reg_mr` over caller memory (for the C ABI and zero-copy users).
    ///
    /// # Safety
    /// `ptr..ptr+len`, widened to whole aligned 8-byte words (always true inside one page),
    /// must be valid for reads and writes from now until [`MemoryRegion::dereg`] has returned
    /// (dropping handles does not deregister), and after that as long as a clone of the
    /// handle is used. The runtime reads and writes it at any time in between, as a NIC would;
    /// Rust code must not form references into it meanwhile (see the crate docs). Once `dereg`
    /// returns, the network never touches it again.
    ///
    /// # Errors
    /// As [`ProtectionDomain::reg_mr`].
    pub unsafe fn reg_mr_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        // SAFETY: reg_mr_iova_raw's contract is this function's; the IOVA is the address.
        unsafe { self.reg_mr_iova_raw(ptr, len, ptr as u64, access) }
    }

    /// `ibv_reg_mr_iova`: as [`ProtectionDomain::reg_mr_raw`], but work requests and peers
    /// address the region by `iova` (its first byte), not by `ptr`. `iova` must have `ptr`'s
    /// offset in its 4 KiB page (the kernel's rule for page-mapped IOVAs), which also keeps
    /// remote atomics on 8-byte-aligned IOVAs aligned in memory.
    ///
    /// # Safety
    /// As [`ProtectionDomain::reg_mr_raw`].
    ///
    /// # Errors
    /// As [`ProtectionDomain::reg_mr`]; [`Error::InvalidArgument`] for an IOVA with another
    /// page offset, or a range that wraps.
    pub unsafe fn reg_mr_iova_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        check_access(access, len as u64)?;
        if (iova ^ ptr as u64) & 4095 != 0 || iova.checked_add(len as u64).is_none() {
            log::debug!("reg_mr: IOVA {iova:#x} for {ptr:p}: another page offset, or it wraps");
            return Err(Error::InvalidArgument(
                "an IOVA must have the address's offset in its page",
            ));
        }
        // SAFETY: this function's contract is `foreign`'s: the widened range stays valid until deregistration, and Rust reaches it only through region copies.
        let mut mr = unsafe { MrInner::foreign(self.handle(), ptr, len, access) };
        mr.addr = iova;
        let inner = self.ctx.shared.mrs().register(mr)?;
        Ok(MemoryRegion {
            inner,
            pd: self.clone(),
        })
    }

    /// Implicit on-demand paging (`ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND |
    /// ...)`): one region over the whole address space. Work requests name any address of the
    /// process with its lkey, and peers any address with its rkey; each access has the kernel
    /// fault in the pages it names, with the right it needs, and a range that is unmapped (or
    /// read-only, for a write) is refused as an access outside a region would be
    /// (`LOC_PROT_ERR` locally, NAK remote access for a peer): never a crash.
    ///
    /// # Safety
    /// While registered, every range reached through the region must be memory Rust code
    /// does not hold references into while the network may touch it (as for
    /// [`ProtectionDomain::reg_mr_raw`]: C allocations, mappings made for the purpose), and
    /// it must not be unmapped by another thread during an access. Remote access rights hand
    /// a peer the whole process: grant them only to a trusted peer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for remote write or atomic access without `LOCAL_WRITE`.
    pub unsafe fn reg_mr_implicit(&self, access: AccessFlags) -> Result<MemoryRegion> {
        check_access(access, 0)?;
        // SAFETY: this function's contract is `implicit`'s.
        let mr = unsafe { MrInner::implicit(self.handle(), access) };
        let inner = self.ctx.shared.mrs().register(mr)?;
        Ok(MemoryRegion {
            inner,
            pd: self.clone(),
        })
    }

    /// `ibv_rereg_mr`: `old` (a region of this device) becomes a region of this PD with
    /// `access`, over new memory `ptr..ptr+len` when `translation` is given (otherwise its own),
    /// under the same lkey and rkey. From the return on, the network reaches the region only as
    /// re-registered; `old`'s handle is stale (use the returned one).
    ///
    /// # Safety
    /// With `translation`, its memory carries [`ProtectionDomain::reg_mr_raw`]'s contract.
    ///
    /// # Errors
    /// As [`ProtectionDomain::reg_mr`]; [`Error::WrongParent`] for a region of another
    /// device; [`Error::InvalidArgument`] if `old` was deregistered.
    pub unsafe fn rereg_mr_raw(
        &self,
        old: &MemoryRegion,
        translation: Option<(*mut u8, usize)>,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        if !old.pd.ctx.same_device(&self.ctx) {
            return Err(Error::WrongParent("a memory region of another device"));
        }
        let len = translation.map_or(old.inner.len, |(_, l)| l as u64);
        // An implicit region keeps its whole-address-space extent (no size limit applies).
        let implicit = old.inner.implicit && translation.is_none();
        check_access(access, if implicit { 0 } else { len })?;
        let mr = match translation {
            // SAFETY: this function's contract for a new translation is `foreign`'s.
            Some((ptr, len)) => unsafe { MrInner::foreign(self.handle(), ptr, len, access) },
            None => MrInner::same_memory(&old.inner, self.handle(), access),
        };
        let shared = &self.ctx.shared;
        let inner = shared
            .mrs()
            .replace(old.inner.lkey, mr)
            .ok_or(Error::InvalidArgument(
                "the memory region is not registered",
            ))?;
        // As in `dereg`: once every shard has taken the new regions under its lock, no copy
        // through the old registration runs or can start.
        shared.copy_barrier();
        Ok(MemoryRegion {
            inner,
            pd: self.clone(),
        })
    }

    /// `ibv_advise_mr`: populates the pages the SGEs name (regions need not be populated or
    /// pinned when registered; this faults them in ahead of the network's accesses, which
    /// would otherwise do it). `PrefetchNoFault` asks for nothing a page fault would bring, so
    /// it only checks the SGEs.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an SGE outside a live region of this PD or over
    /// unmapped memory (EINVAL).
    pub fn advise_mr(&self, advice: MrAdvice, sges: &[Sge]) -> Result<()> {
        let mrs = self.ctx.shared.mrs();
        for sge in sges {
            let r = match advice {
                MrAdvice::PrefetchNoFault => {
                    mrs.prefetch(self.handle(), sge.lkey, sge.addr, 0, false)
                }
                MrAdvice::Prefetch | MrAdvice::PrefetchWrite => mrs.prefetch(
                    self.handle(),
                    sge.lkey,
                    sge.addr,
                    u64::from(sge.length),
                    advice == MrAdvice::PrefetchWrite,
                ),
            };
            r.map_err(|e| {
                log::debug!(
                    "advise_mr: lkey {:#x} [{:#x}, +{}): {e:?}",
                    sge.lkey,
                    sge.addr,
                    sge.length
                );
                Error::InvalidArgument("an SGE outside a region of the PD")
            })?;
        }
        Ok(())
    }

    /// `ibv_create_ah`: an address handle for UD sends.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the destination's family differs from the device's.
    pub fn create_ah(&self, attr: AhAttr) -> Result<AddressHandle> {
        self.ctx
            .check_path(&attr)
            .inspect_err(|e| log::debug!("create_ah to {}: {e}", attr.dest))?;
        Ok(AddressHandle {
            attr,
            _pd: self.clone(),
        })
    }

    /// Whether memory regions, QPs, AHs or other handles still hold the PD (what makes
    /// [`ProtectionDomain::dealloc`] refuse with EBUSY).
    pub fn in_use(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }

    /// `ibv_dealloc_pd`: checks nothing still uses the PD, then drops this handle.
    ///
    /// # Errors
    /// [`Error::Busy`] while memory regions, QPs or AHs of the PD live (EBUSY).
    pub fn dealloc(self) -> Result<()> {
        if Arc::strong_count(&self.inner) > 1 {
            return Err(Error::Busy(
                "the PD still has memory regions, QPs or address handles",
            ));
        }
        Ok(())
    }
}

fn check_access(access: AccessFlags, len: u64) -> Result<()> {
    let remote_w = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if !(access & remote_w).is_empty() && !access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(Error::InvalidArgument(
            "remote write or atomic access needs LOCAL_WRITE",
        ));
    }
    if len > limits::MAX_MR_SIZE {
        return Err(Error::InvalidArgument(
            "memory region larger than max_mr_size",
        ));
    }
    if access.contains(AccessFlags::FLUSH_PERSISTENT) {
        return Err(Error::InvalidArgument(
            "FLUSH_PERSISTENT needs persistent memory: ferroce's regions are ordinary memory \
             (rxe refuses it for pages that are not pmem)",
        ));
    }
    Ok(())
}

/// A registered memory region (`ibv_mr`).
///
/// Its bytes are shared with the network like DMA memory; read and write them with
/// [`MemoryRegion::read`] and [`MemoryRegion::write`], which copy. See the crate docs.
#[derive(Clone)]
pub struct MemoryRegion {
    pub(crate) inner: Arc<MrInner>,
    pd: ProtectionDomain,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl MemoryRegion {
    /// `lkey`.
    pub fn lkey(&self) -> u32 {
        self.inner.lkey
    }

    /// `rkey` (equal to the lkey, as on rxe).
    pub fn rkey(&self) -> u32 {
        self.inner.lkey
    }

    /// `addr`: the start address peers use in RETH/AtomicETH, and SGEs use locally.
    pub fn addr(&self) -> u64 {
        self.inner.addr
    }

    /// `length`.
    pub fn len(&self) -> usize {
        self.inner.len as usize
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The access flags.
    pub fn access(&self) -> AccessFlags {
        self.inner.access
    }

    /// The PD.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// An SGE for `len` bytes at `offset` (not checked here; the transport checks it).
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            addr: self.inner.addr + offset as u64,
            length: len,
            lkey: self.inner.lkey,
        }
    }

    /// Copies `buf.len()` bytes at `offset` out of the region.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the range is outside the region.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        self.inner
            .copy_out(self.inner.addr + offset as u64, buf)
            .map_err(|_| Error::InvalidArgument("range outside the region"))
    }

    /// Copies `data` into the region at `offset`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the range is outside the region.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.inner
            .copy_in(self.inner.addr + offset as u64, data)
            .map_err(|_| Error::InvalidArgument("range outside the region"))
    }

    /// Whether this is an implicit on-demand region over the whole address space
    /// ([`ProtectionDomain::reg_mr_implicit`]; `addr` 0, `len` `usize::MAX`).
    pub fn is_implicit(&self) -> bool {
        self.inner.implicit
    }

    /// A copy of the whole region (empty for an implicit region, which has no bytes of its
    /// own).
    pub fn to_vec(&self) -> Vec<u8> {
        if self.inner.implicit {
            return Vec::new();
        }
        let mut v = vec![0u8; self.len()];
        let _ = self.read(0, &mut v);
        v
    }

    /// Reads the 8-byte word at `offset` atomically (for results of remote atomics).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if unaligned or outside the region.
    pub fn atomic_load(&self, offset: usize) -> Result<u64> {
        self.inner
            .load_word(self.inner.addr + offset as u64)
            .map_err(|_| Error::InvalidArgument("unaligned or outside the region"))
    }

    /// How many memory windows are bound onto the region (`ibv_dereg_mr` refuses while any
    /// is).
    pub fn windows_bound(&self) -> usize {
        self.pd.ctx.shared.mrs().windows_on(self.inner.lkey)
    }

    /// `ibv_dereg_mr`: the keys die at once (work requests that use them afterwards fail with
    /// a protection error, a peer's requests get the remote-access NAK), and when this returns
    /// no copy into or out of the region is running or can start: its memory may be freed.
    /// (Memory ferroce owns is unmapped when the last handle goes.)
    pub fn dereg(self) {
        let shared = &self.pd.ctx.shared;
        // Windows onto the region close with it (the C ABI refuses with EBUSY first, as rxe).
        shared.mrs().unbind_on(self.inner.lkey);
        shared.mrs().remove(self.inner.lkey);
        // Every copy the engine makes into or out of a region happens while it holds its
        // shard's lock, after a key lookup in the shard's snapshot of the regions. The key is
        // gone from the table now, so once each shard has renewed its snapshot under its
        // lock, a copy that found the key earlier has finished and none can start.
        shared.copy_barrier();
    }
}

/// An address handle (`ibv_ah`): where UD work requests go.
#[derive(Debug, Clone)]
pub struct AddressHandle {
    attr: AhAttr,
    _pd: ProtectionDomain,
}

impl AddressHandle {
    /// The address vector.
    pub fn attr(&self) -> AhAttr {
        self.attr
    }
}
