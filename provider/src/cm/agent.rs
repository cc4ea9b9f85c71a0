//! The CM agent of one device in this process: its QP1, the [`CmEngine`], the thread that
//! runs them, and the maps from the engine's comm IDs and listened ServiceIDs to [`CmId`]s.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use ferroce_transport::cm::{CmConfig, CmEngine, CmEvent as EngineEvent, CommId, DepthCaps};
use ferroce_transport::{
    AccessFlags, InlineData, QpCap, QpModify, QpState, QpType, RecvWr, SendFlags, SendWr, UdDest,
    WcOpcode, WcStatus,
};
use ferroce_wire::{GRH_LEN, GrhPacket, GrhRepr, MAD_LEN};
use parking_lot::{Condvar, Mutex};

use super::id::IdInner;
use crate::{
    CompletionChannel, CompletionQueue, Context, Device, MemoryRegion, QpInitAttr, QueuePair,
    Result,
};

const RECVS: usize = 64;
const SLOT: usize = GRH_LEN + MAD_LEN;

/// An agent of this process: its device's address, the agent, the mark of its teardown.
type AgentEntry = (IpAddr, Weak<Agent>, Arc<Gone>);

/// The agents of this process.
static AGENTS: Mutex<Vec<AgentEntry>> = Mutex::new(Vec::new());

/// How long a new agent waits for the last one of its device to finish dropping.
const GONE_WAIT: Duration = Duration::from_secs(5);

/// Whether an agent has been dropped whole, its QP1 destroyed. A device has one QP1, and the
/// last holder of an agent (its own thread, or a program dropping its last ID) may still be
/// dropping it on another thread when the next ID of the device asks for an agent: the new
/// one waits for the mark before it creates its QP1.
#[derive(Default)]
struct Gone {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Gone {
    /// Whether the agent is gone.
    fn is_done(&self) -> bool {
        *self.done.lock()
    }

