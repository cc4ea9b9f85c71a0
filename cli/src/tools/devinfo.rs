//! `ferroce devinfo`: like `ibv_devinfo`.

use std::io::Write;

use ferroce::{Device, Result};

/// Prints every device (or the named one); `verbose` adds the device attributes (opening a
/// context beside any program's), `counters` the live counters of every process using the
/// device, read from their shared pages; `services` the CM service IDs (rdma_cm ports) that
/// processes listen on, from the address's registry.
///
/// # Errors
/// Enumeration failure, or an unknown device name.
pub fn run(
    out: &mut dyn Write,
    device: Option<&str>,
    verbose: bool,
    counters: bool,
    services: bool,
) -> Result<()> {
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
                }
            }
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
