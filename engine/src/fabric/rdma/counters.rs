//! RDMA data-path counters: the process-wide [`RdmaStats`] snapshot ([`stats`]), the atomic
//! totals of rare events, and the per-poller counters the data path bumps without atomic
//! read-modify-writes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::stats::Counter;

/// Process-wide RDMA counters: rare events (errors, stale completions), plus the totals of
/// pollers that are gone. Atomic read-modify-writes, so never bumped per message.
#[derive(Debug, Default)]
pub(super) struct RdmaCounters {
    pub(super) rnr_errors: AtomicU64,
    pub(super) completion_errors: AtomicU64,
    pub(super) flushed_completions: AtomicU64,
    pub(super) stale_completions: AtomicU64,
    pub(super) parked_completions: AtomicU64,
    pub(super) replayed_completions: AtomicU64,
    pub(super) park_overflows: AtomicU64,
    credit_messages: AtomicU64,
    credit_stalls: AtomicU64,
    heartbeats: AtomicU64,
    inline_sends: AtomicU64,
    pooled_sends: AtomicU64,
    frames: AtomicU64,
    framed_messages: AtomicU64,
    rndv_sends: AtomicU64,
    rndv_reads: AtomicU64,
    rndv_acks: AtomicU64,
    /// Registered bytes now (not cumulative): raised at registration, lowered at release.
    pub(super) registered_rx_bytes: AtomicU64,
    pub(super) registered_tx_bytes: AtomicU64,
    pub(super) registered_large_bytes: AtomicU64,
}

/// The process-wide totals.
pub(super) static COUNTERS: RdmaCounters = RdmaCounters {
    rnr_errors: AtomicU64::new(0),
    completion_errors: AtomicU64::new(0),
    flushed_completions: AtomicU64::new(0),
    stale_completions: AtomicU64::new(0),
    parked_completions: AtomicU64::new(0),
    replayed_completions: AtomicU64::new(0),
    park_overflows: AtomicU64::new(0),
    credit_messages: AtomicU64::new(0),
    credit_stalls: AtomicU64::new(0),
    heartbeats: AtomicU64::new(0),
    inline_sends: AtomicU64::new(0),
    pooled_sends: AtomicU64::new(0),
    frames: AtomicU64::new(0),
    framed_messages: AtomicU64::new(0),
    rndv_sends: AtomicU64::new(0),
    rndv_reads: AtomicU64::new(0),
    rndv_acks: AtomicU64::new(0),
    registered_rx_bytes: AtomicU64::new(0),
    registered_tx_bytes: AtomicU64::new(0),
    registered_large_bytes: AtomicU64::new(0),
};

/// What a registered region is for, in [`RdmaStats`]' registered-memory figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Registered {
    /// Eager receive buffers: a connection's own receive pool, or a poller's SRQ pool.
    Rx,
    /// Eager send buffers: a connection's send pool.
    Tx,
    /// Large slots (rendezvous), both directions.
    Large,
}

/// `bytes` of registered memory of one kind, counted in [`RdmaStats`] while this lives
/// (control plane: one atomic add at registration, one subtract at release).
#[derive(Debug)]
pub(super) struct RegisteredBytes {
    kind: Registered,
    bytes: u64,
}

impl RegisteredBytes {
    fn counter(kind: Registered) -> &'static AtomicU64 {
        match kind {
            Registered::Rx => &COUNTERS.registered_rx_bytes,
            Registered::Tx => &COUNTERS.registered_tx_bytes,
            Registered::Large => &COUNTERS.registered_large_bytes,
        }
    }

    /// Counts `bytes` of `kind` until dropped.
    pub(super) fn new(kind: Registered, bytes: usize) -> Self {
        let bytes = bytes as u64;
        Self::counter(kind).fetch_add(bytes, Ordering::Relaxed);
        Self { kind, bytes }
    }
}

