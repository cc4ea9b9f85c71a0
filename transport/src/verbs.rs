//! The verbs vocabulary the engine speaks: names and C values from rdma-core's
//! `<infiniband/verbs.h>` (`ibv_qp_state`, `ibv_qp_attr`, `ibv_send_wr`, `ibv_wc`, ...).
//!
//! The provider re-exports these types, so a Rust program uses the names an RDMA programmer
//! already knows.

use core::fmt;
use std::net::IpAddr;

macro_rules! c_enum {
    (
        $(#[$doc:meta])* $name:ident : $repr:ty {
            $( $(#[$vdoc:meta])* $variant:ident = $value:literal ),* $(,)?
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr($repr)]
        pub enum $name {
            $( $(#[$vdoc])* $variant = $value, )*
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[ $( $name::$variant, )* ];

            /// The value with this C number, if any.
            pub const fn from_raw(v: $repr) -> Option<$name> {
                match v {
                    $( $value => Some($name::$variant), )*
                    _ => None,
                }
            }
        }
    };
}

c_enum! {
    /// `enum ibv_qp_type`.
    QpType: u32 {
        /// `IBV_QPT_RC`: reliable connected.
        Rc = 2,
        /// `IBV_QPT_UC`: unreliable connected.
        Uc = 3,
        /// `IBV_QPT_UD`: unreliable datagram.
        Ud = 4,
        /// `IBV_QPT_XRC_SEND`: the sending half of XRC (the kernel's XRC_INI): RC's requester,
        /// each request naming the target's XRC SRQ (`wr.qp_type.xrc.remote_srqn`); no
        /// receive queue.
        XrcSend = 9,
        /// `IBV_QPT_XRC_RECV`: the receiving half of XRC (the kernel's XRC_TGT): RC's
        /// responder, in an XRC domain, with no queues of its own; each SEND takes a receive
        /// WQE from the XRC SRQ its XRCETH names and completes on that SRQ's CQ.
        XrcRecv = 10,
    }
}

impl QpType {
    /// Reliable: RC and both halves of XRC (acknowledged, retried, with READ and atomics).
    pub const fn is_reliable(self) -> bool {
        matches!(self, QpType::Rc | QpType::XrcSend | QpType::XrcRecv)
    }

    /// One half of XRC.
    pub const fn is_xrc(self) -> bool {
        matches!(self, QpType::XrcSend | QpType::XrcRecv)
    }
}

c_enum! {
    /// `enum ibv_qp_state`.
    QpState: u32 {
        /// `IBV_QPS_RESET`.
        Reset = 0,
        /// `IBV_QPS_INIT`.
        Init = 1,
        /// `IBV_QPS_RTR`: ready to receive.
        Rtr = 2,
        /// `IBV_QPS_RTS`: ready to send.
        Rts = 3,
        /// `IBV_QPS_SQD`: send queue drained.
        Sqd = 4,
        /// `IBV_QPS_SQE`: send queue error (UC/UD only).
        Sqe = 5,
        /// `IBV_QPS_ERR`.
        Err = 6,
    }
}

c_enum! {
    /// `enum ibv_mtu`: the IB path MTU.
    Mtu: u32 {
        /// `IBV_MTU_256`.
        Mtu256 = 1,
        /// `IBV_MTU_512`.
        Mtu512 = 2,
        /// `IBV_MTU_1024`.
        Mtu1024 = 3,
        /// `IBV_MTU_2048`.
        Mtu2048 = 4,
        /// `IBV_MTU_4096`.
        Mtu4096 = 5,
    }
}

impl Mtu {
    /// The MTU in bytes (payload bytes per packet).
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// The largest IB MTU whose packets fit in an IP MTU of `ip_mtu` bytes with RoCEv2's
    /// overhead (rxe subtracts 80 bytes: IPv6 + UDP + BTH + extension headers + ICRC).
    pub fn for_ip_mtu(ip_mtu: u32) -> Option<Mtu> {
        let room = ip_mtu.checked_sub(80)?;
        Mtu::ALL.iter().rev().copied().find(|m| m.bytes() <= room)
    }
}

c_enum! {
    /// `enum ibv_wr_opcode`.
    WrOpcode: u32 {
        /// `IBV_WR_RDMA_WRITE`.
        RdmaWrite = 0,
        /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
        RdmaWriteWithImm = 1,
        /// `IBV_WR_SEND`.
        Send = 2,
        /// `IBV_WR_SEND_WITH_IMM`.
        SendWithImm = 3,
        /// `IBV_WR_RDMA_READ`.
        RdmaRead = 4,
        /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
        AtomicCmpAndSwp = 5,
        /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
        AtomicFetchAndAdd = 6,
        /// `IBV_WR_LOCAL_INV`: invalidate `invalidate_rkey` (a bound type 2 memory window).
        LocalInv = 7,
        /// `IBV_WR_BIND_MW`: bind a memory window ([`SendWr::bind_mw`]).
        BindMw = 8,
        /// `IBV_WR_SEND_WITH_INV`: a SEND whose last packet asks the responder to invalidate
        /// `invalidate_rkey` (IETH).
        SendWithInv = 9,
        /// `IBV_WR_FLUSH` (IBTA 1.5): makes the earlier writes to a range (or the whole region)
        /// of the target globally visible or persistent ([`SendWr::flush`]); needs the target's
        /// `FLUSH_GLOBAL`/`FLUSH_PERSISTENT`; answered by a zero-length READ response.
        Flush = 14,
        /// `IBV_WR_ATOMIC_WRITE` (IBTA 1.5): the 8 bytes of the message stored at once at the
        /// aligned remote address, after every earlier request's effects (needs the target's
        /// `REMOTE_WRITE`); answered by a zero-length READ response.
        AtomicWrite = 15,
    }
}

impl WrOpcode {
    /// READ, an atomic, an ATOMIC WRITE or a FLUSH: answered by a response (not an ACK), it
    /// uses a responder resource and counts against `max_rd_atomic`.
    pub const fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead
                | WrOpcode::AtomicCmpAndSwp
                | WrOpcode::AtomicFetchAndAdd
                | WrOpcode::AtomicWrite
                | WrOpcode::Flush
        )
    }

    /// An atomic operation.
    pub const fn is_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }

    /// A local operation: it runs in the send queue's order and sends nothing (bind a memory
    /// window, invalidate a key).
    pub const fn is_local(self) -> bool {
        matches!(self, WrOpcode::BindMw | WrOpcode::LocalInv)
    }

    /// Whether a QP of type `t` can post this opcode (IBTA Table 120; UD: SEND only, UC: no
    /// READ, atomics or SEND with invalidate; XRC send: RC's but FLUSH and ATOMIC WRITE,
    /// which have no XRC opcode; XRC receive: nothing, it has no send queue).
    pub const fn allowed_on(self, t: QpType) -> bool {
        match t {
            QpType::Rc => true,
            QpType::Uc => !self.is_read_or_atomic() && !matches!(self, WrOpcode::SendWithInv),
            QpType::Ud => matches!(self, WrOpcode::Send | WrOpcode::SendWithImm),
            QpType::XrcSend => !matches!(self, WrOpcode::Flush | WrOpcode::AtomicWrite),
            QpType::XrcRecv => false,
        }
    }
}

c_enum! {
    /// `enum ibv_wc_status`; `Display` gives `ibv_wc_status_str`'s text.
    WcStatus: u32 {
        /// `IBV_WC_SUCCESS`.
        Success = 0,
        /// `IBV_WC_LOC_LEN_ERR`.
        LocLenErr = 1,
        /// `IBV_WC_LOC_QP_OP_ERR`.
        LocQpOpErr = 2,
        /// `IBV_WC_LOC_EEC_OP_ERR`.
        LocEecOpErr = 3,
        /// `IBV_WC_LOC_PROT_ERR`.
        LocProtErr = 4,
        /// `IBV_WC_WR_FLUSH_ERR`.
        WrFlushErr = 5,
        /// `IBV_WC_MW_BIND_ERR`.
        MwBindErr = 6,
        /// `IBV_WC_BAD_RESP_ERR`.
        BadRespErr = 7,
        /// `IBV_WC_LOC_ACCESS_ERR`.
        LocAccessErr = 8,
        /// `IBV_WC_REM_INV_REQ_ERR`.
        RemInvReqErr = 9,
        /// `IBV_WC_REM_ACCESS_ERR`.
        RemAccessErr = 10,
        /// `IBV_WC_REM_OP_ERR`.
        RemOpErr = 11,
        /// `IBV_WC_RETRY_EXC_ERR`.
        RetryExcErr = 12,
        /// `IBV_WC_RNR_RETRY_EXC_ERR`.
        RnrRetryExcErr = 13,
        /// `IBV_WC_LOC_RDD_VIOL_ERR`.
        LocRddViolErr = 14,
        /// `IBV_WC_REM_INV_RD_REQ_ERR`.
        RemInvRdReqErr = 15,
        /// `IBV_WC_REM_ABORT_ERR`.
        RemAbortErr = 16,
        /// `IBV_WC_INV_EECN_ERR`.
        InvEecnErr = 17,
        /// `IBV_WC_INV_EEC_STATE_ERR`.
        InvEecStateErr = 18,
        /// `IBV_WC_FATAL_ERR`.
        FatalErr = 19,
        /// `IBV_WC_RESP_TIMEOUT_ERR`.
        RespTimeoutErr = 20,
        /// `IBV_WC_GENERAL_ERR`.
        GeneralErr = 21,
    }
}

impl WcStatus {
    /// The text `ibv_wc_status_str` gives.
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "operation aborted",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

c_enum! {
    /// `enum ibv_wc_opcode`.
    WcOpcode: u32 {
        /// `IBV_WC_SEND`.
        Send = 0,
        /// `IBV_WC_RDMA_WRITE`.
        RdmaWrite = 1,
        /// `IBV_WC_RDMA_READ`.
        RdmaRead = 2,
        /// `IBV_WC_COMP_SWAP`.
        CompSwap = 3,
        /// `IBV_WC_FETCH_ADD`.
        FetchAdd = 4,
        /// `IBV_WC_BIND_MW`.
        Bind = 5,
        /// `IBV_WC_LOCAL_INV`.
        LocalInv = 6,
        /// `IBV_WC_FLUSH`.
        Flush = 8,
        /// `IBV_WC_ATOMIC_WRITE`.
        AtomicWrite = 9,
        /// `IBV_WC_RECV`.
        Recv = 128,
        /// `IBV_WC_RECV_RDMA_WITH_IMM`.
        RecvRdmaWithImm = 129,
    }
}

impl From<WrOpcode> for WcOpcode {
    fn from(op: WrOpcode) -> WcOpcode {
        match op {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => WcOpcode::Send,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAndAdd => WcOpcode::FetchAdd,
            WrOpcode::BindMw => WcOpcode::Bind,
            WrOpcode::LocalInv => WcOpcode::LocalInv,
            WrOpcode::AtomicWrite => WcOpcode::AtomicWrite,
            WrOpcode::Flush => WcOpcode::Flush,
        }
    }
}

macro_rules! c_flags {
    (
        $(#[$doc:meta])* $name:ident {
            $( $(#[$vdoc:meta])* $flag:ident = $value:literal ),* $(,)?
        }
    ) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub u32);

        impl $name {
            $( $(#[$vdoc])* pub const $flag: $name = $name($value); )*
            /// No flag.
            pub const EMPTY: $name = $name(0);
            const NAMES: &'static [(&'static str, u32)] = &[ $( (stringify!($flag), $value), )* ];

            /// Whether every flag of `other` is set.
            pub const fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether no flag is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }

            /// The flags of `self` not in `other`.
            pub const fn difference(self, other: $name) -> $name {
                $name(self.0 & !other.0)
            }

            /// The flags of `self` and of `other` (`|`, usable in constants).
            pub const fn union(self, other: $name) -> $name {
                $name(self.0 | other.0)
            }

            /// The names of the flags set, as their C names end (`RQ_PSN` for `IBV_QP_RQ_PSN`).
            pub fn names(self) -> impl Iterator<Item = &'static str> {
                Self::NAMES
                    .iter()
                    .filter(move |(_, v)| *v != 0 && self.0 & v == *v)
                    .map(|(n, _)| *n)
            }
        }

        impl core::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, rhs: $name) -> $name {
                $name(self.0 | rhs.0)
            }
        }

        impl core::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: $name) {
                self.0 |= rhs.0;
            }
        }

        impl core::ops::BitAnd for $name {
            type Output = $name;
            fn bitand(self, rhs: $name) -> $name {
                $name(self.0 & rhs.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut first = true;
                let mut rest = self.0;
                f.write_str(concat!(stringify!($name), "("))?;
                for (n, v) in Self::NAMES {
                    if self.0 & v == *v && *v != 0 {
                        if !first {
                            f.write_str(" | ")?;
                        }
                        f.write_str(n)?;
                        first = false;
                        rest &= !v;
                    }
                }
                if rest != 0 {
                    if !first {
                        f.write_str(" | ")?;
                    }
                    write!(f, "{rest:#x}")?;
                }
                f.write_str(")")
            }
        }
    };
}

