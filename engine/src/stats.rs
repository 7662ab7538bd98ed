//! Counters: written by one thread with plain stores, read by anyone as snapshots.
//!
//! Each counter has exactly one writer at a time (a poller, or the application thread that owns a
//! connection), so an increment is a relaxed load plus a relaxed store (two plain `mov`s on
//! x86-64), never an atomic read-modify-write. Readers take [`Copy`] snapshots of plain `u64`s.

use std::sync::atomic::{AtomicU64, Ordering};

/// A single-writer counter.
#[derive(Debug, Default)]
#[repr(transparent)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Only the counter's single writer may call this.
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    /// Sets the value. Only the counter's single writer may call this.
    #[inline]
    pub(crate) fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }

    /// Reads the value.
    #[inline]
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Live counters of one poller (written by the thread driving it).
#[derive(Debug, Default)]
pub(crate) struct PollerCounters {
    pub(crate) cycles: Counter,
    pub(crate) busy_cycles: Counter,
    pub(crate) empty_cycles: Counter,
    pub(crate) commands: Counter,
    pub(crate) rx_msgs: Counter,
    pub(crate) tx_msgs: Counter,
    pub(crate) tx_batches: Counter,
    pub(crate) tx_stalls: Counter,
    pub(crate) rx_ring_full: Counter,
    pub(crate) conn_errors: Counter,
    pub(crate) connections: Counter,
    pub(crate) sleeps: Counter,
    pub(crate) sleep_timeouts: Counter,
}

impl PollerCounters {
    pub(crate) fn snapshot(&self, core: Option<usize>) -> PollerStats {
        PollerStats {
            core,
            cycles: self.cycles.get(),
            busy_cycles: self.busy_cycles.get(),
            empty_cycles: self.empty_cycles.get(),
            commands: self.commands.get(),
            rx_msgs: self.rx_msgs.get(),
            tx_msgs: self.tx_msgs.get(),
            tx_batches: self.tx_batches.get(),
            tx_stalls: self.tx_stalls.get(),
            rx_ring_full: self.rx_ring_full.get(),
            conn_errors: self.conn_errors.get(),
            connections: self.connections.get(),
            sleeps: self.sleeps.get(),
            sleep_timeouts: self.sleep_timeouts.get(),
        }
    }
}

/// A snapshot of one poller's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PollerStats {
    /// The core the poller is pinned to; `None` for the run-to-completion poller.
    pub core: Option<usize>,
    /// Cycles run.
    pub cycles: u64,
    /// Cycles that did work.
    pub busy_cycles: u64,
    /// Cycles that found nothing to do (the idle strategy ran).
    pub empty_cycles: u64,
    /// Commands taken from the control thread.
    pub commands: u64,
    /// Messages delivered to applications.
    pub rx_msgs: u64,
    /// Messages posted to the fabric.
    pub tx_msgs: u64,
    /// Send batches posted (doorbells).
    pub tx_batches: u64,
    /// Times the fabric accepted fewer sends than offered (no credits / ring full).
    pub tx_stalls: u64,
    /// Times received messages waited because an application's receive ring was full.
    pub rx_ring_full: u64,
    /// Connections failed on this poller (protocol violations, fabric errors).
    pub conn_errors: u64,
    /// Connections served now.
    pub connections: u64,
    /// [`IdleStrategy::Block`](crate::IdleStrategy::Block): times the poller slept in the
    /// kernel (armed every source and called `poll(2)`).
    pub sleeps: u64,
    /// Sleeps that ended by their timeout (`max_sleep`, the liveness tick, a source polled
    /// every millisecond) rather than by a wake-up.
    pub sleep_timeouts: u64,
}

