//! Per-process QP tables in the address's registry: each member's keeper writes its QPs (type,
//! state, peer, PSNs and the first error with its reason) into its slot's table a few times a
//! second, and any process of the user reads every live member's table without joining the
//! group (`ferroce devinfo --qps` and `--why QPN`, what `rdma res show qp` is on a kernel
//! device, plus the reason no kernel device can give).
//!
//! A table is a header (a generation, odd while its owner writes, and the number of QPs the
//! process has) and up to [`RECORDS`] fixed records; a reader copies a table between two equal
//! even generations, so it never sees half of a write.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::Ordering;

use super::group::Registry;

/// Bytes of one record (and of a table's header).
const RECORD: usize = 512;
/// Records per table: a process with more QPs lists these (its failed ones first).
pub(crate) const RECORDS: usize = 31;
const TABLE: usize = RECORD * (RECORDS + 1);
const TABLES_AT: usize = super::pages::PAGES_END;
/// Where the registry's last area ends: its file's length.
pub(crate) const TABLES_END: usize = TABLES_AT + 256 * TABLE;
/// Bytes of a reason kept in a record (longer ones are cut at a character boundary).
const REASON_BYTES: usize = RECORD - 7 * 8;

fn table(slot: u8) -> usize {
    TABLES_AT + usize::from(slot) * TABLE
}

/// One QP as its process published it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QpRecord {
    pub(crate) qpn: u32,
    /// `ibv_qp_type`'s value.
    pub(crate) qp_type: u8,
    /// `ibv_qp_state`'s value.
    pub(crate) state: u8,
    /// `path_mtu` as the IBTA code (1 = 256 … 5 = 4096).
    pub(crate) path_mtu: u8,
    pub(crate) dest_qp_num: u32,
    pub(crate) sq_psn: u32,
    pub(crate) rq_psn: u32,
    /// The peer (connected QPs in RTR or later).
    pub(crate) peer: Option<IpAddr>,
    /// The first error: the completion's status (`ibv_wc_status`), its `wr_id`, and why.
    pub(crate) error: Option<(u8, u64, String)>,
}

/// A process's table: its pid, slot, how many QPs it has and the records it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Table {
    pub(crate) slot: u8,
    pub(crate) pid: u32,
    pub(crate) total: u32,
    pub(crate) qps: Vec<QpRecord>,
}

impl Registry {
    /// Writes `slot`'s table: `qps` (the first [`RECORDS`]) of the process's `total` QPs.
    pub(crate) fn publish_qps(&self, slot: u8, total: u32, qps: &[QpRecord]) {
        let at = table(slot);
        let generation = self.word64(at);
        let g = generation.load(Ordering::Relaxed);
        // Odd: a reader that sees it, or sees it change, copies again.
        generation.store(g | 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        let n = qps.len().min(RECORDS);
        self.word64(at + 8)
            .store(u64::from(total) << 32 | n as u64, Ordering::Relaxed);
        for (i, q) in qps.iter().take(RECORDS).enumerate() {
            for (k, w) in encode(q).into_iter().enumerate() {
                self.word64(at + RECORD * (i + 1) + 8 * k)
                    .store(w, Ordering::Relaxed);
            }
        }
        generation.store((g | 1) + 1, Ordering::Release);
    }

    /// The table of every live member that has written one (`mine`: the caller's own slot,
    /// or 0). A table its owner keeps rewriting while this reads it is left out.
    pub(crate) fn qp_tables(&self, mine: u8) -> Vec<Table> {
        (1..=255u8)
            .filter(|&s| self.is_live(s, mine))
            .filter_map(|slot| (0..100).find_map(|_| self.read_table(slot)).flatten())
            .collect()
    }

    /// One consistent copy of `slot`'s table: `Some(None)` if it has none, `None` if it
    /// changed while being read.
    fn read_table(&self, slot: u8) -> Option<Option<Table>> {
        let at = table(slot);
        let g1 = self.word64(at).load(Ordering::Acquire);
        if g1 == 0 {
            return Some(None);
        }
        if g1 & 1 == 1 {
            std::thread::yield_now();
            return None;
        }
        let head = self.word64(at + 8).load(Ordering::Relaxed);
        let n = (head as usize & 0xffff_ffff).min(RECORDS);
        let qps = (0..n)
            .map(|i| {
                let words: [u64; RECORD / 8] = std::array::from_fn(|k| {
                    self.word64(at + RECORD * (i + 1) + 8 * k)
                        .load(Ordering::Relaxed)
                });
                decode(&words)
            })
            .collect();
        std::sync::atomic::fence(Ordering::Acquire);
        (self.word64(at).load(Ordering::Relaxed) == g1).then(|| {
            Some(Table {
                slot,
                pid: self.pid_of(slot),
                total: (head >> 32) as u32,
                qps,
            })
        })
    }

    /// Clears `slot`'s table (its owner is new or gone).
    pub(super) fn clear_qps(&self, slot: u8) {
        self.word64(table(slot)).store(0, Ordering::Release);
        self.word64(table(slot) + 8).store(0, Ordering::Relaxed);
    }
}

/// A record as words: [qpn | type | state | mtu | flags], [dest QPN | sq PSN], [rq PSN |
/// status], peer (2 words), wr_id, reason length, the reason's bytes.
fn encode(q: &QpRecord) -> [u64; RECORD / 8] {
    let mut w = [0u64; RECORD / 8];
    let flags = u64::from(q.peer.is_some()) | u64::from(q.error.is_some()) << 1;
    w[0] = u64::from(q.qpn)
        | u64::from(q.qp_type) << 32
        | u64::from(q.state) << 40
        | u64::from(q.path_mtu) << 48
        | flags << 56;
    w[1] = u64::from(q.dest_qp_num) | u64::from(q.sq_psn) << 32;
    let (status, wr_id, reason) = match &q.error {
        Some((s, id, r)) => (*s, *id, r.as_str()),
        None => (0, 0, ""),
    };
    w[2] = u64::from(q.rq_psn) | u64::from(status) << 32;
    let peer = match q.peer {
        Some(IpAddr::V4(a)) => a.to_ipv6_mapped(),
        Some(IpAddr::V6(a)) => a,
        None => Ipv6Addr::UNSPECIFIED,
    }
    .octets();
    w[3] = u64::from_le_bytes(peer[..8].try_into().unwrap_or_default());
    w[4] = u64::from_le_bytes(peer[8..].try_into().unwrap_or_default());
    w[5] = wr_id;
    let mut len = reason.len().min(REASON_BYTES);
    while !reason.is_char_boundary(len) {
        len -= 1;
    }
    w[6] = len as u64;
    let mut bytes = [0u8; REASON_BYTES];
    bytes[..len].copy_from_slice(&reason.as_bytes()[..len]);
    for (k, chunk) in bytes.chunks(8).enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        w[7 + k] = u64::from_le_bytes(b);
    }
    w
}

