//! A shard: one engine with the sending half of its backend, the runtime counters the engine
//! does not keep, and the state of the bare ACKs held for a program's answer. The driver keeps
//! it behind one lock and reaches the engine only through the methods here: the verbs
//! (`post_send`, `modify_qp`, `create_srq`…), the receive path (`receive`, `fire_timers`) and
//! the pump's steps (`build`, `next_completion`, `next_event`, `settle`). A device runs one
//! or more shards (one per core by default: `driver.rs`), each behind its own lock.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ferroce_transport::{
    AsyncEvent, Completion, Counters, Datagram, Ecn, Endpoint, EndpointConfig, Instant, QpAttr,
    QpAttrMask, QpError, QpInitAttr, QpState, RecvWr, SendWr, SrqAttr, VerbError, XrcSrq,
};

use crate::backend::Transmitter;
use crate::driver::RuntimeCounters;
use crate::host::qptable::QpRecord;
use crate::mr::{MrTable, Snapshot};

/// The longest a bare ACK waits in the send batch for the program's answer (a join pump): a
/// peer's send completes at most this much later than it would with an ACK of its own. As
/// long as the progress thread sleeps while a program polls, so that a hold never costs it a
/// wake-up of its own; a program whose ACKs are held answers within microseconds
/// ([`HOLD_AFTER`]), so this bound is for the one that stops answering.
pub(crate) const ACK_HOLD: Duration = crate::driver::INLINE_WINDOW;

/// A program "answers" a receipt when it posts a send within this time of the poll that
/// received it.
const ANSWER_WITHIN: Duration = Duration::from_micros(20);

/// Receipts in a row a program must have answered before its ACKs are held for its answer:
/// a ping-pong is held, a handshake (perftest's, whose client goes on to connect while its
/// server waits for the send completion before it listens) is not delayed.
const HOLD_AFTER: u32 = 4;

/// What one [`Shard::build`] produced.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Built {
    /// Whether any datagram was built.
    pub(crate) any: bool,
    /// Whether everything built is a bare ACK (true when nothing was).
    pub(crate) only_acks: bool,
    /// Whether the budget ran out with more possibly to build.
    pub(crate) more: bool,
}

/// What [`Shard::settle`] did with the send batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Sent (or nothing to send, or ACKs still held from before).
    Done,
    /// Bare ACKs built now wait for the program's answer, from now on: the driver must see
    /// that they leave within [`ACK_HOLD`].
    NewHold,
}

/// One engine and what goes with it (see the module's documentation).
pub(crate) struct Shard {
    engine: Endpoint,
    /// The backend's sending half: datagrams are built straight into its buffers.
    tx: Box<dyn Transmitter>,
    counters: RuntimeCounters,
    /// Since when bare ACKs wait in `tx` for the program's answer (engine ns), or `None`.
    acks_held: Option<u64>,
    /// When a program's poll last received packets that drew bare ACKs and it has not posted
    /// a send since (engine ns).
    answer_due: Option<u64>,
    /// Receipts in a row the program answered within [`ANSWER_WITHIN`].
    answer_streak: u32,
    /// The regions as this shard last saw them: the engine reaches memory through it with no
    /// lock ([`crate::mr`]).
    regions: Snapshot,
}

impl Shard {
    /// A shard with a new engine of `cfg`, sending through `tx`.
    pub(crate) fn new(cfg: EndpointConfig, tx: Box<dyn Transmitter>) -> Shard {
        Shard {
            engine: Endpoint::new(cfg),
            tx,
            counters: RuntimeCounters::default(),
            acks_held: None,
            answer_due: None,
            answer_streak: 0,
            regions: Snapshot::default(),
        }
    }

    /// Takes the device's current regions (`ibv_dereg_mr` and `ibv_rereg_mr` call this on every
    /// shard, under its lock, before they return: no shard holds the old region after).
    pub(crate) fn renew_regions(&mut self, mrs: &MrTable) {
        self.regions.renew(mrs);
    }

    // ---- Verbs ----

    /// `ibv_create_qp` (QP1 if `gsi`).
    pub(crate) fn create_qp(&mut self, init: QpInitAttr, gsi: bool) -> Result<u32, VerbError> {
        if gsi {
            self.engine.create_gsi_qp(init)
        } else {
            self.engine.create_qp(init)
        }
    }

    /// `ibv_destroy_qp`; its unfinished work is dropped.
    pub(crate) fn destroy_qp(&mut self, qpn: u32) {
        let _ = self.engine.destroy_qp(qpn);
    }

