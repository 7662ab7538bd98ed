//! The quiet-machine guard: how much CPU other processes took on this run's cores while a
//! point ran, and how much CPU each spinning thread achieved.
//!
//! A busy-polling benchmark measures the machine as much as the engine: another process on one
//! of its cores takes turns with a spinner at scheduler-tick granularity and multiplies the
//! tail. Around each point the client samples `/proc/stat` (busy time per core: user, nice,
//! system, irq, softirq, steal) and this process's own CPU time (`/proc/self/stat`). What the
//! run's cores were busy beyond this process's own use is *other processes' CPU*; with
//! `--idle spin` a spinner that got less than [`MIN_SPINNER_CPU`] of its core was descheduled.
//! A point beyond either bound is marked *disturbed* (console, `summary.json`, `summary.csv`),
//! with a warning under the tables; `--retry-disturbed N` reruns it and `--quiet-wait SECONDS`
//! waits for a quiet machine first.
//!
//! The kernel counts in clock ticks (`USER_HZ`, 100 a second), so a point shorter than a few
//! tenths of a second has a coarse figure.

use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// A spinner (with `--idle spin`) below this fraction of its core's time was descheduled.
pub const MIN_SPINNER_CPU: f64 = 0.9;

/// Default bound on other processes' CPU on the run's cores, in cores (`--disturbed-above`).
pub const DEFAULT_OTHERS_MAX: f64 = 0.1;

/// Clock ticks per second of `/proc/stat` and `/proc/<pid>/stat` (`USER_HZ`, 100 on Linux).
const TICKS_PER_SEC: f64 = 100.0;

/// One reading of the counters the guard compares.
#[derive(Debug, Clone)]
pub struct CpuSample {
    at: Instant,
    /// Busy ticks per core, by core id.
    busy: Vec<(usize, u64)>,
    /// This process's user + system ticks.
    own: u64,
}

/// Reads `/proc/stat` and `/proc/self/stat` now.
pub fn sample() -> CpuSample {
    let busy = std::fs::read_to_string("/proc/stat")
        .map(|s| parse_proc_stat(&s))
        .unwrap_or_default();
    let own = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| own_ticks(&s))
        .unwrap_or(0);
    CpuSample {
        at: Instant::now(),
        busy,
        own,
    }
}

/// Busy ticks per `cpuN` line of `/proc/stat`.
fn parse_proc_stat(s: &str) -> Vec<(usize, u64)> {
    s.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("cpu")?;
            let (id, fields) = rest.split_once(' ')?;
            let id: usize = id.parse().ok()?;
            let v: Vec<u64> = fields
                .split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect();
            // user nice system idle iowait irq softirq steal ...
            let busy = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| v.get(i)).sum();
            Some((id, busy))
        })
        .collect()
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line.
fn own_ticks(s: &str) -> Option<u64> {
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: field 3 is index 0, so fields 14 and 15 are 11 and 12.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// The guard's verdict on one point (`quiet` in `summary.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quiet {
    /// The cores this process's threads ran on (app and poller cores).
    pub cores: Vec<usize>,
    /// CPU other processes took on those cores over the point, in cores (1.0: one whole core).
    pub others_cpu: f64,
    /// CPU this process took, in cores.
    pub own_cpu: f64,
    /// Each spinning thread's share of its core over the point, by name (`client`, `server`).
    pub spinners: Vec<(String, f64)>,
    /// Beyond the bounds: the figures are not the quiet machine's.
    pub disturbed: bool,
    /// Why, when disturbed.
    #[serde(default)]
    pub reason: String,
}

/// Bounds a point is checked against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// Other processes' CPU on the run's cores above this (cores) disturbs.
    pub others_max: f64,
    /// Check the spinners' achieved CPU (only `--idle spin` threads spin).
    pub spinning: bool,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            others_max: DEFAULT_OTHERS_MAX,
            spinning: true,
        }
    }
}