c_flags! {
    /// `enum ibv_access_flags` (memory region and QP access rights).
    AccessFlags {
        /// `IBV_ACCESS_LOCAL_WRITE`.
        LOCAL_WRITE = 1,
        /// `IBV_ACCESS_REMOTE_WRITE`.
        REMOTE_WRITE = 2,
        /// `IBV_ACCESS_REMOTE_READ`.
        REMOTE_READ = 4,
        /// `IBV_ACCESS_REMOTE_ATOMIC`.
        REMOTE_ATOMIC = 8,
        /// `IBV_ACCESS_MW_BIND`: memory windows may be bound to the region.
        MW_BIND = 16,
        /// `IBV_ACCESS_ZERO_BASED` (a type 2 memory window's bind): peers address the window
        /// by the offset from its first byte, not by the region's addresses.
        ZERO_BASED = 32,
        /// `IBV_ACCESS_FLUSH_GLOBAL`: peers may FLUSH the region to global visibility.
        FLUSH_GLOBAL = 256,
        /// `IBV_ACCESS_FLUSH_PERSISTENT`: peers may FLUSH the region to persistence.
        FLUSH_PERSISTENT = 512,
    }
}

c_flags! {
    /// `enum ibv_send_flags`.
    SendFlags {
        /// `IBV_SEND_FENCE`: wait for earlier READs and atomics to complete.
        FENCE = 1,
        /// `IBV_SEND_SIGNALED`: generate a completion.
        SIGNALED = 2,
        /// `IBV_SEND_SOLICITED`: set SE in the last packet.
        SOLICITED = 4,
        /// `IBV_SEND_INLINE`: copy the data at post time.
        INLINE = 8,
    }
}

