//! The link between a connection's three parties: the application's handle, its poller and the
//! control thread.
//!
//! [`ConnShared`] is the state all three see (credits, up/down state, counters); [`conn_pair`]
//! builds the rings between the application and the poller and splits a fabric connection into
//! the application's [`ConnParts`] and the poller's [`PollerConn`]; [`direct_parts`] builds the
//! application's parts of a connection with a direct path (shm), which has no poller half.
//! This module is the floor the handles (`conn`), the pollers (`poller`), the fabric seam and
//! the control thread (`control`, `fabric::*::control`) stand on; it imports none of them. The
//! one thing it names from `fabric` is the direct-path handle ([`DirectPath`], which stands
//! below it: it imports nothing of the seam, the control halves or this module), so that the
//! hand-off is typed.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use crossbeam_utils::CachePadded;
use rings::{Consumer, Producer, RingBuffer, StampedConsumer, StampedProducer, StampedRing};

use crate::config::Config;
use crate::desc::{PoolView, RxDesc, TxDesc};
use crate::doorbell::{Doorbell, Scope};
use crate::error::{Error, FabricError};
use crate::fabric::DirectPath;
use crate::stats::{AppCounters, ConnCounters, LiveCounters, PollerCounters};
use crate::wake::PollerWake;

/// Freed buffers collected before one batched push into the application's free ring.
pub(crate) const FREE_BATCH: usize = 32;

const OPEN: u8 = 0;
const DISCONNECTED: u8 = 1;
const FAILED: u8 = 2;
const CLOSED: u8 = 3;

/// Why a connection stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Down {
    Disconnected,
    Failed(FabricError),
    Closed,
}

/// State shared by the application side, the poller side and the control thread of a connection.
#[derive(Debug)]
pub(crate) struct ConnShared {
    pub(crate) id: u64,
    /// Credits returned so far (monotonic). Written by the poller only.
    pub(crate) credits: CachePadded<AtomicU64>,
    /// Bytes of records credited back so far (monotonic), for a connection whose fabric bounds
    /// the application's window in bytes too ([`FabricConn::app_bytes`]: tcp). Written by the
    /// poller only; read by the application only when its byte window looks full.
    ///
    /// [`FabricConn::app_bytes`]: crate::fabric::FabricConn::app_bytes
    pub(crate) credited_bytes: CachePadded<AtomicU64>,
    /// `OPEN`, or why not; the first reason wins.
    state: CachePadded<AtomicU8>,
    error: OnceLock<FabricError>,
    /// Its poller let go of it (retired it): nothing of it is left to post or deliver. Set
    /// once, by the poller; never set for a direct path.
    retired: AtomicBool,
    pub(crate) counters: CachePadded<ConnCounters>,
    /// The application thread's counters (its own cache line: the poller never writes it).
    pub(crate) app: CachePadded<AppCounters>,
    /// Heartbeats and when the peer was last heard from (control thread).
    pub(crate) live: LiveCounters,
    /// [`IdleStrategy::Block`](crate::IdleStrategy::Block): the wake-up of the poller serving
    /// it, set by that poller before it serves it (never for other strategies).
    poller_wake: OnceLock<Arc<PollerWake>>,
    /// [`IdleStrategy::Block`](crate::IdleStrategy::Block): the word of the doorbell
    /// ([`ConnShared::bell`]) the application thread waiting in `recv_timeout` sleeps on;
    /// armed by the poller before it serves the connection, rung by it after delivering, and
    /// by every change of state.
    bell_word: CachePadded<AtomicU32>,
    /// Run-to-completion: where the poller keeps its half of the connection, which the
    /// application thread drives directly while it holds the poller (see [`RtcSlot`]).
    pub(crate) rtc: RtcSlot,
}

impl ConnShared {
    pub(crate) fn new(id: u64) -> ConnShared {
        ConnShared {
            id,
            credits: CachePadded::new(AtomicU64::new(0)),
            credited_bytes: CachePadded::new(AtomicU64::new(0)),
            state: CachePadded::new(AtomicU8::new(OPEN)),
            error: OnceLock::new(),
            retired: AtomicBool::new(false),
            counters: CachePadded::default(),
            app: CachePadded::default(),
            live: LiveCounters::default(),
            poller_wake: OnceLock::new(),
            bell_word: CachePadded::new(AtomicU32::new(0)),
            rtc: RtcSlot::default(),
        }
    }