    /// The QP's first error since RESET and why.
    pub(crate) fn qp_error(&self, qpn: u32) -> Option<QpError> {
        self.engine.qp_error(qpn)
    }

    /// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB` for QP `qpn`.
    pub(crate) fn block_self_mcast_lb(&mut self, qpn: u32) -> Result<(), VerbError> {
        self.engine.block_self_mcast_lb(qpn)
    }

    /// `ibv_attach_mcast` in the engine: whether the QP was not attached before.
    pub(crate) fn attach_mcast(&mut self, qpn: u32, group: IpAddr) -> Result<bool, VerbError> {
        self.engine.attach_mcast(qpn, group)
    }

    /// `ibv_detach_mcast` in the engine: whether no QP is attached to `group` any more.
    pub(crate) fn detach_mcast(&mut self, qpn: u32, group: IpAddr) -> Result<bool, VerbError> {
        self.engine.detach_mcast(qpn, group)
    }

    /// Whether any QP is attached to `group`.
    pub(crate) fn mcast_attached(&self, group: IpAddr) -> bool {
        self.engine.mcast_attached(group)
    }

    /// `ibv_modify_qp`.
    pub(crate) fn modify_qp(
        &mut self,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
        mrs: &MrTable,
        now: Instant,
    ) -> Result<(), VerbError> {
        self.engine
            .modify_qp(qpn, attr, mask, &self.regions.view(mrs), now)
    }

    /// `ibv_query_qp`.
    pub(crate) fn query_qp(&self, qpn: u32) -> Option<QpAttr> {
        self.engine.query_qp(qpn)
    }

    /// Request PSNs of QP `qpn` not yet acknowledged.
    pub(crate) fn unacked_psns(&self, qpn: u32) -> u32 {
        self.engine.unacked_psns(qpn)
    }

    /// `ibv_post_send` for a list: posts in order and stops at the first refused WR, returned
    /// with its index. A send answers what the program's last poll received
    /// ([`Shard::settle`]): ACKs held for it leave with it.
    pub(crate) fn post_send(
        &mut self,
        qpn: u32,
        wrs: &[SendWr],
        mrs: &MrTable,
        now: Instant,
    ) -> Result<(), (usize, VerbError)> {
        self.note_answer(now);
        let mem = self.regions.view(mrs);
        for (index, wr) in wrs.iter().enumerate() {
            self.engine
                .post_send(qpn, wr, &mem, now)
                .map_err(|e| (index, e))?;
        }
        Ok(())
    }

    /// `ibv_post_recv`.
    pub(crate) fn post_recv(
        &mut self,
        qpn: u32,
        wr: &RecvWr,
        mrs: &MrTable,
        now: Instant,
    ) -> Result<(), VerbError> {
        self.engine
            .post_recv(qpn, wr.clone(), &self.regions.view(mrs), now)
    }

