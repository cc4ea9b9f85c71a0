//! `ferroce devinfo`: like `ibv_devinfo`.

use std::io::Write;

use ferroce::{Device, Result};

/// What `ferroce devinfo` prints besides each device's port.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sections {
    /// The device attributes (opening a context beside any program's).
    pub verbose: bool,
    /// The live counters of every process using the device, read from their shared pages.
    pub counters: bool,
    /// The CM service IDs (rdma_cm ports) processes listen on, from the address's registry.
    pub services: bool,
    /// Every process's QPs: state, peer, PSNs and, for a failed one, its first error.
    pub qps: bool,
    /// One QP by number, whichever process has it, with its error's reason in full.
    pub why: Option<u32>,
}

/// Prints every device (or the named one) with the `sections` asked for.
///
/// # Errors
/// Enumeration failure, an unknown device name, or (`why`) a QP no process on the device has.
pub fn run(out: &mut dyn Write, device: Option<&str>, sections: Sections) -> Result<()> {
    let Sections {
        verbose,
        counters,
        services,
        qps,
        why,
    } = sections;
    let devs = match device {
        Some(d) => vec![Device::find(d)?],
        None => ferroce::devices()?,
    };
    for d in devs {
        let _ = writeln!(out, "hca_id:\t{}", d.name);
        let _ = writeln!(
            out,
            "\ttransport:\t\t\tInfiniBand (RoCEv2 over UDP, ferroce)"
        );
        let _ = writeln!(
            out,
            "\taddress:\t\t\t{} ({}, MTU {})",
            d.addr, d.ifname, d.ip_mtu
        );
        let _ = writeln!(out, "\tfw_ver:\t\t\t\t{}", env!("CARGO_PKG_VERSION"));
        let _ = writeln!(out, "\tphys_port_cnt:\t\t\t1");
        let _ = writeln!(out, "\t\tport:\t1");
        let _ = writeln!(out, "\t\t\tstate:\t\t\tPORT_ACTIVE (4)");
        let _ = writeln!(out, "\t\t\tmax_mtu:\t\t4096 (5)");
        let m = d.active_mtu();
        let _ = writeln!(out, "\t\t\tactive_mtu:\t\t{} ({})", m.bytes(), m as u32);
        let _ = writeln!(out, "\t\t\tlink_layer:\t\tEthernet");
        let _ = writeln!(out, "\t\t\tGID[  1]:\t\t{}", d.gid());
        if counters {
            let procs = d.live_counters(ferroce::wire::ROCE_UDP_PORT)?;
            if procs.is_empty() {
                let _ = writeln!(out, "\tcounters:\t\t\t(no process uses the device)");
            }
            for p in procs {
                let _ = writeln!(out, "\tprocess {} (slot {}):", p.pid, p.slot);
                for (k, v) in p.counters {
                    let _ = writeln!(out, "\t\t{k}:\t{v}");
                    // A drop, refusal or failure counted: what it means, on a line of its own.
                    if let Some(why) = ferroce::explain_counter(k).filter(|_| v > 0) {
                        let _ = writeln!(out, "\t\t\t# {why}");
                    }
                }
            }
        }
        if qps {
            print_qps(out, &d)?;
        }
        if let Some(qpn) = why {
            print_why(out, &d, qpn)?;
        }
        if services {
            let listened = d.gsi_services(ferroce::wire::ROCE_UDP_PORT)?;
            if listened.is_empty() {
                let _ = writeln!(out, "\tservices:\t\t\t(none listened)");
            }
            for s in listened {
                let _ = match s.rdma_cm_port() {
                    Some((space, port)) => writeln!(
                        out,
                        "\tservice {:#018x} pid {} rdma_cm port space {space:#x} port {port}",
                        s.service_id, s.pid
                    ),
                    None => writeln!(out, "\tservice {:#018x} pid {}", s.service_id, s.pid),
                };
            }
        }
        if verbose {
            match d.open() {
                Ok(ctx) => {
                    if verbose {
                        let a = ctx.query_device();
                        let _ = writeln!(out, "\tmax_mr_size:\t\t\t{:#x}", a.max_mr_size);
                        for (k, v) in [
                            ("max_qp", u64::from(a.max_qp)),
                            ("max_qp_wr", u64::from(a.max_qp_wr)),
                            ("max_sge", u64::from(a.max_sge)),
                            ("max_cq", u64::from(a.max_cq)),
                            ("max_cqe", u64::from(a.max_cqe)),
                            ("max_mr", u64::from(a.max_mr)),
                            ("max_pd", u64::from(a.max_pd)),
                            ("max_qp_rd_atom", u64::from(a.max_qp_rd_atom)),
                            ("max_qp_init_rd_atom", u64::from(a.max_qp_init_rd_atom)),
                            ("max_srq", u64::from(a.max_srq)),
                            ("max_srq_wr", u64::from(a.max_srq_wr)),
                            ("max_srq_sge", u64::from(a.max_srq_sge)),
                            ("max_pkeys", u64::from(a.max_pkeys)),
                            ("local_ca_ack_delay", u64::from(a.local_ca_ack_delay)),
                            ("max_msg_sz", a.max_msg_sz),
                        ] {
                            let _ = writeln!(out, "\t{k}:\t\t\t{v}");
                        }
                        let _ = writeln!(
                            out,
                            "\tatomic_cap:\t\t\tATOMIC_HCA ({})",
                            a.atomic_cap as u32
                        );
                        let _ = writeln!(out, "\t\t\tGID[  0]:\t\t{}", ctx.query_gid(0)?);
                    }
                }
                Err(e) => {
                    let _ = writeln!(out, "\t(not opened: {e})");
                }
            }
        }
        let _ = writeln!(out);
    }
    Ok(())
}