    /// The doorbell of an application thread waiting for a message (see `bell_word`).
    #[inline]
    pub(crate) fn bell(&self) -> Doorbell<'_> {
        Doorbell::new(&self.bell_word, Scope::Process)
    }

    /// The poller serving it may sleep: this is its wake-up (set once, before it serves it).
    pub(crate) fn set_poller_wake(&self, wake: &Arc<PollerWake>) {
        let _ = self.poller_wake.set(wake.clone());
    }

    /// Wakes the connection's poller if it sleeps, after the application gave it work (a send,
    /// a released buffer). Only for an engine whose strategy is `Block` (the caller checks):
    /// a fence, a load of a line nobody writes, and the flag's load.
    #[inline]
    pub(crate) fn wake_poller(&self) {
        crate::wake::seq_cst_fence();
        if let Some(w) = self.poller_wake.get() {
            w.wake_fenced();
        }
    }

    /// The data path failed this connection.
    pub(crate) fn fail(&self, e: FabricError) {
        let _ = self.error.set(e);
        let _ = self
            .state
            .compare_exchange(OPEN, FAILED, Ordering::AcqRel, Ordering::Acquire);
        self.bell().ring();
    }

    /// The peer went away.
    pub(crate) fn disconnect(&self) {
        let _ =
            self.state
                .compare_exchange(OPEN, DISCONNECTED, Ordering::AcqRel, Ordering::Acquire);
        self.bell().ring();
    }

    /// The application closed it.
    pub(crate) fn close(&self) {
        let _ = self
            .state
            .compare_exchange(OPEN, CLOSED, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The poller retired it (after its last service pass).
    pub(crate) fn set_retired(&self) {
        self.retired.store(true, Ordering::Release);
        self.bell().ring();
    }

    /// Whether its poller has let go of it.
    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    #[inline]
    pub(crate) fn down(&self) -> Option<Down> {
        match self.state.load(Ordering::Acquire) {
            OPEN => None,
            DISCONNECTED => Some(Down::Disconnected),
            FAILED => Some(Down::Failed(
                self.error.get().copied().unwrap_or(FabricError::PeerClosed),
            )),
            _ => Some(Down::Closed),
        }
    }
}

impl Down {
    pub(crate) fn to_error(self) -> Error {
        match self {
            Down::Disconnected | Down::Closed => Error::Disconnected,
            Down::Failed(e) => Error::Fabric(e),
        }
    }
}

/// The application's ring ends of a connection.
pub(crate) struct AppRings {
    pub(crate) tx: StampedProducer<TxDesc>,
    pub(crate) free: Consumer<u32>,
    pub(crate) rx: StampedConsumer<RxDesc>,
    pub(crate) release: Producer<u32>,
    /// The send ring takes inline descriptors ([`TxDesc::is_inline`]): the fabric's
    /// [`FabricConn::INLINE_SENDS`](crate::fabric::FabricConn::INLINE_SENDS).
    pub(crate) inline_sends: bool,
}

/// How the application reaches a connection's data path.
// Unboxed: built once per connection and moved twice (to the application's thread, into its
// handle), where a box would be one more allocation for each.
#[allow(clippy::large_enum_variant)]
pub(crate) enum AppPath {
    /// Through a poller: the application's ends of the rings to it.
    Rings(AppRings),
    /// Directly: the fabric's direct-path handle, which the connection drives itself.
    Direct(DirectPath),
}

/// Everything the control thread hands to the application for a new connection.
pub(crate) struct ConnParts {
    pub(crate) id: u64,
    pub(crate) peer: String,
    pub(crate) path: AppPath,
    /// The connection's pools; a large slot `s` is index `LARGE_BIT | s`
    /// ([`crate::desc::LARGE_BIT`]).
    pub(crate) pools: Pools,
    pub(crate) keep: Arc<dyn Any + Send + Sync>,
    pub(crate) shared: Arc<ConnShared>,
    /// The application's send window in messages when the fabric sizes it
    /// ([`FabricConn::app_depth`](crate::fabric::FabricConn::app_depth)); `None`: the engine's
    /// `depth`.
    pub(crate) depth: Option<usize>,
    /// The application's byte window, when the fabric bounds it in bytes too
    /// ([`FabricConn::app_bytes`](crate::fabric::FabricConn::app_bytes)); `None`: messages only.
    pub(crate) bytes: Option<u64>,
}

/// The four pools of a connection, as its fabric's setup made them: `tx`/`rx` ordinary
/// buffers, `tx_large`/`rx_large` the large slots ([`PoolView::empty`] without large
/// messages).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pools {
    pub(crate) tx: PoolView,
    pub(crate) rx: PoolView,
    pub(crate) tx_large: PoolView,
    pub(crate) rx_large: PoolView,
}

