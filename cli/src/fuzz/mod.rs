//! `ferroce fuzz`: a stateful fuzzer and conformance prober aimed at a remote RoCE stack.
//!
//! A target agent (the lab's C peer `rdma_peer` on any libibverbs device — kernel rxe, a NIC,
//! or ferroce's `libibverbs.so.1` — or `ferroce fuzz-agent` on a ferroce device) creates a fresh
//! RC QP and region for every case on command over TCP and connects it to a QP number the
//! fuzzer makes up. The fuzzer then speaks RoCEv2 to it from a plain UDP socket on port 4791:
//! each case takes the new connection somewhere (idle RTS, inside a multi-packet message,
//! after a NAK) and sends what its campaign mutates there, and the oracle checks every answer
//! against the rule the case names. After each case a liveness probe connects afresh and
//! WRITEs once. Verdicts: conforms, deviates (with the rule), hang (the probe got no ACK),
//! crash (the agent is gone).
//!
//! Cases are a function of the seed, the campaign and the index (`campaigns::generate`; each campaign is a module of [`campaigns`], run on the
//! [`harness`]), so a
//! campaign is the same sequence of cases and packets for the same seed (the target's QPN,
//! R_Key and region address, which it chooses, are filled in as it answers); `--replay
//! SEED:CAMPAIGN:INDEX` runs one case again, and a deviating case is shrunk to the fewest
//! packets that still show it.

pub mod agent;
pub mod campaigns;
pub mod case;
pub mod harness;
pub mod oracle;
pub mod packet;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use case::{CampaignId, Case};
use harness::{Agent, Harness, Verdict};

/// What to fuzz and for how long.
#[derive(Debug, Clone)]
pub struct Options {
    /// The target's RoCE address.
    pub target: Ipv4Addr,
    /// The agent's control address (TCP).
    pub agent: SocketAddr,
    /// Our address (the UDP socket binds it, port 4791).
    pub local: Ipv4Addr,
    /// The campaigns, run round-robin.
    pub campaigns: Vec<CampaignId>,
    /// The seed.
    pub seed: u64,
    /// Stop after this long.
    pub seconds: f64,
    /// Stop after this many cases.
    pub max_cases: Option<u64>,
    /// How long to wait for answers after each packet.
    pub window: Duration,
    /// Where the pcap of every packet goes.
    pub pcap: Option<PathBuf>,
    /// Only this case (`SEED:CAMPAIGN:INDEX`).
    pub replay: Option<(u64, CampaignId, u32)>,
    /// Print only deviations and the summary.
    pub quiet: bool,
    /// The port of the target's rdma_cm listener (the `cm` campaign); `--via-cm` connects to
    /// an accepting one on the next port.
    pub cm_port: u16,
    /// Connect the RC cases through the target's rdma_cm.
    pub via_cm: bool,
}

/// Counts of one campaign.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Cases run.
    pub cases: u64,
    /// Cases that conformed.
    pub conform: u64,
    /// Deviations by rule.
    pub deviate: BTreeMap<String, u64>,
    /// Hangs.
    pub hangs: u64,
    /// Crashes.
    pub crashes: u64,
}

impl Tally {
    fn deviations(&self) -> u64 {
        self.deviate.values().sum()
    }
}

/// The result of a run: a tally per campaign.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Per campaign.
    pub campaigns: BTreeMap<CampaignId, Tally>,
}

impl Summary {
    /// The totals: (cases, conform, deviate, hangs, crashes).
    pub fn totals(&self) -> (u64, u64, u64, u64, u64) {
        self.campaigns.values().fold((0, 0, 0, 0, 0), |t, c| {
            (
                t.0 + c.cases,
                t.1 + c.conform,
                t.2 + c.deviations(),
                t.3 + c.hangs,
                t.4 + c.crashes,
            )
        })
    }

