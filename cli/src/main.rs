//! The `ferroce` command-line tool.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Write};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use ferroce::OpenOptions;
use ferroce::transport::{Mtu, QpType};
use ferroce_cli::tools::loopback::{connected_pair, connected_pair_with};
use ferroce_cli::tools::perf::{self, Limit, Op};
use ferroce_cli::tools::{demo, devinfo, doctor, pingpong, sysfs, udp_ceiling};

/// ferroce: a software RoCEv2 (RDMA over UDP 4791) stack in user space.
#[derive(Parser, Debug)]
#[command(name = "ferroce", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Two RDMA endpoints on loopback in one process: ping-pong, WRITE, READ and atomics with
    /// every byte verified, and the figures. Needs no arguments, root or set-up.
    Demo,
    /// Create /dev/infiniband/ferroce, the device node UCX looks for (as root, once per host).
    Devnode,
    /// Lay out a sysfs-like tree of the devices under DIR (`class/infiniband/<dev>/...`, for
    /// programs that read it; point them at it with SYSFS_PATH=DIR).
    Sysfs {
        /// Where (created if missing).
        dir: PathBuf,
    },
    /// List devices (local addresses) like ibv_devinfo.
    Devinfo {
        /// Only this device (name or address).
        #[arg(short = 'd', long = "ib-dev")]
        device: Option<String>,
        /// Device attributes too.
        #[arg(short = 'v', long)]
        verbose: bool,
        /// Counters too.
        #[arg(long)]
        counters: bool,
        /// The rdma_cm ports and CM service IDs listened on the device, with their processes
        /// (what the host's QP1 routes REQs by).
        #[arg(long)]
        services: bool,
        /// Every process's QPs on the device: type, state, peer, PSNs, and for a failed QP
        /// its first error and why (like `rdma res show qp`, plus the reason).
        #[arg(long)]
        qps: bool,
        /// One QP by number (e.g. 0x10011), whichever process has it, and why its work failed.
        #[arg(long, value_name = "QPN", value_parser = parse_qpn)]
        why: Option<u32>,
    },
    /// Check a device and the way to a peer, as the verbs checklist says: the address and its
    /// interface, the MTU, the GID, who holds UDP 4791, the drop counters; with PEER, the
    /// route, a RoCE stack's answer on its UDP 4791 (a CM MAD) and a packet of the path MTU.
    /// One verdict per line; exits 1 if any check failed.
    Doctor {
        /// The device's address.
        addr: std::net::IpAddr,
        /// A peer to check the way to (a ferroce device that uses rdma_cm, or kernel rxe).
        peer: Option<std::net::IpAddr>,
    },
    /// ibv_rc_pingpong, interoperable with rdma-core's: same options, TCP exchange and output.
    #[command(name = "rc-pingpong")]
    RcPingpong(PingpongArgs),
    /// Bandwidth, perftest-like, between two endpoints on loopback.
    Bw(PerfArgs),
    /// Latency, perftest-like, between two endpoints on loopback.
    Lat(PerfArgs),
    /// The raw ceiling of this path: sendmmsg/recvmmsg UDP, UDP ping-pong and TCP on loopback.
    #[command(name = "udp-ceiling")]
    UdpCeiling {
        /// Datagram size.
        #[arg(short = 's', long, default_value_t = 4124)]
        size: usize,
        /// Seconds per measurement.
        #[arg(short = 'D', long, default_value_t = 2.0)]
        duration: f64,
    },
    /// Fuzz a RoCE stack over the wire: seeded campaigns of hostile and edge-case packets at a
    /// target QP that an agent (tests/interop/peer/rdma_peer.c, or `ferroce fuzz-agent`)
    /// connects afresh for every case, each answer checked against the IBTA rule it tests.
    /// The last line: "N cases, N conform, N deviate, N hangs, N crashes".
    Fuzz(FuzzArgs),
    /// The target agent of `ferroce fuzz` on a ferroce device (rdma_peer's line protocol).
    #[command(name = "fuzz-agent")]
    FuzzAgent {
        /// The device's address.
        #[arg(long)]
        addr: std::net::IpAddr,
        /// TCP control port (0: any; printed as "LISTENING port").
        #[arg(long, default_value_t = 0)]
        tcp: u16,
        /// Region bytes (the campaigns address a 64 KiB region).
        #[arg(long, default_value_t = 64 << 10)]
        mem: usize,
    },
    /// Decode the RoCEv2 packets (UDP port 4791) of a pcap file, one line each, and check
    /// every ICRC. The last line is "N packets, N icrc ok, N icrc bad, N malformed".
    Pcap {
        /// A classic pcap file (Ethernet, raw IP or Linux SLL link type).
        file: PathBuf,
        /// Exit with status 3 if any packet has a bad ICRC or is malformed.
        #[arg(long)]
        strict: bool,
    },
}

