//! The cases of a campaign, sans IO: each case is a short list of request packets aimed at a
//! target RC QP that was just connected to us (RTS, nothing received yet), each with the
//! answer the IBTA (and kernel rxe) gives to it. Cases come from a seed and an index alone, so
//! a campaign is reproducible and a case can be replayed by its name.

use ferroce_wire::{NakCode, Opcode};

use ferroce_transport::rng::Rng;

/// A family of cases, one state machine area each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Campaign {
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
    /// CM MADs at the target's connection manager (see [`super::cm`]).
    Cm,
    /// The target as requester: its WRITE answered rightly or wrongly (see
    /// [`super::requester`]).
    Requester,
}

impl Campaign {
    /// Every campaign, in the order `--campaign all` runs them.
    pub const ALL: [Campaign; 9] = [
        Campaign::Psn,
        Campaign::Rkey,
        Campaign::Opcode,
        Campaign::Header,
        Campaign::Atomic,
        Campaign::Read,
        Campaign::Havoc,
        Campaign::Cm,
        Campaign::Requester,
    ];

    /// The name used on the command line and in case names.
    pub const fn name(self) -> &'static str {
        match self {
            Campaign::Psn => "psn",
            Campaign::Rkey => "rkey",
            Campaign::Opcode => "opcode",
            Campaign::Header => "header",
            Campaign::Atomic => "atomic",
            Campaign::Read => "read",
            Campaign::Havoc => "havoc",
            Campaign::Cm => "cm",
            Campaign::Requester => "requester",
        }
    }

    /// The campaign of a name.
    pub fn from_name(s: &str) -> Option<Campaign> {
        Campaign::ALL.into_iter().find(|c| c.name() == s)
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

/// One case: its name, the rule it checks, our first PSN, its steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// The campaign.
    pub campaign: Campaign,
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
    /// Whether the target must have a receive posted first (for SENDs).
    pub needs_recv: bool,
    /// A counter of the target the case must move by one or more.
    pub counter: Option<Counter>,
    /// The `cm` campaign's case (its steps are empty).
    pub cm: Option<super::cm::CmKind>,
    /// The `requester` campaign's case: how we answer and the WRITE's length (no steps).
    pub req: Option<(super::requester::ReqKind, u32)>,
    /// The packets in order.
    pub steps: Vec<Step>,
}

impl Case {
    /// The case's replay name: `SEED:CAMPAIGN:INDEX`.
    pub fn id(&self) -> String {
        format!("{}:{}:{}", self.seed, self.campaign.name(), self.index)
    }
}

/// The smallest region a target must have (the cases address inside 64 KiB).
pub const REGION_LEN: u64 = 64 << 10;

/// The path MTU the cases assume (the target is connected at 1024).
pub const MTU: u32 = 1024;

