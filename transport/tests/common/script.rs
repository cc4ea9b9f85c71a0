//! Scripted packet loss and a record of every packet put on the wire.

use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;

use ferroce_transport::Datagram;
use ferroce_transport::sim::{Fate, Network};
use ferroce_wire::{AckType, IcrcContext, Opcode, PacketRepr, Psn, RethRepr};

/// One packet seen on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub from: usize,
    pub to: usize,
    pub opcode: Opcode,
    pub psn: Psn,
    pub ack_req: bool,
    pub ack: Option<AckType>,
    pub reth: Option<RethRepr>,
    pub payload_len: usize,
    pub dropped: bool,
}

type Rule = (Box<dyn FnMut(&Seen) -> bool>, u32);

/// The record and the drop rules.
#[derive(Default)]
pub struct Script {
    pub log: Vec<Seen>,
    rules: Vec<Rule>,
}

impl Script {
    /// Installs a script on the network; returns a handle to add rules and read the log.
    pub fn install(net: &mut Network) -> Rc<RefCell<Script>> {
        let s = Rc::new(RefCell::new(Script::default()));
        let s2 = s.clone();
        net.fate = Some(Box::new(move |from, to, p: &PacketRepr<'_>| {
            let mut seen = Seen {
                from,
                to,
                opcode: p.bth.opcode,
                psn: p.bth.psn,
                ack_req: p.bth.ack_req,
                ack: p.ext.aeth.map(|a| a.ack_type()),
                reth: p.ext.reth,
                payload_len: p.payload.len(),
                dropped: false,
            };
            let mut sc = s2.borrow_mut();
            let mut drop = false;
            for (pred, left) in sc.rules.iter_mut() {
                if *left > 0 && pred(&seen) {
                    *left -= 1;
                    drop = true;
                    break;
                }
            }
            seen.dropped = drop;
            sc.log.push(seen);
            if drop { Fate::Drop } else { Fate::Deliver }
        }));
        s
    }

    /// Drops the first `times` packets matching `pred`.
    pub fn drop(&mut self, times: u32, pred: impl FnMut(&Seen) -> bool + 'static) {
        self.rules.push((Box::new(pred), times));
    }

    /// Packets matching `pred`.
    pub fn count(&self, pred: impl Fn(&Seen) -> bool) -> usize {
        self.log.iter().filter(|s| pred(s)).count()
    }
}

/// Delivers a hand-built packet to node `to` as if node `from` had sent it.
pub fn inject(net: &mut Network, from: usize, to: usize, repr: PacketRepr<'_>) {
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf);
    let (IpAddr::V4(s), IpAddr::V4(d)) = (net.nodes[from].addr, net.nodes[to].addr) else {
        panic!("simulated nodes are IPv4");
    };
    IcrcContext::v4(s, d, 0, 4791, 4791).fill(&mut buf);
    let now = net.now;
    let n = &mut net.nodes[to];
    let dg = Datagram::new(SocketAddr::new(IpAddr::V4(s), 4791), IpAddr::V4(d), &buf);
    n.endpoint.receive(now, dg, &n.mem);
}
