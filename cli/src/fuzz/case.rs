//! What a case is, as data only (the campaigns in [`super::campaigns`] make and run them): its
//! name, the rule it checks, and its body — request packets aimed at a target RC QP that was
//! just connected to us (RTS, nothing received yet), each with the answer the IBTA (and kernel
//! rxe) gives to it; or a CM MAD; or how we answer the target's own WRITE. `Case` is a closed
//! type: every campaign's body is one variant of [`Body`].

use ferroce_wire::{NakCode, Opcode};

/// A family of cases, one state machine area each (its generator, runner and rules are the
/// module of the same name in [`super::campaigns`]). The discriminants seed the cases: keep them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CampaignId {
    /// PSNs: in order, ahead (sequence NAK, once), duplicates (re-ACK), across the 2^24 wrap.
    Psn,
    /// R_Keys and region edges: a wrong key, a WRITE that ends on the last byte or one past
    /// it, below the start (remote access NAK; the QP goes to ERR).
    Rkey,
    /// Opcode sequences: MIDDLE without FIRST, a new message inside a multi-packet one, a
    /// reserved opcode, a SEND with no receive posted (RNR NAK).
    Opcode,
    /// Header fields: P_Key, TVer, DestQP, ICRC (silent drops), a payload that disagrees with
    /// the RETH length or the MTU (invalid request NAK).
    Header,
    /// Atomics: FETCH_ADD and COMPARE_SWAP (the original value comes back), misaligned
    /// (invalid request), past the region (remote access).
    Atomic,
    /// READs: the data as the region holds it, past the end, a duplicate READ re-executed.
    Read,
    /// Havoc: a valid request with random bytes of its headers overwritten, its length cut or
    /// grown, its ICRC right or wrong, sent in a state reached first (idle, inside a
    /// multi-packet WRITE, with READ responses in flight, after a sequence NAK, after an
    /// atomic). Any answer must be well formed; the liveness probe after it must pass.
    Havoc,
    /// CM MADs at the target's connection manager (see [`super::campaigns::cm`]).
    Cm,
    /// The target as requester: its WRITE answered rightly or wrongly (see
    /// [`super::campaigns::requester`]).
    Requester,
}

impl CampaignId {
    /// Every campaign, in the order `--campaign all` runs them.
    pub const ALL: [CampaignId; 9] = [
        CampaignId::Psn,
        CampaignId::Rkey,
        CampaignId::Opcode,
        CampaignId::Header,
        CampaignId::Atomic,
        CampaignId::Read,
        CampaignId::Havoc,
        CampaignId::Cm,
        CampaignId::Requester,
    ];

    /// The name used on the command line and in case names.
    pub const fn name(self) -> &'static str {
        match self {
            CampaignId::Psn => "psn",
            CampaignId::Rkey => "rkey",
            CampaignId::Opcode => "opcode",
            CampaignId::Header => "header",
            CampaignId::Atomic => "atomic",
            CampaignId::Read => "read",
            CampaignId::Havoc => "havoc",
            CampaignId::Cm => "cm",
            CampaignId::Requester => "requester",
        }
    }

    /// The campaign of a name.
    pub fn from_name(s: &str) -> Option<CampaignId> {
        CampaignId::ALL.into_iter().find(|c| c.name() == s)
    }
}

/// Where a RETH or AtomicETH points: an offset from the start of the target's region (may be
/// negative or past its end).
pub type VaOffset = i64;