    /// Waits until the agent is gone, at most `bound`; whether it is.
    fn wait(&self, bound: Duration) -> bool {
        let deadline = std::time::Instant::now() + bound;
        let mut done = self.done.lock();
        while !*done {
            if self.cv.wait_until(&mut done, deadline).timed_out() {
                break;
            }
        }
        *done
    }
}

/// An agent's last field: dropped after its QP1 (fields drop in order), it marks it gone.
struct GoneOnDrop(Arc<Gone>);

impl Drop for GoneOnDrop {
    fn drop(&mut self) {
        *self.0.done.lock() = true;
        self.0.cv.notify_all();
    }
}

/// In a forked child ([`crate::fork`]): forgets the parent's agents, never dropping them, so
/// the child's first ID on a device makes its own.
pub(crate) fn forget_agents() {
    if AGENTS.is_locked() {
        // In a forked child only the forking thread runs, and fork is the program's call,
        // never made inside this module's critical sections.
        // SAFETY: a held lock belongs to a parent thread the child does not have.
        unsafe { AGENTS.force_unlock() };
    }
    std::mem::forget(std::mem::take(&mut *AGENTS.lock()));
}

/// Tears down every connection this process's CM agents still hold, on the wire, before
/// the process goes — what the kernel does when a process's rdma_cm file closes (DREPs for
/// DREQs received, DREQs for established connections, rejects for pending requests), so the
/// peers of a program that exits without destroying its IDs learn of it at once instead of
/// after their DREQ timeout. The MADs are sent before this returns, and DREQs not yet
/// answered (also those of IDs destroyed before) are sent again while it waits for their
/// DREPs, at most 300 ms. Call it at exit (the C ABI runs it when the library is unloaded);
/// the IDs are unusable afterwards.
pub fn shutdown() {
    let wait = Duration::from_millis(100);
    let agents: Vec<Arc<Agent>> = match AGENTS.try_lock_for(wait) {
        Some(all) => all.iter().filter_map(|(_, w, _)| w.upgrade()).collect(),
        None => return,
    };
    let mut live = Vec::with_capacity(agents.len());
    for a in agents {
        let now = a.now();
        // The agent's thread may hold the engine for a moment; a wedged one is left alone
        // rather than hanging the exit.
        let Some(mut e) = a.engine.try_lock_for(wait) else {
            log::debug!(
                "rdma_cm shutdown: the CM of {} is busy; skipped",
                a.device.addr
            );
            continue;
        };
        let n = e.len();
        e.destroy_all(now);
        drop(e);
        if n > 0 {
            log::debug!(
                "rdma_cm shutdown: {n} connections on {} torn down",
                a.device.addr
            );
        }
        a.flush();
        // A MAD for a process on this address went to the address's QP1: if that is this
        // process (the role holder), forward it now, not after the process is gone.
        a.ctx.shared.receive_now();
        live.push(a);
    }
    linger(&live);
}

/// How long an exiting process waits for the DREPs of its DREQs, and how often it sends them
/// again meanwhile. Without loss the DREP comes within a millisecond or two (when the peer's
/// program calls `rdma_disconnect`); the bound only matters to a peer that never answers.
const LINGER: Duration = Duration::from_millis(300);
const LINGER_RESEND: Duration = Duration::from_millis(50);

/// Waits (at most [`LINGER`]) until every DREQ of `agents` is answered, sending them again
/// every [`LINGER_RESEND`]: the kernel's CM goes on retrying a DREQ after its process is gone,
/// this process's cannot, and a peer whose one DREQ was lost would wait for ever.
fn linger(agents: &[Arc<Agent>]) {
    let start = std::time::Instant::now();
    let mut resent = start;
    loop {
        let unanswered: usize = agents
            .iter()
            .map(|a| a.engine.lock().dreqs_unanswered())
            .sum();
        if unanswered == 0 {
            return;
        }
        if start.elapsed() >= LINGER {
            log::debug!(
                "rdma_cm shutdown: {unanswered} DREQs still unanswered after {LINGER:?}; \
                 leaving"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
        for a in agents {
            // The agent's thread takes the DREPs off its CQ; this only moves the datagrams.
            a.ctx.shared.receive_now();
            if resent.elapsed() >= LINGER_RESEND {
                a.engine.lock().resend_dreqs();
                a.flush();
            }
        }
        if resent.elapsed() >= LINGER_RESEND {
            resent = std::time::Instant::now();
        }
    }
}

pub(crate) struct Agent {
    pub(crate) ctx: Context,
    pub(crate) device: Device,
    _chan: CompletionChannel,
    cq: CompletionQueue,
    /// Test only: holds the agent's drop before its QP1 goes, while a test looks.
    #[cfg(test)]
    stall: tests::Stall,
    qp1: QueuePair,
    mr: MemoryRegion,
    pub(crate) engine: Mutex<CmEngine>,
    start: std::time::Instant,
    pub(crate) caps: DepthCaps,
    /// Comm ID → the ID it belongs to.
    pub(crate) conns: Mutex<HashMap<CommId, Weak<IdInner>>>,
    /// Listened ServiceID → the listening ID.
    pub(crate) listeners: Mutex<HashMap<u64, Weak<IdInner>>>,
    /// Last, so it drops after `qp1`: marks the agent gone.
    gone: GoneOnDrop,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmAgent")
            .field("device", &self.device.addr)
            .finish()
    }
}

impl Agent {
    /// The agent of `device` in this process, started on first use.
    pub(crate) fn of(device: &Device) -> Result<Arc<Agent>> {
        let mut all = AGENTS.lock();
        if let Some(a) = all
            .iter()
            .filter(|(ip, ..)| *ip == device.addr)
            .find_map(|(_, w, _)| w.upgrade())
        {
            return Ok(a);
        }
        // The device's earlier agents are dropped or being dropped: their QP1s gone first.
        for (_, _, gone) in all.iter().filter(|(ip, ..)| *ip == device.addr) {
            #[cfg(test)]
            tests::WAITED.lock().push(device.addr);
            if !gone.wait(GONE_WAIT) {
                log::debug!(
                    "rdma_cm: the last CM agent on {} is still being dropped after {GONE_WAIT:?}",
                    device.addr
                );
            }
        }
        // Entries go once their agents are gone whole (another device's may still be
        // dropping: its next agent must find the mark).
        all.retain(|(_, w, gone)| w.strong_count() > 0 || !gone.is_done());
        let a = Arc::new(Agent::start(device)?);
        all.push((device.addr, Arc::downgrade(&a), a.gone.0.clone()));
        let weak = Arc::downgrade(&a);
        crate::sys::spawn_quiet("ferroce-cm".into(), move || {
            while let Some(a) = weak.upgrade() {
                a.run_once();
            }
        })?;
        Ok(a)
    }

    fn start(device: &Device) -> Result<Agent> {
        let ctx = device.open()?;
        let pd = ctx.alloc_pd();
        let chan = ctx.create_comp_channel()?;
        let cq = ctx.create_cq(4 * RECVS as u32, Some(&chan))?;
        let qp1 = pd.create_gsi_qp(&QpInitAttr {
            qp_type: QpType::Ud,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 2 * RECVS as u32,
                max_recv_wr: RECVS as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: MAD_LEN as u32,
            },
            sq_sig_all: false,
        })?;
        qp1.modify_with(
            &QpModify::new(QpState::Init)
                .pkey_index(0)
                .qkey(ferroce_wire::GSI_QKEY),
        )?;
        qp1.modify_with(&QpModify::new(QpState::Rtr))?;
        qp1.modify_with(&QpModify::new(QpState::Rts).sq_psn(0))?;
        let mr = pd.reg_mr(RECVS * SLOT, AccessFlags::LOCAL_WRITE)?;
        for i in 0..RECVS {
            qp1.post_recv(&RecvWr::new(i as u64, mr.sge(i * SLOT, SLOT as u32)))?;
        }
        let mut seed = [0u8; 8];
        crate::mr::fill_random(&mut seed)?;
        let attr = ctx.query_device();
        let caps = DepthCaps {
            max_qp_rd_atom: u8::try_from(attr.max_qp_rd_atom).unwrap_or(u8::MAX),
            max_qp_init_rd_atom: u8::try_from(attr.max_qp_init_rd_atom).unwrap_or(u8::MAX),
        };
        let engine = CmEngine::new(CmConfig {
            ca_guid: device.node_guid(),
            comm_id_prefix: ctx.gsi_slot(),
            local_ca_ack_delay: 15,
            seed: u64::from_le_bytes(seed),
        });
        log::debug!(
            "rdma_cm: CM agent on {} (slot {})",
            device.addr,
            ctx.gsi_slot()
        );
        cq.req_notify(false)?;
        Ok(Agent {
            ctx,
            device: device.clone(),
            _chan: chan,
            cq,
            #[cfg(test)]
            stall: tests::Stall::default(),
            qp1,
            mr,
            engine: Mutex::new(engine),
            start: std::time::Instant::now(),
            caps,
            conns: Mutex::new(HashMap::new()),
            listeners: Mutex::new(HashMap::new()),
            gone: GoneOnDrop(Arc::new(Gone::default())),
        })
    }

    /// The engine's clock.
    pub(crate) fn now(&self) -> ferroce_transport::Instant {
        ferroce_transport::Instant::from_nanos(
            u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX),
        )
    }

