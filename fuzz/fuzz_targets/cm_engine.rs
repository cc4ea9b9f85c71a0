//! Arbitrary MADs at the connection manager: at a listener, and at both ends of an
//! established connection (the comm IDs patched to the live ones, the CM header made valid
//! half the time), then every timer run out. Nothing may panic; the engine keeps answering.
#![no_main]

use std::net::IpAddr;
use std::time::Duration;

use ferroce_transport::cm::{CmConfig, CmEngine, CmEvent, ConnParam, ConnectReq, Path};
use ferroce_transport::{Instant, Mtu};
use ferroce_wire::cm::{port_space, service_id};
use libfuzzer_sys::fuzz_target;

const SID: u64 = service_id(port_space::TCP, 7174);

fn engine(n: u8) -> CmEngine {
    CmEngine::new(CmConfig { ca_guid: u64::from(n), comm_id_prefix: n, local_ca_ack_delay: 15, seed: 5 })
}

fn addr(n: u8) -> IpAddr {
    IpAddr::from([10, 0, 0, n])
}

/// Delivers everything each engine sent to the other, until quiet.
fn pump(cm: &mut [CmEngine; 2], now: Instant) {
    for _ in 0..16 {
        let mut moved = false;
        for side in 0..2 {
            while let Some(o) = cm[side].poll_transmit() {
                moved = true;
                let to = if o.dest == addr(1) { 0 } else { 1 };
                if to != side {
                    cm[to].handle_mad(now, addr(side as u8 + 1), &o.mad);
                }
            }
        }
        if !moved {
            return;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // A whole RoCE payload (UD SEND with DETH) from the seeds, or the bytes as a MAD.
    let mut mad = [0u8; 256];
    let body = if data.len() >= 276 && data[0] == 0x64 { &data[20..276] } else { data };
    let n = body.len().min(256);
    mad[..n].copy_from_slice(&body[..n]);

    let mut cm = [engine(1), engine(2)];
    let _ = cm[1].listen(SID);
    let mut now = Instant::ZERO;
    let req = ConnectReq {
        service_id: SID,
        path: Path { local: addr(1), remote: addr(2), mtu: Mtu::Mtu1024, hop_limit: 64, traffic_class: 0, flow_label: 1 },
        qpn: 0x11,
        transport_service_type: 0,
        param: ConnParam { responder_resources: 1, initiator_depth: 1, retry_count: 7, rnr_retry_count: 7, ..ConnParam::default() },
        ack_timeout: 19,
    };
    let Ok(a) = cm[0].connect(now, req) else { return };
    pump(&mut cm, now);
    let mut b = None;
    while let Some(e) = cm[1].poll_event() {
        if let CmEvent::ConnectRequest { id, .. } = e {
            b = Some(id);
        }
    }
    let Some(b) = b else { return };
    let _ = cm[1].accept(now, b, ConnParam { qp_num: 0x22, ..ConnParam::default() });
    pump(&mut cm, now);
    let _ = cm[0].establish(now, a);
    pump(&mut cm, now);

    for (side, target) in [(0usize, a), (1, b)] {
        cm[side].handle_mad(now, addr(3), &mad);
        cm[side].handle_mad(now, addr(2 - side as u8), &mad[..n]);
        let mut m = mad;
        m[..4].copy_from_slice(&[1, 7, 2, 3]);
        m[28..32].copy_from_slice(&target.to_be_bytes());
        cm[side].handle_mad(now, addr(2 - side as u8), &m);
        pump(&mut cm, now);
    }
    for _ in 0..40 {
        now = now + Duration::from_secs(5);
        cm[0].handle_timeout(now);
        cm[1].handle_timeout(now);
        pump(&mut cm, now);
        while cm[0].poll_event().is_some() || cm[1].poll_event().is_some() {}
    }
});
