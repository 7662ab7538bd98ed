//! `mem://` connection setup: the process-wide listener registry, the pools and rings of a
//! connection, listening and connecting. Runs on the control thread (listen, accept) or on the
//! thread calling `connect` (which never waits: the listener is in this process), never on a
//! poller.
//!
//! `listen("mem://name")` registers `name` in a process-wide table (one listener per name);
//! `connect("mem://name")`, from any engine of the process, finds it, builds both ends of the
//! connection at once (each direction's pool is sized by its sender's configuration), queues
//! the accepted end in the listener's inbox and wakes the listening engine's control thread
//! through a socket pair (the listener's descriptor in its poll set), which installs it.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use rings::RingBuffer;

use crate::config::Config;
use crate::desc::PoolView;
use crate::error::Error;
use crate::link::Pools;
use crate::placement::{PlacedRegion, Placer};

use super::datapath::{Channel, EndParts, MemConn};

/// Setting up a `mem://` listener or connection failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemSetupError {
    /// Nobody in this process listens on the name.
    #[error("no mem:// listener named {name:?} in this process")]
    NoListener {
        /// The name.
        name: String,
    },
    /// The name is listened on already.
    #[error("mem:// name {name:?} is already listened on in this process")]
    NameTaken {
        /// The name.
        name: String,
    },
    /// The two engines' buffer sizes differ.
    #[error("buffer sizes differ: ours {ours} bytes, the listener's {theirs}")]
    Mismatch {
        /// The connecting engine's buffer size.
        ours: usize,
        /// The listening engine's.
        theirs: usize,
    },
    /// A pool could not be allocated.
    #[error("could not allocate {bytes} bytes of pool memory")]
    Alloc {
        /// The size asked for.
        bytes: usize,
    },
    /// Placing a pool (hugepages, NUMA node) failed.
    #[error("placing a mem:// pool")]
    Placement(#[source] crate::placement::PlacementError),
    /// The listener's wake-up socket pair could not be made.
    #[error("could not create the listener's wake-up socket pair")]
    Wake(#[source] io::Error),
}

/// What one engine brings to a connection (its configuration, as the sender of one direction).
#[derive(Debug, Clone)]
pub(crate) struct MemParams {
    buffer_size: usize,
    buffers: u32,
    depth: usize,
    copy_max: usize,
    liveness: Duration,
    /// Message limit and large slots, `(limit, 0)` without large messages.
    limit: usize,
    large: u32,
    /// The sender's engine places its direction's pools.
    placer: Arc<Placer>,
    /// The engine's strategy is `Block` (its pollers may sleep).
    block: bool,
}

impl MemParams {
    pub(crate) fn of(cfg: &Config) -> MemParams {
        let (_, large) = cfg.large_pool();
        MemParams {
            buffer_size: cfg.buffer_size,
            buffers: u32::try_from(cfg.buffers).unwrap_or(u32::MAX),
            depth: cfg.depth.max(1),
            copy_max: cfg.inline_threshold,
            liveness: cfg.liveness_timeout,
            limit: cfg.message_limit(),
            large,
            placer: cfg.placer.clone(),
            block: matches!(cfg.idle, crate::IdleStrategy::Block { .. }),
        }
    }
}

/// Both directions' pools of one connection, kept alive by both ends and their handles.
struct MemPools {
    _regions: [PlacedRegion; 4],
}

/// One direction's pools: `(ordinary, large)` views and their regions.
fn direction(
    from: &MemParams,
    slot: usize,
    slots: u32,
) -> Result<(PoolView, PoolView, PlacedRegion, PlacedRegion), MemSetupError> {
    let bytes = from
        .buffer_size
        .checked_mul(from.buffers as usize)
        .ok_or(MemSetupError::Alloc { bytes: usize::MAX })?;
    let large_bytes = slot
        .checked_mul(slots as usize)
        .ok_or(MemSetupError::Alloc { bytes: usize::MAX })?;
    let pool = from.placer.anon(bytes).map_err(MemSetupError::Placement)?;
    let large = from
        .placer
        .anon(large_bytes)
        .map_err(MemSetupError::Placement)?;
    // SAFETY: the regions are at least `buffer_size * buffers` and `slot * slots` bytes
    // (`Placer::anon` refuses what does not fit `isize`), page aligned, zeroed, and alive while the `MemPools` holding them is, which
    // both ends and both applications' handles keep. A view of zero slots reads nothing.
    let views = unsafe {
        (
            PoolView::new(pool.ptr(), from.buffer_size, from.buffers),
            if slots > 0 {
                PoolView::new(large.ptr(), slot, slots)
            } else {
                PoolView::empty()
            },
        )
    };
    Ok((views.0, views.1, pool, large))
}

/// A set-up `mem://` end, before it is registered with its engine.
pub(crate) struct Established {
    pub(crate) conn: MemConn,
    pub(crate) pools: Pools,
    pub(crate) keep: Arc<dyn Any + Send + Sync>,
    pub(crate) peer: String,
    /// What the end's setup side holds (to mark the end closed).
    pub(crate) chan: Arc<Channel>,
    pub(crate) me: usize,
}

/// Builds both ends of a connection: `(connecting end, accepted end)`.
fn build_pair(
    c: &MemParams,
    l: &MemParams,
    name: &str,
) -> Result<(Established, Established), MemSetupError> {
    if c.buffer_size != l.buffer_size {
        return Err(MemSetupError::Mismatch {
            ours: c.buffer_size,
            theirs: l.buffer_size,
        });
    }
    // Large messages when both sides have them, of the smaller limit.
    let slot = if c.large > 0 && l.large > 0 {
        c.limit.min(l.limit)
    } else {
        0
    };
    let (c_slots, l_slots) = if slot > 0 { (c.large, l.large) } else { (0, 0) };
    let (c_tx, c_tx_large, r0, r1) = direction(c, slot, c_slots)?;
    let (l_tx, l_tx_large, r2, r3) = direction(l, slot, l_slots)?;
    let keep: Arc<dyn Any + Send + Sync> = Arc::new(MemPools {
        _regions: [r0, r1, r2, r3],
    });
    let chan = Arc::new(Channel::new([c.block, l.block]));
    // Each data ring holds its sender's depth (at most that many records are in flight); each
    // release ring every buffer and slot of its sender's pools.
    let (c2l_p, c2l_c) = RingBuffer::new(c.depth);
    let (l2c_p, l2c_c) = RingBuffer::new(l.depth);
    let (c_rel_p, c_rel_c) = RingBuffer::new((c.buffers + c_slots).max(1) as usize);
    let (l_rel_p, l_rel_c) = RingBuffer::new((l.buffers + l_slots).max(1) as usize);
    let pair = next_pair();
    let connecting = Established {
        conn: MemConn::new(EndParts {
            chan: chan.clone(),
            me: 0,
            tx: c2l_p,
            rx: l2c_c,
            release_out: l_rel_p,
            release_in: c_rel_c,
            tx_pool: c_tx,
            copy_max: c.copy_max,
            liveness: c.liveness,
            keep: keep.clone(),
        }),
        pools: Pools {
            tx: c_tx,
            rx: l_tx,
            tx_large: c_tx_large,
            rx_large: l_tx_large,
        },
        keep: keep.clone(),
        peer: format!("mem://{name}"),
        chan: chan.clone(),
        me: 0,
    };
    let accepted = Established {
        conn: MemConn::new(EndParts {
            chan: chan.clone(),
            me: 1,
            tx: l2c_p,
            rx: c2l_c,
            release_out: c_rel_p,
            release_in: l_rel_c,
            tx_pool: l_tx,
            copy_max: l.copy_max,
            liveness: l.liveness,
            keep: keep.clone(),
        }),
        pools: Pools {
            tx: l_tx,
            rx: c_tx,
            tx_large: l_tx_large,
            rx_large: c_tx_large,
        },
        keep,
        peer: format!("mem://{name} (connection {pair})"),
        chan: chan.clone(),
        me: 1,
    };
    latest().insert(name.to_owned(), Arc::downgrade(&chan));
    Ok((connecting, accepted))
}

fn next_pair() -> u64 {
    static PAIRS: AtomicU64 = AtomicU64::new(1);
    PAIRS.fetch_add(1, Ordering::Relaxed)
}

/// A listener's mailbox in the process-wide table.
struct Inbox {
    params: MemParams,
    queue: Mutex<VecDeque<Established>>,
    wake: UnixStream,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process-wide table of `mem://` listeners by name.
fn listeners() -> MutexGuard<'static, HashMap<String, Arc<Inbox>>> {
    static TABLE: OnceLock<Mutex<HashMap<String, Arc<Inbox>>>> = OnceLock::new();
    lock(TABLE.get_or_init(Default::default))
}

/// The latest connection made to each name (for [`Faults`](super::Faults)).
pub(crate) fn latest() -> MutexGuard<'static, HashMap<String, Weak<Channel>>> {
    static TABLE: OnceLock<Mutex<HashMap<String, Weak<Channel>>>> = OnceLock::new();
    lock(TABLE.get_or_init(Default::default))
}