    /// `ibv_create_srq`: its number.
    pub(crate) fn create_srq(&mut self, attr: SrqAttr) -> u32 {
        self.engine.create_srq(attr)
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: its number.
    pub(crate) fn create_xrc_srq(&mut self, attr: SrqAttr, xrc: XrcSrq) -> u32 {
        self.engine.create_xrc_srq(attr, xrc)
    }

    /// `ibv_destroy_srq`.
    pub(crate) fn destroy_srq(&mut self, srqn: u32) {
        let _ = self.engine.destroy_srq(srqn);
    }

    /// Whether a QP receives through SRQ `srqn`.
    pub(crate) fn srq_in_use(&self, srqn: u32) -> bool {
        self.engine.srq_in_use(srqn)
    }

    /// Whether a QP reports to CQ `cq`.
    pub(crate) fn cq_in_use(&self, cq: u32) -> bool {
        self.engine.cq_in_use(cq)
    }

    /// `ibv_post_srq_recv`.
    pub(crate) fn post_srq_recv(&mut self, srqn: u32, wr: &RecvWr) -> Result<(), VerbError> {
        self.engine.post_srq_recv(srqn, wr.clone())
    }

    /// `ibv_modify_srq` with `IBV_SRQ_LIMIT`; `None` if the limit is above `max_wr`.
    pub(crate) fn arm_srq(&mut self, srqn: u32, limit: u32) -> Option<Result<(), VerbError>> {
        let max = self.engine.query_srq(srqn).map_or(0, |a| a.max_wr);
        (limit <= max).then(|| self.engine.arm_srq(srqn, limit))
    }

    /// `ibv_query_srq`.
    pub(crate) fn query_srq(&self, srqn: u32) -> Option<SrqAttr> {
        self.engine.query_srq(srqn)
    }

    // ---- Counters and the QP table ----

    /// The engine's counters (named as rxe's hw_counters).
    pub(crate) fn engine_counters(&self) -> Counters {
        *self.engine.counters()
    }

    /// The runtime counters kept here (the backend's are the driver's to add).
    pub(crate) fn runtime_counters(&self) -> RuntimeCounters {
        self.counters
    }

    /// Counts a completion dropped because its CQ was full.
    pub(crate) fn count_cq_overflow(&mut self) {
        self.counters.cq_overflows += 1;
    }

    /// This shard's QPs for `ferroce devinfo --qps` (QP1 left out; failed ones first, then by
    /// QPN), at most `max` of them, with how many there are.
    pub(crate) fn qp_records(&self, max: usize) -> (usize, Vec<QpRecord>) {
        let ep = &self.engine;
        let mut qpns: Vec<(bool, u32)> = ep
            .qpns()
            .filter(|&q| q > 1)
            .map(|q| (ep.qp_error(q).is_none(), q))
            .collect();
        let total = qpns.len();
        qpns.sort_unstable();
        let records = qpns
            .iter()
            .take(max)
            .filter_map(|&(_, qpn)| {
                let a = ep.query_qp(qpn)?;
                // RTR and later (ERR included) have a peer, if ever connected.
                let connected = a.qp_state as u32 >= QpState::Rtr as u32;
                Some(QpRecord {
                    qpn,
                    qp_type: ep.qp_type(qpn).map_or(0, |t| t as u8),
                    state: a.qp_state as u8,
                    path_mtu: a.path_mtu as u8,
                    dest_qp_num: a.dest_qp_num,
                    sq_psn: a.sq_psn,
                    rq_psn: a.rq_psn,
                    peer: a.ah_attr.filter(|_| connected).map(|ah| ah.dest),
                    error: ep
                        .qp_error(qpn)
                        .map(|e| (e.status as u8, e.wr_id, e.to_string())),
                })
            })
            .collect();
        (total, records)
    }

    // ---- The receive path and timers ----

    /// One datagram from the network for this shard's address `local_ip` (its IPv4 ID and
    /// ECN field as the backend read them).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn receive(
        &mut self,
        now: Instant,
        from: SocketAddr,
        local_ip: IpAddr,
        bytes: &[u8],
        ident: u16,
        ecn: Ecn,
        mrs: &MrTable,
    ) {
        let dg = Datagram::new(from, local_ip, bytes)
            .with_ident(ident)
            .with_ecn(ecn);
        self.engine.receive(now, dg, &self.regions.view(mrs));
    }

    /// One datagram received on multicast group `group`'s socket.
    pub(crate) fn receive_group(
        &mut self,
        now: Instant,
        from: SocketAddr,
        group: IpAddr,
        bytes: &[u8],
        mrs: &MrTable,
    ) {
        self.engine.receive(
            now,
            Datagram::new(from, group, bytes),
            &self.regions.view(mrs),
        );
    }

    /// Runs the engine's timers that are due at `now`.
    pub(crate) fn fire_timers(&mut self, now: Instant, mrs: &MrTable) {
        if self.engine.poll_timeout().is_some_and(|t| t <= now) {
            self.engine.handle_timeout(now, &self.regions.view(mrs));
        }
    }

    /// The engine's next deadline.
    pub(crate) fn deadline(&mut self) -> Option<Instant> {
        self.engine.poll_timeout()
    }

    /// Unacknowledged request PSNs of all QPs.
    pub(crate) fn inflight(&self) -> u32 {
        self.engine.inflight()
    }

    // ---- The pump's steps ----

    /// Builds up to `budget` datagrams into the send batch.
    pub(crate) fn build(&mut self, now: Instant, mrs: &MrTable, budget: usize) -> Built {
        let mut b = Built {
            any: false,
            only_acks: true,
            more: false,
        };
        let mut left = budget;
        let mem = self.regions.view(mrs);
        while left > 0 {
            left -= 1;
            match self.engine.poll_transmit(now, self.tx.buffer(), &mem) {
                Ok(Some(t)) => {
                    b.only_acks &= crate::mmsg::is_bare_ack(self.tx.buffer()[0]);
                    b.any = true;
                    self.tx.commit(t.len, t.dst);
                }
                Ok(None) => return b,
                Err(e) => {
                    // Backend buffers are MAX_PACKET long, above MIN_TRANSMIT_BUF (a
                    // compile-time check in `backend`); this cannot happen, but is no panic.
                    log::error!("{e}");
                    return b;
                }
            }
        }
        b.more = budget > 0;
        b
    }

