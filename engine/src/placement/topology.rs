//! What the machine offers, read from sysfs: NUMA nodes, the node of a CPU and of an RDMA
//! device, and the 2 MiB hugepage pool. Control plane only.

use std::fs;
use std::io;
use std::path::Path;

const NODES: &str = "/sys/devices/system/node";
const CPUS: &str = "/sys/devices/system/cpu";
const HUGE_2M: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

/// Whether NUMA node `node` exists (`/sys/devices/system/node/node<N>`).
pub(super) fn node_exists(node: u32) -> bool {
    Path::new(NODES).join(format!("node{node}")).is_dir()
}

/// The online nodes as the kernel lists them (`/sys/devices/system/node/online`, e.g. `0-1`),
/// for error messages; `?` when unreadable.
pub(super) fn online_nodes() -> String {
    fs::read_to_string(Path::new(NODES).join("online"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".to_owned())
}

/// The node of CPU `cpu`: the `node<N>` entry of `/sys/devices/system/cpu/cpu<cpu>/`.
/// `Ok(None)` when the directory has none (a kernel without NUMA: treat as node 0).
pub(super) fn node_of_cpu(cpu: usize) -> io::Result<Option<u32>> {
    let dir = Path::new(CPUS).join(format!("cpu{cpu}"));
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(n) = name.to_str().and_then(|s| s.strip_prefix("node")) else {
            continue;
        };
        if let Ok(n) = n.parse::<u32>() {
            return Ok(Some(n));
        }
    }
    Ok(None)
}

/// The node an RDMA device is attached to (`/sys/class/infiniband/<dev>/device/numa_node`);
/// `None` when the file is missing (a software device: rxe, siw) or says -1 (no affinity).
#[allow(dead_code)] // used by the rdma fabric only
pub(crate) fn device_node(ibdev: &str) -> Option<u32> {
    let path = Path::new("/sys/class/infiniband")
        .join(ibdev)
        .join("device/numa_node");
    fs::read_to_string(path).ok()?.trim().parse::<u32>().ok()
}

/// The 2 MiB hugepage pool: `(free, total)` pages (`free_hugepages`, `nr_hugepages` under
/// `/sys/kernel/mm/hugepages/hugepages-2048kB/`); `(0, 0)` when the kernel has none.
pub(crate) fn hugepages_2m() -> (u64, u64) {
    let read = |f: &str| {
        fs::read_to_string(Path::new(HUGE_2M).join(f))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    (read("free_hugepages"), read("nr_hugepages"))
}
