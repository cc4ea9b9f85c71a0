//! Fault injection at the socket layer for tests and demos: `FERROCE_FAULTS=loss=0.05,dup=0.01,
//! reorder=0.02,corrupt=0.001[,seed=N][,droprx=OPCODE]`.
//!
//! Every probability is per packet, end to end between two ferroce devices that both inject:
//! a packet is lost with probability `loss` in all, split evenly between the sender's socket
//! and the receiver's (each drops with 1 − √(1 − loss)); duplication and reordering happen on
//! send, corruption on receive (where the ICRC catches it).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Probabilities of each fault, per packet, per direction.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    /// A packet is lost (end to end; see the module docs).
    pub loss: f64,
    /// A sent packet goes out twice.
    pub dup: f64,
    /// A sent packet is held back and goes out after the next one.
    pub reorder: f64,
    /// One bit of a received packet is flipped (the ICRC catches it).
    pub corrupt: f64,
    /// A received ECN-capable packet is marked Congestion Experienced, as a queue with ECN
    /// marking on the path would (the notification point then answers with CNPs).
    pub ce: f64,
    /// Seed of the fault generator (default: from the clock).
    pub seed: Option<u64>,
    /// The first received packet with this BTH opcode is dropped, once per device, whatever
    /// shard receives it (`droprx=0x10`: a READ's first RDMA READ Response Only): one loss
    /// exactly where a test wants it.
    pub drop_rx_opcode: Option<u8>,
}

/// A malformed `FERROCE_FAULTS` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultSpecError(pub String);

impl fmt::Display for FaultSpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bad FERROCE_FAULTS: {} (expected e.g. loss=0.05,dup=0.01,reorder=0.02,corrupt=0.001,ce=0.01,seed=7)",
            self.0
        )
    }
}

impl std::error::Error for FaultSpecError {}

impl FaultConfig {
    /// Parses `loss=0.05,dup=0.01,...`.
    ///
    /// # Errors
    /// [`FaultSpecError`] naming the bad item.
    pub fn parse(spec: &str) -> Result<FaultConfig, FaultSpecError> {
        let mut c = FaultConfig::default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| FaultSpecError(item.to_owned()))?;
            if k == "seed" {
                c.seed = Some(v.parse().map_err(|_| FaultSpecError(item.to_owned()))?);
                continue;
            }
            if k == "droprx" {
                let op = match v.strip_prefix("0x") {
                    Some(hex) => u8::from_str_radix(hex, 16),
                    None => v.parse(),
                };
                c.drop_rx_opcode = Some(op.map_err(|_| FaultSpecError(item.to_owned()))?);
                continue;
            }
            let p: f64 = v.parse().map_err(|_| FaultSpecError(item.to_owned()))?;
            if !(0.0..=1.0).contains(&p) {
                return Err(FaultSpecError(item.to_owned()));
            }
            match k {
                "loss" => c.loss = p,
                "dup" => c.dup = p,
                "reorder" => c.reorder = p,
                "corrupt" => c.corrupt = p,
                "ce" => c.ce = p,
                _ => return Err(FaultSpecError(item.to_owned())),
            }
        }
        Ok(c)
    }

    /// The configuration in `FERROCE_FAULTS`, if set.
    ///
    /// # Errors
    /// [`FaultSpecError`] if it is set but malformed.
    pub fn from_env() -> Result<Option<FaultConfig>, FaultSpecError> {
        match std::env::var("FERROCE_FAULTS") {
            Ok(s) if !s.trim().is_empty() => FaultConfig::parse(&s).map(Some),
            _ => Ok(None),
        }
    }
}

/// A seed from the clock, for a configuration without one.
pub(crate) fn seed_from_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// The injector's decisions: a config and its random generator (xorshift64*).
#[derive(Debug, Clone)]
pub(crate) struct Faults {
    cfg: FaultConfig,
    state: u64,
    /// A receiver's: whether the packet `drop_rx_opcode` names has been dropped, one flag
    /// for all the shards of a device, so that `droprx` drops one packet, as with one shard.
    /// A transmitter has none (it never drops by opcode).
    dropped_rx: Option<Arc<AtomicBool>>,
}

impl Faults {
    /// A transmitter's injector drawing from `seed`.
    pub(crate) fn new(cfg: FaultConfig, seed: u64) -> Faults {
        Faults {
            cfg,
            state: seed | 1,
            dropped_rx: None,
        }
    }