    /// The next completion the engine produced.
    pub(crate) fn next_completion(&mut self) -> Option<Completion> {
        self.engine.poll_completion()
    }

    /// QP `qpn`'s first error, once: the first time it is asked for since the QP failed.
    pub(crate) fn error_to_report(&mut self, qpn: u32) -> Option<QpError> {
        self.engine.qp_error_to_report(qpn)
    }

    /// The next asynchronous event the engine produced.
    pub(crate) fn next_event(&mut self) -> Option<AsyncEvent> {
        self.engine.poll_event()
    }

    /// Sends or holds what [`Shard::build`] put in the send batch. Unless `join` (a
    /// program's own receive), everything leaves now. In a join, bare ACKs wait for the
    /// program's answer once it has answered [`HOLD_AFTER`] receipts in a row within
    /// [`ANSWER_WITHIN`], for at most [`ACK_HOLD`]; anything else leaves now, ACKs held
    /// before with it and ahead of it, in the order they were built: the peer completes its
    /// send before it receives the answer, as with a NIC, which ACKs before the program
    /// answers (perftest before 23.07, waiting for both CQs on one channel with `-e`, hung
    /// otherwise). To a loopback address the batch puts them behind the answer in one train,
    /// which the peer reads whole and hands on ACKs first: the same order for the peer, one
    /// trip through the stack ([`crate::mmsg`]).
    pub(crate) fn settle(&mut self, now: Instant, join: bool, built: Built) -> Settled {
        let now = now.as_nanos();
        let expired = self
            .acks_held
            .is_some_and(|t| now.saturating_sub(t) >= ACK_HOLD.as_nanos() as u64);
        if !(join && built.only_acks && !expired) {
            self.flush();
            return Settled::Done;
        }
        if built.any && self.answer_due.replace(now).is_some() {
            // The program left the last receipt unanswered.
            self.answer_streak = 0;
        }
        if self.acks_held.is_none() && self.answer_streak < HOLD_AFTER {
            self.flush();
            Settled::Done
        } else if built.any && self.acks_held.is_none() {
            self.acks_held = Some(now);
            Settled::NewHold
        } else {
            Settled::Done
        }
    }

    /// Since when bare ACKs wait for the program's answer (engine ns), if they do.
    pub(crate) fn acks_held_since(&self) -> Option<u64> {
        self.acks_held
    }

    /// Sends everything in the send batch; ACKs held are held no more (and since they leave
    /// without an answer, the next are not held until the program answers again).
    pub(crate) fn flush(&mut self) {
        self.tx.flush();
        if self.acks_held.take().is_some() {
            self.answer_streak = 0;
        }
    }

    /// Sends the ACKs held for the program's answer, if any.
    pub(crate) fn flush_held(&mut self) {
        if self.acks_held.is_some() {
            self.flush();
        }
    }