    /// One turn of the agent's thread: MADs in, timers, MADs and events out; sleeps until the
    /// next MAD or timer (at most 100 ms, so a dropped agent's thread ends soon).
    fn run_once(self: &Arc<Self>) {
        let now = self.now();
        let wait = self
            .engine
            .lock()
            .poll_timeout()
            .map_or(Duration::from_millis(100), |t| {
                t.saturating_duration_since(now)
                    .min(Duration::from_millis(100))
            });
        if !self.receive() {
            if self._chan.get_event_quietly(wait).is_some() {
                self.cq.ack_events(1);
                let _ = self.cq.req_notify(false);
            }
            self.receive();
        }
        let now = self.now();
        self.engine.lock().handle_timeout(now);
        self.flush();
    }

    /// Hands every received MAD to the engine; whether there was one.
    fn receive(self: &Arc<Self>) -> bool {
        let mut any = false;
        while let Some(wc) = self.cq.poll_one() {
            any = true;
            if wc.opcode != WcOpcode::Recv {
                if wc.status != WcStatus::Success {
                    log::debug!("rdma_cm: a MAD send failed: {}", wc.status);
                }
                continue;
            }
            let i = wc.wr_id as usize % RECVS;
            if wc.status == WcStatus::Success {
                let mut buf = [0u8; SLOT];
                if self.mr.read(i * SLOT, &mut buf).is_ok() {
                    let src = GrhPacket::new_checked(&buf[..GRH_LEN])
                        .and_then(|p| GrhRepr::parse(&p))
                        .map(|g| g.src);
                    match src {
                        Ok(src) => {
                            // What arrived (a UD receive's byte_len counts the GRH): the
                            // engine drops a MAD that is not 256 bytes.
                            let end = (wc.byte_len as usize).clamp(GRH_LEN, SLOT);
                            let now = self.now();
                            self.engine.lock().handle_mad_from(
                                now,
                                src,
                                wc.src_qp,
                                &buf[GRH_LEN..end],
                            );
                        }
                        Err(e) => log::debug!("rdma_cm: a MAD with an unreadable GRH: {e}"),
                    }
                }
            }
            let _ = self
                .qp1
                .post_recv(&RecvWr::new(i as u64, self.mr.sge(i * SLOT, SLOT as u32)));
        }
        if any {
            self.flush();
        }
        any
    }

