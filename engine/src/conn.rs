//! The application's handles: [`Connection`], [`SendBuf`], [`Message`], [`Listener`], and
//! [`SendError`], which hands a [`SendBuf`] back.
//!
//! # Files
//!
//! - this file: [`Connection`] (send, the batch send
//!   [`send_batched`](Connection::send_batched), receive, the batch receive
//!   [`poll`](Connection::poll), stats) and the application side's state it keeps in an `UnsafeCell`.
//! - `buffers`: [`SendBuf`] and [`Message`], the in-place views of a pool buffer.
//! - `listener`: [`Listener`].
//! - `send_error`: [`SendError`].

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::desc::{PoolView, RxDesc, TxDesc, BUF_INLINE, INLINE_MAX};
use crate::engine::Engine;
use crate::error::Error;
use crate::error::FabricError;
use crate::fabric::{DirectPath, Sent};
use crate::idle::{IdleStrategy, Idler};
use crate::link::{AppPath, AppRings, ConnParts, ConnShared};
use crate::stats::ConnStats;

/// `SendBuf::idx` of a claim of ring space ([`Connection::claim`] on a direct path), not a
/// pool buffer.
const RING_CLAIM: u32 = u32::MAX;

mod buffers;
mod large;
mod listener;
mod send_error;

pub use buffers::{Message, SendBuf};
pub use large::RecvIntoError;
pub use listener::Listener;
pub use send_error::SendError;

/// What [`Connection::send_direct_parts`] did.
enum DirectSend {
    /// Sent (the buffer is accounted for).
    Done,
    /// No room: hand the buffer back with `WouldBlock`.
    Full,
    /// Not sent: hand the buffer back with `Closed`.
    Failed(Error),
}

/// The open ring claim's payload pointer and length (`dangling, 0` while none is open).
struct RingClaim(Cell<(std::ptr::NonNull<u8>, usize)>);

// SAFETY: the pointer points into the connection's own segment mapping, which the connection
// keeps alive and which moves with it; it is only dereferenced through a `SendBuf` borrowing
// the connection, on the connection's thread. `Cell` keeps it `!Sync`.
unsafe impl Send for RingClaim {}

impl RingClaim {
    #[inline(always)]
    fn get(&self) -> (std::ptr::NonNull<u8>, usize) {
        self.0.get()
    }

    #[inline(always)]
    fn set(&self, v: (std::ptr::NonNull<u8>, usize)) {
        self.0.set(v)
    }
}

struct AppSide {
    /// The rings to the poller; `None` on a direct path.
    rings: Option<AppRings>,
    /// Buffers allocated and dropped unsent (reused first). Capacity = pool size: never grows.
    spare: Vec<u32>,
    /// Buffers the application holds as `SendBuf`s.
    held: u32,
    /// Free large send slots (`LARGE_BIT | slot`), capacity = slot count: never grows.
    spare_large: Vec<u32>,
    /// Large slots the application holds as `SendBuf`s.
    held_large: u32,
    sent: u64,
    credits_seen: u64,
    unflushed: u32,
    received: u64,
    would_block: u64,
    alloc_failures: u64,
    /// Direct path only (the poller counts these on the poller path).
    tx_bytes: u64,
    rx_bytes: u64,
}

/// One connection: send with [`alloc`](Connection::alloc) + [`send`](Connection::send) (or
/// [`send_batched`](Connection::send_batched) + [`flush`](Connection::flush)), receive with
/// [`try_recv`](Connection::try_recv) / [`recv_timeout`](Connection::recv_timeout), or in batches
/// with [`poll`](Connection::poll).
///
/// `Send` but not `Sync`: move it to the thread that uses it; it is never shared. Buffers and
/// messages borrow it, so they cannot outlive it or travel to another thread. Dropping it closes
/// the connection (the peer sees [`Error::Disconnected`]); messages already queued by `send` are
/// posted first on a best-effort basis.
pub struct Connection {
    app: UnsafeCell<AppSide>,
    /// The fabric's direct path (shm): sends and receives go straight to the fabric, no poller.
    /// Outside `app` because its handle is used while application code runs (a `poll`
    /// handler that sends).
    direct: Option<DirectPath>,
    /// The open ring claim's payload pointer and length ([`claim`](Connection::claim) on a
    /// direct path; a `SendBuf` with `idx == RING_CLAIM` refers to it).
    ring_claim: RingClaim,
    shared: Arc<ConnShared>,
    engine: Engine,
    tx_pool: PoolView,
    rx_pool: PoolView,
    /// The large slots (issue #12): `LARGE_BIT | slot` in a `SendBuf` / `Message`.
    tx_large: PoolView,
    rx_large: PoolView,
    /// The largest message ([`max_message_size`](Self::max_message_size)).
    message_limit: usize,
    /// `send_copy` uses a large slot above this.
    large_threshold: usize,
    depth: u64,
    batch: u32,
    /// Run-to-completion: this thread drives the poller inside `send`/`recv`.
    run_to_completion: bool,
    idle: IdleStrategy,
    peer: String,
    _keep: Arc<dyn Any + Send + Sync>,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("id", &self.shared.id)
            .field("peer", &self.peer)
            .field("max_message_size", &self.max_message_size())
            .finish_non_exhaustive()
    }
}

