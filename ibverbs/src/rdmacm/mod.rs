//! The librdmacm C ABI (rdma-core 44) over ferroce's connection manager ([`ferroce::cm`]).
//!
//! The functions live here, in libibverbs.so.1, as `ferroce_rdma_*` (version node
//! `FERROCE_RDMACM_PRIVATE`), and ferroce's `librdmacm.so.1` (the `librdmacm/` crate) forwards
//! every `rdma_*` and rsocket symbol to them: one provider per process, whose contexts are
//! the ones the program's `ibv_*` calls reach (`id->verbs` is a context of this library).
//!
//! Memory: an ID is a box whose first field is the `rdma_cm_id` the program holds; an event a
//! box holding the `rdma_cm_event` and its private data (valid until `rdma_ack_cm_event`);
//! a channel a box holding `rdma_event_channel` and the provider's channel.

pub mod abi;
pub mod addr;
pub mod rsocket;

use core::ffi::{c_char, c_int, c_void};
use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ferroce::cm::{CmEvent, CmEventType, CmId, ConnParam, EventChannel, McJoinFlag, PortSpace};
use ferroce::transport::QpState;
use parking_lot::Mutex;

use crate::abi::*;
use crate::handle::Obj;
use crate::objects::qp_of;
use crate::set_errno;
pub use abi::*;
use addr::{sockaddr_of, write_sockaddr};

/// A channel: `rdma_event_channel`, then the provider's channel.
type Chan = Obj<rdma_event_channel, EventChannel>;

/// ferroce's state of an ID.
pub struct IdState {
    /// The provider's ID.
    pub id: CmId,
    /// A synchronous ID's own channel (created, or migrated, with `channel` NULL); 0 for an
    /// asynchronous ID. `rdma_migrate_id` changes it, as librdmacm's `sync` flag.
    sync: AtomicUsize,
    /// `rdma_create_ep`'s QP attributes for `rdma_get_request`, and its PD.
    ep: Mutex<Option<(ibv_qp_init_attr, usize)>>,
    /// CQs and channels `rdma_create_qp` made for the ID (destroyed with its QP).
    made: Mutex<Vec<(usize, usize)>>,
}

/// An ID: `rdma_cm_id`, then [`IdState`].
type Id = Obj<rdma_cm_id, IdState>;

/// An event: the C event, its private data (the area librdmacm's `struct cma_event` has), and
/// the provider's event (keeping its IDs alive until the ack).
#[repr(C)]
struct EventBox {
    ev: rdma_cm_event,
    data: [u8; 256],
    _rust: CmEvent,
}

/// Per device: the context every ID on it shares (`id->verbs`), and the PD `rdma_create_qp`
/// uses when given none (librdmacm allocates one per device).
static VERBS: Mutex<Vec<(std::net::IpAddr, usize, usize)>> = Mutex::new(Vec::new());

fn verbs_for(addr: std::net::IpAddr) -> Option<(*mut ibv_context, *mut ibv_pd)> {
    let mut v = VERBS.lock();
    if let Some((_, c, p)) = v.iter().find(|(a, _, _)| *a == addr) {
        return Some((*c as *mut ibv_context, *p as *mut ibv_pd));
    }
    let dev = crate::device::device_on(addr)?;
    let ctx = crate::device::ibv_open_device(dev);
    if ctx.is_null() {
        return None;
    }
    // SAFETY: `ctx` was just opened by this library and is never closed (librdmacm keeps its device contexts for the process's life).
    let pd = unsafe { crate::pd::ibv_alloc_pd(ctx) };
    v.push((addr, ctx as usize, pd as usize));
    Some((ctx, pd))
}

/// What every rdma_cm entry point sets up first: logging, and the CM restricted to the
/// devices `ibv_get_device_list` lists (so `id->verbs` is always one of them).
fn cm_init() {
    crate::init_logging();
    ferroce::cm::set_listed_devices_only(true);
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| ferroce::fork::on_fork_child(forget_verbs));
}

/// In a forked child: the per-device contexts are the parent's (their runtimes are not the
/// child's, see `ferroce::fork`); they are forgotten, never closed, and the child's first ID
/// on a device opens its own.
extern "C" fn forget_verbs() {
    if VERBS.is_locked() {
        // In a forked child only the forking thread runs, and fork is the program's call,
        // never made inside a critical section of VERBS.
        // SAFETY: a held lock belongs to a parent thread the child does not have.
        unsafe { VERBS.force_unlock() };
    }
    std::mem::forget(std::mem::take(&mut *VERBS.lock()));
}

/// When the library is unloaded (at exit, or dlclose): the CM's connections left are torn
/// down on the wire ([`ferroce::cm::shutdown`]), as the kernel does when a process's rdma_cm
/// file closes — qperf's server, for one, exits with its connection's ID never destroyed.
extern "C" fn at_unload() {
    ferroce::cm::shutdown();
}

/// The destructor entry: `.fini_array` holds functions the dynamic loader calls at unload.
#[used]
#[unsafe(link_section = ".fini_array")]
static AT_UNLOAD: extern "C" fn() = at_unload;

#[track_caller]
fn fail_int(e: c_int) -> c_int {
    let at = std::panic::Location::caller();
    log::debug!(
        "{}:{}: rdma_cm call refused: {}",
        at.file(),
        at.line(),
        crate::errno_name(e)
    );
    set_errno(e);
    -1
}

fn err_int(e: &ferroce::Error) -> c_int {
    log::debug!("rdma_cm: {e}");
    fail_int(e.errno())
}

/// The IDs not destroyed, by address. A call with any other pointer — an ID the program
/// destroyed (perftest 4.5-0.17 retries a refused connection with the IDs it destroyed), or
/// garbage — is refused with EINVAL rather than read (librdmacm would read freed memory), and
/// a second destroy of one ID is refused likewise.
static LIVE_IDS: std::sync::LazyLock<Mutex<std::collections::HashSet<usize>>> =
    std::sync::LazyLock::new(|| Mutex::new(std::collections::HashSet::new()));