c_flags! {
    /// `enum ibv_wc_flags`.
    WcFlags {
        /// `IBV_WC_GRH`: the first 40 bytes of the receive buffer hold a GRH.
        GRH = 1,
        /// `IBV_WC_WITH_IMM`: `imm_data` is valid.
        WITH_IMM = 2,
        /// `IBV_WC_IP_CSUM_OK`.
        IP_CSUM_OK = 4,
        /// `IBV_WC_WITH_INV`: `invalidated_rkey` is valid.
        WITH_INV = 8,
    }
}

c_flags! {
    /// `enum ibv_qp_attr_mask`: which fields of a [`QpAttr`] a modify sets.
    QpAttrMask {
        /// `IBV_QP_STATE`.
        STATE = 0x1,
        /// `IBV_QP_CUR_STATE`.
        CUR_STATE = 0x2,
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`.
        EN_SQD_ASYNC_NOTIFY = 0x4,
        /// `IBV_QP_ACCESS_FLAGS`.
        ACCESS_FLAGS = 0x8,
        /// `IBV_QP_PKEY_INDEX`.
        PKEY_INDEX = 0x10,
        /// `IBV_QP_PORT`.
        PORT = 0x20,
        /// `IBV_QP_QKEY`.
        QKEY = 0x40,
        /// `IBV_QP_AV`.
        AV = 0x80,
        /// `IBV_QP_PATH_MTU`.
        PATH_MTU = 0x100,
        /// `IBV_QP_TIMEOUT`.
        TIMEOUT = 0x200,
        /// `IBV_QP_RETRY_CNT`.
        RETRY_CNT = 0x400,
        /// `IBV_QP_RNR_RETRY`.
        RNR_RETRY = 0x800,
        /// `IBV_QP_RQ_PSN`.
        RQ_PSN = 0x1000,
        /// `IBV_QP_MAX_QP_RD_ATOMIC`.
        MAX_QP_RD_ATOMIC = 0x2000,
        /// `IBV_QP_ALT_PATH`.
        ALT_PATH = 0x4000,
        /// `IBV_QP_MIN_RNR_TIMER`.
        MIN_RNR_TIMER = 0x8000,
        /// `IBV_QP_SQ_PSN`.
        SQ_PSN = 0x10000,
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
        MAX_DEST_RD_ATOMIC = 0x20000,
        /// `IBV_QP_PATH_MIG_STATE`.
        PATH_MIG_STATE = 0x40000,
        /// `IBV_QP_CAP`.
        CAP = 0x80000,
        /// `IBV_QP_DEST_QPN`.
        DEST_QPN = 0x100000,
        /// `IBV_QP_RATE_LIMIT`.
        RATE_LIMIT = 0x2000000,
    }
}

/// SGEs a work request holds without allocating; longer lists spill to the heap.
pub const SG_LIST_INLINE: usize = 4;

/// A work request's SGE list (`sg_list`/`num_sge`): up to [`SG_LIST_INLINE`] in place.
pub type SgList = crate::smallvec::SmallVec<Sge, SG_LIST_INLINE>;

/// Inline bytes a send work request holds without allocating.
pub const INLINE_DATA_INLINE: usize = 256;

/// The gathered bytes of an `IBV_SEND_INLINE` request: up to [`INLINE_DATA_INLINE`] in place.
pub type InlineData = crate::smallvec::SmallVec<u8, INLINE_DATA_INLINE>;

/// `struct ibv_sge`: a scatter/gather element in registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Start address (in the memory region's address space).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region.
    pub lkey: u32,
}

/// The RoCE part of `struct ibv_ah_attr`: where a QP's packets go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhAttr {
    /// The peer's address (its GID, as an IP address; IPv4-mapped GIDs become IPv4).
    pub dest: IpAddr,
    /// `grh.hop_limit` (IP TTL / hop limit).
    pub hop_limit: u8,
    /// `grh.traffic_class` (IP TOS / traffic class).
    pub traffic_class: u8,
    /// `grh.flow_label` (IPv6 flow label).
    pub flow_label: u32,
    /// `grh.sgid_index`: the local GID used as source.
    pub sgid_index: u8,
}

impl AhAttr {
    /// An address vector to `dest` with rxe's defaults (hop limit 64, traffic class 0).
    pub const fn new(dest: IpAddr) -> AhAttr {
        AhAttr {
            dest,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            sgid_index: 0,
        }
    }
}

/// `struct ibv_qp_cap`: queue sizes of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpCap {
    /// `max_send_wr`.
    pub max_send_wr: u32,
    /// `max_recv_wr`.
    pub max_recv_wr: u32,
    /// `max_send_sge`.
    pub max_send_sge: u32,
    /// `max_recv_sge`.
    pub max_recv_sge: u32,
    /// `max_inline_data`.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_attr`: the attributes `modify_qp` sets and `query_qp` returns. Which fields a
/// modify uses is given by a [`QpAttrMask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// `qp_state`: the state to move to.
    pub qp_state: QpState,
    /// `cur_qp_state`: the state the caller believes the QP is in.
    pub cur_qp_state: QpState,
    /// `path_mtu`.
    pub path_mtu: Mtu,
    /// `qkey` (UD).
    pub qkey: u32,
    /// `rq_psn`: the first PSN the responder expects.
    pub rq_psn: u32,
    /// `sq_psn`: the first PSN the requester sends.
    pub sq_psn: u32,
    /// `dest_qp_num`.
    pub dest_qp_num: u32,
    /// `qp_access_flags`: what remote peers may do through this QP.
    pub qp_access_flags: AccessFlags,
    /// `cap`.
    pub cap: QpCap,
    /// `ah_attr`: the primary path.
    pub ah_attr: Option<AhAttr>,
    /// `pkey_index`.
    pub pkey_index: u16,
    /// `en_sqd_async_notify`: raise `SqDrained` when SQD is reached.
    pub en_sqd_async_notify: bool,
    /// `sq_draining` (query only).
    pub sq_draining: bool,
    /// `max_rd_atomic`: READ/atomic operations this QP may have outstanding as requester.
    pub max_rd_atomic: u8,
    /// `max_dest_rd_atomic`: responder resources for incoming READ/atomic operations.
    pub max_dest_rd_atomic: u8,
    /// `min_rnr_timer`: the RNR timer index sent in this QP's RNR NAKs.
    pub min_rnr_timer: u8,
    /// `port_num`.
    pub port_num: u8,
    /// `timeout`: local ACK timeout, 4.096 µs · 2^timeout (0 = none).
    pub timeout: u8,
    /// `retry_cnt`: retries after a timeout or sequence NAK (IBTA: 7 means seven).
    pub retry_cnt: u8,
    /// `rnr_retry`: retries after an RNR NAK (7 means infinite).
    pub rnr_retry: u8,
}

impl Default for QpAttr {
    fn default() -> QpAttr {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu256,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::EMPTY,
            cap: QpCap::default(),
            ah_attr: None,
            pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 1,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
        }
    }
}

