//! Two RC engines in the simulator under an arbitrary workload (every opcode, any size up to
//! 16 KiB, any MTU and PSNs) and an arbitrary fate for each packet (deliver, drop, duplicate,
//! corrupt, delay) for a while, on a link that marks some packets CE (so CNPs pace the QPs);
//! then the link heals. Invariants: every WR completes exactly
//! once in posting order with a legitimate status, every byte lands as sent, nothing panics.
#![no_main]

use arbitrary::Arbitrary;
use ferroce_transport::Mtu;
use ferroce_transport::sim::LinkConfig;
use ferroce_transport::sim::pair::Opts;
use ferroce_transport::sim::workload::{OPCODES, Workload, execute, fate_from_bytes, lay_out};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    mtu: u8,
    psn_a: u32,
    psn_b: u32,
    max_rd_atomic: u8,
    ops: Vec<(u8, u16, u32, u64, u64)>,
    fates: Vec<u8>,
    fault_steps: u16,
    ce_tenths: u8,
}

fuzz_target!(|input: Input| {
    let raw = input
        .ops
        .iter()
        .take(16)
        .map(|&(op, len, imm, ca, swap)| (OPCODES[usize::from(op) % OPCODES.len()], u32::from(len) % (16 << 10), imm, ca, swap));
    let (ops, mem_len) = lay_out(raw);
    if ops.is_empty() {
        return;
    }
    let rd = 1 + input.max_rd_atomic % 16;
    let opts = Opts {
        mtu: Mtu::ALL[usize::from(input.mtu) % 5],
        psn_a: input.psn_a & 0xFF_FFFF,
        psn_b: input.psn_b & 0xFF_FFFF,
        max_rd_atomic: rd,
        max_dest_rd_atomic: rd,
        mem_len,
        ..Opts::default()
    };
    let link = LinkConfig { ce: f64::from(input.ce_tenths % 6) / 10.0, ..LinkConfig::default() };
    let w = Workload { opts, link, ops };
    let fate = fate_from_bytes(input.fates);
    if let Err(e) = execute(0, &w, Some(fate), u64::from(input.fault_steps % 4096) + 1) {
        panic!("invariant broken: {e}\n{w:?}");
    }
});
