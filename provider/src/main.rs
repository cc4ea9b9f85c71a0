//! The `ferroce` command-line tool.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// ferroce: a software RoCEv2 (RDMA over UDP 4791) stack in user space.
#[derive(Parser, Debug)]
#[command(name = "ferroce", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
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

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    match cli.command {
        Command::Pcap { file, strict } => pcap(&file, strict),
    }
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
    let result = ferroce::decode::decode_pcap(BufReader::new(f), &mut out);
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
