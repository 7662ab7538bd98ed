//! What machine we run on, and pinning threads to its cores.

use serde::{Deserialize, Serialize};

use crate::error::BenchError;

/// The `machine` object of `summary.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// CPU model name from `/proc/cpuinfo`, or `"unknown"`.
    pub cpu_model: String,
    /// Cores this process may run on.
    pub cores: usize,
    /// Host name, or `"unknown"`.
    pub hostname: String,
    /// Operating system and architecture, e.g. `linux-x86_64`.
    pub os: String,
}

impl Machine {
    /// Reads the facts of this machine (never fails; unknown facts read `"unknown"`).
    pub fn detect() -> Self {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".to_string());
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".to_string());
        Self {
            cpu_model,
            cores: available_cores().len(),
            hostname,
            os: format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
        }
    }
}

/// Ids of the cores this process may be pinned to (at least `[0]`).
pub fn available_cores() -> Vec<usize> {
    let mut ids: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    if ids.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        ids = (0..n).collect();
    }
    ids
}

/// Checks that every id in `cores` names a core we may run on.
///
/// # Errors
/// [`BenchError::UnknownCore`] naming the first bad id and the valid ones.
pub fn check_cores(flag: &'static str, cores: &[usize]) -> Result<(), BenchError> {
    let avail = available_cores();
    match cores.iter().find(|c| !avail.contains(c)) {
        Some(&core) => Err(BenchError::UnknownCore {
            flag,
            core,
            available: avail,
        }),
        None => Ok(()),
    }
}

/// Pins the calling thread to `core`.
///
/// # Errors
/// [`BenchError::Pin`] when the OS refuses.
pub fn pin_current(core: usize) -> Result<(), BenchError> {
    if core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        Ok(())
    } else {
        Err(BenchError::Pin { core })
    }
}