/// Whether `id` is NULL or an ID of this library not destroyed; says why not at debug.
fn live_or_null(id: *const rdma_cm_id, call: &str) -> bool {
    if id.is_null() || LIVE_IDS.lock().contains(&(id as usize)) {
        return true;
    }
    log::debug!("{call}: {id:p} is no rdma_cm_id of this library (destroyed already?): EINVAL");
    false
}

/// The ID box behind a program's `rdma_cm_id`; `None` for NULL or a pointer that is no live
/// ID of ours ([`LIVE_IDS`]).
///
/// # Safety
/// `id` is NULL, or any pointer: one of a live ID of ours is not destroyed while the
/// reference is used (the program does not destroy an ID another of its threads is using).
unsafe fn state<'a>(id: *mut rdma_cm_id) -> Option<&'a IdState> {
    if id.is_null() || !live_or_null(id, "rdma_cm") {
        return None;
    }
    // The caller's contract keeps a live ID alive while the reference is used.
    // SAFETY: `id` is in LIVE_IDS, so it is an ID box of ours (made by `new_c_id`) not yet freed.
    Some(unsafe { Id::rust(id) })
}

/// The C ID of a provider ID (0: it has none yet, or it was destroyed).
fn c_of(id: &CmId) -> *mut rdma_cm_id {
    id.user_context() as *mut rdma_cm_id
}

/// Makes the C box of a provider ID (a new connection's).
fn new_c_id(id: CmId, channel: *mut rdma_event_channel, context: *mut c_void) -> *mut rdma_cm_id {
    let ps = id.port_space();
    let c = rdma_cm_id {
        verbs: core::ptr::null_mut(),
        channel,
        context,
        qp: core::ptr::null_mut(),
        // SAFETY: all-zero bytes are a valid rdma_route (addresses unset, no path records).
        route: unsafe { core::mem::zeroed() },
        ps: ps as u32,
        port_num: 1,
        event: core::ptr::null_mut(),
        send_cq_channel: core::ptr::null_mut(),
        send_cq: core::ptr::null_mut(),
        recv_cq_channel: core::ptr::null_mut(),
        recv_cq: core::ptr::null_mut(),
        srq: core::ptr::null_mut(),
        pd: core::ptr::null_mut(),
        qp_type: if ps == PortSpace::Udp { 4 } else { 2 },
    };
    let p = Id::into_raw(
        c,
        IdState {
            id: id.clone(),
            sync: AtomicUsize::new(0),
            ep: Mutex::new(None),
            made: Mutex::new(Vec::new()),
        },
    );
    id.set_user_context(p as usize);
    LIVE_IDS.lock().insert(p as usize);
    p
}

/// Writes the provider ID's addresses, device context and PD into its C struct.
///
/// # Safety
/// `c` is a live ID of ours.
unsafe fn sync_fields(c: *mut rdma_cm_id, id: &CmId) {
    let verbs = id.device().and_then(|d| verbs_for(d.addr));
    // SAFETY: `c` is a live ID box of ours (the caller's contract); these fields are the library's to write, and the program reads them only after the call or event that sets them.
    unsafe {
        if let Some(a) = id.local_addr() {
            write_sockaddr(&raw mut (*c).route.addr.src_addr, a);
            (*c).route.addr.ibaddr.sgid = addr::gid(a.ip());
        }
        if let Some(a) = id.peer_addr() {
            write_sockaddr(&raw mut (*c).route.addr.dst_addr, a);
            (*c).route.addr.ibaddr.dgid = addr::gid(a.ip());
        }
        (*c).route.addr.ibaddr.pkey = 0xFFFF;
        if let Some((ctx, pd)) = verbs {
            (*c).verbs = ctx;
            if (*c).pd.is_null() {
                (*c).pd = pd;
            }
        }
        if id.path().is_some() {
            (*c).route.num_paths = 1;
        }
    }
}

/// Turns a provider event into the C event the program gets (None: its ID was destroyed).
fn to_c(e: CmEvent) -> Option<*mut rdma_cm_event> {
    let listen = e
        .listen_id
        .as_ref()
        .map(c_of)
        .unwrap_or(core::ptr::null_mut());
    let id = match (e.event, c_of(&e.id).is_null()) {
        (CmEventType::ConnectRequest, true) => {
            // SAFETY: `listen` is the live C ID of the listener (it has a box: the request came through its listen, and its box outlives its events).
            let (ch, ctx) = unsafe { ((*listen).channel, (*listen).context) };
            new_c_id(e.id.clone(), ch, ctx)
        }
        (_, true) => return None,
        (_, false) => c_of(&e.id),
    };
    // SAFETY: `id` is a live ID box of ours (made above, or the one the provider ID names).
    unsafe { sync_fields(id, &e.id) };
    // SAFETY: as above.
    let qp = unsafe { (*id).qp };
    if !qp.is_null() {
        let s = match e.event {
            CmEventType::Established => Some(QpState::Rts),
            CmEventType::Rejected | CmEventType::ConnectError => Some(QpState::Err),
            _ => None,
        };
        if let Some(s) = s {
            // SAFETY: the ID's QP is a live QP of this library (rdma_destroy_qp clears it).
            unsafe { crate::qp::publish_state(qp, s) };
        }
    }
    let mut data = [0u8; 256];
    let n = e.param.private_data.len().min(255);
    data[..n].copy_from_slice(&e.param.private_data[..n]);
    let param = match &e.ud {
        Some(ud) => rdma_event_param {
            ud: rdma_ud_param {
                private_data: core::ptr::null(),
                private_data_len: n as u8,
                ah_attr: crate::convert::ah_attr_to(&ud.ah_attr),
                qp_num: ud.qp_num,
                qkey: ud.qkey,
            },
        },
        None => rdma_event_param {
            conn: rdma_conn_param {
                private_data: core::ptr::null(),
                private_data_len: n as u8,
                responder_resources: e.param.responder_resources,
                initiator_depth: e.param.initiator_depth,
                flow_control: e.param.flow_control,
                retry_count: e.param.retry_count,
                rnr_retry_count: e.param.rnr_retry_count,
                srq: u8::from(e.param.srq),
                qp_num: e.param.qp_num,
            },
        },
    };
    let ev = rdma_cm_event {
        id,
        listen_id: listen,
        event: e.event as u32,
        status: e.status,
        param,
    };
    let multicast = matches!(
        e.event,
        CmEventType::MulticastJoin | CmEventType::MulticastError
    );
    let mc_context = e.mc_context;
    let b = Box::into_raw(Box::new(EventBox { ev, data, _rust: e }));
    // SAFETY: `b` is the box just leaked; its data array lives as long as it, and both union members keep private_data at offset 0.
    unsafe {
        let p = (&raw const (*b).data).cast::<c_void>();
        if multicast {
            // librdmacm hands the join's context back here.
            (*b).ev.param.ud.private_data = mc_context as *const c_void;
        } else if n > 0 {
            (*b).ev.param.conn.private_data = p;
        }
    }
    Some(b.cast())
}