/// The case `index` of `campaign` for `seed`.
pub fn generate(campaign: Campaign, seed: u64, index: u32) -> Case {
    let mut rng = Rng::new(seed ^ (campaign as u64) << 56 ^ u64::from(index) << 20);
    // Our first PSN: anywhere, and near the 2^24 wrap one time in four.
    let start_psn = if rng.below(4) == 0 {
        0xFF_FFFF - rng.below(4) as u32
    } else {
        rng.below(1 << 24) as u32
    };
    let mut case = Case {
        campaign,
        seed,
        index,
        what: String::new(),
        rule: "",
        start_psn,
        needs_recv: false,
        counter: None,
        cm: None,
        req: None,
        steps: Vec::new(),
    };
    if campaign == Campaign::Requester {
        let (kind, len, what, rule) = super::requester::generate(seed, index);
        case.req = Some((kind, len));
        case.what = what;
        case.rule = rule;
        return case;
    }
    if campaign == Campaign::Cm {
        let (kind, what, rule) = super::cm::generate(seed, index);
        case.cm = Some(kind);
        case.what = what;
        case.rule = rule;
        return case;
    }
    let len = 1 + rng.below(u64::from(MTU)) as u32;
    let off = rng.below(REGION_LEN - u64::from(MTU)) as i64;
    let step = |packet, expect| Step { packet, expect };
    match campaign {
        Campaign::Psn => match rng.below(7) {
            0 => {
                let n = 1 + rng.below(4) as u32;
                case.what = format!("psn-in-order-{n}");
                case.rule = "in-order requests are executed and acknowledged";
                for i in 0..n {
                    case.steps
                        .push(step(PacketSpec::write_only(i, off, len), Expect::Ack(i)));
                }
            }
            1 => {
                let k = 1 + rng.below(1000) as u32;
                case.what = format!("psn-ahead-{k}");
                case.counter = Some(Counter::OutOfSeqRequest);
                case.rule = "a request past the expected PSN is NAKed (sequence error) with the expected PSN";
                case.steps.push(step(
                    PacketSpec::write_only(k, off, len),
                    Expect::Nak(NakCode::PsnSeqError, 0),
                ));
            }
            2 => {
                let k = 1 + rng.below(100) as u32;
                case.what = format!("psn-ahead-twice-{k}");
                case.counter = Some(Counter::OutOfSeqRequest);
                case.rule = "one sequence NAK until the expected PSN arrives, then on as usual";
                case.steps.push(step(
                    PacketSpec::write_only(k, off, len),
                    Expect::Nak(NakCode::PsnSeqError, 0),
                ));
                case.steps.push(step(
                    PacketSpec::write_only(k + 1, off, len),
                    Expect::Silence,
                ));
                case.steps
                    .push(step(PacketSpec::write_only(0, off, len), Expect::Ack(0)));
            }
            3 => {
                case.what = "psn-duplicate".into();
                case.counter = Some(Counter::DuplicateRequest);
                case.rule = "a duplicate WRITE is not executed again but acknowledged again";
                case.steps
                    .push(step(PacketSpec::write_only(0, off, len), Expect::Ack(0)));
                case.steps
                    .push(step(PacketSpec::write_only(1, off, len), Expect::Ack(1)));
                case.steps
                    .push(step(PacketSpec::write_only(0, off, len), Expect::Ack(1)));
            }
            5 => {
                case.what = "psn-reordered".into();
                case.rule = "a request overtaken by the next one: the later is NAKed (sequence error, once) and dropped, the earlier taken, the later taken when it comes again";
                case.steps.push(step(
                    PacketSpec::write_only(1, off, len),
                    Expect::Nak(NakCode::PsnSeqError, 0),
                ));
                case.steps
                    .push(step(PacketSpec::write_only(0, off, len), Expect::Ack(0)));
                case.steps
                    .push(step(PacketSpec::write_only(1, off, len), Expect::Ack(1)));
            }
            6 => {
                case.what = "psn-replayed-from-another-connection".into();
                case.rule = "a packet for a QP destroyed since (replayed from an earlier connection) is dropped silently";
                case.steps.push(step(
                    PacketSpec {
                        to_previous_qp: true,
                        ..PacketSpec::write_only(0, off, len)
                    },
                    Expect::Silence,
                ));
                case.steps
                    .push(step(PacketSpec::write_only(0, off, len), Expect::Ack(0)));
            }
            _ => {
                case.start_psn = 0xFF_FFFF - rng.below(2) as u32;
                case.what = "psn-wrap".into();
                case.rule = "PSNs are modulo 2^24; the wrap is one step like any other";
                for i in 0..4 {
                    case.steps
                        .push(step(PacketSpec::write_only(i, off, len), Expect::Ack(i)));
                }
            }
        },
        Campaign::Rkey => match rng.below(4) {
            0 => {
                let x = 1 + rng.below(0xFFFF_FFFE) as u32;
                case.what = format!("rkey-wrong-{x:08x}");
                case.rule = "a WRITE with an R_Key that is not the region's is NAKed (remote access error) and the QP goes to ERR";
                case.steps.push(step(
                    PacketSpec {
                        rkey_xor: x,
                        ..PacketSpec::write_only(0, off, len)
                    },
                    Expect::Nak(NakCode::RemoteAccessError, 0),
                ));
                case.steps
                    .push(step(PacketSpec::write_only(1, off, len), Expect::Silence));
            }
            1 => {
                let end = REGION_LEN as i64 - i64::from(len);
                case.what = format!("rkey-edge-last-byte-{len}");
                case.rule = "a WRITE that ends on the region's last byte is in bounds";
                case.steps
                    .push(step(PacketSpec::write_only(0, end, len), Expect::Ack(0)));
            }
            2 => {
                let end = REGION_LEN as i64 - i64::from(len) + 1;
                case.what = format!("rkey-edge-one-past-{len}");
                case.rule = "a WRITE one byte past the region is NAKed (remote access error)";
                case.steps.push(step(
                    PacketSpec::write_only(0, end, len),
                    Expect::Nak(NakCode::RemoteAccessError, 0),
                ));
            }
            _ => {
                let below = 1 + rng.below(4096) as i64;
                case.what = format!("rkey-below-start-{below}");
                case.rule = "a WRITE that starts before the region is NAKed (remote access error)";
                case.steps.push(step(
                    PacketSpec::write_only(0, -below, len),
                    Expect::Nak(NakCode::RemoteAccessError, 0),
                ));
            }
        },
        Campaign::Opcode => match rng.below(4) {
            0 => {
                case.what = "opcode-middle-without-first".into();
                case.rule = "a MIDDLE with no message in progress is NAKed (invalid request)";
                case.steps.push(step(
                    PacketSpec {
                        payload_len: MTU,
                        ..PacketSpec::new(Opcode::RC_RDMA_WRITE_MIDDLE, 0)
                    },
                    Expect::Nak(NakCode::InvalidRequest, 0),
                ));
            }
            1 => {
                case.what = "opcode-only-inside-first".into();
                case.rule = "a new message before the LAST of a multi-packet one is NAKed (invalid request)";
                case.steps.push(step(
                    PacketSpec {
                        reth: Some((0, 3 * MTU)),
                        payload_len: MTU,
                        ..PacketSpec::new(Opcode::RC_RDMA_WRITE_FIRST, 0)
                    },
                    Expect::Silence,
                ));
                case.steps.push(step(
                    PacketSpec::write_only(1, off, len),
                    Expect::Nak(NakCode::InvalidRequest, 1),
                ));
            }
            2 => {
                let op = [0x18u8, 0x19, 0x1A, 0x1B, 0x1E, 0x1F][rng.below(6) as usize];
                case.what = format!("opcode-reserved-{op:#04x}");
                case.rule = "a reserved RC opcode is not executed (rxe drops it; a NAK invalid request is allowed)";
                case.steps.push(step(
                    PacketSpec {
                        payload_len: 0,
                        ..PacketSpec::new(Opcode(op), 0)
                    },
                    Expect::SilenceOrNak(NakCode::InvalidRequest, 0),
                ));
                case.steps
                    .push(step(PacketSpec::write_only(0, off, len), Expect::Ack(0)));
            }
            _ => {
                case.what = format!("opcode-send-no-receive-{len}");
                case.rule = "a SEND with no receive posted is answered with an RNR NAK";
                case.steps.push(step(
                    PacketSpec {
                        payload_len: len,
                        ..PacketSpec::new(Opcode::RC_SEND_ONLY, 0)
                    },
                    Expect::Rnr(0),
                ));
            }
        },
        Campaign::Header => {
            match rng.below(7) {
                0 => {
                    let pkey = (rng.below(0x7FFF) as u16) & 0x7FFE;
                    case.what = format!("header-pkey-{pkey:04x}");
                    case.rule = "a P_Key of another partition is dropped silently";
                    dropped_then_taken(
                        &mut case,
                        PacketSpec {
                            pkey: Some(pkey),
                            ..PacketSpec::write_only(0, off, len)
                        },
                    );
                }
                1 => {
                    let tver = 1 + rng.below(15) as u8;
                    case.what = format!("header-tver-{tver}");
                    case.rule = "a transport header version other than 0 is dropped silently";
                    dropped_then_taken(
                        &mut case,
                        PacketSpec {
                            tver,
                            ..PacketSpec::write_only(0, off, len)
                        },
                    );
                }
                2 => {
                    case.what = "header-bad-icrc".into();
                    case.rule = "a packet whose ICRC is wrong is dropped silently";
                    dropped_then_taken(
                        &mut case,
                        PacketSpec {
                            bad_icrc: true,
                            ..PacketSpec::write_only(0, off, len)
                        },
                    );
                }
                3 => {
                    let x = 1 + rng.below(0xFF) as u32;
                    case.what = format!("header-wrong-qpn-{x:02x}");
                    case.rule = "a packet for a QP that does not exist is dropped silently";
                    case.steps.push(step(
                        PacketSpec {
                            qpn_xor: x << 8,
                            ..PacketSpec::write_only(0, off, len)
                        },
                        Expect::Silence,
                    ));
                }
                4 => {
                    let claimed = len + 1 + rng.below(64) as u32;
                    case.what = format!("header-reth-length-{claimed}-payload-{len}");
                    case.rule = "a WRITE ONLY whose payload is not the RETH length is NAKed (invalid request)";
                    case.steps.push(step(
                        PacketSpec {
                            reth: Some((off, claimed)),
                            ..PacketSpec::write_only(0, off, len)
                        },
                        Expect::Nak(NakCode::InvalidRequest, 0),
                    ));
                }
                6 => {
                    // A length that needs padding, and another pad count than it needs: the
                    // payload the receiver computes is not the RETH's length.
                    let len = (len | 3).max(5) - 2;
                    let right = (4 - len % 4) % 4;
                    let pad = (right + 1 + rng.below(3) as u32) % 4;
                    case.what = format!("header-pad-count-{pad}-for-{len}");
                    case.rule = "a WRITE ONLY whose pad count makes its payload differ from the RETH length is NAKed (invalid request)";
                    case.steps.push(step(
                        PacketSpec {
                            pad: Some(pad as u8),
                            ..PacketSpec::write_only(0, off, len)
                        },
                        Expect::Nak(NakCode::InvalidRequest, 0),
                    ));
                }
                _ => {
                    let short = MTU - 1 - rng.below(u64::from(MTU) - 1) as u32;
                    case.what = format!("header-first-short-{short}");
                    case.rule = "a FIRST packet whose payload is not the path MTU is NAKed (invalid request)";
                    case.steps.push(step(
                        PacketSpec {
                            reth: Some((0, 4 * MTU)),
                            payload_len: short,
                            ..PacketSpec::new(Opcode::RC_RDMA_WRITE_FIRST, 0)
                        },
                        Expect::Nak(NakCode::InvalidRequest, 0),
                    ));
                }
            }
        }
        Campaign::Atomic => {
            let word = (rng.below(REGION_LEN / 8) * 8) as i64;
            match rng.below(4) {
                0 | 1 => {
                    let (opcode, name) = if rng.below(2) == 0 {
                        (Opcode::RC_FETCH_ADD, "fetch-add")
                    } else {
                        (Opcode::RC_COMPARE_SWAP, "compare-swap")
                    };
                    case.what = format!("atomic-{name}-{word}");
                    case.rule = "an aligned atomic in bounds returns the original value";
                    case.steps.push(step(
                        PacketSpec {
                            atomic: Some((word, rng.next_u64(), rng.next_u64())),
                            ..PacketSpec::new(opcode, 0)
                        },
                        Expect::AtomicOrig {
                            psn_off: 0,
                            off: word as u64,
                        },
                    ));
                }
                2 => {
                    let mis = word + 1 + rng.below(7) as i64;
                    case.what = format!("atomic-misaligned-{mis}");
                    case.rule =
                        "an atomic whose address is not 8-byte aligned is NAKed (invalid request)";
                    case.steps.push(step(
                        PacketSpec {
                            atomic: Some((mis.min(REGION_LEN as i64 - 8), 1, 0)),
                            ..PacketSpec::new(Opcode::RC_FETCH_ADD, 0)
                        },
                        Expect::Nak(NakCode::InvalidRequest, 0),
                    ));
                }
                _ => {
                    case.what = "atomic-past-the-end".into();
                    case.rule = "an atomic past the region is NAKed (remote access error)";
                    case.steps.push(step(
                        PacketSpec {
                            atomic: Some((REGION_LEN as i64, 1, 0)),
                            ..PacketSpec::new(Opcode::RC_FETCH_ADD, 0)
                        },
                        Expect::Nak(NakCode::RemoteAccessError, 0),
                    ));
                }
            }
        }
        Campaign::Read => {
            let rlen = 1 + rng.below(4 * u64::from(MTU)) as u32;
            let roff = rng.below(REGION_LEN - u64::from(rlen)) as i64;
            match rng.below(3) {
                0 => {
                    case.what = format!("read-{rlen}-at-{roff}");
                    case.rule =
                        "a READ in bounds returns the region's bytes in ceil(len/MTU) responses";
                    case.steps.push(step(
                        PacketSpec::read(0, roff, rlen),
                        Expect::ReadData {
                            psn_off: 0,
                            off: roff as u64,
                            len: rlen,
                        },
                    ));
                }
                1 => {
                    let past = REGION_LEN as i64 - i64::from(rlen) + 1;
                    case.what = format!("read-one-past-{rlen}");
                    case.rule = "a READ past the region is NAKed (remote access error)";
                    case.steps.push(step(
                        PacketSpec::read(0, past, rlen),
                        Expect::Nak(NakCode::RemoteAccessError, 0),
                    ));
                }
                _ => {
                    case.what = format!("read-duplicate-{rlen}");
                    case.counter = Some(Counter::DuplicateRequest);
                    case.rule = "a duplicate READ is executed again from the region";
                    case.steps.push(step(
                        PacketSpec::read(0, roff, rlen),
                        Expect::ReadData {
                            psn_off: 0,
                            off: roff as u64,
                            len: rlen,
                        },
                    ));
                    case.steps.push(step(
                        PacketSpec::read(0, roff, rlen),
                        Expect::ReadData {
                            psn_off: 0,
                            off: roff as u64,
                            len: rlen,
                        },
                    ));
                }
            }
        }
        Campaign::Havoc => havoc(&mut case, &mut rng, off, len),
        Campaign::Cm | Campaign::Requester => {}
    }
    if case
        .steps
        .iter()
        .any(|s| s.packet.opcode == Opcode::RC_SEND_ONLY && s.expect != Expect::Rnr(0))
    {
        case.needs_recv = true;
    }
    case
}

