//! What machine we run on, and pinning threads to its cores.

use serde::{Deserialize, Serialize};

use crate::error::BenchError;

/// The `machine` object of `summary.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// CPU model name from `/proc/cpuinfo`, or `"unknown"`.
    pub cpu_model: String,
    /// Cores the machine has online (not only those this process may use: see
    /// [`allowed_cores`](Self::allowed_cores)).
    pub cores: usize,
    /// The cores this process may run on (its affinity mask: `taskset`, cgroups).
    #[serde(default)]
    pub allowed_cores: Vec<usize>,
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
        let allowed_cores = available_cores();
        Self {
            cpu_model,
            cores: online_cores().unwrap_or(allowed_cores.len()),
            allowed_cores,
            hostname,
            os: format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
        }
    }
}

/// How many cores the machine has online (`/sys/devices/system/cpu/online`, e.g. `0-3,6`),
/// whatever this process's affinity.
pub fn online_cores() -> Option<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    parse_cpu_list(s.trim())
}

/// The number of cores in a kernel CPU list (`0-3,6`).
fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut n = 0;
    for part in s.split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse().ok()?)? + 1,
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
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

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_lists() {
        assert_eq!(super::parse_cpu_list("0-3,6"), Some(5));
        assert_eq!(super::parse_cpu_list("0"), Some(1));
        assert_eq!(super::parse_cpu_list("x"), None);
    }
}
