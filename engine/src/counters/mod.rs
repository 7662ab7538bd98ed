//! Live counters outside the process: one memory-mapped file per engine, and its reader.
//!
//! Every engine (unless [`EngineBuilder::counters_file`](crate::EngineBuilder::counters_file)
//! turns it off) maps a file `<name>-<pid>-<n>.counters` in [`dir`] (the `counters/`
//! directory of the per-user runtime directory the shm rendezvous sockets use, or of
//! `/dev/shm/spinwire-<uid>/` when that directory is not memory-backed). Its control
//! thread publishes the counters the data path already keeps into it at most ten times a
//! second (on its own turns: the liveness beat while connections are up): per engine the
//! connections and control wake-ups, per poller its cycles, busy cycles and messages, per
//! connection its endpoint, fabric, state and disconnect reason, messages and bytes each way,
//! would-block results, credit stalls, large messages, heartbeats, liveness and errors. The
//! data path itself is unchanged: the pollers' counters are single-writer atomics the control
//! thread reads with relaxed loads; a direct path (shm, no poller) keeps plain counters and
//! copies them into its connection's shared counters every 256 messages and whenever a
//! receive finds its ring empty (a few relaxed stores, no read-modify-write).
//!
//! The file is removed when the engine closes. A file whose process died without closing it
//! (killed) stays; [`read`] reports it as [`Liveness::Dead`], and an engine starting ten minutes
//! after its last publication removes it.
//!
//! [`layout`] is the one definition of the file's layout: the writer and this reader share
//! it, and a reader of another [`LAYOUT_VERSION`] refuses the file
//! ([`CountersError::Version`]). The `spinwire-stat` tool is built on [`list`] and [`read`].
//!
//! ```
//! # fn main() -> Result<(), spinwire::counters::CountersError> {
//! for path in spinwire::counters::list()? {
//!     match spinwire::counters::read(&path) {
//!         Ok(s) => println!("{} pid {} ({})", s.name, s.pid, s.liveness.as_str()),
//!         Err(e) => println!("{e}"),
//!     }
//! }
//! # Ok(())
//! # }
//! ```

pub mod layout;
mod place;
pub(crate) mod publish;
mod reader;
mod writer;

pub use layout::{ConnState, CONN_FIELDS, ENGINE_FIELDS, LAYOUT_VERSION, POLLER_FIELDS};
pub use place::COUNTERS_DIR_ENV;
pub use reader::{dir, list, read, ConnCounts, Liveness, PollerCounts, Snapshot};

use std::path::PathBuf;

/// Why a counters file could not be listed or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CountersError {
    /// The counters directory is missing, insecure or unreadable.
    #[error("counters directory{}", path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Dir {
        /// The directory, when known.
        path: Option<PathBuf>,
        /// What failed.
        #[source]
        source: crate::BoxError,
    },
    /// A file could not be read (an engine that just closed removed it).
    #[error("reading {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// Not a counters file.
    #[error("{} is not a spinwire counters file: {reason}", path.display())]
    NotCounters {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A counters file of another layout version.
    #[error("{} has counters layout version {found}, this reader reads version {supported}: use the spinwire-stat of the engine's version", path.display())]
    Version {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u64,
        /// The one this build reads.
        supported: u64,
    },
    /// The writer kept updating the file while it was read.
    #[error("{} changed during every read attempt", path.display())]
    Busy {
        /// The file.
        path: PathBuf,
    },
}

/// Nanoseconds since the Unix epoch now.
pub(crate) fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The fields of `/proc/<pid>/stat` after the command name (field 3 on), or `None` when the
/// process does not exist.
fn proc_stat_fields(pid: u32) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or parentheses.
    let rest = &s[s.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// Process `pid`'s start time, clock ticks after boot (`/proc/<pid>/stat` field 22).
pub(crate) fn proc_start_ticks(pid: u32) -> Option<u64> {
    proc_stat_fields(pid)?.get(19)?.parse().ok()
}

/// Whether process `pid`, started at `start` ticks (0: unknown), still runs.
fn liveness(pid: u32, start: u64) -> Liveness {
    let Some(f) = proc_stat_fields(pid) else {
        return Liveness::Dead;
    };
    let zombie = f.first().is_some_and(|s| s == "Z" || s == "X");
    let reused = start != 0 && f.get(19).and_then(|s| s.parse::<u64>().ok()) != Some(start);
    if zombie || reused {
        Liveness::Dead
    } else {
        Liveness::Running
    }
}

/// `name` as a file-name part: ASCII letters, digits, `.`, `_` and `-` kept, anything else
/// `_`, at most 64 bytes, never empty or starting with `.`.
pub(crate) fn file_name_part(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if s.is_empty() || s.starts_with('.') {
        s.insert(0, '_');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_self() {
        assert_eq!(file_name_part("a b/c"), "a_b_c");
        assert_eq!(file_name_part(""), "_");
        assert_eq!(file_name_part(".x"), "_.x");
        let me = std::process::id();
        let start = proc_start_ticks(me).expect("own start time");
        assert_eq!(liveness(me, start), Liveness::Running);
        assert_eq!(liveness(me, start + 1), Liveness::Dead);
        assert_eq!(liveness(u32::MAX - 1, 0), Liveness::Dead);
    }
}