/// One line per QP of every process on `d`: number, type, state, peer and PSNs, and for a failed
/// QP its status and reason.
fn print_qps(out: &mut dyn Write, d: &Device) -> Result<()> {
    let procs = d.live_qps(ferroce::wire::ROCE_UDP_PORT)?;
    if procs.is_empty() {
        let _ = writeln!(out, "\tqps:\t\t\t\t(no process uses the device)");
    }
    for p in procs {
        let _ = writeln!(
            out,
            "\tprocess {} (slot {}): {} QP{}{}",
            p.pid,
            p.slot,
            p.total,
            if p.total == 1 { "" } else { "s" },
            if p.total as usize > p.qps.len() {
                format!(", the first {} listed (failed ones first)", p.qps.len())
            } else {
                String::new()
            }
        );
        for q in &p.qps {
            let _ = writeln!(out, "\t\t{}", qp_line(q));
            if let Some(e) = &q.error {
                let _ = writeln!(out, "\t\t\twhy: {}", e.reason);
            }
        }
    }
    Ok(())
}

/// `QPN 0x10011 RC RTS mtu 1024 peer 10.0.0.2 dest_qp_num 0x10022 sq_psn 0x.. rq_psn 0x..`.
fn qp_line(q: &ferroce::LiveQp) -> String {
    let mut s = format!(
        "QPN {:#x} {} {}",
        q.qp_num,
        q.qp_type.map_or("?", |t| match t {
            ferroce::QpType::Rc => "RC",
            ferroce::QpType::Uc => "UC",
            ferroce::QpType::Ud => "UD",
            ferroce::QpType::XrcSend => "XRC_SEND",
            ferroce::QpType::XrcRecv => "XRC_RECV",
        }),
        q.qp_state
            .map_or_else(|| "?".to_owned(), |st| format!("{st:?}").to_uppercase()),
    );
    if let Some(m) = q.path_mtu {
        s += &format!(" mtu {}", m.bytes());
    }
    if let Some(p) = q.peer {
        s += &format!(" peer {p} dest_qp_num {:#x}", q.dest_qp_num);
    }
    s += &format!(" sq_psn {:#x} rq_psn {:#x}", q.sq_psn, q.rq_psn);
    if let Some(e) = &q.error {
        s += &format!(
            " error {} (wr_id {})",
            e.status.map_or_else(|| "?".to_owned(), |st| st.to_string()),
            e.wr_id
        );
    }
    s
}

/// QP `qpn` of whichever process on `d` has it, and why it failed (or that it has not).
fn print_why(out: &mut dyn Write, d: &Device, qpn: u32) -> Result<()> {
    let procs = d.live_qps(ferroce::wire::ROCE_UDP_PORT)?;
    let found = procs
        .iter()
        .find_map(|p| p.qps.iter().find(|q| q.qp_num == qpn).map(|q| (p, q)));
    let Some((p, q)) = found else {
        let listed: u32 = procs.iter().map(|p| p.qps.len() as u32).sum();
        let total: u32 = procs.iter().map(|p| p.total).sum();
        return Err(ferroce::Error::Invalid(format!(
            "QPN {qpn:#x} is not a QP of any process on {} ({} processes, {total} QPs, {listed} \
             of them listed: a process lists at most 31, its failed ones first)",
            d.addr,
            procs.len()
        )));
    };
    let _ = writeln!(out, "\tprocess {} (slot {}):", p.pid, p.slot);
    let _ = writeln!(out, "\t\t{}", qp_line(q));
    let _ = match &q.error {
        Some(e) => writeln!(out, "\t\twhy: {}", e.reason),
        None => writeln!(out, "\t\twhy: no work of this QP has failed"),
    };
    Ok(())
}
