//! Publishing an engine's counters into its counters file, on the control thread.
//!
//! [`Publisher`] holds the engine's counters file and what it shows: the engine counters, the
//! pollers' counters and, per connection, a weak reference to the state the connection's
//! parties share ([`ConnShared`]: the poller's counters, the application's, up/down state).
//! Connections are attached when their handle is made (setup, on the application thread);
//! [`Publisher::publish`] runs on the control thread's turns. Everything it reads is a
//! single-writer atomic read with a relaxed load, so the data path is unchanged.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::layout::{ConnState, CONN_FIELDS, CONN_SLOTS, ENGINE_FIELDS, POLLER_FIELDS};
use super::writer::{ConnSlot, CountersFile};
use crate::link::{ConnShared, Down};
use crate::stats::{EngineCounters, PollerCounters};

/// Shortest time between two publications.
const PERIOD: Duration = Duration::from_millis(100);

/// One attached connection.
struct Entry {
    shared: Weak<ConnShared>,
    fabric: String,
    endpoint: String,
}

struct State {
    file: CountersFile,
    conns: Vec<Option<Entry>>,
    last: Option<Instant>,
}

/// An engine's counters file and what it shows (see the module docs).
pub(crate) struct Publisher {
    state: Mutex<State>,
    engine: Arc<EngineCounters>,
    pollers: Vec<(Option<usize>, Arc<PollerCounters>)>,
    /// Connections that found no free slot.
    unlisted: AtomicU64,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").finish_non_exhaustive()
    }
}