    /// Sends what the engine queued and delivers its events (never under the engine lock).
    pub(crate) fn flush(self: &Arc<Self>) {
        loop {
            let (out, events) = {
                let mut e = self.engine.lock();
                let out: Vec<_> = std::iter::from_fn(|| e.poll_transmit()).collect();
                let ev: Vec<_> = std::iter::from_fn(|| e.poll_event()).collect();
                (out, ev)
            };
            if out.is_empty() && events.is_empty() {
                return;
            }
            for o in out {
                let mut wr = SendWr::new(0, ferroce_transport::WrOpcode::Send);
                wr.send_flags = SendFlags::INLINE;
                wr.inline_data = Some(InlineData::from_slice(&o.mad));
                wr.ud = Some(UdDest {
                    ah: ferroce_transport::AhAttr::new(o.dest),
                    remote_qpn: o.dest_qpn,
                    remote_qkey: ferroce_wire::GSI_QKEY,
                });
                if let Err(e) = self.qp1.post_send(&wr) {
                    log::debug!("rdma_cm: a MAD to {} not sent: {e}", o.dest);
                }
            }
            for ev in events {
                self.deliver(ev);
            }
        }
    }

    fn deliver(self: &Arc<Self>, ev: EngineEvent) {
        let id = match &ev {
            EngineEvent::ConnectRequest { info, .. } => {
                let l = self
                    .listeners
                    .lock()
                    .get(&info.service_id)
                    .and_then(Weak::upgrade);
                return IdInner::on_request(self, l, ev);
            }
            EngineEvent::SidrRequest { service_id, .. } => {
                let l = self
                    .listeners
                    .lock()
                    .get(service_id)
                    .and_then(Weak::upgrade);
                return IdInner::on_request(self, l, ev);
            }
            EngineEvent::ConnectResponse { id, .. }
            | EngineEvent::Established { id }
            | EngineEvent::Rejected { id, .. }
            | EngineEvent::Unreachable { id }
            | EngineEvent::Disconnected { id, .. }
            | EngineEvent::TimewaitExit { id }
            | EngineEvent::SidrResponse { id, .. } => *id,
        };
        let target = self.conns.lock().get(&id).and_then(Weak::upgrade);
        match target {
            Some(t) => t.on_event(self, ev),
            None => {
                // The ID is gone (destroyed): the engine finishes the connection alone.
                if matches!(ev, EngineEvent::TimewaitExit { .. }) {
                    self.conns.lock().remove(&id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Addresses whose next agent waited for an earlier one's teardown.
    pub(super) static WAITED: Mutex<Vec<IpAddr>> = Mutex::new(Vec::new());

    /// A drop that, once armed, says it has begun and waits until released.
    #[derive(Default)]
    pub(super) struct Stall(Arc<StallCtl>);

    #[derive(Default)]
    pub(super) struct StallCtl {
        /// Armed, entered, released.
        state: Mutex<(bool, bool, bool)>,
        cv: Condvar,
    }

    impl Drop for Stall {
        fn drop(&mut self) {
            let mut s = self.0.state.lock();
            if !s.0 {
                return;
            }
            s.1 = true;
            self.0.cv.notify_all();
            while !s.2 {
                self.0.cv.wait(&mut s);
            }
        }
    }

    /// A device's next agent, asked for while the last one is being dropped on another
    /// thread (held here after its last holder let go and before its QP1 goes), waits for
    /// that QP1 to go instead of failing on it: a device has one QP1. Without the wait, the
    /// new agent's QP1 is refused ("QP1 exists").
    #[test]
    fn a_new_agent_waits_for_the_last_one_to_be_dropped() {
        let dev = Device::for_addr("127.0.236.1".parse().unwrap()).unwrap();
        let a = Agent::of(&dev).unwrap();
        let ctl = a.stall.0.clone();
        ctl.state.lock().0 = true;
        // The last holder (that thread or the agent's own) stalls in the drop.
        std::thread::spawn(move || drop(a));
        {
            let mut s = ctl.state.lock();
            while !s.1 {
                let waited = ctl.cv.wait_for(&mut s, Duration::from_secs(10));
                assert!(!waited.timed_out() || s.1, "the agent was never dropped");
            }
        }
        let addr = dev.addr;
        let next = std::thread::spawn(move || Agent::of(&dev).map(drop));
        while !next.is_finished() && !WAITED.lock().contains(&addr) {
            std::thread::yield_now();
        }
        {
            let mut s = ctl.state.lock();
            s.2 = true;
            ctl.cv.notify_all();
        }
        next.join().unwrap().unwrap();
    }
}
