//! The oracle: what came back for one step against what the IBTA (and rxe) answer, sans IO.

use ferroce_wire::Opcode;

use super::case::{Expect, MTU};
use super::packet::Answer;

/// The region's byte `i` after the agent's `FILL 0 LEN seed` (rdma_peer's pattern).
pub fn region_byte(i: u64, fill_seed: u64) -> u8 {
    (i.wrapping_mul(31).wrapping_add(fill_seed) & 255) as u8
}

/// Judges the answers to one step. `Err` says how the target deviated.
pub fn judge(expect: Expect, answers: &[Answer], fill_seed: u64) -> Result<(), String> {
    if let Some(a) = answers.iter().find(|a| !a.icrc_ok) {
        return Err(format!("an answer with a wrong ICRC: {}", a.describe()));
    }
    let seen = || {
        if answers.is_empty() {
            "nothing".to_owned()
        } else {
            answers
                .iter()
                .map(Answer::describe)
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let nak_or_rnr = |a: &&Answer| a.nak().is_some() || a.is_rnr();
    match expect {
        Expect::Anything => Ok(()),
        Expect::Silence => {
            if answers.is_empty() {
                Ok(())
            } else {
                Err(format!("expected silence, got {}", seen()))
            }
        }
        Expect::SilenceOrNak(code, psn) => match answers {
            [] => Ok(()),
            [a] if a.nak() == Some(code) && a.psn_off == psn => Ok(()),
            _ => Err(format!(
                "expected silence or NAK {} psn+{psn}, got {}",
                code.name(),
                seen()
            )),
        },
        Expect::Ack(psn) => {
            if answers.iter().any(|a| nak_or_rnr(&a)) {
                return Err(format!("expected ACK psn+{psn}, got {}", seen()));
            }
            if answers.iter().any(|a| a.is_ack() && a.psn_off == psn) {
                Ok(())
            } else {
                Err(format!("expected ACK psn+{psn}, got {}", seen()))
            }
        }
        Expect::Nak(code, psn) => {
            let naks: Vec<&Answer> = answers.iter().filter(|a| a.nak().is_some()).collect();
            match naks.as_slice() {
                [a] if a.nak() == Some(code) && a.psn_off == psn => Ok(()),
                _ => Err(format!(
                    "expected one NAK {} psn+{psn}, got {}",
                    code.name(),
                    seen()
                )),
            }
        }
        Expect::Rnr(psn) => {
            if answers.iter().any(|a| a.is_rnr() && a.psn_off == psn)
                && !answers.iter().any(|a| a.nak().is_some())
            {
                Ok(())
            } else {
                Err(format!("expected RNR NAK psn+{psn}, got {}", seen()))
            }
        }
        Expect::AtomicOrig { psn_off, off } => {
            let want = u64::from_le_bytes(std::array::from_fn(|i| {
                region_byte(off + i as u64, fill_seed)
            }));
            match answers {
                [a] if a.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE
                    && a.psn_off == psn_off
                    && a.is_ack() =>
                {
                    if a.orig == Some(want) {
                        Ok(())
                    } else {
                        Err(format!(
                            "atomic ACK with original {:#x?}, the region held {want:#x}",
                            a.orig
                        ))
                    }
                }
                _ => Err(format!(
                    "expected one atomic ACK psn+{psn_off}, got {}",
                    seen()
                )),
            }
        }
        Expect::ReadData { psn_off, off, len } => {
            let n = len.div_ceil(MTU).max(1);
            let ops: Vec<Opcode> = (0..n)
                .map(|i| match (i == 0, i + 1 == n) {
                    (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                    (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                })
                .collect();
            if answers.len() != n as usize {
                return Err(format!(
                    "expected {n} READ response(s) from psn+{psn_off}, got {}",
                    seen()
                ));
            }
            let mut data = Vec::with_capacity(len as usize);
            for (i, (a, op)) in answers.iter().zip(&ops).enumerate() {
                if a.opcode != *op || a.psn_off != (psn_off + i as u32) & 0xFF_FFFF {
                    return Err(format!(
                        "READ response {i}: expected {} psn+{}, got {}",
                        op.name(),
                        psn_off + i as u32,
                        a.describe()
                    ));
                }
                data.extend_from_slice(&a.payload);
            }
            let want: Vec<u8> = (0..u64::from(len))
                .map(|i| region_byte(off + i, fill_seed))
                .collect();
            if data == want {
                Ok(())
            } else {
                let at = data.iter().zip(&want).position(|(a, b)| a != b);
                Err(format!(
                    "READ data differs from the region ({} bytes, expected {len}; first difference at {at:?})",
                    data.len()
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroce_wire::{NakCode, Syndrome};

    fn ans(opcode: Opcode, psn_off: u32, syndrome: Option<Syndrome>) -> Answer {
        Answer {
            opcode,
            psn_off,
            syndrome: syndrome.map(|s| s.0),
            orig: None,
            payload: Vec::new(),
            icrc_ok: true,
        }
    }

    fn ack(psn: u32) -> Answer {
        ans(Opcode::RC_ACKNOWLEDGE, psn, Some(Syndrome::ACK_UNLIMITED))
    }

    fn nak(code: NakCode, psn: u32) -> Answer {
        ans(Opcode::RC_ACKNOWLEDGE, psn, Some(Syndrome::nak(code)))
    }

    #[test]
    fn acks_naks_and_silence() {
        assert!(judge(Expect::Ack(2), &[ack(2)], 0).is_ok());
        assert!(judge(Expect::Ack(2), &[ack(1)], 0).is_err());
        assert!(judge(Expect::Ack(2), &[], 0).is_err());
        assert!(
            judge(
                Expect::Ack(0),
                &[ack(0), nak(NakCode::InvalidRequest, 0)],
                0
            )
            .is_err()
        );
        let seq = Expect::Nak(NakCode::PsnSeqError, 0);
        assert!(judge(seq, &[nak(NakCode::PsnSeqError, 0)], 0).is_ok());
        assert!(judge(seq, &[nak(NakCode::PsnSeqError, 5)], 0).is_err());
        assert!(
            judge(
                seq,
                &[nak(NakCode::PsnSeqError, 0), nak(NakCode::PsnSeqError, 0)],
                0
            )
            .is_err()
        );
        assert!(judge(seq, &[nak(NakCode::InvalidRequest, 0)], 0).is_err());
        assert!(judge(Expect::Silence, &[], 0).is_ok());
        assert!(judge(Expect::Silence, &[ack(0)], 0).is_err());
        let either = Expect::SilenceOrNak(NakCode::InvalidRequest, 0);
        assert!(judge(either, &[], 0).is_ok());
        assert!(judge(either, &[nak(NakCode::InvalidRequest, 0)], 0).is_ok());
        assert!(judge(either, &[ack(0)], 0).is_err());
        let rnr = ans(Opcode::RC_ACKNOWLEDGE, 0, Some(Syndrome::rnr_nak(12)));
        assert!(judge(Expect::Rnr(0), std::slice::from_ref(&rnr), 0).is_ok());
        assert!(judge(Expect::Rnr(0), &[ack(0)], 0).is_err());
        assert!(judge(Expect::Nak(NakCode::InvalidRequest, 0), &[rnr], 0).is_err());
        let mut bad = ack(2);
        bad.icrc_ok = false;
        assert!(judge(Expect::Ack(2), &[bad], 0).is_err());
    }

    #[test]
    fn read_data_and_atomic_originals_are_checked_against_the_region() {
        let seed = 9;
        let len = MTU + 10;
        let mut first = ans(
            Opcode::RC_RDMA_READ_RESPONSE_FIRST,
            0,
            Some(Syndrome::ACK_UNLIMITED),
        );
        first.payload = (0..u64::from(MTU))
            .map(|i| region_byte(100 + i, seed))
            .collect();
        let mut last = ans(
            Opcode::RC_RDMA_READ_RESPONSE_LAST,
            1,
            Some(Syndrome::ACK_UNLIMITED),
        );
        last.payload = (u64::from(MTU)..u64::from(len))
            .map(|i| region_byte(100 + i, seed))
            .collect();
        let e = Expect::ReadData {
            psn_off: 0,
            off: 100,
            len,
        };
        assert!(judge(e, &[first.clone(), last.clone()], seed).is_ok());
        last.payload[3] ^= 1;
        assert!(judge(e, &[first.clone(), last.clone()], seed).is_err());
        assert!(judge(e, &[first], seed).is_err(), "a response missing");
        let mut a = ans(
            Opcode::RC_ATOMIC_ACKNOWLEDGE,
            0,
            Some(Syndrome::ACK_UNLIMITED),
        );
        a.orig = Some(u64::from_le_bytes(std::array::from_fn(|i| {
            region_byte(64 + i as u64, seed)
        })));
        let e = Expect::AtomicOrig {
            psn_off: 0,
            off: 64,
        };
        assert!(judge(e, std::slice::from_ref(&a), seed).is_ok());
        a.orig = Some(0);
        assert!(judge(e, &[a], seed).is_err());
    }
}