impl Publisher {
    /// Creates the engine's counters file in [`super::dir`], named `<name>-<pid>-<n>.counters`;
    /// `None` (with a warning on the control plane's log) when it cannot be made: the engine
    /// runs without one.
    pub(crate) fn create(
        name: &str,
        engine: Arc<EngineCounters>,
        pollers: Vec<(Option<usize>, Arc<PollerCounters>)>,
    ) -> Option<Arc<Publisher>> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        remove_long_dead();
        let made = super::dir().map_err(|e| e.to_string()).and_then(|dir| {
            let part = super::file_name_part(name);
            let pid = std::process::id();
            // A name taken by an earlier engine of this process: the next number.
            let mut last = String::new();
            for _ in 0..64 {
                let n = SEQ.fetch_add(1, Ordering::Relaxed);
                let path: PathBuf = dir.join(format!("{part}-{pid}-{n}.counters"));
                match CountersFile::create(&path, name, pollers.len()) {
                    Ok(f) => return Ok(f),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        // A stale file of a dead process that had this pid: replace it.
                        let _ = std::fs::remove_file(&path);
                        last = format!("{}: {e}", path.display());
                    }
                    Err(e) => return Err(format!("{}: {e}", path.display())),
                }
            }
            Err(last)
        });
        match made {
            Ok(file) => {
                let p = Publisher {
                    state: Mutex::new(State {
                        file,
                        conns: (0..CONN_SLOTS).map(|_| None).collect(),
                        last: None,
                    }),
                    engine,
                    pollers,
                    unlisted: AtomicU64::new(0),
                };
                p.publish_now();
                Some(Arc::new(p))
            }
            Err(e) => {
                tracing::warn!(error = %e, "no counters file for this engine");
                None
            }
        }
    }

    /// The file's path.
    pub(crate) fn path(&self) -> PathBuf {
        self.lock().file.path().to_owned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while publishing leaves nothing half-done that matters: keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Shows connection `shared` (of `fabric`, to `endpoint`) from the next publication on.
    pub(crate) fn attach(&self, shared: &Arc<ConnShared>, fabric: &str, endpoint: &str) {
        let mut st = self.lock();
        let free = st
            .conns
            .iter()
            .position(|e| e.as_ref().map_or(true, |e| e.shared.strong_count() == 0));
        match free {
            Some(i) => {
                st.conns[i] = Some(Entry {
                    shared: Arc::downgrade(shared),
                    fabric: fabric.to_owned(),
                    endpoint: endpoint.to_owned(),
                });
            }
            None => {
                self.unlisted.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Publishes when the last publication is at least 100 ms old.
    pub(crate) fn publish(&self, now: Instant) {
        let due = self
            .lock()
            .last
            .map_or(true, |t| now.duration_since(t) >= PERIOD);
        if due {
            self.publish_now();
        }
    }

    /// Publishes every counter now.
    pub(crate) fn publish_now(&self) {
        let mut guard = self.lock();
        let st = &mut *guard;
        st.last = Some(Instant::now());
        st.file.begin();
        let mut live = 0u64;
        for (i, slot) in st.conns.iter_mut().enumerate() {
            let shared = slot.as_ref().and_then(|e| e.shared.upgrade());
            let (Some(e), Some(shared)) = (slot.as_ref(), shared) else {
                *slot = None;
                st.file.clear_conn(i);
                continue;
            };
            let (state, reason) = state_of(&shared);
            if state == ConnState::Open {
                live += 1;
            }
            st.file.set_conn(
                i,
                &ConnSlot {
                    id: shared.id,
                    state,
                    fabric: &e.fabric,
                    reason: &reason,
                    endpoint: &e.endpoint,
                    counters: conn_values(&shared),
                },
            );
        }
        let c = &self.engine;
        let vals: [u64; ENGINE_FIELDS.len()] = [
            live,
            c.connections_opened.load(Ordering::Relaxed),
            c.connections_closed.load(Ordering::Relaxed),
            c.control_wakeups.load(Ordering::Relaxed),
            c.events_dropped.load(Ordering::Relaxed),
            self.unlisted.load(Ordering::Relaxed),
        ];
        st.file.set_engine(&vals, self.pollers.len());
        for (i, (core, p)) in self.pollers.iter().enumerate() {
            let s = p.snapshot(*core);
            let v: [u64; POLLER_FIELDS.len()] = [
                s.cycles,
                s.busy_cycles,
                s.empty_cycles,
                s.commands,
                s.rx_msgs,
                s.tx_msgs,
                s.tx_batches,
                s.tx_stalls,
                s.rx_ring_full,
                s.conn_errors,
                s.connections,
                s.sleeps,
                s.sleep_timeouts,
            ];
            st.file.set_poller(i, *core, &v);
        }
        st.file.end();
    }
}

/// Files of processes that died without closing their engine stay for readers to report as
/// stale; once such a file has not been published for this long, the next engine to start
/// removes it, so killed processes do not fill the directory.
const STALE_KEEP: Duration = Duration::from_secs(600);

/// Removes the files of dead processes unpublished for [`STALE_KEEP`].
fn remove_long_dead() {
    let Ok(paths) = super::list() else {
        return;
    };
    let now = super::unix_ns();
    for path in paths {
        // `<name>-<pid>-<n>.counters`: only a file whose process is gone is read.
        let pid = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.rsplit('-').nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists()) {
            continue;
        }
        if let Ok(s) = super::read(&path) {
            let idle = now.saturating_sub(s.published_unix_ns);
            if s.liveness == super::Liveness::Dead && idle > STALE_KEEP.as_nanos() as u64 {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// A connection's state and disconnect reason.
fn state_of(shared: &ConnShared) -> (ConnState, String) {
    match shared.down() {
        None => (ConnState::Open, String::new()),
        Some(Down::Disconnected) => (ConnState::Disconnected, "peer closed".into()),
        Some(Down::Closed) => (ConnState::Closed, "closed here".into()),
        Some(Down::Failed(e)) => (ConnState::Failed, e.to_string()),
    }
}

/// A connection's counters in [`CONN_FIELDS`] order.
fn conn_values(shared: &ConnShared) -> [u64; CONN_FIELDS.len()] {
    let c = &shared.counters;
    let a = &shared.app;
    let credits = shared.credits.load(Ordering::Relaxed);
    let direct = a.direct.load(Ordering::Relaxed);
    // A polled connection's own send and receive counts are the application's plain state:
    // the messages its poller posted and delivered stand for them.
    let (sent, received) = if direct {
        (a.sent.get(), a.received.get())
    } else {
        (c.tx_msgs.get(), c.rx_msgs.get())
    };
    // A direct path has no poller: the application's counts are the connection's.
    let (tx_msgs, tx_bytes, rx_msgs, rx_bytes, stalls) = if direct {
        (
            sent,
            a.tx_bytes.get(),
            received,
            a.rx_bytes.get(),
            a.would_block.get(),
        )
    } else {
        (
            c.tx_msgs.get(),
            c.tx_bytes.get(),
            c.rx_msgs.get(),
            c.rx_bytes.get(),
            c.tx_stalls.get(),
        )
    };
    let heard = shared.live.last_heard_ns.load(Ordering::Relaxed);
    [
        sent,
        received,
        tx_msgs,
        tx_bytes,
        rx_msgs,
        rx_bytes,
        a.would_block.get(),
        stalls,
        a.alloc_failures.get(),
        a.large_sent.get(),
        a.large_received.get(),
        // Poller paths only (a direct path's count is in its shared segment).
        if direct {
            0
        } else {
            sent.saturating_sub(credits)
        },
        shared.live.heartbeats.load(Ordering::Relaxed),
        if heard == 0 {
            u64::MAX
        } else {
            super::unix_ns().saturating_sub(heard) / 1_000_000
        },
        u64::from(shared.down().is_some_and(|d| matches!(d, Down::Failed(_)))),
    ]
}