impl Pools {
    /// Ordinary pools only (no large slots).
    #[allow(dead_code)] // not every fabric is built in every configuration
    pub(crate) fn small(tx: PoolView, rx: PoolView) -> Pools {
        Pools {
            tx,
            rx,
            tx_large: PoolView::empty(),
            rx_large: PoolView::empty(),
        }
    }
}

/// Bit of send buffer (or large slot) `idx` in an ownership bitmap of `count` ordinary buffers
/// followed by the large slots: `(word, mask)`, `None` when `idx` is out of range.
#[inline(always)]
pub(crate) fn owned_bit(idx: u32, count: u32, large: u32) -> Option<(usize, u64)> {
    let dense = if crate::desc::is_large(idx) {
        let slot = crate::desc::large_slot(idx);
        if slot >= large {
            return None;
        }
        count as usize + slot as usize
    } else {
        if idx >= count {
            return None;
        }
        idx as usize
    };
    Some((dense / 64, 1u64 << (dense % 64)))
}

/// Builds both halves of a connection around a fabric connection.
///
/// `pools.tx` (and `tx_large`) is where this side writes messages; `rx` (and `rx_large`) is
/// where received pooled messages are read; `keep` keeps the memory of all of them alive.
pub(crate) fn conn_pair<C: crate::fabric::FabricConn>(
    id: u64,
    peer: String,
    fabric: C,
    pools: Pools,
    keep: Arc<dyn Any + Send + Sync>,
    cfg: &Config,
) -> (ConnParts, Box<PollerConn<C>>) {
    let Pools {
        tx: tx_pool,
        rx: rx_pool,
        tx_large,
        rx_large,
    } = pools;
    // Ordinary buffers and large slots share the send, free and release rings (a large slot is
    // `LARGE_BIT | slot`) and the ownership bitmap (the slots after the buffers).
    let count = tx_pool.count() as usize + tx_large.count() as usize;
    // The send ring is stamped: a poller waiting for sends checks the next slot, which brings
    // the descriptor with the news that it is there (one line, not the tail's and the slot's).
    let (mut tx_p, tx_c) = StampedRing::<TxDesc>::new(count.max(1));
    // With dedicated pollers the application asks for each send-ring line ahead of its first
    // write (the poller's core read it last); run to completion reads it on the same core.
    tx_p.set_prefetch(!cfg.run_to_completion());
    let (mut free_p, free_c) = RingBuffer::<u32>::new(count.max(1));
    for i in (0..tx_pool.count()).chain((0..tx_large.count()).map(|s| crate::desc::LARGE_BIT | s)) {
        // Capacity >= count, so this cannot fail.
        let _ = free_p.push(i);
    }
    // Stamped too: the application waiting for a delivery checks the next slot's stamp, in the
    // line that holds a small message's descriptor and payload.
    let (rx_p, rx_c) = StampedRing::<RxDesc>::new(cfg.depth.max(1));
    let (rel_p, rel_c) =
        RingBuffer::<u32>::new((rx_pool.count() as usize + rx_large.count() as usize).max(1));
    let shared = Arc::new(ConnShared::new(id));
    let depth = fabric.app_depth();
    let bytes = fabric.app_bytes();
    let poller = Box::new(PollerConn {
        id,
        fabric,
        tx: tx_c,
        free: free_p,
        rx: rx_p,
        release: rel_c,
        tx_owned: vec![0u64; count.div_ceil(64)].into_boxed_slice(),
        tx_pool,
        rx_pool,
        tx_large,
        rx_large,
        shared: shared.clone(),
        credits_returned: 0,
        bytes_returned: 0,
        closing: false,
        draining: false,
        drain_reason: None,
        drained: false,
        free_scratch: [0; FREE_BATCH],
        block: false,
        pack_rx: false,
        deferred: None,
        rtc_counters: None,
    });
    let parts = ConnParts {
        id,
        peer,
        path: AppPath::Rings(AppRings {
            tx: tx_p,
            free: free_c,
            rx: rx_c,
            release: rel_p,
            inline_sends: C::INLINE_SENDS,
        }),
        pools,
        keep,
        shared,
        depth,
        bytes,
    };
    (parts, poller)
}