/// Reads the next event of `ch` (blocking unless its fd is O_NONBLOCK); EBADF if `ch` is not a
/// live channel (destroyed).
///
/// # Safety
/// `ch` was returned by `rdma_create_event_channel` (destroyed since, or not).
unsafe fn next_event(ch: *mut rdma_event_channel) -> Result<*mut rdma_cm_event, c_int> {
    // A handle of its own (an Arc): a program may destroy the channel while this thread waits
    // in it (rping's main thread does, its event thread blocked here), and librdmacm's blocked
    // read(2) keeps the file, so this wait keeps the queue and goes on waiting, never
    // touching the freed object.
    let (chan, fd) = {
        let live = LIVE_CHANNELS.lock();
        if !live.contains(&(ch as usize)) {
            log::debug!(
                "rdma_get_cm_event: {ch:p} is not a live channel (destroyed): EBADF, as \
                 librdmacm's read of its closed descriptor"
            );
            return Err(libc::EBADF);
        }
        // The channel is in the set, which its destroy leaves under this lock before freeing.
        // SAFETY: `ch` is a live channel of ours: in the set, and its destroy waits for this lock.
        let chan = unsafe { Chan::rust(ch) }.clone();
        // SAFETY: as above; `fd` of a live channel is written only at creation.
        (chan, unsafe { (*ch).fd })
    };
    // SAFETY: F_GETFL on the channel's own descriptor reads its flags.
    let nonblock = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    loop {
        let e = if nonblock {
            chan.try_get_event().ok_or(libc::EAGAIN)?
        } else {
            // librdmacm's wait is a read(2): a signal without SA_RESTART ends it with EINTR.
            chan.wait_event()?
        };
        if let Some(c) = to_c(e) {
            return Ok(c);
        }
    }
}

fn rust_param(p: *const rdma_conn_param) -> ConnParam {
    if p.is_null() {
        return ConnParam::defaults();
    }
    // SAFETY: a non-NULL conn_param is the program's valid struct for the call.
    let p = unsafe { *p };
    let private_data = if p.private_data.is_null() || p.private_data_len == 0 {
        Vec::new()
    } else {
        // SAFETY: rdma_connect's contract: private_data holds private_data_len bytes.
        unsafe {
            core::slice::from_raw_parts(
                p.private_data.cast::<u8>(),
                usize::from(p.private_data_len),
            )
        }
        .to_vec()
    };
    ConnParam {
        private_data,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: p.flow_control,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: p.srq != 0,
        qp_num: p.qp_num,
    }
}

/// For a synchronous ID: waits for its next event, keeps it in `id->event` (acking the one
/// before), and maps it to the call's result as librdmacm's `ucma_complete` does.
///
/// # Safety
/// `id` is a live ID of ours.
unsafe fn complete(id: *mut rdma_cm_id, want: CmEventType) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    let Some(ch) = st.sync() else { return 0 };
    // SAFETY: as above: the ID's fields are the library's to write for a sync ID.
    unsafe {
        if !(*id).event.is_null() {
            ferroce_rdma_ack_cm_event((*id).event);
            (*id).event = core::ptr::null_mut();
        }
    }
    // SAFETY: a sync ID's channel is the live one it made.
    let e = match unsafe { next_event(ch as *mut rdma_event_channel) } {
        Ok(e) => e,
        Err(e) => return fail_int(e),
    };
    // SAFETY: `e` is the event just made; `id` is live.
    let (kind, status) = unsafe {
        (*id).event = e;
        ((*e).event, (*e).status)
    };
    if kind == want as u32 {
        0
    } else if kind == CmEventType::Rejected as u32 {
        fail_int(libc::ECONNREFUSED)
    } else if status < 0 {
        fail_int(-status)
    } else {
        fail_int(if status == 0 { libc::EINVAL } else { status })
    }
}

/// The event channels not destroyed, by address: `rdma_get_cm_event` on a destroyed one fails
/// with EBADF, as librdmacm's read(2) of the closed descriptor does, instead of reading freed
/// memory (rdma-core 44's rping calls it after its main thread destroyed the channel, a race
/// upstream fixed in rping, rdma-core 61).
static LIVE_CHANNELS: std::sync::LazyLock<Mutex<std::collections::HashSet<usize>>> =
    std::sync::LazyLock::new(|| Mutex::new(std::collections::HashSet::new()));

/// `rdma_create_event_channel`.
#[unsafe(no_mangle)]
pub extern "C" fn ferroce_rdma_create_event_channel() -> *mut rdma_event_channel {
    cm_init();
    match EventChannel::new() {
        Ok(ch) => {
            let p = Chan::into_raw(rdma_event_channel { fd: ch.fd() }, ch);
            LIVE_CHANNELS.lock().insert(p as usize);
            p
        }
        Err(e) => {
            set_errno(e.errno());
            core::ptr::null_mut()
        }
    }
}

/// `rdma_destroy_event_channel`.
///
/// # Safety
/// `ch` is a live channel of ours with no IDs left.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    if ch.is_null() {
        return;
    }
    let mut live = LIVE_CHANNELS.lock();
    if !live.remove(&(ch as usize)) {
        log::debug!("rdma_destroy_event_channel: {ch:p} is not a live channel (destroyed twice?)");
        return;
    }
    // It was live (in the set, removed under its lock, so no `next_event` is taking a handle).
    // SAFETY: `ch` is a live channel of ours the program gives up with this call (verbs' rule).
    unsafe { Chan::free(ch) };
}