/// What a send work request asks the remote side to touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RemoteAddr {
    /// `remote_addr`.
    pub remote_addr: u64,
    /// `rkey`.
    pub rkey: u32,
}

/// The UD part of a send work request (`wr.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// Where to send.
    pub ah: AhAttr,
    /// `remote_qpn`.
    pub remote_qpn: u32,
    /// `remote_qkey`; a value with the high bit set means "use the QP's own Q_Key".
    pub remote_qkey: u32,
}

/// `wr.bind_mw` of a `BIND_MW` work request (`struct ibv_mw_bind_info` with the window and
/// its new key): after the bind, `new_rkey` grants `access` on `[addr, addr + length)` of the
/// region `mr_lkey` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MwBind {
    /// The window's current rkey (`mw->rkey`).
    pub mw_rkey: u32,
    /// Its rkey once bound: the same index (bits 31:8), a new key byte (`ibv_inc_rkey`).
    pub new_rkey: u32,
    /// The region the window opens onto (`bind_info.mr`'s lkey); it needs `MW_BIND`.
    pub mr_lkey: u32,
    /// `bind_info.addr`.
    pub addr: u64,
    /// `bind_info.length` (0 unbinds a type 1 window).
    pub length: u64,
    /// `bind_info.mw_access_flags`: remote READ, WRITE, ATOMIC.
    pub access: AccessFlags,
}

