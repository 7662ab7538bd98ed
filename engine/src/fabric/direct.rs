//! The direct-path dispatch: [`DirectPath`], one variant per fabric whose connections the
//! application drives itself (see [the module docs](crate::fabric#direct-paths)), and [`Sent`].

use std::ptr::NonNull;

use crate::desc::PoolView;
use crate::error::FabricError;

use super::shm;

/// The fabrics whose connections have a *direct path*: the application's
/// [`Connection`](crate::Connection) drives the fabric's data path itself, with no poller and
/// no application↔poller rings (shm: both ends of each record ring are the two applications'
/// threads). One variant per such fabric (one line each); the connection
/// branches once per call between this and the poller path, and the dispatch below is static.
///
/// A direct path's handle takes `&self` and is `Send + !Sync`; its calls never block, lock,
/// allocate or log. Errors are [`FabricError`]s that fail the connection.
pub(crate) enum DirectPath {
    /// `shm://`: [`shm::direct::ShmDirect`].
    Shm(shm::direct::ShmDirect),
}

/// What a direct path's send did with the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Copied into the fabric's record: the buffer is free again at once.
    Copied,
    /// Sent by reference: in flight until the peer gives it back.
    Referenced,
    /// No room (the window or the ring is full); nothing was sent.
    Full,
}

impl DirectPath {
    /// Largest message sent inline (copied into the fabric's records).
    #[inline]
    pub(crate) fn inline_max(&self) -> usize {
        match self {
            DirectPath::Shm(d) => d.inline_max(),
        }
    }

    /// Sends `len` bytes of send-pool buffer `idx`, its common case alone (a message copied
    /// inline with room known): `true`, sent (`Sent::Copied`); `false`, nothing done:
    /// [`send`](Self::send) does the rest and reports why.
    ///
    /// # Safety
    ///
    /// The caller owns send-pool buffer `idx < pool.count()`, and `len <= pool.buf_size()`.
    #[inline(always)]
    pub(crate) unsafe fn try_send_copied(
        &self,
        pool: &PoolView,
        idx: u32,
        len: u32,
        batched: bool,
    ) -> bool {
        match self {
            // SAFETY: the caller's contract, passed on.
            DirectPath::Shm(d) => unsafe { d.try_send_copied(pool, idx, len, batched) },
        }
    }

    /// Sends `len` bytes of send-pool buffer `idx` (owned by the caller, validated), the
    /// general path, after [`try_send_copied`](Self::try_send_copied) returned `false` for it
    /// (it does not try that again): copied inline
    /// or by reference, `Sent::Full` when the window or the ring is full (the batch published
    /// then). `batched`: an inline record is not published until [`flush`](Self::flush) (or
    /// the next unbatched send, or a full window or ring).
    #[inline]
    pub(crate) fn send(
        &self,
        pool: &PoolView,
        idx: u32,
        len: u32,
        batched: bool,
    ) -> Result<Sent, FabricError> {
        match self {
            DirectPath::Shm(d) => d.send(pool, idx, len, batched),
        }
    }

    /// Sends `data` (at most [`inline_max`](Self::inline_max) bytes) copied into a published
    /// record (`batched`: written, published with its run) when that needs nothing but the
    /// copy (room known, no claim open); `false`: nothing sent.
    #[inline(always)]
    pub(crate) fn try_send_bytes(&self, data: &[u8], batched: bool) -> bool {
        match self {
            DirectPath::Shm(d) => d.try_send_bytes(data, batched),
        }
    }

    /// Sleeps until the peer publishes to this side or closes (it rings this side's
    /// doorbell), or for at most `max`; returns at once when records are pending already or
    /// `down()` (re-checked after announcing the sleep) says the connection is down.
    /// ([`IdleStrategy::Block`](crate::IdleStrategy::Block)'s wait.)
    #[inline]
    /// Whether a ring ended the sleep (`None`: it did not sleep).
    pub(crate) fn sleep(
        &self,
        max: std::time::Duration,
        down: impl FnOnce() -> bool,
    ) -> Option<bool> {
        match self {
            DirectPath::Shm(d) => d.sleep(max, down),
        }
    }

    /// Publishes what batched sends wrote.
    #[inline]
    pub(crate) fn flush(&self) {
        match self {
            DirectPath::Shm(d) => d.flush(),
        }
    }

    /// Sends large slot `idx` (`LARGE_BIT | slot`, owned by the caller) by reference.
    #[inline]
    pub(crate) fn send_ref(&self, idx: u32, len: u32) -> Result<Sent, FabricError> {
        match self {
            DirectPath::Shm(d) => d.send_ref(idx, len),
        }
    }

