//! Golden data: the five CM MADs of `rxe-mtu1024-ucmatose.pcap` (kernel rdma_cm over rxe 6.1,
//! client 10.77.0.12, server 10.77.0.11), as sent (256 bytes each; the bytes after the last
//! one given are zero).

use proptest::prelude::*;

/// The captured MADs: their bytes up to the last non-zero one.
const CAPTURED: &[(&str, &str)] = &[
    (
        "req",
        concat!(
            "010702030000000000000002ce7523140010000000000000142375ce000000000000000001061d2f",
            "505400fffe77000c000000000000000000001a0100000001000000a09bf04aa5ffff30f0ffffffff",
            "00000000000000000000ffff0a4d000c00000000000000000000ffff0a4d000b612f600000400098",
            "00000000000000000000000000000000000000000000000000000000000000000000000000000000",
            "000000000040b5590000000000000000000000000a4d000c0000000000000000000000000a4d000b",
        ),
    ),
    (
        "rep",
        concat!(
            "010702030000000000000002ce7523140013000000000000a678b8a9142375ce0000000000001a00",
            "0000000024b9f500010178e0505400fffe77000b",
        ),
    ),
    (
        "rtu",
        "010702030000000000000002ce7523140014000000000000142375cea678b8a9",
    ),
    (
        "dreq",
        "010702030000000000000002a9b878a60015000000000000a678b8a9142375ce00001a",
    ),
    (
        "drep",
        "010702030000000000000002a9b878a60016000000000000142375cea678b8a9",
    ),
];

/// The whole 256-byte MAD `name` of the capture.
pub(crate) fn mad(name: &str) -> [u8; 256] {
    let hex = CAPTURED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, h)| *h)
        .expect("a captured MAD");
    let mut m = [0u8; 256];
    for (i, b) in m.iter_mut().enumerate().take(hex.len() / 2) {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex");
    }
    m
}

/// The first `len` bytes of the CM data (after the 24-byte MAD header) of MAD `name`.
pub(crate) fn fields(name: &str, len: usize) -> Vec<u8> {
    mad(name)[24..24 + len].to_vec()
}

/// Arbitrary field values of a message: any bytes, read back as its `Repr`.
pub(crate) fn arb_bytes(len: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), len)
}