/// A damaged packet that must be dropped silently, then the same packet undamaged, which must
/// be taken (ACKed at the same PSN: the drop left no trace).
fn dropped_then_taken(case: &mut Case, damaged: PacketSpec) {
    let valid = PacketSpec {
        pkey: None,
        tver: 0,
        bad_icrc: false,
        qpn_xor: 0,
        ..damaged.clone()
    };
    let psn = damaged.psn_off;
    case.steps.push(Step {
        packet: damaged,
        expect: Expect::Silence,
    });
    case.steps.push(Step {
        packet: valid,
        expect: Expect::Ack(psn),
    });
}

/// The case `index` for an unmodified `ibv_rc_pingpong` server (`-n 1 -s size`): one case per
/// server run, made only of what leaves its QP usable (the server's QP allows no remote access
/// and a fatal NAK would end it), since the run's ping must still be answered after it: a SEND
/// past the expected PSN (sequence NAK, once), and SENDs a receiver must drop silently (another
/// P_Key, TVer, DestQP, a wrong ICRC).
pub fn generate_pingpong(seed: u64, index: u32, size: u32) -> Case {
    let mut rng = Rng::new(seed ^ 0x9199_0000_0000 ^ u64::from(index) << 20);
    let send = |psn_off| PacketSpec {
        payload_len: size,
        ..PacketSpec::new(Opcode::RC_SEND_ONLY, psn_off)
    };
    let step = |packet, expect| Step { packet, expect };
    let mut case = Case {
        campaign: Campaign::Psn,
        seed,
        index,
        what: String::new(),
        rule: "",
        start_psn: rng.below(1 << 24) as u32,
        needs_recv: false,
        counter: None,
        cm: None,
        req: None,
        steps: Vec::new(),
    };
    match rng.below(6) {
        0 => {
            let k = 1 + rng.below(1000) as u32;
            case.what = format!("pingpong-psn-ahead-{k}");
            case.rule =
                "a request past the expected PSN is NAKed (sequence error) with the expected PSN";
            case.steps
                .push(step(send(k), Expect::Nak(NakCode::PsnSeqError, 0)));
            case.steps.push(step(send(k + 1), Expect::Silence));
        }
        1 => {
            case.campaign = Campaign::Header;
            case.what = "pingpong-header-pkey".into();
            case.rule = "a P_Key of another partition is dropped silently";
            case.steps.push(step(
                PacketSpec {
                    pkey: Some(0x1234),
                    ..send(0)
                },
                Expect::Silence,
            ));
        }
        2 => {
            case.campaign = Campaign::Header;
            let tver = 1 + rng.below(15) as u8;
            case.what = format!("pingpong-header-tver-{tver}");
            case.rule = "a transport header version other than 0 is dropped silently";
            case.steps
                .push(step(PacketSpec { tver, ..send(0) }, Expect::Silence));
        }
        3 => {
            case.campaign = Campaign::Header;
            case.what = "pingpong-header-bad-icrc".into();
            case.rule = "a packet whose ICRC is wrong is dropped silently";
            case.steps.push(step(
                PacketSpec {
                    bad_icrc: true,
                    ..send(0)
                },
                Expect::Silence,
            ));
        }
        4 => {
            case.campaign = Campaign::Header;
            case.what = "pingpong-header-wrong-qpn".into();
            case.rule = "a packet for a QP that does not exist is dropped silently";
            case.steps.push(step(
                PacketSpec {
                    qpn_xor: 0x100,
                    ..send(0)
                },
                Expect::Silence,
            ));
        }
        _ => {
            case.what = "pingpong-psn-behind".into();
            case.rule =
                "a request before the expected PSN, never seen, is a duplicate: not executed";
            case.steps.push(step(send(0xFF_FFF0), Expect::Anything));
        }
    }
    case
}