impl Connection {
    pub(crate) fn new(engine: Engine, parts: ConnParts) -> Connection {
        let cfg = engine.config();
        let count = parts.pools.tx.count() as usize;
        let mut spare = Vec::with_capacity(count);
        let mut spare_large = Vec::with_capacity(parts.pools.tx_large.count() as usize);
        let (rings, direct) = match parts.path {
            AppPath::Rings(r) => (Some(r), None),
            AppPath::Direct(d) => {
                // A direct path owns its whole pool from the start (the poller path's free ring
                // starts full instead). Popped from the end: buffer 0 first.
                spare.extend((0..parts.pools.tx.count()).rev());
                spare_large.extend(
                    (0..parts.pools.tx_large.count())
                        .rev()
                        .map(|s| crate::desc::LARGE_BIT | s),
                );
                // The fabric's control half built it as a `DirectPath`.
                let d = d.downcast::<DirectPath>().ok().map(|b| *b);
                (None, d)
            }
        };
        Connection {
            direct,
            ring_claim: RingClaim(Cell::new((std::ptr::NonNull::dangling(), 0))),
            app: UnsafeCell::new(AppSide {
                rings,
                spare,
                held: 0,
                spare_large,
                held_large: 0,
                sent: 0,
                credits_seen: 0,
                unflushed: 0,
                received: 0,
                would_block: 0,
                alloc_failures: 0,
                tx_bytes: 0,
                rx_bytes: 0,
            }),
            shared: parts.shared,
            tx_pool: parts.pools.tx,
            rx_pool: parts.pools.rx,
            // A fabric may settle a smaller limit with its peer (tcp's hello): its slots are
            // then that size.
            message_limit: if parts.pools.tx_large.count() > 0 {
                cfg.message_limit().min(parts.pools.tx_large.buf_size())
            } else {
                parts.pools.tx.buf_size()
            },
            large_threshold: cfg.large_threshold(),
            tx_large: parts.pools.tx_large,
            rx_large: parts.pools.rx_large,
            depth: cfg.depth as u64,
            batch: cfg.batch as u32,
            run_to_completion: cfg.run_to_completion(),
            idle: cfg.idle,
            peer: parts.peer,
            _keep: parts.keep,
            engine,
            _not_sync: PhantomData,
        }
    }