/// `rdma_create_id`: `channel` NULL makes a synchronous ID.
///
/// # Safety
/// `id` is valid for writing; `channel` is NULL or a live channel of ours.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: u32,
) -> c_int {
    cm_init();
    let Some(ps) = PortSpace::from_raw(ps) else {
        log::debug!("rdma_create_id: port space {ps:#x} is none of rdma_cm's");
        return fail_int(libc::EINVAL);
    };
    if id.is_null() {
        return fail_int(libc::EINVAL);
    }
    let (ch, sync) = if channel.is_null() {
        let c = ferroce_rdma_create_event_channel();
        if c.is_null() {
            return -1;
        }
        (c, true)
    } else {
        (channel, false)
    };
    // SAFETY: `ch` is a live channel of ours (made above, or the caller's).
    let rust_ch = unsafe { Chan::rust(ch) };
    let r = match CmId::new(rust_ch, ps) {
        Ok(r) => r,
        Err(e) => return err_int(&e),
    };
    let c = new_c_id(r, ch, context);
    if sync {
        // SAFETY: `c` was just made.
        unsafe { Id::rust(c) }.sync_set(ch);
    }
    // SAFETY: `id` is valid for writing (the caller's contract).
    unsafe { *id = c };
    0
}

impl IdState {
    /// The ID's own channel if it is synchronous.
    fn sync(&self) -> Option<usize> {
        Some(self.sync.load(Ordering::Acquire)).filter(|c| *c != 0)
    }

    /// Makes the ID synchronous on its own channel `ch`, or asynchronous (NULL).
    fn sync_set(&self, ch: *mut rdma_event_channel) {
        self.sync.store(ch as usize, Ordering::Release);
    }
}

/// `rdma_destroy_id`.
///
/// # Safety
/// `id` is a live ID of ours, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    // Out of the live set first, under its lock: a second destroy finds it gone.
    if id.is_null() || !LIVE_IDS.lock().remove(&(id as usize)) {
        log::debug!("rdma_destroy_id: {id:p} is no live rdma_cm_id (destroyed twice?): EINVAL");
        return fail_int(libc::EINVAL);
    }
    // This call alone took `id` out of LIVE_IDS: it frees the box below, nobody else does.
    // SAFETY: `id` was in LIVE_IDS, so it is an ID box of ours (made by `new_c_id`) not yet freed.
    let st = unsafe { Id::rust(id) };
    st.id.set_user_context(0);
    st.id.destroy();
    let sync = st.sync();
    // SAFETY: `id` is live until freed below; its pending event is ours to ack.
    unsafe {
        if !(*id).event.is_null() {
            ferroce_rdma_ack_cm_event((*id).event);
        }
        Id::free(id);
    }
    if let Some(ch) = sync {
        // SAFETY: a sync ID's channel is its own, made at creation, used by nobody else.
        unsafe { ferroce_rdma_destroy_event_channel(ch as *mut rdma_event_channel) };
    }
    0
}

/// `rdma_bind_addr`.
///
/// # Safety
/// `id` is live; `addr` points to a sockaddr of its family's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_bind_addr(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    // SAFETY: as above.
    let Some(a) = (unsafe { sockaddr_of(addr) }) else {
        return fail_int(libc::EINVAL);
    };
    if let Err(e) = st.id.bind_addr(a) {
        return err_int(&e);
    }
    // SAFETY: `id` is live.
    unsafe { sync_fields(id, &st.id) };
    0
}

/// `struct ibv_ece` (rdma-core 31+): an Enhanced Connection Establishment offer.
#[repr(C)]
pub struct ibv_ece {
    /// The IEEE OUI of the vendor whose options these are; 0 for none.
    pub vendor_id: u32,
    /// The vendor's option bits.
    pub options: u32,
    /// Must be 0.
    pub comp_mask: u32,
}

/// `rdma_set_local_ece`: librdmacm's checks (EINVAL for an ID with a QP, no ECE, vendor 0 or
/// a comp_mask), then accepted. ferroce's CM carries no ECE on the wire, so the peer sees
/// none, as from a kernel rdma_cm peer that sets none; rxe, like ferroce's QPs, has no ECE
/// options to negotiate (`ibv_set_ece` is EOPNOTSUPP on both).
///
/// # Safety
/// `id` is NULL or live; `ece` is NULL or an `ibv_ece`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_set_local_ece(
    id: *mut rdma_cm_id,
    ece: *const ibv_ece,
) -> c_int {
    if !live_or_null(id, "rdma_set_local_ece") {
        return fail_int(libc::EINVAL);
    }
    // `id` is NULL or a live rdma_cm_id (checked), `ece` NULL or an aligned ibv_ece.
    // SAFETY: both are NULL (None) or valid to read for this call.
    let (id, ece) = unsafe { (id.as_ref(), ece.as_ref()) };
    match (id, ece) {
        (Some(id), Some(e)) if id.qp.is_null() && e.vendor_id != 0 && e.comp_mask == 0 => 0,
        _ => {
            log::debug!(
                "rdma_set_local_ece: no ID or ECE, an ID with a QP, vendor 0 or a comp_mask: EINVAL"
            );
            fail_int(libc::EINVAL)
        }
    }
}

/// `rdma_get_remote_ece`: the peer's ECE as librdmacm reports it — none (vendor 0): ferroce's
/// CM does not read ECE off the wire. EINVAL for an ID with a QP, as librdmacm.
///
/// # Safety
/// `id` is NULL or live; `ece` is NULL or a writable `ibv_ece`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_get_remote_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    if !live_or_null(id, "rdma_get_remote_ece") {
        return fail_int(libc::EINVAL);
    }
    // `id` is NULL or a live rdma_cm_id (checked), `ece` NULL or an aligned ibv_ece.
    // SAFETY: both NULL (None) or valid; `ece` is the caller's, writable, aliased by nothing.
    let (id, ece) = unsafe { (id.as_ref(), ece.as_mut()) };
    match (id, ece) {
        (Some(id), Some(e)) if id.qp.is_null() => {
            *e = ibv_ece {
                vendor_id: 0,
                options: 0,
                comp_mask: 0,
            };
            0
        }
        _ => {
            log::debug!("rdma_get_remote_ece: no ID or ECE, or an ID with a QP: EINVAL");
            fail_int(libc::EINVAL)
        }
    }
}