#[derive(Args, Debug)]
struct FuzzArgs {
    /// The target's RoCE address (an agent listens on it, `--agent-port`).
    #[arg(long, required_unless_present_any = ["self_target", "pingpong"])]
    target: Option<Ipv4Addr>,
    /// Aim at an unmodified `ibv_rc_pingpong -g 1 -n 1 -s SIZE` server instead (`HOST[:PORT]`,
    /// port 18515 by default): one case per server run, `--cases` runs.
    #[arg(long)]
    pingpong: Option<String>,
    /// The pingpong server's `-s`.
    #[arg(long, default_value_t = 64)]
    pingpong_size: u32,
    /// Fuzz a ferroce device on loopback (an agent process started here at 127.0.90.1).
    #[arg(long = "self")]
    self_target: bool,
    /// The agent's TCP port on the target.
    #[arg(long, default_value_t = 18800)]
    agent_port: u16,
    /// Our address (default: 10.77.0.1 for a target in the lab; with --self the first free
    /// 127.0.90.x from .2).
    #[arg(long)]
    local: Option<Ipv4Addr>,
    /// Campaigns: all, or a comma-separated list of psn, rkey, opcode, header, atomic, read.
    #[arg(long, default_value = "all")]
    campaign: String,
    /// Seed of the campaigns.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run for this long.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Stop after this many cases.
    #[arg(long)]
    cases: Option<u64>,
    /// Milliseconds to wait for answers after each packet (default: 30, 400 for a remote target).
    #[arg(long)]
    window_ms: Option<u64>,
    /// The pcap of every packet (default: ferroce-fuzz-SEED.pcap here).
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Run one case again: SEED:CAMPAIGN:INDEX, as a deviation prints it.
    #[arg(long)]
    replay: Option<String>,
    /// Print only deviations, hangs, crashes and the summary.
    #[arg(short, long)]
    quiet: bool,
    /// The port of the target's rdma_cm listener for the cm campaign (the agent opens it if it
    /// can, as `ferroce fuzz-agent` does; with rdma_peer run `cm_reject serve IP PORT` beside).
    #[arg(long, default_value_t = 7471)]
    cm_port: u16,
    /// Connect the target's QP for each case through its rdma_cm (a listener that accepts on
    /// the cm port + 1 and names its region in the REP: `fuzz-agent`'s CMACCEPT, or
    /// `cm_reject accept IP PORT`) instead of the agent's CONNECT.
    #[arg(long)]
    via_cm: bool,
}

#[derive(Args, Debug)]
struct PingpongArgs {
    /// Listen on / connect to TCP port.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// Device: name from `ferroce devinfo` or local address.
    #[arg(short = 'd', long = "ib-dev")]
    device: Option<String>,
    /// Port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Size of message to exchange.
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// Path MTU.
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// Service level value.
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,
    /// Sleep on CQ events (default poll).
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// Local port GID index.
    #[arg(short = 'g', long = "gid-idx")]
    gidx: Option<u32>,
    /// Validate received buffer.
    #[arg(short = 'c', long = "chk")]
    validate: bool,
    /// The server to connect to; without it, act as the server.
    server: Option<String>,
}

#[derive(Args, Debug)]
struct PerfArgs {
    /// Operation: send, write, read or atomic.
    #[arg(long, default_value = "write")]
    op: Op,
    /// Message size.
    #[arg(short = 's', long, default_value_t = 65536)]
    size: u32,
    /// Iterations (default: 5000 for bw, 1000 for lat).
    #[arg(short = 'n', long)]
    iters: Option<u64>,
    /// Run for this many seconds instead (bw).
    #[arg(short = 'D', long)]
    duration: Option<f64>,
    /// Number of QPs (bw).
    #[arg(short = 'q', long, default_value_t = 1)]
    qps: usize,
    /// Path MTU.
    #[arg(short = 'm', long, default_value_t = 4096)]
    mtu: u32,
    /// Messages in flight per QP (bw).
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    depth: u32,
    /// Sweep sizes 2 B … 8 MiB.
    #[arg(short = 'a', long)]
    all: bool,
    /// Also measure the raw UDP ceiling at the same datagram size and print the ratio (bw).
    #[arg(long)]
    compare: bool,
    /// SEND ping-pong between two threads that sleep on completion channels (lat).
    #[arg(long)]
    blocking: bool,
}