impl Drop for RegisteredBytes {
    fn drop(&mut self) {
        Self::counter(self.kind).fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Adds `n` to `c` (a relaxed read-modify-write: for rare events only).
#[inline]
pub(super) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Per-poller data-path counters: written only by the thread driving that poller (plain
/// relaxed load + store, no read-modify-write), read by [`stats`].
#[derive(Debug, Default)]
pub(crate) struct PollerRdmaCounters {
    pub(super) credit_messages: Counter,
    pub(super) credit_stalls: Counter,
    pub(super) heartbeats: Counter,
    pub(super) inline_sends: Counter,
    pub(super) pooled_sends: Counter,
    pub(super) frames: Counter,
    pub(super) framed_messages: Counter,
    pub(super) rndv_sends: Counter,
    pub(super) rndv_reads: Counter,
    pub(super) rndv_acks: Counter,
}

impl Drop for PollerRdmaCounters {
    fn drop(&mut self) {
        bump(&COUNTERS.credit_messages, self.credit_messages.get());
        bump(&COUNTERS.credit_stalls, self.credit_stalls.get());
        bump(&COUNTERS.heartbeats, self.heartbeats.get());
        bump(&COUNTERS.inline_sends, self.inline_sends.get());
        bump(&COUNTERS.pooled_sends, self.pooled_sends.get());
        bump(&COUNTERS.frames, self.frames.get());
        bump(&COUNTERS.framed_messages, self.framed_messages.get());
        bump(&COUNTERS.rndv_sends, self.rndv_sends.get());
        bump(&COUNTERS.rndv_reads, self.rndv_reads.get());
        bump(&COUNTERS.rndv_acks, self.rndv_acks.get());
    }
}

/// Live per-poller counters, for [`stats`].
static LIVE: Mutex<Vec<Weak<PollerRdmaCounters>>> = Mutex::new(Vec::new());

/// New counters for one poller (control path), registered for [`stats`].
pub(crate) fn poller_counters() -> Arc<PollerRdmaCounters> {
    let c = Arc::new(PollerRdmaCounters::default());
    if let Ok(mut live) = LIVE.lock() {
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&c));
    }
    c
}

/// Snapshot of the process's RDMA data-path counters (all engines, live and gone).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RdmaStats {
    /// Completions with `IBV_WC_RNR_RETRY_EXC_ERR`. Must stay 0: the credits guarantee a posted
    /// receive for every message, and `rnr_retry = 0` makes any RNR an error, never a stall.
    pub rnr_errors: u64,
    /// Error completions of any status (flushes after a disconnect included).
    pub completion_errors: u64,
    /// Of `completion_errors`, those with `IBV_WC_WR_FLUSH_ERR`: work requests flushed because
    /// their QP entered the error state, as a disconnect puts it (a connection's posted
    /// receives, at its teardown, on devices that report them) or after another error
    /// completion, which is counted apart. `completion_errors - flushed_completions`: the
    /// errors that are not flushes.
    pub flushed_completions: u64,
    /// Explicit credit messages sent (one-way traffic returning credits).
    pub credit_messages: u64,
    /// Times a batch could not be posted in full for lack of peer credits or send-queue room
    /// (back-pressure).
    pub credit_stalls: u64,
    /// Heartbeats sent (credit messages on a connection that sent nothing else for a quarter of
    /// the liveness timeout; not counted in `credit_messages`).
    pub heartbeats: u64,
    /// Completions of connections no longer attached to their poller (ignored; shared receive
    /// buffers among them are re-posted).
    pub stale_completions: u64,
    /// Successful receive completions of a QP not attached to its poller yet (the peer sent
    /// right after its connect returned, before this side's poller attached the connection),
    /// parked to be replayed once it is. Those never attached within the parking age are
    /// dropped and counted in `stale_completions` too.
    pub parked_completions: u64,
    /// Parked receive completions delivered to their connection once it was attached.
    pub replayed_completions: u64,
    /// Receive completions that found the poller's parking buffer full (dropped and counted in
    /// `stale_completions` too: their message is lost). Must stay 0.
    pub park_overflows: u64,
    /// SENDs (messages or frames) posted with `IBV_SEND_INLINE`.
    pub inline_sends: u64,
    /// SENDs (messages or frames) posted from the registered pool (not inline).
    pub pooled_sends: u64,
    /// SENDs that were frames of coalesced small messages (counted in `inline_sends` or
    /// `pooled_sends` too).
    pub frames: u64,
    /// Messages that travelled inside those frames.
    pub framed_messages: u64,
    /// Large messages sent by rendezvous (RNDV frames posted; counted in `frames` too).
    pub rndv_sends: u64,
    /// Large messages pulled with RDMA READ (READs posted).
    pub rndv_reads: u64,
    /// Rendezvous acknowledgement frames sent (each acknowledges one or more large messages).
    pub rndv_acks: u64,
    /// Registered memory of eager receive buffers now (not cumulative): every connection's
    /// own receive pool (`buffers x buffer_size`) or, with
    /// [`EngineBuilder::rdma_srq`](crate::EngineBuilder::rdma_srq), each poller's SRQ pool
    /// (`rdma_srq x buffer_size` per device), whatever the connections on it.
    pub registered_rx_bytes: u64,
    /// Registered memory of eager send buffers now: every connection's send pool
    /// (`buffers x buffer_size`).
    pub registered_tx_bytes: u64,
    /// Registered memory of large slots now (rendezvous: `large_buffers x max_message_size`
    /// per connection per direction).
    pub registered_large_bytes: u64,
}

