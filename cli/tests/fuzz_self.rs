//! `ferroce fuzz --self`: every campaign against a ferroce device on loopback (an agent process
//! the fuzzer starts), with no deviation from the rules the cases check, no hang and no crash;
//! and a campaign is the same cases for the same seed.

use std::process::Command;

fn fuzz(args: &[&str], pcap: &std::path::Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .arg("fuzz")
        .arg("--self")
        .args(args)
        .arg("--pcap")
        .arg(pcap)
        .output()
        .expect("ferroce runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    (out.status.success(), stdout)
}

#[test]
fn every_campaign_against_ferroce_conforms() {
    let dir = std::env::temp_dir().join(format!("ferroce-fuzz-self-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("self.pcap");
    // A fixed number of cases (eight of each of the nine campaigns), not a time budget: how
    // many cases fit in a time window depends on the machine. A wider answer window than the
    // default 30 ms: the test shares two cores with the rest of the suite, and a late ACK
    // would read as a deviation.
    let (ok, out) = fuzz(
        &[
            "--cases",
            "72",
            "--seed",
            "7",
            "-q",
            "--local",
            "127.0.90.20",
            "--window-ms",
            "100",
        ],
        &pcap,
    );
    let last = out.lines().last().unwrap_or_default().to_owned();
    let n: Vec<u64> = last
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|s| s.parse().ok())
        .collect();
    assert_eq!(n, [72, 72, 0, 0, 0], "{last}");
    assert!(ok, "exit status");
    // Every campaign ran its share, and every case conformed.
    for c in [
        "psn",
        "rkey",
        "opcode",
        "header",
        "atomic",
        "read",
        "havoc",
        "cm",
        "requester",
    ] {
        let row = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(c))
            .unwrap_or_else(|| panic!("{c} missing:\n{out}"));
        let counts: Vec<&str> = row.split_whitespace().skip(1).collect();
        assert_eq!(counts, ["8", "8", "0", "0", "0"], "{row}");
    }
    // The pcap holds the packets both ways.
    let len = std::fs::metadata(&pcap).unwrap().len();
    assert!(len > 24 + 16 * n[0], "pcap of {len} bytes");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_same_seed_runs_the_same_cases() {
    let dir = std::env::temp_dir().join(format!("ferroce-fuzz-det-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = |seed: &str| {
        let (ok, out) = fuzz(
            &[
                "--cases",
                "18",
                "--seed",
                seed,
                "--local",
                "127.0.90.21",
                "--cm-port",
                "7491",
            ],
            &dir.join("d.pcap"),
        );
        assert!(ok);
        out.lines()
            .filter(|l| l.starts_with("case "))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let a = cases("11");
    assert_eq!(a.len(), 18);
    assert_eq!(a, cases("11"));
    assert_ne!(a, cases("12"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pingpong_mode_runs_one_case_per_server_run() {
    // ferroce's rc-pingpong as the unmodified server (it speaks ibv_rc_pingpong's exchange),
    // three runs in a row; each must end as if a real client had pinged it.
    let server = std::thread::spawn(|| {
        (0..3)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_ferroce"))
                    .args([
                        "rc-pingpong",
                        "-d",
                        "127.0.91.11",
                        "-g",
                        "1",
                        "-n",
                        "1",
                        "-s",
                        "64",
                    ])
                    .args(["-p", "18611"])
                    .output()
                    .expect("rc-pingpong runs")
                    .status
                    .success()
            })
            .collect::<Vec<bool>>()
    });
    let dir = std::env::temp_dir().join(format!("ferroce-fuzz-pp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .args([
            "fuzz",
            "--pingpong",
            "127.0.91.11:18611",
            "--local",
            "127.0.91.12",
        ])
        .args(["--cases", "3", "--seed", "4", "--window-ms", "50", "--pcap"])
        .arg(dir.join("pp.pcap"))
        .output()
        .expect("ferroce runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success());
    assert_eq!(
        stdout.lines().last(),
        Some("3 cases, 3 conform, 0 deviate, 0 hangs, 0 crashes")
    );
    assert_eq!(
        server.join().unwrap(),
        vec![true; 3],
        "every server run ended well"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_rc_campaigns_run_over_connections_made_by_the_cm() {
    let dir = std::env::temp_dir().join(format!("ferroce-fuzz-cm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ok, out) = fuzz(
        &[
            "--via-cm",
            "--campaign",
            "psn,rkey,opcode,header,atomic,read,havoc",
            "--cases",
            "28",
            "--seed",
            "5",
            "--local",
            "127.0.90.22",
            "--window-ms",
            "100",
            "--cm-port",
            "7481",
        ],
        &dir.join("cm.pcap"),
    );
    assert!(ok, "exit status");
    assert_eq!(
        out.lines().last(),
        Some("28 cases, 28 conform, 0 deviate, 0 hangs, 0 crashes")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