/// `rdma_resolve_addr`.
///
/// # Safety
/// `id` is live; `src` is NULL or a sockaddr; `dst` a sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    timeout_ms: c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    // SAFETY: as above.
    let (s, d) = unsafe { (sockaddr_of(src), sockaddr_of(dst)) };
    let Some(d) = d else {
        return fail_int(libc::EINVAL);
    };
    let t = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0));
    if let Err(e) = st.id.resolve_addr(s, d, t) {
        return err_int(&e);
    }
    // SAFETY: `id` is live.
    unsafe { complete(id, CmEventType::AddrResolved) }
}

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    /// `RDMA_CM_JOIN_MC_ATTR_ADDRESS` (1) | `RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS` (2).
    pub comp_mask: u32,
    /// `enum rdma_cm_mc_join_flags`.
    pub join_flags: u32,
    /// The group's address.
    pub addr: *mut libc::sockaddr,
}

/// Joins as `rdma_join_multicast2` does, then waits for the event on a synchronous ID.
///
/// # Safety
/// `id` is live; `addr` NULL or a sockaddr.
unsafe fn join(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    flag: McJoinFlag,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    // SAFETY: as above.
    let Some(a) = (unsafe { sockaddr_of(addr) }) else {
        return fail_int(libc::EINVAL);
    };
    if let Err(e) = st.id.join_multicast(a, flag, context as usize) {
        return err_int(&e);
    }
    // SAFETY: `id` is live.
    unsafe { complete(id, CmEventType::MulticastJoin) }
}

/// `rdma_join_multicast`: joins as a full member.
///
/// # Safety
/// `id` is live; `addr` a sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { join(id, addr, McJoinFlag::Fullmember, context) }
}

/// `rdma_join_multicast_ex`: the address and join flags from `attr` (both required, as
/// librdmacm: EINVAL without them, ENOTSUP for unknown comp_mask bits).
///
/// # Safety
/// `id` is live; `attr` points to an `rdma_cm_join_mc_attr_ex`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    const ADDRESS: u32 = 1;
    const JOIN_FLAGS: u32 = 2;
    if attr.is_null() {
        return fail_int(libc::EINVAL);
    }
    // SAFETY: `attr` points to the caller's struct (non-null, checked).
    let (mask, flags, addr) = unsafe { ((*attr).comp_mask, (*attr).join_flags, (*attr).addr) };
    if mask >= 4 {
        log::debug!("rdma_join_multicast_ex: comp_mask {mask:#x} has unknown bits");
        return fail_int(libc::EOPNOTSUPP);
    }
    let flag = McJoinFlag::from_raw(flags);
    let (true, true, Some(flag)) = (mask & ADDRESS != 0, mask & JOIN_FLAGS != 0, flag) else {
        log::debug!(
            "rdma_join_multicast_ex: the address and join flags are required (comp_mask \
             {mask:#x}, join_flags {flags})"
        );
        return fail_int(libc::EINVAL);
    };
    // SAFETY: the caller's contract; `addr` is the struct's sockaddr.
    unsafe { join(id, addr, flag, context) }
}

/// `rdma_leave_multicast`: EADDRNOTAVAIL if the ID has not joined `addr`.
///
/// # Safety
/// `id` is live; `addr` a sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    // SAFETY: as above.
    let Some(a) = (unsafe { sockaddr_of(addr) }) else {
        return fail_int(libc::EINVAL);
    };
    match st.id.leave_multicast(a) {
        Ok(()) => 0,
        Err(e) => err_int(&e),
    }
}

/// `rdma_resolve_route`.
///
/// # Safety
/// `id` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_resolve_route(
    id: *mut rdma_cm_id,
    timeout_ms: c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    let t = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0));
    if let Err(e) = st.id.resolve_route(t) {
        return err_int(&e);
    }
    // SAFETY: `id` is live.
    unsafe { complete(id, CmEventType::RouteResolved) }
}

/// `rdma_listen`.
///
/// # Safety
/// `id` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    if let Err(e) = st.id.listen(backlog) {
        return err_int(&e);
    }
    // SAFETY: `id` is live.
    unsafe { sync_fields(id, &st.id) };
    0
}

/// `rdma_create_qp`: CQs (with `cq_context` = the ID) and a completion channel each are made
/// when the attributes name none; the PD is the device's when `pd` is NULL.
///
/// # Safety
/// `id` is live; `pd` NULL or a live PD of ours; `attr` valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    if attr.is_null() {
        return fail_int(libc::EINVAL);
    }
    // SAFETY: `id` is live; `attr` valid (the caller's contract).
    unsafe {
        sync_fields(id, &st.id);
        let pd = if pd.is_null() { (*id).pd } else { pd };
        if pd.is_null() || !(*id).qp.is_null() {
            log::debug!("rdma_create_qp: no PD (the ID is on no device) or a QP already");
            return fail_int(libc::EINVAL);
        }
        let mut a = *attr;
        let verbs = (*pd).context;
        for (cq, chan, n) in [
            (
                &raw mut a.send_cq,
                &raw mut (*id).send_cq_channel,
                a.cap.max_send_wr,
            ),
            (
                &raw mut a.recv_cq,
                &raw mut (*id).recv_cq_channel,
                a.cap.max_recv_wr,
            ),
        ] {
            if (*cq).is_null() {
                let ch = crate::channel::ibv_create_comp_channel(verbs);
                let c = crate::cq::ibv_create_cq(verbs, n.max(1) as c_int, id.cast(), ch, 0);
                if ch.is_null() || c.is_null() {
                    return -1;
                }
                *cq = c;
                *chan = ch;
                st.made.lock().push((c as usize, ch as usize));
            }
        }
        (*id).send_cq = a.send_cq;
        (*id).recv_cq = a.recv_cq;
        let qp = crate::qp::ibv_create_qp(pd, &raw mut a);
        if qp.is_null() {
            return -1;
        }
        let q = qp_of(qp);
        st.id.set_qp(&q.qp);
        let up = if st.id.port_space() == PortSpace::Udp {
            [
                Some(
                    ferroce::QpModify::new(QpState::Init)
                        .pkey_index(0)
                        .port_num(1)
                        .qkey(ferroce::cm::RDMA_UDP_QKEY),
                ),
                Some(ferroce::QpModify::new(QpState::Rtr)),
                Some(ferroce::QpModify::new(QpState::Rts).sq_psn(0)),
            ]
        } else {
            [
                Some(
                    ferroce::QpModify::new(QpState::Init)
                        .pkey_index(0)
                        .port_num(1)
                        .qp_access_flags(ferroce::AccessFlags::EMPTY),
                ),
                None,
                None,
            ]
        };
        for m in up.iter().flatten() {
            if let Err(e) = q.qp.modify_with(m) {
                crate::qp::ibv_destroy_qp(qp);
                return err_int(&e);
            }
        }
        crate::qp::publish_state(qp, q.qp.query().qp_state);
        (*id).qp = qp;
        (*id).pd = pd;
        *attr = a;
    }
    0
}