/// `struct ibv_send_wr` (one work request; no linked list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// `wr_id`, returned in the completion.
    pub wr_id: u64,
    /// `opcode`.
    pub opcode: WrOpcode,
    /// `send_flags`.
    pub send_flags: SendFlags,
    /// `sg_list`.
    pub sg_list: SgList,
    /// `imm_data` (host order here; big-endian on the wire).
    pub imm_data: u32,
    /// `wr.rdma` (WRITE, READ) or the target of an atomic (`wr.atomic.remote_addr`/`rkey`).
    pub remote: RemoteAddr,
    /// `wr.atomic.compare_add`: the compare value (CMP_SWAP) or the addend (FETCH_ADD).
    pub compare_add: u64,
    /// `wr.atomic.swap`.
    pub swap: u64,
    /// `wr.ud` (UD QPs only).
    pub ud: Option<UdDest>,
    /// `invalidate_rkey` (`LOCAL_INV`, `SEND_WITH_INV`).
    pub invalidate_rkey: u32,
    /// `bind_mw` (`BIND_MW`).
    pub bind_mw: Option<MwBind>,
    /// The message bytes of an `IBV_SEND_INLINE` request, already gathered by the caller: verbs
    /// reads inline SGEs at post time and ignores their lkeys, so a C caller may point them at
    /// unregistered memory. When set (with INLINE), it is the payload and `sg_list` is unused;
    /// when `None`, an inline request is gathered from `sg_list` through registered memory.
    /// An ATOMIC WRITE's 8 bytes may come here too, with or without INLINE
    /// (`ibv_wr_atomic_write`).
    pub inline_data: Option<InlineData>,
    /// What a `FLUSH` flushes (`ibv_wr_flush`'s `len`, `type` and `level`).
    pub flush: Option<FlushSpec>,
    /// `qp_type.xrc.remote_srqn`: on an XRC send QP, the XRC SRQ at the target this request
    /// is for (its XRCETH); ignored on other QPs.
    pub remote_srqn: u32,
}

