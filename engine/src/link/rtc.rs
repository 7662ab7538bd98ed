//! The run-to-completion hand-off without the rings: when the application thread is the
//! poller, its connection handle reaches the poller's half of the connection ([`RtcConn`])
//! through [`RtcSlot`] and posts a send / takes a message there itself, as the shm direct path
//! does, instead of going through the application↔poller rings and a whole poller cycle.
//!
//! Only for a fabric that opts in (`FabricConn::RTC_DIRECT`); the poller registers the
//! connection's half when it starts serving it and clears it before it lets go of it. Every
//! access happens under the engine's run-to-completion guard (`RtcGuard`), the same exclusion
//! that keeps the poller's cycle single-threaded.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::desc::{RxDesc, TxDesc};

/// The poller's half of one connection, as the application thread drives it directly while it
/// holds the run-to-completion guard. Each method does what the poller's service pass does for
/// one message, in the same order with respect to the rings: it declines (`false` / 0) while
/// the rings hold anything in that direction, so FIFO order holds across both ways, and while
/// the connection closes, drains or has a failure for the pass to handle.
pub(crate) trait RtcConn {
    /// Posts one send to the fabric.
    fn send_one(&mut self, d: TxDesc) -> Posted;

    /// Posts what waits in the send ring, at most `max`, as the pass does (one batch, one
    /// publication); `true` when the ring is empty after it.
    fn post_queued(&mut self, max: usize) -> bool;

    /// Takes one received message from the fabric into `out`; `true` when it did (then `out`'s
    /// `len` and `buf` and the payload or offset are written, as by `RxSink`). When more is
    /// pending, it also receives a burst of it into the receive ring (after `out` in order), so
    /// that the next receives take it there without the poller.
    fn recv_one(&mut self, out: &mut MaybeUninit<RxDesc>) -> bool;

    /// Receives up to `max` messages from the fabric into the receive ring (one publication),
    /// as the pass does; returns how many.
    fn recv_burst(&mut self, max: usize) -> usize;
}

/// What [`RtcConn::send_one`] did with the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Posted {
    /// Not posted: the caller queues it in the send ring, and the next pass posts it.
    No,
    /// Posted; the fabric holds the buffer until it frees it (through the free ring).
    Held,
    /// Posted as a copy, and the buffer is the caller's again at once (not through the free
    /// ring).
    Free,
}

/// Where a connection's [`RtcConn`] is registered (in `ConnShared`).
pub(crate) struct RtcSlot {
    conn: UnsafeCell<Option<NonNull<dyn RtcConn>>>,
    /// Whether a half is registered, readable without the guard: a hint that keeps the
    /// connections of fabrics without the direct way (tcp, rdma) from taking the poller for
    /// nothing (one load of a word written twice per connection).
    registered: AtomicBool,
}

// SAFETY: the cell is written by the poller serving the connection (in its cycle) and read only
// by a thread holding that engine's run-to-completion guard, which is also what a
// run-to-completion poller's cycle runs under; with dedicated pollers it is written by the
// poller thread and never read. So no two threads access it at once (the guard's Acquire/Release
// orders the accesses), and the `RtcConn` it points to is only used under that guard.
unsafe impl Sync for RtcSlot {}
// SAFETY: as above; the pointer is only dereferenced under the guard.
unsafe impl Send for RtcSlot {}

impl std::fmt::Debug for RtcSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RtcSlot").finish_non_exhaustive()
    }
}

impl RtcSlot {
    pub(crate) fn new() -> RtcSlot {
        RtcSlot {
            conn: UnsafeCell::new(None),
            registered: AtomicBool::new(false),
        }
    }

    /// Registers `conn` (or clears it with `None`).
    ///
    /// # Safety
    ///
    /// Called only by the poller serving the connection, from its cycle. `conn` points to the
    /// poller's half of this connection, which stays where it is and alive until the poller
    /// clears the slot (before it hands the half to anyone else or drops it).
    pub(crate) unsafe fn set(&self, conn: Option<NonNull<dyn RtcConn>>) {
        // SAFETY: the caller is the serving poller, in its cycle: no other thread accesses the
        // cell now (see the `Sync` impl).
        unsafe { *self.conn.get() = conn };
        self.registered.store(conn.is_some(), Ordering::Relaxed);
    }

    /// Whether a half is registered (a hint: [`with`](Self::with) decides under the guard).
    #[inline]
    pub(crate) fn is_registered(&self) -> bool {
        self.registered.load(Ordering::Relaxed)
    }

    /// Runs `f` on the registered half; `None` when none is registered.
    ///
    /// # Safety
    ///
    /// The caller holds the run-to-completion guard of the engine whose poller serves the
    /// connection, and no other reference to that half is live (the guard's holder is not
    /// inside a poller cycle).
    #[inline]
    pub(crate) unsafe fn with<R>(&self, f: impl FnOnce(&mut dyn RtcConn) -> R) -> Option<R> {
        // SAFETY: the guard excludes the poller's cycle and every other holder, so the cell is
        // not written now; a registered pointer is valid until the poller clears it, which it
        // only does in its cycle, and no other reference to the half is live.
        unsafe {
            let p = (*self.conn.get())?;
            Some(f(&mut *p.as_ptr()))
        }
    }
}
