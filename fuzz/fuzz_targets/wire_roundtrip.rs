//! parse → emit → parse is the identity on every packet that parses, and the emitted packet
//! has the same length as the input.
#![no_main]

use ferroce_wire::PacketRepr;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(repr) = PacketRepr::parse(data) else { return };
    let mut out = vec![0xa5u8; repr.buffer_len()];
    assert_eq!(out.len(), data.len());
    repr.emit(&mut out);
    let again = PacketRepr::parse(&out).expect("an emitted packet parses");
    assert_eq!(again, repr);
    // Headers and payload are byte-identical up to reserved bits, which are emitted as zero.
    let n = repr.header_len();
    assert_eq!(&out[n..n + repr.payload.len()], repr.payload);
});
