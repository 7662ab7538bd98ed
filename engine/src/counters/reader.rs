//! The reading side: lists this user's counters files and decodes them into snapshots.
//!
//! A reader never maps a file: it reads it (the kernel's page cache is the mapping's), checks
//! the magic, the layout version and the size, and retries while the writer's publication
//! sequence is odd or moved during the read.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::layout::*;
use super::{place, CountersError};

/// Whether the process that wrote a counters file still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Liveness {
    /// The writing process runs: the counters are live.
    Running,
    /// No such process (or its id now belongs to another process, or it is a zombie): the file
    /// is stale, left by a process that died without closing its engine.
    Dead,
}

impl Liveness {
    /// `running` or `stale`.
    pub fn as_str(self) -> &'static str {
        match self {
            Liveness::Running => "running",
            Liveness::Dead => "stale",
        }
    }
}

/// One poller's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollerCounts {
    /// The core it is pinned to; `None` for the run-to-completion poller.
    pub core: Option<usize>,
    /// Values in [`POLLER_FIELDS`] order.
    pub values: [u64; POLLER_FIELDS.len()],
}

impl PollerCounts {
    /// The counter named `name` (one of [`POLLER_FIELDS`]).
    pub fn get(&self, name: &str) -> Option<u64> {
        POLLER_FIELDS
            .iter()
            .position(|f| *f == name)
            .map(|i| self.values[i])
    }
}

/// One connection's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnCounts {
    /// The engine's id of the connection.
    pub id: u64,
    /// Open, or why not.
    pub state: ConnState,
    /// `shm`, `tcp`, `rdma`, ...
    pub fabric: String,
    /// The peer's endpoint (as connected to, or as listened on for an accepted connection).
    pub endpoint: String,
    /// Why it went down (empty while open).
    pub reason: String,
    /// Values in [`CONN_FIELDS`] order.
    pub values: [u64; CONN_FIELDS.len()],
}

impl ConnCounts {
    /// The counter named `name` (one of [`CONN_FIELDS`]).
    pub fn get(&self, name: &str) -> Option<u64> {
        CONN_FIELDS
            .iter()
            .position(|f| *f == name)
            .map(|i| self.values[i])
    }
}

/// A consistent snapshot of one engine's counters file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The file read.
    pub path: PathBuf,
    /// The writing process.
    pub pid: u32,
    /// The engine's name ([`EngineBuilder::name`](crate::EngineBuilder::name)).
    pub name: String,
    /// Whether the writing process still runs.
    pub liveness: Liveness,
    /// When the engine started, ns since the Unix epoch.
    pub created_unix_ns: u64,
    /// When the counters were last published, ns since the Unix epoch.
    pub published_unix_ns: u64,
    /// Engine counters in [`ENGINE_FIELDS`] order.
    pub engine: [u64; ENGINE_FIELDS.len()],
    /// The pollers.
    pub pollers: Vec<PollerCounts>,
    /// The connections, by slot.
    pub conns: Vec<ConnCounts>,
}

impl Snapshot {
    /// The engine counter named `name` (one of [`ENGINE_FIELDS`]).
    pub fn engine_counter(&self, name: &str) -> Option<u64> {
        ENGINE_FIELDS
            .iter()
            .position(|f| *f == name)
            .map(|i| self.engine[i])
    }
}

/// The directory counters files live in: `$SPINWIRE_COUNTERS_DIR` when set; else `counters/`
/// in the per-user runtime directory the shm rendezvous sockets use (`$SPINWIRE_RUNTIME_DIR`,
/// else `$XDG_RUNTIME_DIR/spinwire`, else `/tmp/spinwire-<uid>`) when that is on tmpfs, else
/// `/dev/shm/spinwire-<uid>/counters` (a memory-backed place: a mapped file on a disk file
/// system can stall the control thread on writeback), else the runtime directory's
/// `counters/` as it is. Created with mode 0700 if missing and checked (a directory of this
/// user, no group or other access).
///
/// # Errors
/// [`CountersError::Dir`] when a directory fails its checks or cannot be created.
pub fn dir() -> Result<PathBuf, CountersError> {
    let err = |path: &Path| {
        let path = path.to_owned();
        move |e: std::io::Error| CountersError::Dir {
            path: Some(path),
            source: Box::new(e),
        }
    };
    if let Some(d) = std::env::var_os(place::COUNTERS_DIR_ENV).filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        return place::private_dir(&d).map_err(err(&d));
    }
    let base = cm::uds::runtime_dir().map_err(|e| CountersError::Dir {
        path: None,
        source: Box::new(e),
    })?;
    let shm = Path::new("/dev/shm");
    let base = if !place::on_memory_fs(&base) && place::on_memory_fs(shm) {
        let d = shm.join(format!("spinwire-{}", place::euid()));
        place::private_dir(&d).map_err(err(&d))?
    } else {
        base
    };
    let d = base.join("counters");
    place::private_dir(&d).map_err(err(&d))
}