/// `rdma_destroy_qp`.
///
/// # Safety
/// `id` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_destroy_qp(id: *mut rdma_cm_id) {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return;
    };
    st.id.destroy_qp();
    // SAFETY: `id` is live; its QP, CQs and channels are the ones rdma_create_qp stored.
    unsafe {
        if !(*id).qp.is_null() {
            crate::qp::ibv_destroy_qp((*id).qp);
            (*id).qp = core::ptr::null_mut();
        }
        for (cq, ch) in st.made.lock().drain(..) {
            crate::cq::ibv_destroy_cq(cq as *mut ibv_cq);
            crate::channel::ibv_destroy_comp_channel(ch as *mut ibv_comp_channel);
        }
    }
}

/// `rdma_connect`.
///
/// # Safety
/// `id` is live; `param` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_connect(
    id: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    let mut p = rust_param(param);
    if !param.is_null() && p.qp_num == 0 {
        p.qp_num = st.id.qp().map_or(0, |q| q.qp_num());
    }
    if let Err(e) = st.id.connect(&p) {
        return err_int(&e);
    }
    // SAFETY: `id` is live.
    unsafe { complete(id, CmEventType::Established) }
}

/// `rdma_accept`.
///
/// # Safety
/// `id` is live; `param` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_accept(
    id: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    if let Err(e) = st.id.accept(&rust_param(param)) {
        return err_int(&e);
    }
    // SAFETY: `id` is live; its QP (if any) is live.
    unsafe {
        if !(*id).qp.is_null() && st.id.port_space() != PortSpace::Udp {
            crate::qp::publish_state((*id).qp, QpState::Rts);
        }
        complete(id, CmEventType::Established)
    }
}

/// `rdma_reject`.
///
/// # Safety
/// `id` is live; `data` holds `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_reject(
    id: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    let d = if data.is_null() {
        &[][..]
    } else {
        // SAFETY: rdma_reject's contract: data holds len bytes.
        unsafe { core::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }
    };
    match st.id.reject(d) {
        Ok(()) => 0,
        Err(e) => err_int(&e),
    }
}

/// `rdma_disconnect`.
///
/// # Safety
/// `id` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    let r = st.id.disconnect();
    // SAFETY: `id` is live; its QP (if any) is live.
    unsafe {
        if !(*id).qp.is_null() {
            crate::qp::publish_state((*id).qp, QpState::Err);
        }
    }
    match r {
        Ok(()) => 0,
        Err(e) => err_int(&e),
    }
}

/// `rdma_establish`.
///
/// # Safety
/// `id` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_establish(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    match st.id.establish() {
        Ok(()) => 0,
        Err(e) => err_int(&e),
    }
}

/// `rdma_notify`.
///
/// # Safety
/// `id` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    match st.id.notify() {
        Ok(()) => 0,
        Err(e) => err_int(&e),
    }
}

/// `rdma_get_cm_event`.
///
/// # Safety
/// `ch` is a live channel of ours; `event` valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_get_cm_event(
    ch: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    if ch.is_null() || event.is_null() {
        return fail_int(libc::EINVAL);
    }
    // SAFETY: the caller's contract.
    match unsafe { next_event(ch) } {
        Ok(e) => {
            // SAFETY: `event` is valid for writing.
            unsafe { *event = e };
            0
        }
        Err(libc::EAGAIN) => {
            set_errno(libc::EAGAIN);
            -1
        }
        Err(e) => fail_int(e),
    }
}

/// `rdma_ack_cm_event`: frees the event and its private data.
///
/// # Safety
/// `event` came from `rdma_get_cm_event` and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    if event.is_null() {
        return fail_int(libc::EINVAL);
    }
    // SAFETY: the event is an EventBox this library leaked (its first field), given back once.
    drop(unsafe { Box::from_raw(event.cast::<EventBox>()) });
    0
}

/// `rdma_event_str`.
#[unsafe(no_mangle)]
pub extern "C" fn ferroce_rdma_event_str(event: u32) -> *const c_char {
    static NAMES: OnceLock<HashMap<u32, std::ffi::CString>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        (0..16u32)
            .filter_map(|v| {
                let t = event_type(v)?;
                Some((v, std::ffi::CString::new(t.as_str()).ok()?))
            })
            .collect()
    });
    static UNKNOWN: &[u8] = b"UNKNOWN EVENT\0";
    names
        .get(&event)
        .map_or(UNKNOWN.as_ptr().cast(), |s| s.as_ptr())
}

fn event_type(v: u32) -> Option<CmEventType> {
    use CmEventType::*;
    [
        AddrResolved,
        AddrError,
        RouteResolved,
        RouteError,
        ConnectRequest,
        ConnectResponse,
        ConnectError,
        Unreachable,
        Rejected,
        Established,
        Disconnected,
        DeviceRemoval,
        MulticastJoin,
        MulticastError,
        AddrChange,
        TimewaitExit,
    ]
    .into_iter()
    .find(|t| *t as u32 == v)
}

