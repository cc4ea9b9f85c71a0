//! What the packet campaigns (`psn`, `rkey`, `opcode`, `header`, `atomic`, `read`, `havoc`)
//! share: the draws every case starts from, the steps it is built of, and its run — the steps
//! on a fresh connection, each answer judged by the oracle, the counter the case names, then
//! the liveness probe.

use std::io;

use ferroce_transport::rng::Rng;
use ferroce_wire::Opcode;

use crate::fuzz::case::{
    Body, CampaignId as Id, Case, Counter, Expect, MTU, PacketSpec, Packets, REGION_LEN, Step,
};
use crate::fuzz::harness::{Harness, Verdict};

/// A packet case being made: the draws it starts from and what the campaign fills in.
pub struct Draft {
    /// The case's generator (after the first PSN, the length and the offset were drawn).
    pub rng: Rng,
    /// A payload length, 1 to the MTU.
    pub len: u32,
    /// A region offset with an MTU's room after it.
    pub off: i64,
    /// The case's short name.
    pub what: String,
    /// The rule it checks.
    pub rule: &'static str,
    /// Our first PSN (drawn; a campaign may move it).
    pub start_psn: u32,
    /// A counter of the target the case must move.
    pub counter: Option<Counter>,
    /// The packets in order.
    pub steps: Vec<Step>,
}

/// A packet campaign: its id and what makes one case's packets from the common draws; its run
/// is the trait's default ([`run`]).
pub struct PacketCampaign {
    /// Which campaign.
    pub id: Id,
    /// Fills a case's name, rule and steps.
    pub make: fn(&mut Draft),
}

impl super::Campaign for PacketCampaign {
    fn id(&self) -> Id {
        self.id
    }

    fn generate(&self, seed: u64, index: u32) -> Case {
        generate(self.id, seed, index, self.make)
    }
}

/// A step: `packet`, answered as `expect` says.
pub fn step(packet: PacketSpec, expect: Expect) -> Step {
    Step { packet, expect }
}

/// The case `index` of packet campaign `id` for `seed`: the common draws, then `make`.
pub fn generate(id: Id, seed: u64, index: u32, make: fn(&mut Draft)) -> Case {
    let (mut rng, start_psn) = super::start(id, seed, index);
    let len = 1 + rng.below(u64::from(MTU)) as u32;
    let off = rng.below(REGION_LEN - u64::from(MTU)) as i64;
    let mut d = Draft {
        rng,
        len,
        off,
        what: String::new(),
        rule: "",
        start_psn,
        counter: None,
        steps: Vec::new(),
    };
    make(&mut d);
    // A SEND that is not meant to meet an empty receive queue needs a receive posted.
    let needs_recv = d
        .steps
        .iter()
        .any(|s| s.packet.opcode == Opcode::RC_SEND_ONLY && s.expect != Expect::Rnr(0));
    Case {
        campaign: id,
        seed,
        index,
        what: d.what,
        rule: d.rule,
        start_psn: d.start_psn,
        body: Body::Packets(Packets {
            needs_recv,
            counter: d.counter,
            steps: d.steps,
        }),
    }
}

/// A damaged packet that must be dropped silently, then the same packet undamaged, which must
/// be taken (ACKed at the same PSN: the drop left no trace).
pub fn dropped_then_taken(d: &mut Draft, damaged: PacketSpec) {
    let valid = PacketSpec {
        pkey: None,
        tver: 0,
        bad_icrc: false,
        qpn_xor: 0,
        ..damaged.clone()
    };
    let psn = damaged.psn_off;
    d.steps.push(step(damaged, Expect::Silence));
    d.steps.push(step(valid, Expect::Ack(psn)));
}

/// Runs a packet case: its steps on a fresh connection, then the liveness probe.
///
/// # Errors
/// Reaching the agent or the target's socket.
pub fn run(case: &Case, h: &mut Harness) -> io::Result<Verdict> {
    let v = h.run_steps(case, case.steps())?;
    h.probed(case, v)
}