    /// A receiver's injector drawing from `seed`; `dropped_rx` is the device's `droprx` flag.
    pub(crate) fn receiving(cfg: FaultConfig, seed: u64, dropped_rx: Arc<AtomicBool>) -> Faults {
        Faults {
            dropped_rx: Some(dropped_rx),
            ..Faults::new(cfg, seed)
        }
    }

    fn next(&mut self) -> f64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.next() < p
    }

    /// Whether to drop a packet at this socket: half the end-to-end loss, in probability.
    pub(crate) fn lose(&mut self) -> bool {
        let p = 1.0 - (1.0 - self.cfg.loss).sqrt();
        self.chance(p)
    }

    /// Whether this received packet (a UDP payload, BTH first) is the one `droprx` drops.
    pub(crate) fn drop_rx(&mut self, packet: &[u8]) -> bool {
        self.cfg.drop_rx_opcode.is_some()
            && packet.first().copied() == self.cfg.drop_rx_opcode
            && self
                .dropped_rx
                .as_ref()
                .is_some_and(|once| !once.swap(true, Ordering::Relaxed))
    }

    pub(crate) fn duplicate(&mut self) -> bool {
        let p = self.cfg.dup;
        self.chance(p)
    }

    pub(crate) fn reorder(&mut self) -> bool {
        let p = self.cfg.reorder;
        self.chance(p)
    }

    /// Whether to mark a received packet CE.
    pub(crate) fn mark_ce(&mut self) -> bool {
        let p = self.cfg.ce;
        self.chance(p)
    }

    /// Maybe flips one bit of `b`.
    pub(crate) fn corrupt(&mut self, b: &mut [u8]) {
        let p = self.cfg.corrupt;
        if !b.is_empty() && self.chance(p) {
            let bit = (self.next() * (b.len() * 8) as f64) as usize % (b.len() * 8);
            b[bit / 8] ^= 1 << (bit % 8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        let c =
            FaultConfig::parse("loss=0.05, dup=0.01,reorder=0.02,corrupt=0.001,seed=9").unwrap();
        assert_eq!(
            (c.loss, c.dup, c.reorder, c.corrupt, c.seed),
            (0.05, 0.01, 0.02, 0.001, Some(9))
        );
        assert!(FaultConfig::parse("loss=2").is_err());
        assert!(FaultConfig::parse("lose=0.1").is_err());
        assert!(FaultConfig::parse("loss").is_err());
        assert_eq!(
            FaultConfig::parse("droprx=0x10").unwrap().drop_rx_opcode,
            Some(0x10)
        );
        assert_eq!(
            FaultConfig::parse("droprx=17").unwrap().drop_rx_opcode,
            Some(17)
        );
        assert!(FaultConfig::parse("droprx=0x100").is_err());
        assert_eq!(FaultConfig::parse("").unwrap(), FaultConfig::default());
    }

    #[test]
    fn droprx_drops_the_first_packet_of_its_opcode_once() {
        let mut f = Faults::receiving(
            FaultConfig::parse("droprx=0x10").unwrap(),
            1,
            Arc::default(),
        );
        let packets: [&[u8]; 5] = [&[0x11, 0], &[0x10, 1], &[0x10, 2], &[], &[0x10]];
        let seen: Vec<bool> = packets.iter().map(|p| f.drop_rx(p)).collect();
        assert_eq!(seen, vec![false, true, false, false, false]);
    }

    #[test]
    fn droprx_drops_once_per_device_not_once_per_shard() {
        // Two shards' receivers share the device's flag: the second shard's first packet of
        // the opcode passes (dropping it too was a second loss no test asked for: a FLUSH
        // response that kernel rxe never sends again).
        let cfg = FaultConfig::parse("droprx=0x10").unwrap();
        let once = Arc::new(AtomicBool::new(false));
        let mut a = Faults::receiving(cfg, 1, once.clone());
        let mut b = Faults::receiving(cfg, 2, once);
        assert!(a.drop_rx(&[0x10]));
        assert!(!b.drop_rx(&[0x10]));
        assert!(!a.drop_rx(&[0x10]));
        // A transmitter's injector never drops by opcode.
        assert!(!Faults::new(cfg, 3).drop_rx(&[0x10]));
    }

    #[test]
    fn loss_rate_is_about_right() {
        let mut f = Faults::new(
            FaultConfig {
                loss: 0.1,
                ..FaultConfig::default()
            },
            3,
        );
        // Two sockets each dropping 1 − √0.9 lose 10 % end to end.
        let lost = (0..100_000).filter(|_| f.lose() || f.lose()).count();
        assert!((9_000..11_000).contains(&lost), "{lost}");
    }
}