/// Engine-wide counters: [`Engine::counters`](crate::Engine::counters).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineStats {
    /// One entry per poller (the run-to-completion poller has `core: None`).
    pub pollers: Vec<PollerStats>,
    /// Events dropped because the application did not drain [`Engine::try_event`](crate::Engine::try_event).
    pub events_dropped: u64,
    /// Connections established since start.
    pub connections_opened: u64,
    /// Connections torn down since start.
    pub connections_closed: u64,
    /// Turns of the control thread since start (each wake-up from `poll(2)`: a deadline, a
    /// request, a poller's notice, a descriptor). Every one may preempt a busy-polling thread
    /// on a machine with no spare core; with established connections and nothing in flight it
    /// grows only at the liveness cadence (twelve a second at the default 1-s timeout).
    pub control_wakeups: u64,
    /// What the engine's pools, segments and regions got: hugepages or 4 KiB pages, and the
    /// NUMA node ([`EngineBuilder::hugepages`](crate::EngineBuilder::hugepages),
    /// [`EngineBuilder::numa`](crate::EngineBuilder::numa)).
    pub placement: crate::placement::PlacementStats,
}

/// Per-connection counters written by its poller.
#[derive(Debug, Default)]
pub(crate) struct ConnCounters {
    pub(crate) rx_msgs: Counter,
    pub(crate) rx_bytes: Counter,
    pub(crate) tx_msgs: Counter,
    pub(crate) tx_bytes: Counter,
    pub(crate) tx_stalls: Counter,
}

/// A snapshot of one connection's counters: [`Connection::stats`](crate::Connection::stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnStats {
    /// Messages the poller delivered to this connection's receive ring.
    pub rx_msgs: u64,
    /// Payload bytes of those.
    pub rx_bytes: u64,
    /// Messages the poller posted to the fabric.
    pub tx_msgs: u64,
    /// Payload bytes of those.
    pub tx_bytes: u64,
    /// Times the fabric accepted fewer sends than offered.
    pub tx_stalls: u64,
    /// Messages the application handed to `send` successfully.
    pub sent: u64,
    /// Messages the application received.
    pub received: u64,
    /// `send` calls that returned `WouldBlock` (no credits).
    pub would_block: u64,
    /// `alloc` calls that found no free buffer.
    pub alloc_failures: u64,
    /// Messages in flight now (sent, credit not yet returned). Credits are collected lazily
    /// (shm: once half the window is out), so an idle connection may show a small remainder.
    pub in_flight: u64,
    /// Times a receive on this connection slept in the kernel
    /// ([`IdleStrategy::Block`](crate::IdleStrategy::Block)) after its spin phase.
    pub sleeps: u64,
    /// Of [`sleeps`](Self::sleeps), those that ended without being rung: at their time limit
    /// (`max_sleep`, or the call's own deadline) or spuriously. With messages flowing these
    /// stay near zero; a count that rises with the traffic would be lost wake-ups.
    pub sleeps_unrung: u64,
}

/// Engine-wide counters written by the control thread.
#[derive(Debug, Default)]
pub(crate) struct EngineCounters {
    pub(crate) events_dropped: AtomicU64,
    pub(crate) connections_opened: AtomicU64,
    pub(crate) connections_closed: AtomicU64,
    pub(crate) control_wakeups: AtomicU64,
}

/// A connection's application-side counts as the control thread sees them (for the counters
/// file, [`crate::counters`]): a direct path copies its plain counts in every 256 messages and
/// when a receive finds its ring empty; a polled path adds its would-block results and
/// allocation failures here as they happen (slow paths); large slots are counted as they are
/// taken and released. One writer each: the connection's owning thread.
#[derive(Debug, Default)]
pub(crate) struct AppCounters {
    pub(crate) sent: Counter,
    pub(crate) received: Counter,
    pub(crate) would_block: Counter,
    pub(crate) alloc_failures: Counter,
    /// Direct path only (the poller counts these on the poller path).
    pub(crate) tx_bytes: Counter,
    pub(crate) rx_bytes: Counter,
    /// Large slots taken to send, and large messages released.
    pub(crate) large_sent: Counter,
    pub(crate) large_received: Counter,
    /// Set once at setup: the connection takes the direct path.
    pub(crate) direct: std::sync::atomic::AtomicBool,
}

/// Per-connection liveness, written by the control thread.
#[derive(Debug, Default)]
pub(crate) struct LiveCounters {
    /// Heartbeats this side sent.
    pub(crate) heartbeats: AtomicU64,
    /// When the peer was last heard from, ns since the Unix epoch (0: not tracked).
    pub(crate) last_heard_ns: AtomicU64,
}
