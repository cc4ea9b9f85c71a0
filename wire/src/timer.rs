//! The two IB-encoded times of the transport: the RNR NAK timer (IBTA Table 45, "Encoding for
//! RNR NAK Timer Field") and the local ACK timeout (IBTA §9.7.6.1.3, 4.096 µs · 2^timeout).
//!
//! Verbs keeps both as small integers (`min_rnr_timer`, `timeout`); this is the one place they
//! become durations.

use core::time::Duration;

/// RNR timer index → microseconds (IBTA Table 45). Index 0 is the longest, 655.36 ms.
/// (rxe's own table has 61410 µs for index 25, a typo for 61440.)
pub const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The time an RNR NAK with timer index `index` asks the requester to wait (low 5 bits used).
pub const fn rnr_timer(index: u8) -> Duration {
    Duration::from_micros(RNR_TIMER_US[(index & 0x1F) as usize] as u64)
}

/// The smallest RNR timer index whose wait is at least `wait`; waits longer than 491.52 ms
/// give index 0 (655.36 ms), the longest.
pub fn rnr_timer_index(wait: Duration) -> u8 {
    let mut best: Option<(u8, u32)> = None;
    for (i, &us) in RNR_TIMER_US.iter().enumerate() {
        if u128::from(us) * 1000 >= wait.as_nanos() && best.is_none_or(|(_, b)| us < b) {
            best = Some((i as u8, us));
        }
    }
    best.map_or(0, |(i, _)| i)
}

/// The local ACK timeout for the verbs `timeout` attribute: 4.096 µs · 2^timeout, or `None`
/// for 0, which disables the timer (IBTA C9-140). Only the low 5 bits are used (`timeout` ≤ 31).
pub const fn local_ack_timeout(timeout: u8) -> Option<Duration> {
    let t = timeout & 0x1F;
    if t == 0 {
        None
    } else {
        Some(Duration::from_nanos(4096u64 << t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rnr_table_spot_values() {
        assert_eq!(rnr_timer(0), Duration::from_micros(655_360));
        assert_eq!(rnr_timer(1), Duration::from_micros(10));
        assert_eq!(rnr_timer(12), Duration::from_micros(640));
        assert_eq!(rnr_timer(25), Duration::from_micros(61_440));
        assert_eq!(rnr_timer(31), Duration::from_micros(491_520));
        assert_eq!(rnr_timer(32 + 12), rnr_timer(12));
        // From index 1 the table grows monotonically.
        assert!(RNR_TIMER_US[1..].windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn rnr_index_inverts_the_table() {
        for i in 0..32u8 {
            assert_eq!(rnr_timer_index(rnr_timer(i)), i, "index {i}");
        }
        assert_eq!(rnr_timer_index(Duration::ZERO), 1);
        assert_eq!(rnr_timer_index(Duration::from_micros(11)), 2);
        assert_eq!(rnr_timer_index(Duration::from_millis(500)), 0);
        assert_eq!(rnr_timer_index(Duration::from_secs(5)), 0);
    }

    #[test]
    fn ack_timeout_formula() {
        assert_eq!(local_ack_timeout(0), None);
        assert_eq!(local_ack_timeout(1), Some(Duration::from_nanos(8192)));
        // ibv_rc_pingpong's default 14: 4.096 µs · 16384 = 67.108864 ms.
        assert_eq!(
            local_ack_timeout(14),
            Some(Duration::from_nanos(67_108_864))
        );
        assert_eq!(
            local_ack_timeout(31),
            Some(Duration::from_nanos(4096 << 31))
        );
        assert_eq!(local_ack_timeout(31).unwrap().as_secs(), 8796);
    }
}