/// The application's parts of a connection with a direct path (no poller half).
pub(crate) fn direct_parts(
    id: u64,
    peer: String,
    direct: DirectPath,
    pools: Pools,
    keep: Arc<dyn Any + Send + Sync>,
) -> ConnParts {
    ConnParts {
        id,
        peer,
        path: AppPath::Direct(direct),
        pools,
        keep,
        shared: Arc::new(ConnShared::new(id)),
        depth: None,
        bytes: None,
    }
}

/// The poller's half of one connection.
pub(crate) struct PollerConn<C> {
    pub(crate) id: u64,
    pub(crate) fabric: C,
    pub(crate) tx: StampedConsumer<TxDesc>,
    pub(crate) free: Producer<u32>,
    pub(crate) rx: StampedProducer<RxDesc>,
    pub(crate) release: Consumer<u32>,
    /// Send buffers held by the poller/fabric: bit `i` of word `i / 64`.
    pub(crate) tx_owned: Box<[u64]>,
    pub(crate) tx_pool: PoolView,
    pub(crate) rx_pool: PoolView,
    pub(crate) tx_large: PoolView,
    pub(crate) rx_large: PoolView,
    pub(crate) shared: Arc<ConnShared>,
    pub(crate) credits_returned: u64,
    /// Bytes credited back so far ([`ConnShared::credited_bytes`]'s value).
    pub(crate) bytes_returned: u64,
    /// The application closed it: it stays until what it queued is posted and the fabric has
    /// settled it (its fabric connection's `settled`).
    pub(crate) closing: bool,
    /// The peer is gone: keep delivering what it sent, then retire (with `drain_reason`).
    pub(crate) draining: bool,
    pub(crate) drain_reason: Option<FabricError>,
    /// The last receive pass found the fabric empty (it delivered less than the sink's room).
    pub(crate) drained: bool,
    /// Scratch for `fabric::TxDone`'s batched buffer returns.
    pub(crate) free_scratch: [u32; FREE_BATCH],
    /// Its poller may sleep, and so may the application thread: ring [`ConnShared::bell`]
    /// after delivering (set by the poller when it starts serving it).
    pub(crate) block: bool,
    /// Its poller is a dedicated thread: the receive step packs small messages into shared
    /// receive slots ([`RxSink::packing`](crate::fabric::RxSink::packing); set by the poller
    /// when it starts serving it).
    pub(crate) pack_rx: bool,
    /// A failure met outside the pass (a run-to-completion direct send or receive, see
    /// [`RtcConn`]): the next pass reports it as its own.
    pub(crate) deferred: Option<FabricError>,
    /// The serving poller's counters, while it has the half registered for direct use
    /// ([`ConnShared::rtc`]).
    pub(crate) rtc_counters: Option<Arc<PollerCounters>>,
}

#[path = "link/rtc.rs"]
mod rtc;
pub(crate) use rtc::{Posted, RtcConn, RtcSlot};

#[cfg(test)]
#[path = "link/tests.rs"]
mod tests;