/// Connects to listener `name` of this process (connecting side; never waits).
pub(crate) fn connect(name: &str, endpoint: &str, cfg: &Config) -> Result<Established, Error> {
    let cerr = |e: MemSetupError| Error::Connect {
        endpoint: endpoint.to_owned(),
        source: Box::new(e),
    };
    let inbox = listeners()
        .get(name)
        .cloned()
        .ok_or_else(|| cerr(MemSetupError::NoListener { name: name.into() }))?;
    let (ours, theirs) = build_pair(&MemParams::of(cfg), &inbox.params, name).map_err(cerr)?;
    lock(&inbox.queue).push_back(theirs);
    // A full socket buffer means a wake-up is pending already.
    let _ = (&inbox.wake).write(&[1]);
    Ok(ours)
}

/// A listening `mem://` name; unregistered when dropped (queued connections are dropped with
/// it, which their connecting ends see as a close).
pub(crate) struct MemListenerState {
    name: String,
    inbox: Arc<Inbox>,
    wake_rx: UnixStream,
}

impl MemListenerState {
    /// Registers `name`.
    pub(crate) fn bind(name: &str, endpoint: &str, cfg: &Config) -> Result<Self, Error> {
        let lerr = |e: MemSetupError| Error::Listen {
            endpoint: endpoint.to_owned(),
            source: Box::new(e),
        };
        let (wake_rx, wake) = UnixStream::pair().map_err(|e| lerr(MemSetupError::Wake(e)))?;
        for s in [&wake_rx, &wake] {
            s.set_nonblocking(true)
                .map_err(|e| lerr(MemSetupError::Wake(e)))?;
        }
        let inbox = Arc::new(Inbox {
            params: MemParams::of(cfg),
            queue: Mutex::new(VecDeque::new()),
            wake,
        });
        let mut table = listeners();
        if table.contains_key(name) {
            return Err(lerr(MemSetupError::NameTaken { name: name.into() }));
        }
        table.insert(name.to_owned(), inbox.clone());
        Ok(MemListenerState {
            name: name.to_owned(),
            inbox,
            wake_rx,
        })
    }

