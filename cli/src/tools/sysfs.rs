//! `ferroce sysfs DIR`: a sysfs-like tree of ferroce's devices under DIR, for the programs that
//! read `class/infiniband/<dev>/…` where rdma-core reads its devices (`SYSFS_PATH=DIR`, which
//! ferroce's `ibv_get_sysfs_path` honours, or a bind mount over `/sys/class/infiniband`): per
//! device `node_type`, `node_guid`, `sys_image_guid`, `fw_ver`, `node_desc`, the port's
//! `state`, `phys_state`, `link_layer`, `lid`, `active_mtu`, its GIDs with their
//! `gid_attrs/types` ("RoCE v2") and `gid_attrs/ndevs` (the interface), `device/net/<ifname>`,
//! and `class/infiniband_verbs/uverbs<N>/ibdev` — what rdma-core's `ibv_devinfo`, pyverbs'
//! tests, Open MPI and NCCL look at. The values are the ones ferroce's verbs report.

use std::io;
use std::path::{Path, PathBuf};

use ferroce::Device;

/// ferroce's firmware version, as `ibv_query_device` reports it.
const FW_VER: &str = env!("CARGO_PKG_VERSION");

fn put(path: &Path, text: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, format!("{text}\n"))
}

/// The GUID as sysfs prints it: four groups of four hex digits.
fn guid_text(g: u64) -> String {
    let b = g.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

/// A GID as sysfs prints it: eight groups of four hex digits.
fn gid_text(g: std::net::Ipv6Addr) -> String {
    g.segments()
        .iter()
        .map(|s| format!("{s:04x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Lays the tree of `devices` out under `dir`; returns each device's directory.
///
/// # Errors
/// What creating the directories and files returns.
pub fn lay_out(dir: &Path, devices: &[Device]) -> io::Result<Vec<PathBuf>> {
    let class = dir.join("class");
    put(&class.join("infiniband_verbs/abi_version"), "6")?;
    let mut made = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        let dev = class.join("infiniband").join(&d.name);
        put(&dev.join("node_type"), "1: CA")?;
        put(&dev.join("node_guid"), &guid_text(d.node_guid()))?;
        put(&dev.join("sys_image_guid"), &guid_text(d.node_guid()))?;
        put(&dev.join("fw_ver"), FW_VER)?;
        put(&dev.join("hca_type"), "ferroce")?;
        put(&dev.join("node_desc"), &format!("ferroce {}", d.addr))?;
        let port = dev.join("ports/1");
        put(&port.join("state"), "4: ACTIVE")?;
        put(&port.join("phys_state"), "5: LinkUp")?;
        put(&port.join("link_layer"), "Ethernet")?;
        put(&port.join("lid"), "0x0")?;
        put(&port.join("sm_lid"), "0x0")?;
        put(&port.join("lid_mask_count"), "0")?;
        put(
            &port.join("active_mtu"),
            &d.active_mtu().bytes().to_string(),
        )?;
        // GID indexes 0 and 1 are both the address, as ibv_query_gid reports.
        for g in 0..2 {
            put(&port.join(format!("gids/{g}")), &gid_text(d.gid()))?;
            put(&port.join(format!("gid_attrs/types/{g}")), "RoCE v2")?;
            put(&port.join(format!("gid_attrs/ndevs/{g}")), &d.ifname)?;
        }
        put(&port.join("pkeys/0"), "0xffff")?;
        std::fs::create_dir_all(dev.join("device/net").join(&d.ifname))?;
        let uverbs = class.join(format!("infiniband_verbs/uverbs{i}"));
        put(&uverbs.join("ibdev"), &d.name)?;
        put(&uverbs.join("abi_version"), "1")?;
        made.push(dev);
    }
    Ok(made)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

    use super::*;

    #[test]
    fn the_tree_says_what_verbs_says() {
        let dir = std::env::temp_dir().join(format!("ferroce-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let d = Device::for_addr("127.0.0.1".parse().unwrap()).unwrap();
        let made = lay_out(&dir, std::slice::from_ref(&d)).unwrap();
        let dev = &made[0];
        let read = |p: &str| std::fs::read_to_string(dev.join(p)).unwrap();
        assert_eq!(read("node_type"), "1: CA\n");
        assert_eq!(read("node_guid"), "0200:5eff:7f00:0001\n");
        assert_eq!(read("ports/1/state"), "4: ACTIVE\n");
        assert_eq!(read("ports/1/link_layer"), "Ethernet\n");
        assert_eq!(
            read("ports/1/gids/1"),
            "0000:0000:0000:0000:0000:ffff:7f00:0001\n"
        );
        assert_eq!(read("ports/1/gid_attrs/types/1"), "RoCE v2\n");
        assert_eq!(read("ports/1/gid_attrs/ndevs/1"), format!("{}\n", d.ifname));
        assert!(dev.join("device/net").join(&d.ifname).is_dir());
        let ibdev = dir.join("class/infiniband_verbs/uverbs0/ibdev");
        assert_eq!(
            std::fs::read_to_string(ibdev).unwrap(),
            format!("{}\n", d.name)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