    /// Counts a case's verdict and prints its line (conforming ones unless `quiet`).
    fn record(&mut self, case: &Case, id: &str, verdict: &Verdict, quiet: bool, replay: &str) {
        let t = self.campaigns.entry(case.campaign).or_default();
        t.cases += 1;
        match verdict {
            Verdict::Conforms => {
                t.conform += 1;
                if !quiet {
                    println!("case {id} {}: conforms", case.what);
                }
            }
            Verdict::Deviates { step, why } => {
                *t.deviate.entry(case.rule.to_owned()).or_default() += 1;
                println!(
                    "case {id} {}: DEVIATES at packet {step}: {why}\n    rule: {}\n    replay: {replay}",
                    case.what, case.rule
                );
            }
            Verdict::Hang(why) => {
                t.hangs += 1;
                println!("case {id} {}: HANG: {why}", case.what);
            }
            Verdict::Crash(why) => {
                t.crashes += 1;
                println!("case {id} {}: CRASH: {why}", case.what);
            }
        }
    }

    /// The table, ending with `N cases, N conform, N deviate, N hangs, N crashes`.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<10} {:>7} {:>8} {:>8} {:>6} {:>8}\n",
            "campaign", "cases", "conform", "deviate", "hangs", "crashes"
        );
        for (c, t) in &self.campaigns {
            s += &format!(
                "{:<10} {:>7} {:>8} {:>8} {:>6} {:>8}\n",
                c.name(),
                t.cases,
                t.conform,
                t.deviations(),
                t.hangs,
                t.crashes
            );
            for (rule, n) in &t.deviate {
                s += &format!("    {n} × {rule}\n");
            }
        }
        let (n, ok, dev, hangs, crashes) = self.totals();
        s += &format!("{n} cases, {ok} conform, {dev} deviate, {hangs} hangs, {crashes} crashes\n");
        s
    }
}

/// Runs the campaigns against the target and returns the summary (printing a line per case
/// unless quiet, and each deviation's replay command and shrunk packets).
///
/// # Errors
/// Reaching the agent or opening the socket or pcap.
pub fn run(opts: &Options, mut target_alive: impl FnMut() -> bool) -> std::io::Result<Summary> {
    let agent = Agent::connect(opts.agent, Duration::from_secs(30))?;
    let mut runner = Harness::new(
        agent,
        opts.local,
        opts.target,
        opts.window,
        opts.pcap.as_deref(),
    )?;
    runner.cm_port = opts.cm_port;
    runner.via_cm = opts.via_cm;
    let mut summary = Summary::default();
    let deadline = Instant::now() + Duration::from_secs_f64(opts.seconds.max(0.0));
    let cases: Box<dyn Iterator<Item = Case>> = match opts.replay {
        Some((seed, c, i)) => Box::new(std::iter::once(campaigns::generate(c, seed, i))),
        None => {
            let (campaigns, seed) = (opts.campaigns.clone(), opts.seed);
            Box::new((0u64..).map(move |n| {
                let c = campaigns[(n % campaigns.len() as u64) as usize];
                campaigns::generate(c, seed, (n / campaigns.len() as u64) as u32)
            }))
        }
    };
    for (n, case) in cases.enumerate() {
        if opts.replay.is_none()
            && (Instant::now() >= deadline || opts.max_cases.is_some_and(|m| n as u64 >= m))
        {
            break;
        }
        let mut verdict = campaigns::get(case.campaign)
            .run(&case, &mut runner)
            .unwrap_or_else(|e| Verdict::Crash(e.to_string()));
        if matches!(verdict, Verdict::Crash(_) | Verdict::Hang(_)) && !target_alive() {
            verdict = Verdict::Crash("the target process ended".into());
        }
        let id = case.id();
        let replay = format!("ferroce fuzz --replay {id} (with the same target options)");
        summary.record(&case, &id, &verdict, opts.quiet, &replay);
        if let Verdict::Deviates { step, .. } = &verdict {
            match &case.body {
                case::Body::Cm(kind) => println!("    one MAD: {kind:?}"),
                case::Body::Requester { kind, len } => {
                    println!("    one WRITE, answered {:?}", (kind, len))
                }
                case::Body::Packets(_) => {
                    let shrunk = runner.shrink(&case, *step);
                    println!("    shrunk to {} packet(s):", shrunk.len());
                    for s in &shrunk {
                        println!("      {:?} -> expect {:?}", s.packet, s.expect);
                    }
                }
            }
        }
        if matches!(verdict, Verdict::Crash(_)) {
            // Nothing is left to talk to.
            break;
        }
    }
    runner.flush();
    let _ = runner.agent.cmd("QUIT");
    Ok(summary)
}

