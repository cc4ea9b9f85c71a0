//! Two connected endpoints in one process on private loopback addresses: the set-up of
//! `ferroce demo`, `ferroce bw`/`lat` without a server, and the tests.

use std::net::IpAddr;

use ferroce::transport::{AccessFlags, Mtu, QpCap, QpType, RecvWr};
use ferroce::{
    CompletionChannel, CompletionQueue, Context, Device, Error, MemoryRegion, OpenOptions,
    ProtectionDomain, QpInitAttr, QueuePair, Result,
};

/// Every access right.
pub const ALL_ACCESS: AccessFlags = AccessFlags(1 | 2 | 4 | 8);

/// One side: a device, a PD, a CQ, QPs and a memory region.
#[derive(Debug)]
pub struct Side {
    /// The open device.
    pub ctx: Context,
    /// Its PD.
    pub pd: ProtectionDomain,
    /// One CQ for sends and receives of every QP.
    pub cq: CompletionQueue,
    /// The QPs.
    pub qps: Vec<QueuePair>,
    /// The memory region.
    pub mr: MemoryRegion,
    /// The CQ's completion channel (`ibv_comp_channel`), for sides that wait for events.
    pub channel: Option<CompletionChannel>,
}

impl Side {
    /// A receive WR (`ibv_recv_wr`) `wr_id` for the first `len` bytes of the region.
    pub fn recv_wr(&self, wr_id: u64, len: u32) -> RecvWr {
        RecvWr {
            wr_id,
            sg_list: [self.mr.sge(0, len)].into(),
        }
    }
}

/// Opens a device on the first free pair of addresses 127.77.x.1 / 127.77.x.2.
///
/// # Errors
/// [`Error::AddressInUse`] if 64 candidate pairs are all taken, or any open failure.
pub fn open_pair(opts: &OpenOptions) -> Result<(Context, Context)> {
    let mut last = None;
    for x in 0..64u8 {
        let (a, b) = (IpAddr::from([127, 77, x, 1]), IpAddr::from([127, 77, x, 2]));
        match (
            Device::for_addr(a)?.open_with(opts.clone()),
            Device::for_addr(b)?.open_with(opts.clone()),
        ) {
            (Ok(ca), Ok(cb)) => return Ok((ca, cb)),
            (Err(e), _) | (_, Err(e)) => last = Some(e),
        }
    }
    Err(last.unwrap_or(Error::NoDevice("127.77.x.y".into())))
}

/// A side with `nqp` QPs of `qp_type` and a region of `mem` bytes.
///
/// # Errors
/// Any verbs failure.
pub fn side(ctx: Context, qp_type: QpType, nqp: usize, mem: usize, depth: u32) -> Result<Side> {
    side_with(ctx, qp_type, nqp, mem, depth, false)
}

/// As [`side`], its CQ on a completion channel if `events`.
///
/// # Errors
/// Any verbs failure.
pub fn side_with(
    ctx: Context,
    qp_type: QpType,
    nqp: usize,
    mem: usize,
    depth: u32,
    events: bool,
) -> Result<Side> {
    let pd = ctx.alloc_pd();
    let channel = if events {
        Some(ctx.create_comp_channel()?)
    } else {
        None
    };
    let cq = ctx.create_cq(
        (depth * 2 * nqp as u32).clamp(16, ferroce::context::limits::MAX_CQE),
        channel.as_ref(),
    )?;
    let cap = QpCap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qps = (0..nqp)
        .map(|_| {
            pd.create_qp(&QpInitAttr {
                qp_type,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap,
                sq_sig_all: false,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mr = pd.reg_mr(mem, ALL_ACCESS)?;
    Ok(Side {
        ctx,
        pd,
        cq,
        qps,
        mr,
        channel,
    })
}

/// The device's `max_qp_init_rd_atom` (128), perftest's default depth of READs and atomics
/// (`-o`): with it a long READ toward another ferroce goes in pairs
/// (`EndpointConfig::pair_reads`), whose responses leave in full trains.
// The limit is 128: it fits a u8, as the verbs attribute does.
pub const DEEP_RD_ATOMIC: u8 = ferroce::context::limits::MAX_RD_ATOM as u8;

/// Two sides connected QP to QP, [`DEEP_RD_ATOMIC`] READs deep.
///
/// # Errors
/// Any open or verbs failure.
pub fn connected_pair(
    opts: &OpenOptions,
    qp_type: QpType,
    nqp: usize,
    mem: usize,
    mtu: Mtu,
    depth: u32,
) -> Result<(Side, Side)> {
    connected_pair_with(opts, qp_type, nqp, mem, mtu, depth, false)
}

/// As [`connected_pair`], each CQ on a completion channel if `events`.
///
/// # Errors
/// Any open or verbs failure.
pub fn connected_pair_with(
    opts: &OpenOptions,
    qp_type: QpType,
    nqp: usize,
    mem: usize,
    mtu: Mtu,
    depth: u32,
    events: bool,
) -> Result<(Side, Side)> {
    let (ca, cb) = open_pair(opts)?;
    let (aa, ab) = (ca.device().addr, cb.device().addr);
    let a = side_with(ca, qp_type, nqp, mem, depth, events)?;
    let b = side_with(cb, qp_type, nqp, mem, depth, events)?;
    for (i, (qa, qb)) in a.qps.iter().zip(&b.qps).enumerate() {
        let (pa, pb) = (0x1000 + i as u32, 0x2000 + i as u32);
        qa.connect_to_rd_atomic(ab, qb.qp_num(), mtu, (pa, pb), DEEP_RD_ATOMIC)?;
        qb.connect_to_rd_atomic(aa, qa.qp_num(), mtu, (pb, pa), DEEP_RD_ATOMIC)?;
    }
    Ok((a, b))
}