/// The operands of a `FLUSH` (`ibv_wr_flush`; IBTA 1.5 FETH and RETH).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlushSpec {
    /// `len`: bytes from the remote address (a range flush; ignored for the whole region).
    pub len: u32,
    /// `type`: `IBV_FLUSH_GLOBAL` (1) or `IBV_FLUSH_PERSISTENT` (2) — the FETH placement type.
    pub placement_type: u8,
    /// `level`: `IBV_FLUSH_RANGE` (0) or `IBV_FLUSH_MR` (1) — the FETH selectivity level.
    pub selectivity_level: u8,
}

impl FlushSpec {
    /// `IBV_FLUSH_GLOBAL`.
    pub const GLOBAL: u8 = 1;
    /// `IBV_FLUSH_PERSISTENT`.
    pub const PERSISTENT: u8 = 2;
    /// `IBV_FLUSH_RANGE`.
    pub const RANGE: u8 = 0;
    /// `IBV_FLUSH_MR`.
    pub const MR: u8 = 1;

    /// The FETH word: selectivity level in bits 5..4, placement type in bits 3..0.
    pub const fn feth_bits(self) -> u32 {
        ((self.selectivity_level as u32 & 0x3) << 4) | (self.placement_type as u32 & 0xf)
    }

    /// The operands a FETH word and a RETH length carry.
    pub const fn from_feth(bits: u32, len: u32) -> FlushSpec {
        FlushSpec {
            len,
            placement_type: (bits & 0xf) as u8,
            selectivity_level: ((bits >> 4) & 0x3) as u8,
        }
    }

    /// The access a region must grant: `FLUSH_GLOBAL` and/or `FLUSH_PERSISTENT` as the
    /// placement type asks (none for a type that names neither).
    pub const fn access(self) -> AccessFlags {
        let mut a = 0;
        if self.placement_type & FlushSpec::GLOBAL != 0 {
            a |= AccessFlags::FLUSH_GLOBAL.0;
        }
        if self.placement_type & FlushSpec::PERSISTENT != 0 {
            a |= AccessFlags::FLUSH_PERSISTENT.0;
        }
        AccessFlags(a)
    }

    /// Whether the operands are ones verbs accepts: a placement type of global visibility
    /// and/or persistence, a level of range or whole region.
    pub const fn is_valid(self) -> bool {
        self.placement_type != 0
            && self.placement_type & !(FlushSpec::GLOBAL | FlushSpec::PERSISTENT) == 0
            && self.selectivity_level <= FlushSpec::MR
    }
}

impl SendWr {
    /// A copy with `inline_data` replaced by `inline`: what a send queue keeps of a posted
    /// request, made in one copy (the caller's `inline_data` is not copied only to be
    /// replaced).
    pub(crate) fn queued_with(&self, inline: Option<InlineData>) -> SendWr {
        SendWr {
            wr_id: self.wr_id,
            opcode: self.opcode,
            send_flags: self.send_flags,
            sg_list: self.sg_list.clone(),
            imm_data: self.imm_data,
            remote: self.remote,
            compare_add: self.compare_add,
            swap: self.swap,
            ud: self.ud,
            invalidate_rkey: self.invalidate_rkey,
            bind_mw: self.bind_mw,
            inline_data: inline,
            flush: self.flush,
            remote_srqn: self.remote_srqn,
        }
    }

    /// A work request with no SGEs, no flags and zeroed operands.
    pub fn new(wr_id: u64, opcode: WrOpcode) -> SendWr {
        SendWr {
            wr_id,
            opcode,
            send_flags: SendFlags::EMPTY,
            sg_list: SgList::new(),
            imm_data: 0,
            remote: RemoteAddr::default(),
            compare_add: 0,
            swap: 0,
            ud: None,
            invalidate_rkey: 0,
            bind_mw: None,
            inline_data: None,
            flush: None,
            remote_srqn: 0,
        }
    }