    /// The application side's state.
    ///
    /// An `unsafe fn` rather than `&mut self` methods: the public API takes `&self` so that
    /// several [`SendBuf`]s and [`Message`]s can borrow the connection at once, and an
    /// `UnsafeCell` read costs nothing on the data path (a `RefCell` would add a flag check and
    /// update per call).
    ///
    /// # Safety
    ///
    /// The returned reference must be the only live reference to the `AppSide`: the caller drops
    /// it before anything that may call `app` again (another method of this connection, a
    /// `SendBuf`/`Message` drop). Threads cannot overlap: `Connection` is `!Sync` and every handle
    /// borrowing it (`SendBuf`, `Message`) is `!Send`. [`Engine::poll`] never touches `AppSide`.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    unsafe fn app(&self) -> &mut AppSide {
        // SAFETY: the caller guarantees that no other reference to `AppSide` is live.
        unsafe { &mut *self.app.get() }
    }

    /// The engine-wide id of this connection (as in [`Event`](crate::Event)s).
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// The endpoint this connection was made to / accepted on.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// The largest message this connection carries: the engine's
    /// [`max_message_size`](crate::EngineBuilder::max_message_size) when it has large slots,
    /// else the buffer size. A message above the buffer size goes through a large slot
    /// ([`alloc_large`](Self::alloc_large), [`claim`](Self::claim), [`send_copy`](Self::send_copy)).
    pub fn max_message_size(&self) -> usize {
        self.message_limit
    }

    /// The pool's buffer size: the largest message sent eagerly through a pool buffer
    /// ([`alloc`](Self::alloc)'s capacity); larger ones take a large slot.
    pub fn buffer_size(&self) -> usize {
        self.tx_pool.buf_size()
    }

    /// Whether the connection is still open (no disconnect or failure seen).
    pub fn is_open(&self) -> bool {
        self.shared.down().is_none()
    }

    /// Why the connection is down ([`Error::Disconnected`] / [`Error::Fabric`]), or `None`
    /// while it is open. For the reconnecting helper ([`crate::Reconnecting`]).
    pub(crate) fn down_error(&self) -> Option<Error> {
        self.shared.down().map(|d| d.to_error())
    }

    /// True when no received message waits to be taken (`try_recv` would find none queued).
    pub(crate) fn rx_is_empty(&self) -> bool {
        if let Some(d) = &self.direct {
            return !d.rx_pending();
        }
        // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
        unsafe { self.app() }
            .rings
            .as_mut()
            .map_or(true, |r| r.rx.is_empty())
    }

    /// A direct path found the peer breaking the protocol: the connection fails (the control
    /// thread reports it on its next tick and closes it).
    #[cold]
    fn fail(&self, e: FabricError) -> Error {
        self.shared.fail(e);
        self.shared
            .down()
            .map_or(Error::Fabric(e), |d| d.to_error())
    }

    #[inline]
    fn drive_poller(&self) -> usize {
        // A direct path has no poller to drive (other fabrics' connections are served by the
        // application's own `Engine::poll`).
        if self.run_to_completion && self.direct.is_none() {
            self.engine.poll()
        } else {
            0
        }
    }

    /// Takes a free send buffer (empty, capacity [`max_message_size`](Self::max_message_size)).
    /// Fill it in place and [`send`](Self::send) it; dropping it unsent returns it to the pool.
    ///
    /// # Errors
    ///
    /// [`Error::WouldBlock`] when every free buffer is in flight (they come back as the peer
    /// consumes them: retry), [`Error::PoolExhausted`] when the application itself holds every
    /// buffer, [`Error::Disconnected`] / [`Error::Fabric`] when the connection is down.
    #[inline(always)]
    pub fn alloc(&self) -> Result<SendBuf<'_>, Error> {
        // A thin dispatch, inlined into the caller: the direct path's fast case stays small
        // (its slow paths are out of line), the poller path is one call.
        if let Some(d) = &self.direct {
            return self.alloc_direct(d);
        }
        self.alloc_rings()
    }

    /// [`alloc`](Self::alloc) on the poller path.
    #[inline]
    fn alloc_rings(&self) -> Result<SendBuf<'_>, Error> {
        let idx = match self.take_buf() {
            Some(i) => i,
            None => {
                self.drive_poller();
                match self.take_buf() {
                    Some(i) => i,
                    None => {
                        // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
                        let app = unsafe { self.app() };
                        app.alloc_failures += 1;
                        if let Some(d) = self.shared.down() {
                            return Err(d.to_error());
                        }
                        return Err(if app.held >= self.tx_pool.count() {
                            Error::PoolExhausted {
                                count: self.tx_pool.count() as usize,
                            }
                        } else {
                            Error::WouldBlock
                        });
                    }
                }
            }
        };
        Ok(SendBuf::new(self, idx, 0))
    }

    /// [`alloc`](Self::alloc), waiting up to `timeout` for a buffer to come back.
    ///
    /// # Errors
    ///
    /// As `alloc`, with [`Error::Timeout`] instead of [`Error::WouldBlock`].
    pub fn alloc_timeout(&self, timeout: Duration) -> Result<SendBuf<'_>, Error> {
        self.retry_timeout(timeout, || self.alloc())
    }

    /// Calls `attempt` until it gives anything but [`Error::WouldBlock`], idling per the
    /// engine's strategy between tries, for at most `timeout` (then [`Error::Timeout`]).
    fn retry_timeout<T>(
        &self,
        timeout: Duration,
        mut attempt: impl FnMut() -> Result<T, Error>,
    ) -> Result<T, Error> {
        let deadline = Instant::now() + timeout;
        let mut idler = Idler::new(self.idle);
        let mut spins = 0u32;
        loop {
            match attempt() {
                Err(Error::WouldBlock) => {}
                other => return other,
            }
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 && Instant::now() >= deadline {
                return Err(Error::Timeout);
            }
            idler.idle(0);
        }
    }

    /// [`alloc`](Self::alloc) on a direct path: one pop from the free list and a bound check;
    /// the rest (reclaiming what the peer released, the errors) is out of line.
    #[inline(always)]
    fn alloc_direct(&self, d: &DirectPath) -> Result<SendBuf<'_>, Error> {
        // SAFETY: no other `AppSide` reference is live; it ends before the slow path takes one.
        let app = unsafe { self.app() };
        match app.spare.pop() {
            // Only buffers the wire layer validated reach the list; checked anyway.
            Some(idx) if idx < self.tx_pool.count() => {
                app.held += 1;
                Ok(SendBuf::new(self, idx, 0))
            }
            Some(_) => Err(Error::WouldBlock),
            None => self.alloc_direct_slow(d),
        }
    }

    /// The free list is empty: take back what the peer released, then allocate.
    #[cold]
    #[inline(never)]
    fn alloc_direct_slow(&self, d: &DirectPath) -> Result<SendBuf<'_>, Error> {
        // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
        let app = unsafe { self.app() };
        if let Err(e) = d.reclaim_all(&mut app.spare, &mut app.spare_large) {
            return Err(self.fail(e));
        }
        match app.spare.pop() {
            Some(idx) if idx < self.tx_pool.count() => {
                app.held += 1;
                Ok(SendBuf::new(self, idx, 0))
            }
            // Only buffers the wire layer validated reach the list; checked anyway.
            Some(_) => Err(Error::WouldBlock),
            None => {
                app.alloc_failures += 1;
                if let Some(d) = self.shared.down() {
                    return Err(d.to_error());
                }
                Err(if app.held >= self.tx_pool.count() {
                    Error::PoolExhausted {
                        count: self.tx_pool.count() as usize,
                    }
                } else {
                    Error::WouldBlock
                })
            }
        }
    }

    /// Takes `len` bytes to write a message in place, for zero-copy sends: on a direct path
    /// (shm) a message up to the inline threshold is written straight into the connection's
    /// record ring; a larger one, and every message on other fabrics, gets a pool buffer
    /// ([`alloc`](Self::alloc) with the length set). Fill it through
    /// [`as_mut_slice`](SendBuf::as_mut_slice) (or deref), then [`send`](Self::send) it (one
    /// `Release` store of the record header); dropping it aborts (nothing is published).
    ///
    /// At most one ring claim is open at a time, and while it is open nothing else is sent on
    /// the connection: commit or drop it first.
    ///
    /// # Errors
    ///
    /// [`Error::ClaimOpen`] while a ring claim is open; [`Error::MessageTooLarge`] above
    /// [`max_message_size`](Self::max_message_size); [`Error::WouldBlock`] when the ring (or
    /// the pool) is full for now; otherwise as [`alloc`](Self::alloc).
    #[inline]
    pub fn claim(&self, len: usize) -> Result<SendBuf<'_>, Error> {
        if let Some(d) = &self.direct {
            if d.claim_open() {
                return Err(Error::ClaimOpen);
            }
            if len <= d.inline_max() {
                if let Some(down) = self.shared.down() {
                    return Err(down.to_error());
                }
                return match d.claim(len) {
                    Ok(Some(ptr)) => {
                        self.ring_claim.set((ptr, len));
                        Ok(SendBuf::new(self, RING_CLAIM, len as u32))
                    }
                    Ok(None) => {
                        // SAFETY: no other `AppSide` reference is live.
                        unsafe { self.app() }.would_block += 1;
                        Err(Error::WouldBlock)
                    }
                    Err(e) => Err(self.fail(e)),
                };
            }
        }
        if len > self.tx_pool.buf_size() {
            return self.claim_large(len);
        }
        let mut b = self.alloc()?;
        b.set_len(len)?;
        Ok(b)
    }

    #[inline]
    fn take_buf(&self) -> Option<u32> {
        // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
        let app = unsafe { self.app() };
        let idx = match app.spare.pop() {
            Some(i) => i,
            None => loop {
                let i = app.rings.as_mut()?.free.pop().ok()?;
                if !crate::desc::is_large(i) {
                    break i;
                }
                // A large slot came back: keep it for `alloc_large` (the list has room for
                // every slot, and the engine frees each slot once).
                if app.spare_large.len() < app.spare_large.capacity() {
                    app.spare_large.push(i);
                }
            },
        };
        // The poller only frees buffers of this pool; checked anyway since `SendBuf` relies on it.
        if idx >= self.tx_pool.count() {
            return None;
        }
        app.held += 1;
        Some(idx)
    }

    /// Sends a message (zero copy: the buffer itself is handed to the poller; on a direct path
    /// (shm) a message up to the inline threshold is copied into a ring record and its buffer
    /// is free again at once, a larger one is sent by reference, and either is visible to the
    /// peer when `send` returns; a buffer from [`claim`](Self::claim) is committed in place). In
    /// run-to-completion mode it is posted when `batch` sends have queued, on [`flush`](Self::flush),
    /// or by the next poller cycle (`try_recv`, `recv_timeout`, [`Engine::poll`]).
    ///
    /// # Errors
    ///
    /// [`SendError::WouldBlock`] (buffer handed back) when `depth` messages are in flight: the
    /// receiver has no room for more yet (shm: or the ring is full). [`SendError::Closed`] when
    /// the connection is down or the buffer belongs to another connection, or with
    /// [`Error::ClaimOpen`] for a pool buffer while a ring claim is open (send or drop the
    /// claim first).
    #[inline(always)]
    pub fn send<'c>(&'c self, buf: SendBuf<'c>) -> Result<(), SendError<'c>> {
        // A thin dispatch, inlined into the caller so that the buffer's fields stay in
        // registers (passing the `SendBuf` to an out-of-line `send` made it reload them from the
        // caller's stack right after storing them: a store-forwarding stall, the largest single
        // cost of a direct send in `perf annotate`). The checks are those of `send_checked`.
        if let Some(d) = &self.direct {
            if std::ptr::eq(buf.conn, self) && self.shared.down().is_none() {
                return self.send_direct(d, buf, false);
            }
        }
        self.send_checked(buf)
    }

    /// [`send`](Self::send): the ownership and state checks, then either path.
    #[inline]
    fn send_checked<'c>(&'c self, buf: SendBuf<'c>) -> Result<(), SendError<'c>> {
        if !std::ptr::eq(buf.conn, self) {
            return Err(SendError::Closed {
                buf,
                error: Error::ForeignBuffer,
            });
        }
        if let Some(d) = self.shared.down() {
            return Err(SendError::Closed {
                buf,
                error: d.to_error(),
            });
        }
        if let Some(d) = &self.direct {
            return self.send_direct(d, buf, false);
        }
        if !self.has_credit() {
            self.drive_poller();
            if !self.has_credit() {
                // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
                unsafe { self.app() }.would_block += 1;
                return Err(SendError::WouldBlock(buf));
            }
        }
        let desc = TxDesc {
            buf: buf.idx(),
            len: buf.msg_len(),
        };
        // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
        let app = unsafe { self.app() };
        let pushed = match app.rings.as_mut() {
            Some(r) => r.tx.push(desc).is_ok(),
            None => false,
        };
        if !pushed {
            // The send ring holds the whole pool, so this cannot happen; treat it as back-pressure.
            app.would_block += 1;
            return Err(SendError::WouldBlock(buf));
        }
        let large = crate::desc::is_large(buf.idx());
        std::mem::forget(buf);
        if large {
            app.held_large -= 1;
        } else {
            app.held -= 1;
        }
        app.sent += 1;
        if self.run_to_completion {
            app.unflushed += 1;
            if app.unflushed >= self.batch {
                app.unflushed = 0;
                self.engine.poll();
            }
        }
        Ok(())
    }

    /// [`send`](Self::send), batched: on a direct path (shm) a message up to the inline
    /// threshold is written into the ring but not published yet, so that a run of messages
    /// costs one publication (one zero-ahead store and one `Release` store of the run's first
    /// header) instead of one per message. The run is published by [`flush`](Self::flush), by
    /// the engine's `batch`-th batched send in a row (bounded latency), by the next plain
    /// [`send`](Self::send) or ring [`claim`](Self::claim) commit (FIFO order is kept), by a
    /// send that finds the window or the ring full (before it returns
    /// [`SendError::WouldBlock`]), by a receive call on this connection that finds nothing,
    /// and when the connection is dropped. A larger message (sent by reference) is published at
    /// once, with the run before it.
    ///
    /// On other fabrics it is [`send`](Self::send) (in run-to-completion mode that already
    /// queues up to `batch` messages until [`flush`](Self::flush)).
    ///
    /// Use it for streams; a lone message wants [`send`](Self::send), which publishes at once.
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send).
    #[inline(always)]
    pub fn send_batched<'c>(&'c self, buf: SendBuf<'c>) -> Result<(), SendError<'c>> {
        // The same thin dispatch as `send` (a ring claim is committed and published as there).
        if let Some(d) = &self.direct {
            if std::ptr::eq(buf.conn, self) && self.shared.down().is_none() {
                return self.send_direct(d, buf, true);
            }
        }
        self.send_checked(buf)
    }

    #[inline(always)]
    fn send_direct<'c>(
        &'c self,
        d: &DirectPath,
        buf: SendBuf<'c>,
        batched: bool,
    ) -> Result<(), SendError<'c>> {
        // Field by field: the buffer is read where it lies and never moved on the way to the
        // ring (a moved `SendBuf` is copied with wide loads over fields its owner just wrote
        // narrowly, which stall on store forwarding: the largest single cost of alloc +
        // copy_from + send in `perf annotate` of `bench cost`). It is handed back whole only
        // when the send fails.
        let (idx, len) = buf.parts();
        match self.send_direct_parts(d, idx, len, batched) {
            DirectSend::Done => {
                std::mem::forget(buf);
                Ok(())
            }
            DirectSend::Full => Err(SendError::WouldBlock(buf)),
            DirectSend::Failed(error) => Err(SendError::Closed { buf, error }),
        }
    }

    /// The direct send of the message in buffer `idx` (or the open ring claim, `RING_CLAIM`)
    /// of `len` bytes; on [`DirectSend::Done`] the caller forgets the `SendBuf` (its buffer
    /// is accounted for here). `batched`: see [`send_batched`](Self::send_batched).
    #[inline(always)]
    fn send_direct_parts(&self, d: &DirectPath, idx: u32, len: u32, batched: bool) -> DirectSend {
        if idx == RING_CLAIM {
            // The record is in the ring already: publish it (with any batch before it).
            d.commit_claim(len as usize);
            // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
            let app = unsafe { self.app() };
            app.unflushed = 0;
            app.sent += 1;
            app.tx_bytes += u64::from(len);
            return DirectSend::Done;
        }
        if d.claim_open() {
            return DirectSend::Failed(Error::ClaimOpen);
        }
        if crate::desc::is_large(idx) {
            return self.send_direct_large(d, idx, len);
        }
        match d.send(&self.tx_pool, idx, len, batched) {
            Ok(Sent::Full) => {
                // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
                let app = unsafe { self.app() };
                // The fabric published the batch before reporting it full.
                app.unflushed = 0;
                app.would_block += 1;
                DirectSend::Full
            }
            Ok(sent) => {
                // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
                let app = unsafe { self.app() };
                app.held -= 1;
                if sent == Sent::Copied {
                    // Copied into the ring: the buffer is ours again at once. `spare` has
                    // capacity for the whole pool: no reallocation.
                    app.spare.push(idx);
                }
                app.sent += 1;
                app.tx_bytes += u64::from(len);
                if batched && sent == Sent::Copied {
                    app.unflushed += 1;
                    if app.unflushed >= self.batch {
                        app.unflushed = 0;
                        d.flush();
                    }
                } else {
                    // Published, with any batch before it (a reference is never batched).
                    app.unflushed = 0;
                }
                DirectSend::Done
            }
            Err(e) => DirectSend::Failed(self.fail(e)),
        }
    }

    #[inline]
    fn has_credit(&self) -> bool {
        // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
        let app = unsafe { self.app() };
        if app.sent - app.credits_seen < self.depth {
            return true;
        }
        app.credits_seen = self.shared.credits.load(Ordering::Acquire);
        app.sent - app.credits_seen < self.depth
    }

    /// [`send`](Self::send), waiting up to `timeout` for credits (spinning or backing off per the
    /// engine's idle strategy; it never parks longer than the strategy's bound).
    ///
    /// # Errors
    ///
    /// [`SendError::Timeout`] (buffer handed back) or [`SendError::Closed`].
    pub fn send_timeout<'c>(
        &'c self,
        buf: SendBuf<'c>,
        timeout: Duration,
    ) -> Result<(), SendError<'c>> {
        let deadline = Instant::now() + timeout;
        let mut idler = Idler::new(self.idle);
        let mut buf = buf;
        let mut spins = 0u32;
        loop {
            match self.send(buf) {
                Err(SendError::WouldBlock(b)) => buf = b,
                other => return other,
            }
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 && Instant::now() >= deadline {
                return Err(SendError::Timeout(buf));
            }
            idler.idle(0);
        }
    }

    /// Pushes queued sends out now. On a direct path (shm) it publishes what
    /// [`send_batched`](Self::send_batched) wrote (`send` publishes at once). In
    /// run-to-completion mode this runs a poller cycle; with dedicated pollers it does nothing
    /// (they drain continuously).
    #[inline]
    pub fn flush(&self) {
        if let Some(d) = &self.direct {
            // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
            unsafe { self.app() }.unflushed = 0;
            d.flush();
            return;
        }
        if self.run_to_completion {
            // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
            unsafe { self.app() }.unflushed = 0;
            self.engine.poll();
        }
    }

    /// Takes the next received message, if any (in run-to-completion mode, after running a poller
    /// cycle if none was waiting). The message is read in place; dropping it recycles its buffer.
    ///
    /// On a direct path (shm) the slots of the messages taken are given back to the sender once
    /// per run, not per message: when the ring runs empty, after a quarter of the window, and at
    /// the latest by the next call of another kind on this connection (a send, `poll`,
    /// `stats`). A call that finds nothing also publishes a pending
    /// [`send_batched`](Self::send_batched) run.
    ///
    /// # Errors
    ///
    /// [`Error::Disconnected`] / [`Error::Fabric`] once the connection is down and every message
    /// received before is taken.
    #[inline(always)]
    pub fn try_recv(&self) -> Result<Option<Message<'_>>, Error> {
        // A thin dispatch, inlined into the caller: the direct path fills the message where
        // the caller's result lies.
        if let Some(d) = &self.direct {
            return self.try_recv_direct(d);
        }
        self.try_recv_rings()
    }

    /// [`try_recv`](Self::try_recv) on the poller path.
    #[inline]
    fn try_recv_rings(&self) -> Result<Option<Message<'_>>, Error> {
        if let Some(m) = self.pop_rx() {
            return Ok(Some(m));
        }
        if self.drive_poller() > 0 {
            if let Some(m) = self.pop_rx() {
                return Ok(Some(m));
            }
        }
        if let Some(d) = self.shared.down() {
            // Anything delivered before the state changed is still ours.
            if let Some(m) = self.pop_rx() {
                return Ok(Some(m));
            }
            return Err(d.to_error());
        }
        Ok(None)
    }

    #[inline(always)]
    fn recv_direct(&self, d: &DirectPath) -> Result<Option<Message<'_>>, Error> {
        // Built once, filled in place by the fabric (only the payload's bytes are written).
        let mut m = Message {
            conn: self,
            desc: RxDesc {
                len: 0,
                buf: BUF_INLINE,
                data: [std::mem::MaybeUninit::uninit(); INLINE_MAX],
            },
        };
        match d.recv_into(&mut m.desc) {
            Ok(true) => {
                // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
                let app = unsafe { self.app() };
                app.received += 1;
                app.rx_bytes += u64::from(m.desc.len);
                Ok(Some(m))
            }
            Ok(false) => {
                // Nothing received: `m` is an empty inline message, dropping it does nothing.
                std::mem::forget(m);
                Ok(None)
            }
            Err(e) => {
                std::mem::forget(m);
                Err(self.fail(e))
            }
        }
    }

    #[inline(always)]
    fn try_recv_direct(&self, d: &DirectPath) -> Result<Option<Message<'_>>, Error> {
        if let Some(m) = self.recv_direct(d)? {
            return Ok(Some(m));
        }
        self.try_recv_direct_empty(d)
    }

    /// The ring was found empty: only now look at the connection's state.
    #[cold]
    #[inline(never)]
    fn try_recv_direct_empty(&self, d: &DirectPath) -> Result<Option<Message<'_>>, Error> {
        // Nothing to receive: let a batch of sends go out (a reply may depend on it).
        self.flush();
        match self.direct_down(d) {
            Some(e) => match self.recv_direct(d)? {
                // Published before the state changed: still ours.
                Some(m) => Ok(Some(m)),
                None => Err(e),
            },
            None => Ok(None),
        }
    }

    /// The error a direct-path connection is down with, if it is: its shared state, or the
    /// peer's closed flag in the fabric (then the connection is marked disconnected). Called
    /// only when the ring was found empty, never per message.
    #[inline]
    fn direct_down(&self, d: &DirectPath) -> Option<Error> {
        if let Some(down) = self.shared.down() {
            return Some(down.to_error());
        }
        if d.peer_closed() {
            self.shared.disconnect();
            return self.shared.down().map(|down| down.to_error());
        }
        None
    }

    /// Batch receive, in Aeron's style: hands up to `limit` received messages, in order, to
    /// `handler`, each read in place, and recycles each buffer as soon as the handler returns
    /// for it. Returns how many were delivered (0 when none was waiting).
    ///
    /// In run-to-completion mode it runs at most one poller cycle per call (only when the
    /// messages already waiting do not fill `limit`), so a batch costs one engine pass instead of
    /// one per message, and the cycle also posts queued sends and returns credits. With
    /// dedicated pollers it only drains what they delivered. It never waits.
    ///
    /// Cheaper per message than [`try_recv`](Self::try_recv) in a loop: no poller cycle, no
    /// connection-state check and no `Option<Message>` per message (`bench cost --batch N`
    /// measures both).
    ///
    /// On a direct path (shm) the messages are read in place in the segment and nothing runs
    /// the poller; a receive call on this connection from inside the handler finds nothing.
    ///
    /// A handler that panics loses nothing: the message it was given is recycled during the
    /// unwind, the ones not yet delivered stay queued.
    ///
    /// # Errors
    ///
    /// [`Error::Disconnected`] / [`Error::Fabric`] once the connection is down and every message
    /// received before has been delivered (a call that delivers messages returns `Ok`).
    pub fn poll(&self, mut handler: impl FnMut(&[u8]), limit: usize) -> Result<usize, Error> {
        if let Some(d) = &self.direct {
            let n = self.poll_direct(d, &mut handler, limit)?;
            if n > 0 || limit == 0 {
                return Ok(n);
            }
            // Nothing to receive: let a batch of sends go out (a reply may depend on it).
            self.flush();
            return match self.direct_down(d) {
                Some(e) => match self.poll_direct(d, &mut handler, limit)? {
                    0 => Err(e),
                    n => Ok(n),
                },
                None => Ok(0),
            };
        }
        let mut n = self.drain_rx(&mut handler, limit);
        if n < limit && self.drive_poller() > 0 {
            n += self.drain_rx(&mut handler, limit - n);
        }
        if n == 0 {
            if let Some(d) = self.shared.down() {
                // Anything delivered before the state changed is still ours.
                n = self.drain_rx(&mut handler, limit);
                if n == 0 {
                    return Err(d.to_error());
                }
            }
        }
        Ok(n)
    }

    #[inline]
    fn poll_direct(
        &self,
        d: &DirectPath,
        handler: &mut impl FnMut(&[u8]),
        limit: usize,
    ) -> Result<usize, Error> {
        match d.poll(&self.rx_pool, handler, limit) {
            Ok((n, bytes)) => {
                if n > 0 {
                    // SAFETY: no other `AppSide` reference is live (the handlers have returned).
                    let app = unsafe { self.app() };
                    app.received += n as u64;
                    app.rx_bytes += bytes;
                }
                Ok(n)
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    #[inline]
    fn drain_rx(&self, handler: &mut impl FnMut(&[u8]), limit: usize) -> usize {
        let mut n = 0;
        while n < limit {
            let desc = {
                // SAFETY: no other `AppSide` reference is live, and this one ends before the
                // handler runs (the handler may call back into this connection).
                let app = unsafe { self.app() };
                let Some(Ok(desc)) = app.rings.as_mut().map(|r| r.rx.pop()) else {
                    break;
                };
                app.received += 1;
                desc
            };
            n += 1;
            // Dropping the message (also on unwind) recycles its buffer.
            let m = Message { conn: self, desc };
            handler(&m);
        }
        n
    }

    #[inline]
    fn pop_rx(&self) -> Option<Message<'_>> {
        // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
        let app = unsafe { self.app() };
        let desc = app.rings.as_mut()?.rx.pop().ok()?;
        app.received += 1;
        Some(Message { conn: self, desc })
    }

    /// Waits up to `timeout` for the next message.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`], or [`Error::Disconnected`] / [`Error::Fabric`] (promptly: a dead peer is
    /// reported within a second by the control thread).
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message<'_>, Error> {
        if let Some(m) = self.try_recv()? {
            return Ok(m);
        }
        let deadline = Instant::now() + timeout;
        let mut idler = Idler::new(self.idle);
        if let Some(d) = &self.direct {
            let mut spins = 0u32;
            loop {
                if let Some(m) = self.try_recv_direct(d)? {
                    return Ok(m);
                }
                spins = spins.wrapping_add(1);
                if spins % 64 == 0 && Instant::now() >= deadline {
                    return Err(Error::Timeout);
                }
                idler.idle(0);
            }
        }
        // Run-to-completion and busy-spinning: hold the poller for the whole wait (one ownership
        // CAS per wait, not per cycle). Other connections keep being served: by this thread.
        let mut guard = if self.run_to_completion && self.idle == IdleStrategy::BusySpin {
            self.engine.rtc_guard()
        } else {
            None
        };
        let mut spins = 0u32;
        loop {
            let work = match guard.as_mut() {
                Some(g) => {
                    if let Some(m) = self.pop_rx() {
                        return Ok(m);
                    }
                    g.poll(self.engine.now_ns())
                }
                None => 0,
            };
            if work > 0 || guard.is_none() {
                if let Some(m) = self.try_recv()? {
                    return Ok(m);
                }
            } else if let Some(d) = self.shared.down() {
                if let Some(m) = self.pop_rx() {
                    return Ok(m);
                }
                return Err(d.to_error());
            }
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 && Instant::now() >= deadline {
                return Err(Error::Timeout);
            }
            idler.idle(work);
        }
    }

    /// A snapshot of this connection's counters.
    pub fn stats(&self) -> ConnStats {
        let c = &self.shared.counters;
        // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
        let app = unsafe { self.app() };
        if let Some(d) = &self.direct {
            // No poller: the application's own counts are the connection's.
            return ConnStats {
                rx_msgs: app.received,
                rx_bytes: app.rx_bytes,
                tx_msgs: app.sent,
                tx_bytes: app.tx_bytes,
                tx_stalls: app.would_block,
                sent: app.sent,
                received: app.received,
                would_block: app.would_block,
                alloc_failures: app.alloc_failures,
                in_flight: match d.unconsumed() {
                    Ok(n) => n as u64,
                    Err(e) => {
                        self.shared.fail(e);
                        0
                    }
                },
            };
        }
        let credits = self.shared.credits.load(Ordering::Acquire);
        ConnStats {
            rx_msgs: c.rx_msgs.get(),
            rx_bytes: c.rx_bytes.get(),
            tx_msgs: c.tx_msgs.get(),
            tx_bytes: c.tx_bytes.get(),
            tx_stalls: c.tx_stalls.get(),
            sent: app.sent,
            received: app.received,
            would_block: app.would_block,
            alloc_failures: app.alloc_failures,
            in_flight: app.sent.saturating_sub(credits),
        }
    }

    fn give_back(&self, idx: u32) {
        if idx == RING_CLAIM {
            if let Some(d) = &self.direct {
                d.abort_claim();
            }
            return;
        }
        // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
        let app = unsafe { self.app() };
        if crate::desc::is_large(idx) {
            app.held_large -= 1;
            // Capacity for every slot, and only slots we own: no reallocation.
            app.spare_large.push(idx);
            return;
        }
        app.held -= 1;
        // `spare` has capacity for the whole pool and holds only buffers we own: no reallocation.
        app.spare.push(idx);
    }

    fn release_rx(&self, idx: u32) {
        if let Some(d) = &self.direct {
            if let Err(e) = d.release(idx) {
                self.fail(e);
            }
            return;
        }
        // The release ring holds the whole receive pool; a peer delivering a buffer twice could
        // overflow it, in which case the buffer is simply not returned (the peer's loss).
        // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
        if let Some(r) = unsafe { self.app() }.rings.as_mut() {
            let _ = r.release.push(idx);
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // A batch of sends goes out before the close is signalled.
        if let Some(d) = &self.direct {
            d.flush();
        }
        if self.run_to_completion && self.direct.is_none() {
            self.engine.poll();
        }
        self.shared.close();
        self.engine.close_connection(self.shared.id);
    }
}