    /// Commits the memory of the large send slots before the first is written (shm leaves
    /// them unreserved until then); cheap once done.
    #[inline]
    pub(crate) fn reserve_large(&self) -> Result<(), crate::error::Error> {
        match self {
            DirectPath::Shm(d) => d.reserve_large(),
        }
    }

    /// Moves what the peer released into `free` (ordinary buffers) and `free_large` (large
    /// slots), each at most its spare capacity.
    #[inline]
    pub(crate) fn reclaim_all(
        &self,
        free: &mut Vec<u32>,
        free_large: &mut Vec<u32>,
    ) -> Result<usize, FabricError> {
        match self {
            DirectPath::Shm(d) => d.reclaim_all(free, free_large),
        }
    }

    /// Whether a claim of record space is open.
    #[inline]
    pub(crate) fn claim_open(&self) -> bool {
        match self {
            DirectPath::Shm(d) => d.claim_open(),
        }
    }

    /// Claims `len <= inline_max` bytes of record space to write in place (`None`: full).
    /// Always inlined, as the fabric's claim is: with `Connection::claim` inlined into its
    /// caller, this was left a call (callgrind of `bench cost`).
    #[inline(always)]
    pub(crate) fn claim(&self, len: usize) -> Result<Option<core::ptr::NonNull<u8>>, FabricError> {
        match self {
            DirectPath::Shm(d) => d.claim(len),
        }
    }

    /// [`claim`](Self::claim)'s common case alone (room known, no claim open): `None`,
    /// nothing claimed, `claim` does the rest. The caller checked `len <= inline_max`.
    #[inline(always)]
    pub(crate) fn try_claim(&self, len: usize) -> Option<core::ptr::NonNull<u8>> {
        match self {
            DirectPath::Shm(d) => d.try_claim(len),
        }
    }

    /// Publishes the open claim as a `len`-byte message.
    #[inline(always)]
    pub(crate) fn commit_claim(&self, len: usize) {
        match self {
            DirectPath::Shm(d) => d.commit_claim(len),
        }
    }

    /// Drops the open claim (nothing is published).
    #[inline]
    pub(crate) fn abort_claim(&self) {
        match self {
            DirectPath::Shm(d) => d.abort_claim(),
        }
    }

    /// Batch receive in place; returns messages and bytes delivered.
    #[inline]
    pub(crate) fn poll<H: FnMut(&[u8])>(
        &self,
        rx_pool: &PoolView,
        handler: &mut H,
        limit: usize,
    ) -> Result<(usize, u64), FabricError> {
        match self {
            DirectPath::Shm(d) => d.poll(rx_pool, handler, limit),
        }
    }

    /// One message in place, the common case of `poll(handler, 1)`: `Some(Some(len))`
    /// delivered, `Some(None)` nothing there, `None` anything else (for `poll`).
    #[inline(always)]
    pub(crate) fn poll_one<H: FnMut(&[u8])>(&self, handler: &mut H) -> Option<Option<usize>> {
        match self {
            DirectPath::Shm(d) => d.poll_one(handler),
        }
    }

    /// The next received message: an inline payload copied into `slot`, `got` its length and
    /// buffer (`BUF_INLINE`, or a pooled one, held until released); `Ok(false)`: none.
    ///
    /// # Safety
    ///
    /// `slot` is valid for writes of `INLINE_MAX` bytes and overlaps no fabric memory.
    #[inline(always)]
    pub(crate) unsafe fn recv_into(
        &self,
        slot: NonNull<u8>,
        got: &mut (u32, u32),
    ) -> Result<bool, FabricError> {
        match self {
            // SAFETY: the caller's contract, passed on.
            DirectPath::Shm(d) => unsafe { d.recv_into(slot, got) },
        }
    }

    /// Gives received buffer `buf` back to the peer.
    #[inline]
    pub(crate) fn release(&self, buf: u32) -> Result<(), FabricError> {
        match self {
            DirectPath::Shm(d) => d.release(buf),
        }
    }

    /// Whether the peer published something not yet received (a hint).
    #[inline]
    pub(crate) fn rx_pending(&self) -> bool {
        match self {
            DirectPath::Shm(d) => d.rx_pending(),
        }
    }

    /// Messages in flight: sent, not yet consumed by the peer (reads the peer's position).
    #[inline]
    pub(crate) fn unconsumed(&self) -> Result<usize, FabricError> {
        match self {
            DirectPath::Shm(d) => d.unconsumed(),
        }
    }

    /// How the peer closed the connection, if it marked it closed in the data path's shared
    /// state: [`FabricError::PeerClosed`] or [`FabricError::PeerAborted`].
    #[inline]
    pub(crate) fn peer_close(&self) -> Option<FabricError> {
        match self {
            DirectPath::Shm(d) => d.peer_close(),
        }
    }
}