    /// `IBV_WR_SEND` of the bytes `local` names, signaled (it completes on the send CQ).
    pub fn send(wr_id: u64, local: Sge) -> SendWr {
        SendWr::signaled(wr_id, WrOpcode::Send, local)
    }

    /// `IBV_WR_SEND_WITH_IMM`, signaled.
    pub fn send_with_imm(wr_id: u64, local: Sge, imm_data: u32) -> SendWr {
        SendWr {
            imm_data,
            ..SendWr::signaled(wr_id, WrOpcode::SendWithImm, local)
        }
    }

    /// `IBV_WR_SEND_WITH_INV`: a SEND that invalidates `rkey` at the responder, signaled.
    pub fn send_with_inv(wr_id: u64, local: Sge, rkey: u32) -> SendWr {
        SendWr {
            invalidate_rkey: rkey,
            ..SendWr::signaled(wr_id, WrOpcode::SendWithInv, local)
        }
    }

    /// `IBV_WR_LOCAL_INV` of `rkey`, signaled.
    pub fn local_inv(wr_id: u64, rkey: u32) -> SendWr {
        SendWr {
            invalidate_rkey: rkey,
            send_flags: SendFlags::SIGNALED,
            ..SendWr::new(wr_id, WrOpcode::LocalInv)
        }
    }

    /// `IBV_WR_BIND_MW`, signaled.
    pub fn bind_mw(wr_id: u64, bind: MwBind) -> SendWr {
        SendWr {
            bind_mw: Some(bind),
            send_flags: SendFlags::SIGNALED,
            ..SendWr::new(wr_id, WrOpcode::BindMw)
        }
    }

    /// `IBV_WR_RDMA_WRITE` of the bytes `local` names to `remote`, signaled.
    pub fn write(wr_id: u64, local: Sge, remote: RemoteAddr) -> SendWr {
        SendWr {
            remote,
            ..SendWr::signaled(wr_id, WrOpcode::RdmaWrite, local)
        }
    }

    /// `IBV_WR_RDMA_WRITE_WITH_IMM`, signaled (it also consumes a receive at the peer).
    pub fn write_with_imm(wr_id: u64, local: Sge, remote: RemoteAddr, imm_data: u32) -> SendWr {
        SendWr {
            remote,
            imm_data,
            ..SendWr::signaled(wr_id, WrOpcode::RdmaWriteWithImm, local)
        }
    }

    /// `IBV_WR_RDMA_READ` of `remote` into the bytes `local` names, signaled.
    pub fn read(wr_id: u64, local: Sge, remote: RemoteAddr) -> SendWr {
        SendWr {
            remote,
            ..SendWr::signaled(wr_id, WrOpcode::RdmaRead, local)
        }
    }

    /// `IBV_WR_ATOMIC_FETCH_AND_ADD` of `add` to the 8 bytes at `remote`; the original value
    /// lands in `local` (8 bytes). Signaled.
    pub fn fetch_add(wr_id: u64, local: Sge, remote: RemoteAddr, add: u64) -> SendWr {
        SendWr {
            remote,
            compare_add: add,
            ..SendWr::signaled(wr_id, WrOpcode::AtomicFetchAndAdd, local)
        }
    }

    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: `swap` replaces the 8 bytes at `remote` if they equal
    /// `compare`; the original value lands in `local`. Signaled.
    pub fn compare_swap(
        wr_id: u64,
        local: Sge,
        remote: RemoteAddr,
        compare: u64,
        swap: u64,
    ) -> SendWr {
        SendWr {
            remote,
            compare_add: compare,
            swap,
            ..SendWr::signaled(wr_id, WrOpcode::AtomicCmpAndSwp, local)
        }
    }

    /// `IBV_WR_ATOMIC_WRITE` (`ibv_wr_atomic_write`): `value` stored at once in the aligned
    /// 8 bytes at `remote` after every earlier request's effects. Signaled.
    pub fn atomic_write(wr_id: u64, remote: RemoteAddr, value: [u8; 8]) -> SendWr {
        SendWr {
            remote,
            send_flags: SendFlags::SIGNALED,
            inline_data: Some(InlineData::from_slice(&value)),
            ..SendWr::new(wr_id, WrOpcode::AtomicWrite)
        }
    }

    /// `IBV_WR_FLUSH` (`ibv_wr_flush`): the earlier writes to `len` bytes at `remote` (or, at
    /// level [`FlushSpec::MR`], to the whole region) made globally visible or persistent as
    /// `placement_type` says. Signaled.
    pub fn flush(
        wr_id: u64,
        remote: RemoteAddr,
        len: u32,
        placement_type: u8,
        selectivity_level: u8,
    ) -> SendWr {
        SendWr {
            remote,
            send_flags: SendFlags::SIGNALED,
            flush: Some(FlushSpec {
                len,
                placement_type,
                selectivity_level,
            }),
            ..SendWr::new(wr_id, WrOpcode::Flush)
        }
    }