fn decode(w: &[u64; RECORD / 8]) -> QpRecord {
    let flags = (w[0] >> 56) as u8;
    let mut peer = [0u8; 16];
    peer[..8].copy_from_slice(&w[3].to_le_bytes());
    peer[8..].copy_from_slice(&w[4].to_le_bytes());
    let peer = Ipv6Addr::from(peer);
    let mut bytes = Vec::with_capacity(REASON_BYTES);
    for word in &w[7..] {
        bytes.extend_from_slice(&word.to_le_bytes());
    }
    bytes.truncate((w[6] as usize).min(REASON_BYTES));
    QpRecord {
        qpn: w[0] as u32,
        qp_type: (w[0] >> 32) as u8,
        state: (w[0] >> 40) as u8,
        path_mtu: (w[0] >> 48) as u8,
        dest_qp_num: w[1] as u32,
        sq_psn: (w[1] >> 32) as u32,
        rq_psn: w[2] as u32,
        peer: (flags & 1 != 0).then(|| peer.to_ipv4_mapped().map_or(IpAddr::V6(peer), IpAddr::V4)),
        error: (flags & 2 != 0).then(|| {
            (
                (w[2] >> 32) as u8,
                w[5],
                String::from_utf8_lossy(&bytes).into_owned(),
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(qpn: u32, reason: &str) -> QpRecord {
        QpRecord {
            qpn,
            qp_type: 2,
            state: 6,
            path_mtu: 3,
            dest_qp_num: 0x10022,
            sq_psn: 0xabcdef,
            rq_psn: 0x123456,
            peer: Some("10.0.0.2".parse().unwrap()),
            error: Some((12, 77, reason.to_owned())),
        }
    }

    #[test]
    fn records_round_trip() {
        let a = record(0x10011, "no answer");
        assert_eq!(decode(&encode(&a)), a);
        let b = QpRecord {
            peer: Some("fd00::7".parse().unwrap()),
            error: None,
            ..record(0x10012, "")
        };
        assert_eq!(decode(&encode(&b)), b);
        let c = QpRecord { peer: None, ..b };
        assert_eq!(decode(&encode(&c)), c);
    }

    #[test]
    fn a_long_reason_is_cut_at_a_character_boundary() {
        // 199 ASCII bytes then 2-byte characters: the cut falls inside one.
        let long = format!("{}{}", "x".repeat(REASON_BYTES - 1), "é".repeat(10));
        let got = decode(&encode(&record(1, &long)));
        let reason = got.error.unwrap().2;
        assert_eq!(reason, "x".repeat(REASON_BYTES - 1));
    }
}