/// The verdict from `before` to `after` on `cores`, with the spinners' CPU seconds.
pub fn judge(
    before: &CpuSample,
    after: &CpuSample,
    cores: &[usize],
    spinners: &[(&str, f64)],
    bounds: Bounds,
) -> Quiet {
    let secs = after.at.duration_since(before.at).as_secs_f64().max(1e-9);
    let busy = |s: &CpuSample| -> u64 {
        s.busy
            .iter()
            .filter(|(c, _)| cores.contains(c))
            .map(|(_, b)| *b)
            .sum()
    };
    let busy_ticks = busy(after).saturating_sub(busy(before));
    let own_ticks = after.own.saturating_sub(before.own);
    let others_cpu = busy_ticks.saturating_sub(own_ticks) as f64 / TICKS_PER_SEC / secs;
    let own_cpu = own_ticks as f64 / TICKS_PER_SEC / secs;
    let spinners: Vec<(String, f64)> = spinners
        .iter()
        .map(|(n, cpu_s)| ((*n).to_owned(), (cpu_s / secs).min(1.0)))
        .collect();
    let mut why = Vec::new();
    if others_cpu > bounds.others_max {
        why.push(format!(
            "other processes used {:.0} % of a core on cores {cores:?}",
            others_cpu * 100.0
        ));
    }
    if bounds.spinning {
        for (n, share) in &spinners {
            if *share < MIN_SPINNER_CPU {
                why.push(format!(
                    "the {n} thread ran {:.0} % of the time (descheduled)",
                    share * 100.0
                ));
            }
        }
    }
    Quiet {
        cores: cores.to_vec(),
        others_cpu,
        own_cpu,
        spinners,
        disturbed: !why.is_empty(),
        reason: why.join("; "),
    }
}

/// Waits up to `limit` until other processes use at most `others_max` cores' worth on
/// `cores` over a 200 ms window; returns the last window's figure and whether it was quiet.
pub fn wait_quiet(cores: &[usize], others_max: f64, limit: Duration) -> (f64, bool) {
    let deadline = Instant::now() + limit;
    loop {
        let a = sample();
        std::thread::sleep(Duration::from_millis(200));
        let b = sample();
        let q = judge(
            &a,
            &b,
            cores,
            &[],
            Bounds {
                others_max,
                spinning: false,
            },
        );
        let others = q.others_cpu;
        if others <= others_max || Instant::now() >= deadline || crate::run::stop_requested() {
            return (others, others <= others_max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let s = "cpu  10 0 10 100 0 0 0 0 0 0\ncpu0 5 1 5 50 3 1 1 1 0 0\ncpu1 5 0 5 50 0 0 0 0 0 0\nintr 1\n";
        assert_eq!(parse_proc_stat(s), vec![(0, 14), (1, 10)]);
        let me = "42 (a b) c) R 1 2 3 4 5 6 7 8 9 10 70 30 0 0";
        assert_eq!(own_ticks(me), Some(100));
    }

    #[test]
    fn judges() {
        let at = Instant::now();
        let a = CpuSample {
            at,
            busy: vec![(0, 0), (1, 0)],
            own: 0,
        };
        let b = CpuSample {
            at: at + Duration::from_secs(1),
            busy: vec![(0, 100), (1, 100)],
            own: 150,
        };
        let q = judge(
            &a,
            &b,
            &[0, 1],
            &[("client", 1.0), ("server", 0.5)],
            Bounds::default(),
        );
        assert!((q.others_cpu - 0.5).abs() < 1e-9);
        assert!(q.disturbed);
        assert!(q.reason.contains("server thread ran 50 %"), "{}", q.reason);
        let quiet = CpuSample {
            own: 200,
            ..b.clone()
        };
        let q = judge(
            &a,
            &quiet,
            &[0, 1],
            &[("client", 1.0), ("server", 1.0)],
            Bounds::default(),
        );
        assert!(!q.disturbed, "{q:?}");
    }
}