    /// A program's send: it answers what its poll last received if it comes within
    /// [`ANSWER_WITHIN`]; ACKs held for it leave with it (the caller's pump sends them).
    fn note_answer(&mut self, now: Instant) {
        if let Some(t) = self.answer_due.take() {
            if now.as_nanos().saturating_sub(t) <= ANSWER_WITHIN.as_nanos() as u64 {
                self.answer_streak = self.answer_streak.saturating_add(1);
            } else {
                self.answer_streak = 0;
            }
        }
        self.acks_held = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A send batch that counts its flushes.
    struct Counting {
        buf: Vec<u8>,
        flushes: Arc<AtomicUsize>,
    }

    impl Transmitter for Counting {
        fn buffer(&mut self) -> &mut [u8] {
            &mut self.buf
        }
        fn commit(&mut self, _len: usize, _dst: SocketAddr) {}
        fn flush(&mut self) {
            self.flushes.fetch_add(1, Ordering::SeqCst);
        }
    }

    const ACK: Built = Built {
        any: true,
        only_acks: true,
        more: false,
    };

    fn shard() -> (Shard, Arc<AtomicUsize>) {
        let flushes = Arc::new(AtomicUsize::new(0));
        let tx = Counting {
            buf: vec![0; crate::backend::MAX_PACKET],
            flushes: flushes.clone(),
        };
        let cfg = EndpointConfig::new(IpAddr::from([127, 0, 0, 1]));
        (Shard::new(cfg, Box::new(tx)), flushes)
    }

    fn at_us(us: u64) -> Instant {
        Instant::from_nanos(us * 1000)
    }

    /// Receipts answered within ANSWER_WITHIN, from `t` µs on, 10 µs apart; returns the time
    /// after the last.
    fn answer(sh: &mut Shard, mrs: &MrTable, mut t: u64, n: u32) -> u64 {
        for _ in 0..n {
            assert_eq!(sh.settle(at_us(t), true, ACK), Settled::Done);
            sh.post_send(0, &[], mrs, at_us(t + 5)).unwrap();
            t += 10;
        }
        t
    }

    #[test]
    fn bare_acks_wait_only_for_a_program_that_answers() {
        let (mut sh, flushes) = shard();
        let mrs = MrTable::default();
        // A handshake's first receipts: every ACK leaves at once.
        let t = answer(&mut sh, &mrs, 0, HOLD_AFTER);
        assert_eq!(flushes.load(Ordering::SeqCst), HOLD_AFTER as usize);
        // A ping-pong now: the next ACK waits for the answer.
        assert_eq!(sh.settle(at_us(t), true, ACK), Settled::NewHold);
        assert_eq!(flushes.load(Ordering::SeqCst), HOLD_AFTER as usize);
        assert_eq!(sh.acks_held_since(), Some(at_us(t).as_nanos()));
        // Receiving more bare ACKs while held starts no second hold.
        assert_eq!(sh.settle(at_us(t + 1), true, ACK), Settled::Done);
        // The answer: the ACK leaves with it (the post's own pump).
        sh.post_send(0, &[], &mrs, at_us(t + 5)).unwrap();
        assert_eq!(sh.acks_held_since(), None);
        assert_eq!(sh.settle(at_us(t + 5), false, ACK), Settled::Done);
        assert_eq!(flushes.load(Ordering::SeqCst), HOLD_AFTER as usize + 1);
    }

    #[test]
    fn a_hold_ends_by_its_bound_and_the_streak_starts_again() {
        let (mut sh, flushes) = shard();
        let mrs = MrTable::default();
        let t = answer(&mut sh, &mrs, 0, HOLD_AFTER);
        assert_eq!(sh.settle(at_us(t), true, ACK), Settled::NewHold);
        let before = flushes.load(Ordering::SeqCst);
        // A poll that finds nothing once the hold is over sends the ACKs.
        let end = t + ACK_HOLD.as_micros() as u64;
        let nothing = Built {
            any: false,
            only_acks: true,
            more: false,
        };
        assert_eq!(sh.settle(at_us(end), true, nothing), Settled::Done);
        assert_eq!(flushes.load(Ordering::SeqCst), before + 1);
        assert_eq!(sh.acks_held_since(), None);
        // The program did not answer: its next ACK is not held.
        assert_eq!(sh.settle(at_us(end + 1), true, ACK), Settled::Done);
        assert_eq!(flushes.load(Ordering::SeqCst), before + 2);
    }

    #[test]
    fn a_late_answer_and_anything_but_a_bare_ack_leave_at_once() {
        let (mut sh, flushes) = shard();
        let mrs = MrTable::default();
        let t = answer(&mut sh, &mrs, 0, HOLD_AFTER - 1);
        // The last receipt before the streak is full is answered too late.
        assert_eq!(sh.settle(at_us(t), true, ACK), Settled::Done);
        let late = t + ANSWER_WITHIN.as_micros() as u64 + 1;
        sh.post_send(0, &[], &mrs, at_us(late)).unwrap();
        assert_eq!(sh.settle(at_us(late + 10), true, ACK), Settled::Done);
        // A full streak, then a pump that built a request: it leaves, held ACKs with it.
        let t = answer(&mut sh, &mrs, late + 20, HOLD_AFTER);
        assert_eq!(sh.settle(at_us(t), true, ACK), Settled::NewHold);
        let before = flushes.load(Ordering::SeqCst);
        let request = Built {
            any: true,
            only_acks: false,
            more: false,
        };
        assert_eq!(sh.settle(at_us(t + 1), true, request), Settled::Done);
        assert_eq!(flushes.load(Ordering::SeqCst), before + 1);
        assert_eq!(sh.acks_held_since(), None);
    }

    #[test]
    fn a_held_pump_builds_nothing() {
        let (mut sh, _) = shard();
        let b = sh.build(at_us(0), &MrTable::default(), 0);
        assert!(!b.any && b.only_acks && !b.more);
    }
}