/// Snapshot of the process-wide RDMA counters. Control path (takes a lock); call it from
/// monitoring code, not from a poller.
pub fn stats() -> RdmaStats {
    let c = &COUNTERS;
    // The two kinds of error completion counted apart before all of them (Acquire, against
    // their Release increments, which follow `completion_errors`'): a snapshot never shows
    // more of either than `completion_errors`, so `completion_errors - flushed_completions`
    // cannot underflow.
    let rnr_errors = c.rnr_errors.load(Ordering::Acquire);
    let flushed_completions = c.flushed_completions.load(Ordering::Acquire);
    let mut s = RdmaStats {
        rnr_errors,
        completion_errors: c.completion_errors.load(Ordering::Relaxed),
        flushed_completions,
        credit_messages: c.credit_messages.load(Ordering::Relaxed),
        credit_stalls: c.credit_stalls.load(Ordering::Relaxed),
        heartbeats: c.heartbeats.load(Ordering::Relaxed),
        stale_completions: c.stale_completions.load(Ordering::Relaxed),
        parked_completions: c.parked_completions.load(Ordering::Relaxed),
        replayed_completions: c.replayed_completions.load(Ordering::Relaxed),
        park_overflows: c.park_overflows.load(Ordering::Relaxed),
        inline_sends: c.inline_sends.load(Ordering::Relaxed),
        pooled_sends: c.pooled_sends.load(Ordering::Relaxed),
        frames: c.frames.load(Ordering::Relaxed),
        framed_messages: c.framed_messages.load(Ordering::Relaxed),
        rndv_sends: c.rndv_sends.load(Ordering::Relaxed),
        rndv_reads: c.rndv_reads.load(Ordering::Relaxed),
        rndv_acks: c.rndv_acks.load(Ordering::Relaxed),
        registered_rx_bytes: c.registered_rx_bytes.load(Ordering::Relaxed),
        registered_tx_bytes: c.registered_tx_bytes.load(Ordering::Relaxed),
        registered_large_bytes: c.registered_large_bytes.load(Ordering::Relaxed),
    };
    if let Ok(live) = LIVE.lock() {
        for p in live.iter().filter_map(Weak::upgrade) {
            s.credit_messages += p.credit_messages.get();
            s.credit_stalls += p.credit_stalls.get();
            s.heartbeats += p.heartbeats.get();
            s.inline_sends += p.inline_sends.get();
            s.pooled_sends += p.pooled_sends.get();
            s.frames += p.frames.get();
            s.framed_messages += p.framed_messages.get();
            s.rndv_sends += p.rndv_sends.get();
            s.rndv_reads += p.rndv_reads.get();
            s.rndv_acks += p.rndv_acks.get();
        }
    }
    s
}