/// One request packet, relative to the connection: PSN as an offset from our first PSN,
/// addresses as offsets into the target's region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketSpec {
    /// BTH opcode.
    pub opcode: Opcode,
    /// PSN - our first PSN (wraps modulo 2^24).
    pub psn_off: u32,
    /// RETH (address offset, length) for WRITE FIRST/ONLY and READ.
    pub reth: Option<(VaOffset, u32)>,
    /// AtomicETH (address offset, swap/add, compare).
    pub atomic: Option<(VaOffset, u64, u64)>,
    /// Payload bytes (a pattern of the case's seed).
    pub payload_len: u32,
    /// XOR applied to the target's R_Key (0: the right key).
    pub rkey_xor: u32,
    /// Another P_Key than the default 0xFFFF.
    pub pkey: Option<u16>,
    /// A non-zero transport header version.
    pub tver: u8,
    /// XOR applied to the target's QPN (0: the right QP).
    pub qpn_xor: u32,
    /// Flip one bit of the ICRC.
    pub bad_icrc: bool,
    /// Havoc: (byte offset, value) written over the built packet before its ICRC.
    pub pokes: Vec<(u16, u8)>,
    /// Havoc: the packet (before its ICRC) cut to or grown to this many bytes.
    pub resize: Option<u16>,
    /// A BTH pad count other than the payload's.
    pub pad: Option<u8>,
    /// Sent to the target's previous QP (destroyed since), as a packet replayed from another
    /// connection would be.
    pub to_previous_qp: bool,
}

impl PacketSpec {
    /// A well-formed packet of `opcode` at `psn_off`, no extended headers, no payload.
    pub fn new(opcode: Opcode, psn_off: u32) -> PacketSpec {
        PacketSpec {
            opcode,
            psn_off,
            reth: None,
            atomic: None,
            payload_len: 0,
            rkey_xor: 0,
            pkey: None,
            tver: 0,
            qpn_xor: 0,
            bad_icrc: false,
            pokes: Vec::new(),
            resize: None,
            pad: None,
            to_previous_qp: false,
        }
    }

    /// An RDMA WRITE ONLY of `len` bytes at region offset `off`.
    pub fn write_only(psn_off: u32, off: VaOffset, len: u32) -> PacketSpec {
        PacketSpec {
            reth: Some((off, len)),
            payload_len: len,
            ..PacketSpec::new(Opcode::RC_RDMA_WRITE_ONLY, psn_off)
        }
    }

    /// An RDMA READ request of `len` bytes at region offset `off`.
    pub fn read(psn_off: u32, off: VaOffset, len: u32) -> PacketSpec {
        PacketSpec {
            reth: Some((off, len)),
            ..PacketSpec::new(Opcode::RC_RDMA_READ_REQUEST, psn_off)
        }
    }
}

/// What the target must answer to one packet (IBTA chapter 9.7, as rxe does it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// An ACK for this PSN offset.
    Ack(u32),
    /// A NAK with this code, for this PSN offset (a sequence NAK names the expected PSN).
    Nak(NakCode, u32),
    /// An RNR NAK for this PSN offset.
    Rnr(u32),
    /// Nothing (a silent drop, or a QP in ERR).
    Silence,
    /// Nothing, or a NAK with this code for this PSN offset: the IBTA leaves the choice (rxe
    /// drops silently, other stacks NAK).
    SilenceOrNak(NakCode, u32),
    /// READ responses from this PSN offset carrying `len` bytes of the region from `off`.
    ReadData {
        /// PSN offset of the first response.
        psn_off: u32,
        /// Region offset read.
        off: u64,
        /// Bytes read.
        len: u32,
    },
    /// Anything, or nothing: only that every answer is well formed (right ICRC, our QP).
    Anything,
    /// An atomic ACK for this PSN offset whose original value is the region's 8 bytes at
    /// `off` before the operation.
    AtomicOrig {
        /// PSN offset.
        psn_off: u32,
        /// Region offset of the target word.
        off: u64,
    },
}

/// A counter of the target's port that a case must move (rxe's hw_counters names; ferroce's
/// engine counters have the same), where the agent can read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// `duplicate_request`: duplicate requests seen.
    DuplicateRequest,
    /// `out_of_seq_request`: requests past the expected PSN NAKed.
    OutOfSeqRequest,
}

impl Counter {
    /// The counter's name.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::DuplicateRequest => "duplicate_request",
            Counter::OutOfSeqRequest => "out_of_seq_request",
        }
    }
}

/// One step: a packet and the answer it must get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// What is sent.
    pub packet: PacketSpec,
    /// What must come back.
    pub expect: Expect,
}