    /// The same request without `IBV_SEND_SIGNALED`: verbs then reports it only if it fails
    /// (or every request, on a QP created with `sq_sig_all`).
    pub fn unsignaled(mut self) -> SendWr {
        self.send_flags = SendFlags(self.send_flags.0 & !SendFlags::SIGNALED.0);
        self
    }

    /// The same request with more `send_flags` (FENCE, SOLICITED, INLINE).
    pub fn with_flags(mut self, flags: SendFlags) -> SendWr {
        self.send_flags = SendFlags(self.send_flags.0 | flags.0);
        self
    }

    fn signaled(wr_id: u64, opcode: WrOpcode, local: Sge) -> SendWr {
        SendWr {
            send_flags: SendFlags::SIGNALED,
            sg_list: SgList::from([local]),
            ..SendWr::new(wr_id, opcode)
        }
    }

    /// The message length: the inline bytes given (INLINE, or an ATOMIC WRITE's value), or
    /// the sum of the SGE lengths.
    pub fn length(&self) -> u64 {
        match &self.inline_data {
            Some(d)
                if self.send_flags.contains(SendFlags::INLINE)
                    || self.opcode == WrOpcode::AtomicWrite =>
            {
                d.len() as u64
            }
            _ => self.sg_list.iter().map(|s| u64::from(s.length)).sum(),
        }
    }
}

/// `struct ibv_recv_wr` (one work request).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecvWr {
    /// `wr_id`, returned in the completion.
    pub wr_id: u64,
    /// `sg_list`: where received data is scattered.
    pub sg_list: SgList,
}

impl RecvWr {
    /// A receive into the bytes `local` names.
    pub fn new(wr_id: u64, local: Sge) -> RecvWr {
        RecvWr {
            wr_id,
            sg_list: SgList::from([local]),
        }
    }
}

/// `struct ibv_wc`: a work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkCompletion {
    /// `wr_id` of the work request.
    pub wr_id: u64,
    /// `status`.
    pub status: WcStatus,
    /// `opcode` (only meaningful when `status` is `Success`).
    pub opcode: WcOpcode,
    /// `vendor_err`.
    pub vendor_err: u32,
    /// `byte_len`: bytes transferred (receives: including the 40-byte GRH area on UD).
    pub byte_len: u32,
    /// `imm_data` (host order), valid with `WcFlags::WITH_IMM`.
    pub imm_data: u32,
    /// `qp_num`: the local QP.
    pub qp_num: u32,
    /// `src_qp`: the remote QP (receives).
    pub src_qp: u32,
    /// `wc_flags`.
    pub wc_flags: WcFlags,
    /// `sl`. RoCE has no service level in its packets; for UD receives this carries the
    /// received packet's type as mlx5 reports it there ([`ROCE_PKT_TYPE_V2_IPV4`] or
    /// [`ROCE_PKT_TYPE_V2_IPV6`]), which UCX reads to find the address inside the GRH area;
    /// 0 otherwise (as rxe).
    pub sl: u8,
    /// `ibv_wc_read_completion_ts`: when the completion reached its CQ, in ns of the
    /// runtime's free-running clock (`CLOCK_MONOTONIC`), if the CQ stamps completions; the
    /// engine (which reads no clock) leaves 0.
    pub completion_ts: u64,
    /// `ibv_wc_read_completion_wallclock_ns`: the same moment in ns since the Unix epoch.
    pub completion_wallclock_ns: u64,
    /// `invalidated_rkey`, valid with `WcFlags::WITH_INV` (a SEND with invalidate received).
    pub invalidated_rkey: u32,
}

/// `wc.sl` of a UD receive of a RoCEv2 packet over IPv4: bit 3 (UDP-encapsulated) with L3
/// type 2 (IPv4), mlx5's CQE encoding.
pub const ROCE_PKT_TYPE_V2_IPV4: u8 = 0x8 | 0x2;
/// `wc.sl` of a UD receive of a RoCEv2 packet over IPv6: bit 3 with L3 type 1 (IPv6).
pub const ROCE_PKT_TYPE_V2_IPV6: u8 = 0x8 | 0x1;

impl Default for WorkCompletion {
    /// A placeholder for preallocated `poll` buffers: zeroed, with status `GeneralErr`, so an
    /// entry `poll` did not fill can never be mistaken for a success.
    fn default() -> WorkCompletion {
        WorkCompletion {
            wr_id: 0,
            status: WcStatus::GeneralErr,
            opcode: WcOpcode::Send,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            qp_num: 0,
            src_qp: 0,
            wc_flags: WcFlags::EMPTY,
            sl: 0,
            completion_ts: 0,
            completion_wallclock_ns: 0,
            invalidated_rkey: 0,
        }
    }
}

/// The largest message verbs lets a QP carry (`max_msg_sz`, as rxe: 8 MiB).
pub const MAX_MSG_SZ: u64 = 8 << 20;