/// `rdma_set_option`: TOS, AFONLY and ACK_TIMEOUT are honoured, REUSEADDR accepted.
///
/// # Safety
/// `id` is live; `optval` holds `optlen` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    if optval.is_null() || optlen == 0 {
        return fail_int(libc::EINVAL);
    }
    // SAFETY: optval holds at least one byte (optlen > 0).
    let byte = unsafe { *optval.cast::<u8>() };
    match (level, optname) {
        (0, 0) => st.id.set_tos(byte),
        // REUSEADDR: an int, as the kernel reads it.
        (0, 1) if optlen == core::mem::size_of::<c_int>() => {}
        (0, 2) if optlen == core::mem::size_of::<c_int>() => {
            // SAFETY: optval holds an int (optlen says so); it may be unaligned.
            let v = unsafe { optval.cast::<c_int>().read_unaligned() };
            if let Err(e) = st.id.set_afonly(v != 0) {
                return err_int(&e);
            }
        }
        (0, 3) => st.id.set_ack_timeout(byte),
        (0, 1 | 2) => {
            log::debug!("rdma_set_option: option {optname} takes an int, not {optlen} bytes");
            return fail_int(libc::EINVAL);
        }
        _ => {
            log::debug!("rdma_set_option: level {level} option {optname} not offered");
            return fail_int(libc::ENOSYS);
        }
    }
    0
}

/// `rdma_migrate_id`: the ID and its queued events move to `ch`; with `ch` NULL the ID
/// becomes synchronous on a channel of its own, and an ID that was synchronous becomes
/// asynchronous on `ch` (its own channel and kept event gone), as librdmacm does.
///
/// # Safety
/// `id` is live; `ch` NULL or a live channel of ours.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_migrate_id(
    id: *mut rdma_cm_id,
    ch: *mut rdma_event_channel,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    let old_sync = st.sync();
    if ch.is_null() && old_sync.is_some() {
        log::debug!("rdma_migrate_id: the ID is synchronous already");
        return fail_int(libc::EINVAL);
    }
    let (ch, sync) = if ch.is_null() {
        let own = ferroce_rdma_create_event_channel();
        if own.is_null() {
            return -1;
        }
        (own, true)
    } else {
        (ch, false)
    };
    // SAFETY: `ch` is a live channel of ours (the caller's, or made above); `id` live.
    unsafe { st.id.migrate(Chan::rust(ch)) };
    if let Some(old) = old_sync {
        // SAFETY: a sync ID's kept event and channel are its own: nobody else holds them, and the ID's events now go to `ch`.
        unsafe {
            if !(*id).event.is_null() {
                ferroce_rdma_ack_cm_event((*id).event);
                (*id).event = core::ptr::null_mut();
            }
            ferroce_rdma_destroy_event_channel(old as *mut rdma_event_channel);
        }
    }
    st.sync_set(if sync { ch } else { core::ptr::null_mut() });
    // SAFETY: `id` is live; `channel` is the library's field to write.
    unsafe { (*id).channel = ch };
    0
}

/// `rdma_init_qp_attr`.
///
/// # Safety
/// `id` is live; `attr` and `mask` valid for writing; `attr->qp_state` set by the caller.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(id) }) else {
        return fail_int(libc::EINVAL);
    };
    if attr.is_null() || mask.is_null() {
        return fail_int(libc::EINVAL);
    }
    // SAFETY: `attr` is valid (the caller's contract).
    let want = unsafe { (*attr).qp_state };
    let Some(s) = QpState::from_raw(want as u32) else {
        return fail_int(libc::EINVAL);
    };
    match st.id.init_qp_attr(s) {
        Ok((a, m)) => {
            // SAFETY: both out-pointers are valid for writing.
            unsafe {
                attr.write(addr::qp_attr_to_c(&a));
                *mask = m.0 as c_int;
            }
            0
        }
        Err(e) => err_int(&e),
    }
}

/// `rdma_get_src_port`.
///
/// # Safety
/// `id` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller's contract.
    unsafe { state(id) }
        .and_then(|s| s.id.local_addr())
        .map_or(0, |a| a.port().to_be())
}

/// `rdma_get_dst_port`.
///
/// # Safety
/// `id` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller's contract.
    unsafe { state(id) }
        .and_then(|s| s.id.peer_addr())
        .map_or(0, |a| a.port().to_be())
}

/// `rdma_get_devices`: a NULL-terminated array of a context per ferroce device.
///
/// # Safety
/// `num` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    let ctxs: Vec<*mut ibv_context> = ferroce::device_list()
        .iter()
        .filter_map(|d| verbs_for(d.addr).map(|v| v.0))
        .collect();
    if !num.is_null() {
        // SAFETY: `num` is valid for writing.
        unsafe { *num = ctxs.len() as c_int };
    }
    let mut v = ctxs;
    v.push(core::ptr::null_mut());
    Box::into_raw(v.into_boxed_slice()).cast()
}

/// `rdma_free_devices`.
///
/// # Safety
/// `list` came from `rdma_get_devices`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_free_devices(list: *mut *mut ibv_context) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: the list is NULL-terminated (made by rdma_get_devices).
    while !unsafe { *list.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: the boxed slice of n + 1 pointers rdma_get_devices leaked.
    drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(list, n + 1)) });
}

/// `rdma_get_request`: the next connection request of a synchronous listening ID, as a new
/// synchronous ID (with the QP `rdma_create_ep` asked for).
///
/// # Safety
/// `listen` is live; `id` valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(st) = (unsafe { state(listen) }) else {
        return fail_int(libc::EINVAL);
    };
    let Some(ch) = st.sync() else {
        log::debug!("rdma_get_request: the listening ID is not synchronous");
        return fail_int(libc::EINVAL);
    };
    loop {
        // SAFETY: a sync ID's channel is its own live one.
        let e = match unsafe { next_event(ch as *mut rdma_event_channel) } {
            Ok(e) => e,
            Err(e) => return fail_int(e),
        };
        // SAFETY: `e` is the event just made.
        let (kind, new) = unsafe { ((*e).event, (*e).id) };
        if kind != CmEventType::ConnectRequest as u32 {
            // SAFETY: an event of ours, not kept.
            unsafe { ferroce_rdma_ack_cm_event(e) };
            continue;
        }
        // SAFETY: `new` is the request's ID box, made for this event; it gets a channel of its own.
        unsafe {
            let own = ferroce_rdma_create_event_channel();
            if own.is_null() {
                return -1;
            }
            let ns = Id::rust(new);
            ns.id.migrate(Chan::rust(own));
            ns.sync_set(own);
            (*new).channel = own;
            (*new).event = e;
            if let Some((attr, pd)) = *st.ep.lock() {
                let mut a = attr;
                if ferroce_rdma_create_qp(new, pd as *mut ibv_pd, &raw mut a) != 0 {
                    return -1;
                }
            }
            *id = new;
        }
        return 0;
    }
}

