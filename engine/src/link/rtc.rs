//! The run-to-completion hand-off without the rings: when the application thread is the
//! poller, its connection handle reaches the poller's half of the connection ([`RtcConn`])
//! and posts a send / takes a message there itself, as the shm direct path does, instead of
//! going through the application↔poller rings and a whole poller cycle.
//!
//! Only for a fabric that opts in (`FabricConn::RTC_DIRECT`: mem, tcp, rdma). The poller serving the
//! connection writes where it keeps the half ([`RtcSlot`]: its agent's tag and table slot)
//! when it starts serving it and clears it before it lets go of it; the application thread
//! looks the half up through the run-to-completion guard (`RtcGuard::direct`), the same
//! exclusion that keeps the poller's cycle single-threaded, and through the same owners the
//! cycle goes through (no pointer into the table is kept).

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::desc::{RxDesc, TxDesc};

/// The poller's half of one connection, as the application thread drives it directly while it
/// holds the run-to-completion guard. Each method does what the poller's service pass does for
/// one message, in the same order with respect to the rings: it declines (`Posted::No`,
/// `false`, 0) while the rings hold anything in that direction, so FIFO order holds across both
/// ways, and while the connection closes, drains or has a failure for the pass to handle.
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

/// Where the poller serving a connection keeps its half, for the direct way (in
/// `ConnShared`). Written by that poller in its cycle, read by the thread holding the
/// run-to-completion guard; the guard's Acquire/Release orders the two, so the words are
/// `Relaxed`. A value read any other way only fails to find the half (the lookup checks it).
#[derive(Debug, Default)]
pub(crate) struct RtcSlot {
    /// The serving agent's tag (its fabric's, nonzero), or 0: none registered.
    tag: AtomicU64,
    /// The half's slot in that agent's connection table.
    slot: AtomicU32,
    /// The half declined a direct send as a stream's and nothing was delivered since
    /// (`FabricConn::DIRECT_SEND_AFTER_RECV`): the next sends skip the direct way.
    stream: AtomicBool,
}

impl RtcSlot {
    /// Registers the half at `slot` of the agent tagged `tag` (nonzero).
    pub(crate) fn set(&self, tag: u64, slot: u32) {
        self.slot.store(slot, Ordering::Relaxed);
        self.tag.store(tag, Ordering::Relaxed);
    }

    /// Clears the registration (before the poller lets go of the half).
    pub(crate) fn clear(&self) {
        self.tag.store(0, Ordering::Relaxed);
    }

    /// The registration: the agent's tag and the slot; `None` when none.
    #[inline]
    pub(crate) fn get(&self) -> Option<(u64, u32)> {
        match self.tag.load(Ordering::Relaxed) {
            0 => None,
            tag => Some((tag, self.slot.load(Ordering::Relaxed))),
        }
    }

    /// Whether a half is registered: a hint (one load of a word written twice per connection)
    /// that keeps the connections of fabrics without the direct way (and those not served yet)
    /// from taking the poller for nothing; the lookup under the guard decides.
    #[inline]
    pub(crate) fn is_registered(&self) -> bool {
        self.tag.load(Ordering::Relaxed) != 0
    }

    /// Whether the half declined its last direct send as a stream's and nothing was delivered
    /// since: the send goes through the send ring without asking it. A hint for the sending
    /// thread: written under the run-to-completion guard (the same thread, in that mode).
    #[inline]
    pub(crate) fn is_stream(&self) -> bool {
        self.stream.load(Ordering::Relaxed)
    }

    /// The half declined a direct send as a stream's.
    #[inline]
    pub(crate) fn set_stream(&self) {
        self.stream.store(true, Ordering::Relaxed);
    }

    /// A message was delivered: the next send may be a ping-pong's again. Stores only when set
    /// (a dedicated poller's passes, which never set it, only read the line).
    #[inline]
    pub(crate) fn clear_stream(&self) {
        if self.is_stream() {
            self.stream.store(false, Ordering::Relaxed);
        }
    }
}