    /// The descriptor that becomes readable when a connection is queued.
    pub(crate) fn fd(&self) -> RawFd {
        self.wake_rx.as_raw_fd()
    }

    /// Takes the next queued connection, if any. The wake-up is cleared only when the queue is
    /// left empty (under its lock, so a connection queued later wakes the listener again): while
    /// connections wait, the descriptor stays readable, so none is missed when an accept burst
    /// ends before the queue does.
    pub(crate) fn take_one(&self) -> Option<Established> {
        let mut queue = lock(&self.inbox.queue);
        let est = queue.pop_front();
        if queue.is_empty() {
            let mut sink = [0u8; 64];
            while matches!((&self.wake_rx).read(&mut sink), Ok(n) if n > 0) {}
        }
        est
    }
}

impl Drop for MemListenerState {
    fn drop(&mut self) {
        let mut table = listeners();
        if table
            .get(&self.name)
            .is_some_and(|i| Arc::ptr_eq(i, &self.inbox))
        {
            table.remove(&self.name);
        }
        drop(table);
        lock(&self.inbox.queue).clear();
    }
}

/// Both ends of a connection between two sides configured as `cfg`, outside any engine (the
/// crate's unit tests drive them through a bare poller).
#[cfg(test)]
pub(crate) fn test_pair(cfg: &Config, name: &str) -> (Established, Established) {
    let p = MemParams::of(cfg);
    build_pair(&p, &p, name).expect("mem pair")
}