/// `rdma_create_ep`: a synchronous ID for `res` — bound (passive) or resolved (active), with a
/// QP if `qp_init_attr` is given.
///
/// # Safety
/// `id` valid for writing; `res` a valid rdma_addrinfo; `pd` NULL or live; `qp_init_attr` NULL
/// or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    if id.is_null() || res.is_null() {
        return fail_int(libc::EINVAL);
    }
    // SAFETY: `res` is valid (the caller's contract).
    let r = unsafe { &*res };
    let mut c: *mut rdma_cm_id = core::ptr::null_mut();
    let ps = if r.ai_port_space != 0 {
        r.ai_port_space as u32
    } else {
        PortSpace::Tcp as u32
    };
    // SAFETY: `c` is a valid out-pointer.
    if unsafe {
        ferroce_rdma_create_id(core::ptr::null_mut(), &raw mut c, core::ptr::null_mut(), ps)
    } != 0
    {
        return -1;
    }
    // SAFETY: `c` was just made; the addresses of `res` are valid sockaddrs or NULL.
    let rc = unsafe {
        if r.ai_flags & RAI_PASSIVE != 0 {
            let rc = ferroce_rdma_bind_addr(c, r.ai_src_addr);
            if rc == 0 && !qp_init_attr.is_null() {
                // librdmacm: the QP type is the address's.
                (*qp_init_attr).qp_type = r.ai_qp_type;
                let st = Id::rust(c);
                let pd = if pd.is_null() { (*c).pd } else { pd };
                *st.ep.lock() = Some((*qp_init_attr, pd as usize));
            }
            rc
        } else {
            let mut rc = ferroce_rdma_resolve_addr(c, r.ai_src_addr, r.ai_dst_addr, 2000);
            if rc == 0 {
                rc = ferroce_rdma_resolve_route(c, 2000);
            }
            if rc == 0 && !qp_init_attr.is_null() {
                (*qp_init_attr).qp_type = r.ai_qp_type;
                rc = ferroce_rdma_create_qp(c, pd, qp_init_attr);
            }
            rc
        }
    };
    if rc != 0 {
        // SAFETY: `c` is ours and unused by anyone else.
        unsafe { ferroce_rdma_destroy_id(c) };
        return -1;
    }
    // SAFETY: `id` is valid for writing.
    unsafe { *id = c };
    0
}

/// `rdma_destroy_ep`.
///
/// # Safety
/// `id` is live and not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_destroy_ep(id: *mut rdma_cm_id) {
    // SAFETY: the caller's contract.
    unsafe {
        ferroce_rdma_destroy_qp(id);
        ferroce_rdma_destroy_id(id);
    }
}

/// `rdma_create_srq`: an SRQ on the ID's PD, kept in `id->srq`.
///
/// # Safety
/// `id` is live; `pd` NULL or live; `attr` valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    if id.is_null() || attr.is_null() || !live_or_null(id, "rdma_create_srq") {
        return fail_int(libc::EINVAL);
    }
    // SAFETY: `id` is live (checked); `attr` valid.
    unsafe {
        let pd = if pd.is_null() { (*id).pd } else { pd };
        if pd.is_null() {
            return fail_int(libc::EINVAL);
        }
        let srq = crate::srq::ibv_create_srq(pd, attr);
        if srq.is_null() {
            return -1;
        }
        (*id).srq = srq;
    }
    0
}

/// `rdma_destroy_srq`.
///
/// # Safety
/// `id` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_destroy_srq(id: *mut rdma_cm_id) {
    if !live_or_null(id, "rdma_destroy_srq") {
        return;
    }
    // SAFETY: `id` is NULL or live (checked); its SRQ is the one rdma_create_srq stored.
    unsafe {
        if !id.is_null() && !(*id).srq.is_null() {
            crate::srq::ibv_destroy_srq((*id).srq);
            (*id).srq = core::ptr::null_mut();
        }
    }
}

/// `rdma_create_qp_ex`: as `rdma_create_qp` with the base attributes (PD from the attributes).
///
/// # Safety
/// `id` is live; `attr` valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    if attr.is_null() {
        return fail_int(libc::EINVAL);
    }
    // SAFETY: `attr` is valid (the caller's contract).
    let a = unsafe { &*attr };
    let mut base = ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    let pd = if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
        a.pd
    } else {
        core::ptr::null_mut()
    };
    // Creation flags as ibv_create_qp_ex takes them (mckey -l asks BLOCK_SELF_MCAST_LB).
    let flags = if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 {
        a.create_flags
    } else {
        0
    };
    if flags & !IBV_QP_CREATE_BLOCK_SELF_MCAST_LB != 0 {
        log::debug!(
            "rdma_create_qp_ex: create_flags {:#x} are not offered (EOPNOTSUPP)",
            flags & !IBV_QP_CREATE_BLOCK_SELF_MCAST_LB
        );
        return fail_int(libc::EOPNOTSUPP);
    }
    // SAFETY: `id` is a live CM ID of ours (this function's contract), `pd` is NULL or a live PD of ours, and `base` is a local ibv_qp_init_attr valid for reading and writing.
    let r = unsafe { ferroce_rdma_create_qp(id, pd, &raw mut base) };
    if r != 0 || flags == 0 {
        return r;
    }
    // SAFETY: the call above succeeded, so `id` holds its new live QP.
    let qp = unsafe { (*id).qp };
    // SAFETY: `qp` is the live QP just made.
    match unsafe { crate::qp::apply_create_flags(qp, flags) } {
        0 => 0,
        e => {
            // SAFETY: `id` holds the QP just made, handed to no one yet.
            unsafe { ferroce_rdma_destroy_qp(id) };
            fail_int(e)
        }
    }
}