/// The counters files in [`dir`], sorted by path.
///
/// # Errors
/// [`CountersError::Dir`].
pub fn list() -> Result<Vec<PathBuf>, CountersError> {
    let d = dir()?;
    let rd = std::fs::read_dir(&d).map_err(|e| CountersError::Dir {
        path: Some(d.clone()),
        source: Box::new(e),
    })?;
    let mut out: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "counters"))
        .collect();
    out.sort();
    Ok(out)
}

/// Reads one counters file into a consistent snapshot.
///
/// # Errors
/// [`CountersError::Read`] when it cannot be read (it may have just been removed: the engine
/// closed), [`CountersError::NotCounters`] for a file without the magic or too short,
/// [`CountersError::Version`] for a file of another layout version, [`CountersError::Busy`]
/// when the writer kept updating it.
pub fn read(path: &Path) -> Result<Snapshot, CountersError> {
    let read_err = |e| CountersError::Read {
        path: path.to_owned(),
        source: e,
    };
    for _ in 0..100 {
        let mut f = std::fs::File::open(path).map_err(read_err)?;
        let mut b = Vec::new();
        f.read_to_end(&mut b).map_err(read_err)?;
        let snap = decode(path, &b)?;
        let Some((seq, snap)) = snap else {
            std::thread::yield_now();
            continue;
        };
        // The sequence again: unchanged means no update overlapped the read.
        let mut head = [0u8; 64];
        let again = std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut head))
            .map(|()| word(&head, H_SEQ * 8));
        if again.map_err(read_err)? == seq {
            return Ok(snap);
        }
    }
    Err(CountersError::Busy {
        path: path.to_owned(),
    })
}

fn word(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn text(b: &[u8], (at, len): (usize, usize)) -> String {
    let t = &b[at..at + len];
    let end = t.iter().position(|&c| c == 0).unwrap_or(len);
    String::from_utf8_lossy(&t[..end]).into_owned()
}

/// Decodes `b`; `None` while an update runs (odd sequence).
fn decode(path: &Path, b: &[u8]) -> Result<Option<(u64, Snapshot)>, CountersError> {
    let not = |reason: &str| CountersError::NotCounters {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    if b.len() < HEADER_BYTES {
        return Err(not("shorter than the header"));
    }
    if word(b, H_MAGIC * 8) != MAGIC {
        return Err(not("no counters magic (or not yet written)"));
    }
    let version = word(b, H_VERSION * 8);
    if version != LAYOUT_VERSION {
        return Err(CountersError::Version {
            path: path.to_owned(),
            found: version,
            supported: LAYOUT_VERSION,
        });
    }
    let seq = word(b, H_SEQ * 8);
    if seq % 2 == 1 {
        return Ok(None);
    }
    let pollers = usize::try_from(word(b, H_POLLER_SLOTS * 8)).unwrap_or(usize::MAX);
    let conns = usize::try_from(word(b, H_CONN_SLOTS * 8)).unwrap_or(usize::MAX);
    if pollers > 4096 || conns > 1 << 20 || b.len() < file_bytes(pollers, conns) {
        return Err(not("slot counts do not match the file's size"));
    }
    let pid = u32::try_from(word(b, H_PID * 8)).map_err(|_| not("bad process id"))?;
    let used = usize::try_from(word(b, H_POLLERS_USED * 8))
        .unwrap_or(0)
        .min(pollers);
    let pollers = (0..used)
        .map(|i| {
            let at = poller_at(i);
            let core = word(b, at);
            PollerCounts {
                core: (core != u64::MAX).then_some(core as usize),
                values: std::array::from_fn(|k| word(b, at + 8 + k * 8)),
            }
        })
        .collect();
    let npollers = usize::try_from(word(b, H_POLLER_SLOTS * 8)).unwrap_or(0);
    let conns = (0..conns)
        .filter_map(|i| {
            let at = conn_at(npollers, i);
            let id = word(b, at + C_ID * 8);
            (id != 0).then(|| ConnCounts {
                id: id - 1,
                state: ConnState::from_code(word(b, at + C_STATE * 8)),
                fabric: text(b, (at + C_FABRIC.0, C_FABRIC.1)),
                endpoint: text(b, (at + C_ENDPOINT.0, C_ENDPOINT.1)),
                reason: text(b, (at + C_REASON.0, C_REASON.1)),
                values: std::array::from_fn(|k| word(b, at + (C_COUNTERS + k) * 8)),
            })
        })
        .collect();
    let start = word(b, H_PROC_START * 8);
    Ok(Some((
        seq,
        Snapshot {
            path: path.to_owned(),
            pid,
            name: text(b, H_NAME),
            liveness: super::liveness(pid, start),
            created_unix_ns: word(b, H_CREATED_NS * 8),
            published_unix_ns: word(b, H_PUBLISHED_NS * 8),
            engine: std::array::from_fn(|k| word(b, (H_ENGINE + k) * 8)),
            pollers,
            conns,
        },
    )))
}
