//! Per-process counter pages in the address's registry: each member's keeper copies its
//! engine and runtime counters into its slot's page every keeper period, and any process of
//! the user reads every live member's page without joining the group (`ferroce devinfo
//! --counters`, what `/sys/class/infiniband/<dev>/ports/1/hw_counters/` is on a kernel
//! device).

use std::sync::atomic::Ordering;

use super::group::Registry;

/// Words per page: the publication time (ns since the Unix epoch), then the counters.
const PAGE_WORDS: usize = 64;
const PAGES_AT: usize = super::gsi::TABLES_END;
/// Where the counter pages end (the QP tables follow, see `qptable`).
pub(crate) const PAGES_END: usize = PAGES_AT + 256 * PAGE_WORDS * 8;
/// The most counters a page holds.
pub(crate) const MAX_COUNTERS: usize = PAGE_WORDS - 1;

fn page(slot: u8) -> usize {
    PAGES_AT + usize::from(slot) * PAGE_WORDS * 8
}

/// One live member's page: its slot, pid, when it was written and its counters in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Page {
    pub(crate) slot: u8,
    pub(crate) pid: u32,
    pub(crate) published_ns: u64,
    pub(crate) values: Vec<u64>,
}

impl Registry {
    /// Writes `slot`'s counters (the first [`MAX_COUNTERS`]) and the time.
    pub(crate) fn publish(&self, slot: u8, values: impl Iterator<Item = u64>) {
        let at = page(slot);
        for (i, v) in values.take(MAX_COUNTERS).enumerate() {
            self.word64(at + 8 * (i + 1)).store(v, Ordering::Relaxed);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        self.word64(at).store(now, Ordering::Release);
    }

    /// The pages of every live member that has published, `n` counters each (`mine`: the
    /// caller's own slot, or 0).
    pub(crate) fn pages(&self, n: usize, mine: u8) -> Vec<Page> {
        (1..=255u8)
            .filter(|&s| self.is_live(s, mine))
            .filter_map(|slot| {
                let at = page(slot);
                let published_ns = self.word64(at).load(Ordering::Acquire);
                (published_ns != 0).then(|| Page {
                    slot,
                    pid: self.pid_of(slot),
                    published_ns,
                    values: (0..n.min(MAX_COUNTERS))
                        .map(|i| self.word64(at + 8 * (i + 1)).load(Ordering::Relaxed))
                        .collect(),
                })
            })
            .collect()
    }

    /// Clears `slot`'s page (its owner is new or gone).
    pub(super) fn clear_page(&self, slot: u8) {
        let at = page(slot);
        for i in 0..PAGE_WORDS {
            self.word64(at + 8 * i).store(0, Ordering::Relaxed);
        }
    }
}