/// Cases against an unmodified `ibv_rc_pingpong -g 1 -n 1 -s SIZE` server, one per server run
/// (`--pingpong`): `opts.max_cases` runs (1 unless set), each waiting for the server to listen
/// again; `replay` is `(seed, index)` of one.
pub fn run_pingpong(
    opts: &Options,
    server: SocketAddr,
    size: u32,
    replay: Option<(u64, u32)>,
) -> Summary {
    let mut summary = Summary::default();
    let indexes: Vec<(u64, u32)> = match replay {
        Some(r) => vec![r],
        None => (0..opts.max_cases.unwrap_or(1) as u32)
            .map(|i| (opts.seed, i))
            .collect(),
    };
    let deadline = Instant::now() + Duration::from_secs_f64(opts.seconds.max(0.0));
    for (n, (seed, i)) in indexes.into_iter().enumerate() {
        if n > 0 && Instant::now() >= deadline {
            break;
        }
        let case = campaigns::pingpong::generate(seed, i, size);
        let pcap = opts
            .pcap
            .as_ref()
            .map(|p| p.with_extension(format!("{i}.pcap")));
        let verdict = campaigns::pingpong::run(
            server,
            opts.local,
            &case,
            size,
            opts.window,
            pcap.as_deref(),
        )
        .unwrap_or_else(|e| Verdict::Crash(e.to_string()));
        let id = format!("{seed}:pingpong:{i}");
        let replay = format!("ferroce fuzz --pingpong {server} --replay {id}");
        summary.record(&case, &id, &verdict, opts.quiet, &replay);
        if matches!(verdict, Verdict::Crash(_)) {
            break;
        }
    }
    summary
}

/// Parses `SEED:pingpong:INDEX`.
pub fn parse_pingpong_id(s: &str) -> Option<(u64, u32)> {
    let mut it = s.split(':');
    let seed = it.next()?.parse().ok()?;
    (it.next()? == "pingpong").then_some(())?;
    let i = it.next()?.parse().ok()?;
    it.next().is_none().then_some((seed, i))
}

/// `ferroce fuzz --self`: an agent process on a ferroce device at `device` (this very binary,
/// `ferroce fuzz-agent`), and the address of its control port.
///
/// # Errors
/// Starting it, or an agent that does not say where it listens.
pub fn spawn_self_agent(device: Ipv4Addr) -> std::io::Result<(Child, SocketAddr)> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args([
            "fuzz-agent",
            "--addr",
            &device.to_string(),
            "--tcp",
            "0",
            "--mem",
        ])
        .arg(case::REGION_LEN.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let out = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("the agent's stdout"))?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    let port = line
        .trim()
        .strip_prefix("LISTENING ")
        .and_then(|p| p.parse::<u16>().ok())
        .ok_or_else(|| std::io::Error::other(format!("the agent said {line:?}")))?;
    Ok((child, SocketAddr::from((device, port))))
}

/// Parses `SEED:CAMPAIGN:INDEX`.
pub fn parse_case_id(s: &str) -> Option<(u64, CampaignId, u32)> {
    let mut it = s.split(':');
    let seed = it.next()?.parse().ok()?;
    let c = CampaignId::from_name(it.next()?)?;
    let i = it.next()?.parse().ok()?;
    it.next().is_none().then_some((seed, c, i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_ids_round_trip() {
        let c = campaigns::generate(CampaignId::Read, 7, 12);
        assert_eq!(parse_case_id(&c.id()), Some((7, CampaignId::Read, 12)));
        assert_eq!(parse_case_id("7:nope:1"), None);
        assert_eq!(parse_case_id("7:psn"), None);
    }

    #[test]
    fn the_table_ends_with_the_totals_line() {
        let mut s = Summary::default();
        let t = s.campaigns.entry(CampaignId::Psn).or_default();
        t.cases = 5;
        t.conform = 3;
        t.deviate.insert("a rule".into(), 1);
        t.hangs = 1;
        let table = s.table();
        assert_eq!(
            table.lines().last(),
            Some("5 cases, 3 conform, 1 deviate, 1 hangs, 0 crashes")
        );
        assert!(table.contains("1 × a rule"));
    }
}