/// One case: its name, the rule it checks, our first PSN, and its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// The campaign.
    pub campaign: CampaignId,
    /// The campaign's seed and the case's index in it: `--replay SEED:CAMPAIGN:INDEX`.
    pub seed: u64,
    /// Index in the campaign.
    pub index: u32,
    /// A short name of what is done (e.g. `psn-ahead-17`).
    pub what: String,
    /// The rule checked, as the IBTA and rxe state it.
    pub rule: &'static str,
    /// Our first PSN (the target's expected PSN at the start).
    pub start_psn: u32,
    /// What the case sends.
    pub body: Body,
}

/// What a case sends, by kind of campaign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// Request packets at the target's responder, each with its expected answer.
    Packets(Packets),
    /// One CM MAD at the target's connection manager.
    Cm(CmKind),
    /// The target's WRITE of `len` bytes, answered as `kind` says.
    Requester {
        /// How we answer.
        kind: ReqKind,
        /// The WRITE's length.
        len: u32,
    },
}

/// The body of a packet case.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Packets {
    /// Whether the target must have a receive posted first (for SENDs).
    pub needs_recv: bool,
    /// A counter of the target the case must move by one or more.
    pub counter: Option<Counter>,
    /// The packets in order.
    pub steps: Vec<Step>,
}

/// What a CM case does to its REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmKind {
    /// The REQ as built, to the listening port.
    Valid,
    /// To a port nobody listens on (`port` = the listener's + this).
    ClosedPort(u16),
    /// The MAD cut to this many bytes.
    Truncated(u16),
    /// MAD base version set to this (only 1 exists).
    BaseVersion(u8),
    /// The same REQ twice.
    Duplicate,
    /// (offset, value) written over the MAD.
    Havoc(Vec<(u16, u8)>),
}

/// How we answer the target's WRITE in a `requester` case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqKind {
    /// An ACK of its last PSN: success.
    Ack,
    /// NAK remote access error at its first PSN: `IBV_WC_REM_ACCESS_ERR`.
    NakAccess,
    /// NAK invalid request at its first PSN: `IBV_WC_REM_INV_REQ_ERR`.
    NakInvalid,
    /// RNR NAK to every try, with the QP's `rnr_retry` this: `rnr_retry` + 1 tries, then
    /// `IBV_WC_RNR_RETRY_EXC_ERR`.
    RnrExhaust(u8),
    /// No answer, with the QP's `retry_cnt` this: `retry_cnt` + 1 tries, then
    /// `IBV_WC_RETRY_EXC_ERR`.
    Silence(u8),
    /// An ACK this far past anything sent (a ghost: ignored), then the real one: success.
    GhostAck(u32),
    /// A sequence NAK naming its first PSN: it sends the message again, whose ACK ends it.
    SeqNak,
    /// The ACK of its last PSN with this MSN (not the 1 it should be): the WR must still
    /// complete one way or another and the target keep serving (the IBTA leaves what a
    /// requester makes of the MSN to it; rxe and ferroce complete by PSN).
    AckMsn(u32),
}

impl Case {
    /// The case's replay name: `SEED:CAMPAIGN:INDEX`.
    pub fn id(&self) -> String {
        format!("{}:{}:{}", self.seed, self.campaign.name(), self.index)
    }

    /// The packet steps (none for a CM or requester case).
    pub fn steps(&self) -> &[Step] {
        match &self.body {
            Body::Packets(p) => &p.steps,
            Body::Cm(_) | Body::Requester { .. } => &[],
        }
    }
}

/// The smallest region a target must have (the cases address inside 64 KiB).
pub const REGION_LEN: u64 = 64 << 10;

/// The path MTU the cases assume (the target is connected at 1024).
pub const MTU: u32 = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn campaign_names_round_trip() {
        for c in CampaignId::ALL {
            assert_eq!(CampaignId::from_name(c.name()), Some(c));
        }
        assert_eq!(CampaignId::from_name("nope"), None);
    }
}