/// `ferroce fuzz`: exit status 0 when every case conformed, 1 on an error, 4 on a deviation,
/// hang or crash.
fn fuzz(a: FuzzArgs) -> ExitCode {
    use ferroce_cli::fuzz::{self, case::CampaignId};
    let campaigns: Option<Vec<CampaignId>> = if a.campaign == "all" {
        Some(CampaignId::ALL.to_vec())
    } else {
        a.campaign.split(',').map(CampaignId::from_name).collect()
    };
    let Some(campaigns) = campaigns.filter(|c| !c.is_empty()) else {
        eprintln!(
            "ferroce fuzz: unknown campaign in {:?} (all, psn, rkey, opcode, header, atomic, read)",
            a.campaign
        );
        return ExitCode::FAILURE;
    };
    if let Some(server) = a.pingpong.as_deref() {
        use std::net::ToSocketAddrs;
        let with_port = if server.contains(':') {
            server.to_owned()
        } else {
            format!("{server}:18515")
        };
        let Some(at) = with_port.to_socket_addrs().ok().and_then(|mut i| i.next()) else {
            eprintln!("ferroce fuzz: --pingpong {server}: not an address");
            return ExitCode::FAILURE;
        };
        let replay = match a.replay.as_deref().map(fuzz::parse_pingpong_id) {
            Some(None) => {
                eprintln!("ferroce fuzz: with --pingpong, --replay takes SEED:pingpong:INDEX");
                return ExitCode::FAILURE;
            }
            r => r.flatten(),
        };
        let opts = fuzz::Options {
            target: Ipv4Addr::UNSPECIFIED,
            agent: at,
            local: a.local.unwrap_or(Ipv4Addr::new(10, 77, 0, 1)),
            campaigns: Vec::new(),
            seed: a.seed,
            seconds: a.seconds,
            max_cases: a.cases,
            window: Duration::from_millis(a.window_ms.unwrap_or(400)),
            pcap: a.pcap.clone(),
            replay: None,
            quiet: a.quiet,
            cm_port: a.cm_port,
            via_cm: false,
        };
        println!(
            "ferroce fuzz: ibv_rc_pingpong server {at}, from {}, seed {}",
            opts.local, a.seed
        );
        let summary = fuzz::run_pingpong(&opts, at, a.pingpong_size, replay);
        print!("{}", summary.table());
        let (_, _, dev, hangs, crashes) = summary.totals();
        return if dev + hangs + crashes == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(4)
        };
    }
    let replay = match a.replay.as_deref().map(fuzz::parse_case_id) {
        Some(None) => {
            eprintln!("ferroce fuzz: --replay takes SEED:CAMPAIGN:INDEX");
            return ExitCode::FAILURE;
        }
        Some(Some(id)) => Some(id),
        None => None,
    };
    let (mut child, target, agent, local) = if a.self_target {
        let device = Ipv4Addr::new(127, 0, 90, 1);
        match fuzz::spawn_self_agent(device) {
            Ok((c, at)) => {
                // The first free 127.0.90.x for our socket (another campaign may hold .2).
                let local = a.local.unwrap_or_else(|| {
                    (2..=250)
                        .map(|x| Ipv4Addr::new(127, 0, 90, x))
                        .find(|ip| std::net::UdpSocket::bind((*ip, 4791)).is_ok())
                        .unwrap_or(Ipv4Addr::new(127, 0, 90, 2))
                });
                (Some(c), device, at, local)
            }
            Err(e) => {
                eprintln!("ferroce fuzz: the agent did not start: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        let Some(t) = a.target else {
            return ExitCode::FAILURE;
        };
        (
            None,
            t,
            std::net::SocketAddr::from((t, a.agent_port)),
            a.local.unwrap_or(Ipv4Addr::new(10, 77, 0, 1)),
        )
    };
    let window = Duration::from_millis(a.window_ms.unwrap_or(if a.self_target { 30 } else { 400 }));
    let opts = fuzz::Options {
        target,
        agent,
        local,
        campaigns,
        seed: a.seed,
        seconds: a.seconds,
        max_cases: a.cases,
        window,
        pcap: Some(
            a.pcap
                .unwrap_or_else(|| PathBuf::from(format!("ferroce-fuzz-{}.pcap", a.seed))),
        ),
        replay,
        quiet: a.quiet,
        cm_port: a.cm_port,
        via_cm: a.via_cm,
    };
    println!(
        "ferroce fuzz: target {target} (agent {agent}), from {local}, seed {}, campaigns {}",
        a.seed,
        opts.campaigns
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join(",")
    );
    let alive = || match child.as_mut() {
        Some(c) => matches!(c.try_wait(), Ok(None)),
        None => true,
    };
    let result = fuzz::run(&opts, alive);
    if let Some(c) = child.as_mut() {
        // The agent quits with its control connection; a hung one is stopped.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while matches!(c.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
    match result {
        Ok(summary) => {
            print!("{}", summary.table());
            let (_, _, dev, hangs, crashes) = summary.totals();
            if dev + hangs + crashes == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(4)
            }
        }
        Err(e) => {
            eprintln!("ferroce fuzz: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    // FERROCE_LOG, as for the libraries (RUST_LOG too, for those used to it); warnings by default.
    let filter = std::env::var("FERROCE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "warn".to_owned());
    env_logger::Builder::new().parse_filters(&filter).init();
    let cli = Cli::parse();
    let out = &mut io::stdout();
    let r = match cli.command {
        Command::Pcap { file, strict } => return pcap(&file, strict),
        Command::Fuzz(a) => return fuzz(a),
        Command::FuzzAgent { addr, tcp, mem } => {
            return match ferroce_cli::fuzz::agent::serve(addr, tcp, mem) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("ferroce fuzz-agent: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::Demo => demo::run(out),
        Command::Devnode => ferroce::create_uverbs_node().map(|made| {
            let _ = writeln!(
                out,
                "{} {}",
                ferroce::UVERBS_NODE,
                if made { "created" } else { "already there" }
            );
        }),
        Command::Sysfs { dir } => {
            return match sysfs::lay_out(&dir, &ferroce::device_list()) {
                Ok(made) => {
                    for d in made {
                        let _ = writeln!(out, "{}", d.display());
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("ferroce sysfs {}: {e}", dir.display());
                    ExitCode::FAILURE
                }
            };
        }
        Command::Doctor { addr, peer } => {
            return if doctor::run(out, addr, peer) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
        Command::Devinfo {
            device,
            verbose,
            counters,
            services,
            qps,
            why,
        } => devinfo::run(
            out,
            device.as_deref(),
            devinfo::Sections {
                verbose,
                counters,
                services,
                qps,
                why,
            },
        ),
        Command::RcPingpong(a) => pingpong::run(
            &pingpong::Options {
                port: a.port,
                device: a.device,
                ib_port: a.ib_port,
                size: a.size,
                mtu: a.mtu,
                rx_depth: a.rx_depth,
                iters: a.iters,
                sl: a.sl,
                use_events: a.events,
                gidx: a.gidx,
                validate: a.validate,
                server: a.server,
            },
            out,
        ),
        Command::Bw(a) => bw(&a, out),
        Command::Lat(a) => lat(&a, out),
        Command::UdpCeiling { size, duration } => ceiling(size, duration, out),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferroce: {e}");
            ExitCode::from(1)
        }
    }
}

/// A QP number in hex (`0x10011`) or decimal.
fn parse_qpn(s: &str) -> Result<u32, String> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("{s:?} is not a QP number ({e}): e.g. 0x10011"))
}

fn mtu_of(bytes: u32) -> ferroce::Result<Mtu> {
    Mtu::ALL
        .iter()
        .copied()
        .find(|m| m.bytes() == bytes)
        .ok_or(ferroce::Error::InvalidArgument("MTU must be 256 … 4096"))
}

fn sizes(a: &PerfArgs) -> Vec<u32> {
    if a.all {
        perf::all_sizes()
    } else {
        vec![a.size]
    }
}

fn bw(a: &PerfArgs, out: &mut dyn Write) -> ferroce::Result<()> {
    let max = sizes(a).into_iter().max().unwrap_or(a.size) as usize;
    let mtu = mtu_of(a.mtu)?;
    let open_pair = || {
        connected_pair(
            &OpenOptions::default(),
            QpType::Rc,
            a.qps,
            (max * 4).max(1 << 20),
            mtu,
            a.depth,
        )
    };
    let (x, y) = open_pair()?;
    let _ = writeln!(
        out,
        "ferroce bw: {:?} on {} -> {}, {} QP(s), MTU {}, {} in flight per QP",
        a.op,
        x.ctx.device().addr,
        y.ctx.device().addr,
        a.qps,
        a.mtu,
        a.depth
    );
    let _ = writeln!(
        out,
        "{:>10} {:>12} {:>12} {:>10} {:>12} {:>10} {:>12} {:>10}",
        "#bytes", "#messages", "MB/s", "Gb/s", "msg/s", "calls/msg", "empty/msg", "wakes/msg"
    );
    let mut last = None;
    let mut pair = Some((x, y));
    for size in sizes(a) {
        // A SEND run leaves its receiver's queue full of receives posted for its own size, so
        // each size of a SEND sweep runs on a pair of its own (one pair ran the first size and
        // then failed with "queue full").
        let (x, y) = match pair.take() {
            Some(p) => p,
            None => open_pair()?,
        };
        let limit = match (a.duration, a.iters) {
            (Some(d), _) => Limit::Duration(Duration::from_secs_f64(d)),
            (None, Some(n)) => Limit::Iters(n),
            (None, None) => Limit::Iters(if size >= 1 << 20 { 200 } else { 5000 }),
        };
        let r = perf::bandwidth(&x, &y, a.op, size, limit, a.depth)?;
        let _ = writeln!(
            out,
            "{:>10} {:>12} {:>12.1} {:>10.2} {:>12.0} {:>10.3} {:>12.3} {:>10.3}",
            r.size,
            r.msgs,
            r.mb_per_s(),
            r.gbit_per_s(),
            r.msgs_per_s(),
            r.calls.per(r.msgs),
            r.calls.empty_per(r.msgs),
            r.calls.wakeups_per(r.msgs)
        );
        last = Some(r);
        if a.op != perf::Op::Send {
            pair = Some((x, y));
        }
    }
    // The devices close before the ceilings are measured: their progress threads (spinning
    // under FERROCE_BUSY_POLL) would otherwise take CPU from the raw sockets.
    drop(pair);
    if a.compare {
        if let Some(r) = last {
            // The datagram of a full data packet: BTH + payload + ICRC (+ RETH on the first).
            let payload = r.size.min(a.mtu) as usize;
            let dgram = 12 + payload + 4;
            let c = udp_ceiling::measure(dgram, Duration::from_secs(2))?;
            let pkts_per_s = r.msgs_per_s() * f64::from(r.size.div_ceil(a.mtu).max(1));
            let _ = writeln!(
                out,
                "raw UDP sendmmsg/recvmmsg ceiling at {dgram} B: {:.0} datagrams/s, {:.1} MB/s; ferroce: {:.0} data packets/s = {:.2}x",
                c.udp_dgrams_per_s,
                c.udp_bytes_per_s / 1e6,
                pkts_per_s,
                pkts_per_s / c.udp_dgrams_per_s
            );
            let _ = writeln!(
                out,
                "raw UDP GSO/GRO ceiling at {dgram} B: {:.0} datagrams/s, {:.1} MB/s; ferroce = {:.2}x",
                c.gso_dgrams_per_s,
                c.gso_bytes_per_s / 1e6,
                pkts_per_s / c.gso_dgrams_per_s
            );
            let _ = writeln!(
                out,
                "TCP over loopback: {:.1} MB/s; ferroce = {:.2}x",
                c.tcp_bytes_per_s / 1e6,
                r.mb_per_s() * 1e6 / c.tcp_bytes_per_s
            );
            let _ = writeln!(
                out,
                "CPU per GB (both ends, user + system): ferroce {:.3} s, TCP {:.3} s; ferroce = {:.2}x",
                r.cpu_s_per_gb(),
                c.tcp_cpu_s_per_gb,
                r.cpu_s_per_gb() / c.tcp_cpu_s_per_gb
            );
        }
    }
    Ok(())
}

fn lat(a: &PerfArgs, out: &mut dyn Write) -> ferroce::Result<()> {
    let max = sizes(a).into_iter().max().unwrap_or(a.size) as usize;
    if a.blocking && a.op != perf::Op::Send {
        return Err(ferroce::Error::InvalidArgument(
            "--blocking measures SEND ping-pongs only (--op send)",
        ));
    }
    let (x, y) = connected_pair_with(
        &OpenOptions::default(),
        QpType::Rc,
        1,
        (max * 2).max(1 << 20),
        mtu_of(a.mtu)?,
        16,
        a.blocking,
    )?;
    let _ = writeln!(
        out,
        "ferroce lat: {:?}{} on {} -> {}, MTU {}",
        a.op,
        if a.blocking {
            " (blocking: completion channels)"
        } else {
            ""
        },
        x.ctx.device().addr,
        y.ctx.device().addr,
        a.mtu
    );
    let _ = writeln!(
        out,
        "{:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>11}",
        "#bytes",
        "#iters",
        "min us",
        "median us",
        "p99 us",
        "max us",
        "calls/iter",
        "empty/iter",
        "wakes/iter"
    );
    for size in sizes(a) {
        let iters = a.iters.unwrap_or(if size >= 1 << 20 { 50 } else { 1000 });
        let r = if a.blocking {
            perf::ping_pong(&x, &y, size, iters)?
        } else {
            perf::latency(&x, &y, a.op, size, iters)?
        };
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let _ = writeln!(
            out,
            "{:>10} {:>10} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>11.2} {:>11.2} {:>11.2}",
            r.size,
            iters,
            us(r.percentile(0.0)),
            us(r.percentile(50.0)),
            us(r.percentile(99.0)),
            us(r.percentile(100.0)),
            r.calls.per(iters),
            r.calls.empty_per(iters),
            r.calls.wakeups_per(iters)
        );
    }
    // As in `bw`: the devices close before the raw sockets are timed.
    drop((x, y));
    if a.compare {
        let c = udp_ceiling::measure(64, Duration::from_millis(200))?;
        let _ = writeln!(
            out,
            "raw UDP 64 B ping-pong, blocking: median round trip {:.2} us (one way {:.2} us)",
            c.udp_rtt.as_secs_f64() * 1e6,
            c.udp_rtt.as_secs_f64() * 5e5
        );
        let _ = writeln!(
            out,
            "raw UDP 64 B ping-pong, busy-polling: median round trip {:.2} us (one way {:.2} us)",
            c.udp_rtt_spin.as_secs_f64() * 1e6,
            c.udp_rtt_spin.as_secs_f64() * 5e5
        );
    }
    Ok(())
}

fn ceiling(size: usize, duration: f64, out: &mut dyn Write) -> ferroce::Result<()> {
    let c = udp_ceiling::measure(size, Duration::from_secs_f64(duration))?;
    let _ = writeln!(
        out,
        "UDP sendmmsg/recvmmsg, {} B datagrams: {:.0} datagrams/s, {:.1} MB/s",
        c.size,
        c.udp_dgrams_per_s,
        c.udp_bytes_per_s / 1e6
    );
    let _ = writeln!(
        out,
        "UDP GSO trains/GRO reads, {} B datagrams: {:.0} datagrams/s, {:.1} MB/s",
        c.size,
        c.gso_dgrams_per_s,
        c.gso_bytes_per_s / 1e6
    );
    let _ = writeln!(
        out,
        "UDP 64 B ping-pong (blocking): median round trip {:.2} us",
        c.udp_rtt.as_secs_f64() * 1e6
    );
    let _ = writeln!(
        out,
        "UDP 64 B ping-pong (busy-polling): median round trip {:.2} us",
        c.udp_rtt_spin.as_secs_f64() * 1e6
    );
    let _ = writeln!(
        out,
        "TCP stream, 1 MiB writes: {:.1} MB/s",
        c.tcp_bytes_per_s / 1e6
    );
    Ok(())
}

fn pcap(path: &PathBuf, strict: bool) -> ExitCode {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("ferroce pcap: {}: {e}", path.display());
            return ExitCode::from(1);
        }
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = ferroce_cli::decode::decode_pcap(BufReader::new(f), &mut out);
    let flushed = out.flush();
    match (result, flushed) {
        (Ok(sum), Ok(())) => {
            if strict && (sum.icrc_bad > 0 || sum.malformed > 0) {
                ExitCode::from(3)
            } else {
                ExitCode::SUCCESS
            }
        }
        (Err(e), _) => {
            eprintln!("ferroce pcap: {}: {e}", path.display());
            ExitCode::from(1)
        }
        (_, Err(e)) => {
            if e.kind() != io::ErrorKind::BrokenPipe {
                eprintln!("ferroce pcap: writing output: {e}");
            }
            ExitCode::from(1)
        }
    }
}