/// A havoc case: a state, then a valid request of a random kind with random damage.
fn havoc(case: &mut Case, rng: &mut Rng, off: i64, len: u32) {
    let step = |packet, expect| Step { packet, expect };
    let (state, mut psn): (&str, u32) = match rng.below(5) {
        0 => ("idle", 0),
        1 => {
            // Inside a 4-packet WRITE: FIRST sent, the rest to come.
            case.steps.push(step(
                PacketSpec {
                    reth: Some((0, 4 * MTU)),
                    payload_len: MTU,
                    ..PacketSpec::new(Opcode::RC_RDMA_WRITE_FIRST, 0)
                },
                Expect::Silence,
            ));
            ("mid-write", 1)
        }
        2 => {
            // A 4-packet READ whose responses are still coming when the damage arrives.
            case.steps
                .push(step(PacketSpec::read(0, 0, 4 * MTU), Expect::Anything));
            ("mid-read", 1)
        }
        3 => {
            case.steps.push(step(
                PacketSpec::write_only(5, off, len),
                Expect::Nak(NakCode::PsnSeqError, 0),
            ));
            ("after-nak", 0)
        }
        _ => {
            case.steps.push(step(
                PacketSpec {
                    atomic: Some((8, 1, 0)),
                    ..PacketSpec::new(Opcode::RC_FETCH_ADD, 0)
                },
                Expect::Anything,
            ));
            ("after-atomic", 1)
        }
    };
    // The damaged packet's base: a valid request at the next PSN, sometimes one off.
    if rng.below(4) == 0 {
        psn = psn.wrapping_add(rng.below(3) as u32).wrapping_sub(1) & 0xFF_FFFF;
    }
    let mut p = match rng.below(6) {
        0 => PacketSpec::write_only(psn, off, len),
        1 => PacketSpec::read(psn, off, len),
        2 => PacketSpec {
            payload_len: len,
            ..PacketSpec::new(Opcode::RC_SEND_ONLY, psn)
        },
        3 => PacketSpec {
            atomic: Some((off & !7, rng.next_u64(), rng.next_u64())),
            ..PacketSpec::new(Opcode::RC_COMPARE_SWAP, psn)
        },
        4 => PacketSpec {
            payload_len: MTU,
            ..PacketSpec::new(Opcode::RC_RDMA_WRITE_MIDDLE, psn)
        },
        _ => PacketSpec {
            payload_len: len.min(MTU),
            ..PacketSpec::new(Opcode::RC_RDMA_WRITE_LAST, psn)
        },
    };
    // 1-4 header bytes (BTH 0..12, then up to 28 of extended headers) overwritten.
    let n = 1 + rng.below(4);
    for _ in 0..n {
        let at = rng.below(40) as u16;
        // Keep DestQP (bytes 5..8) ours mostly: damage to it is the header campaign's.
        if (5..8).contains(&at) && rng.below(4) != 0 {
            continue;
        }
        p.pokes.push((at, rng.below(256) as u8));
    }
    if rng.below(5) == 0 {
        p.resize = Some(rng.below(u64::from(MTU) + 64) as u16);
    }
    p.bad_icrc = rng.below(8) == 0;
    let what: Vec<String> = p
        .pokes
        .iter()
        .map(|(a, v)| format!("{a}={v:02x}"))
        .collect();
    case.what = format!(
        "havoc-{state}-{}-[{}]{}{}",
        p.opcode.name().to_ascii_lowercase(),
        what.join(","),
        p.resize.map(|r| format!("-len{r}")).unwrap_or_default(),
        if p.bad_icrc { "-badicrc" } else { "" }
    );
    case.rule = "any packet, however damaged, gets a well-formed answer or none, and the target keeps serving new connections";
    case.steps.push(step(p, Expect::Anything));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_are_a_function_of_seed_campaign_and_index() {
        for c in Campaign::ALL {
            for i in 0..50 {
                assert_eq!(generate(c, 7, i), generate(c, 7, i));
            }
            let a: Vec<_> = (0..20).map(|i| generate(c, 7, i).what).collect();
            let b: Vec<_> = (0..20).map(|i| generate(c, 8, i).what).collect();
            assert_ne!(a, b, "{c:?}: another seed, other cases");
        }
    }

    #[test]
    fn every_kind_of_case_comes_up_and_stays_inside_the_rules() {
        for c in Campaign::ALL {
            let mut kinds = std::collections::BTreeSet::new();
            for i in 0..400 {
                let case = generate(c, 1, i);
                assert!(!case.rule.is_empty());
                assert!(case.steps.is_empty() == matches!(c, Campaign::Cm | Campaign::Requester));
                assert!(case.start_psn < 1 << 24);
                assert!(case.what.starts_with(c.name()), "{}", case.what);
                kinds.insert(case.what.split('-').take(3).collect::<Vec<_>>().join("-"));
                for s in &case.steps {
                    if let Some((_, l)) = s.packet.reth {
                        assert!(l > 0);
                    }
                }
            }
            assert!(kinds.len() >= 3, "{c:?}: {kinds:?}");
        }
    }

    #[test]
    fn campaign_names_round_trip() {
        for c in Campaign::ALL {
            assert_eq!(Campaign::from_name(c.name()), Some(c));
        }
        assert_eq!(Campaign::from_name("nope"), None);
    }
}
