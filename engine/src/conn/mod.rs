//! The application's handles: [`Connection`], [`SendBuf`], [`Message`], [`Listener`], and
//! [`SendError`], which hands a [`SendBuf`] back.
//!
//! # One handle, two paths
//!
//! A [`Connection`] is one handle over one of two data paths, chosen when the connection is
//! set up and dispatched on once per call (a `match` on [`Path`], inlined into the caller):
//!
//! - the **polled path** (`polled`): a poller drives the fabric (tcp, RDMA, and every fabric
//!   without a direct path); the handle talks to it through the application↔poller rings.
//! - the **direct path** (`direct`): the handle drives the fabric's data path itself (shm),
//!   with no poller.
//!
//! Each path owns its state (rings or fabric handle, spare lists, window, counters) in its
//! own `UnsafeCell`, behind its own accessor and safety argument. What both keep the same way
//! is written once (`spare`: the spare lists, the counts, the bounded wait of the `*_timeout`
//! calls), as is what is the same on both (the ownership and state checks of a send, the
//! error of an `alloc` that finds nothing, large messages above the buffer size). The credit
//! window of either path is a [`flow`](crate::flow) window of the connection's policy: the
//! polled path's own, the direct path's inside the fabric.
//!
//! # Files
//!
//! - this file: [`Connection`] and its dispatch.
//! - `polled`, `direct`: the two paths.
//! - `spare`: the pieces both paths share.
//! - `large`: large messages ([`Connection::alloc_large`], [`Connection::send_copy`],
//!   [`Connection::recv_into`]).
//! - `buffers`: [`SendBuf`] and [`Message`], the in-place views of a pool buffer.
//! - `listener`: [`Listener`].
//! - `send_error`: [`SendError`].

use std::any::Any;
use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use crate::desc::PoolView;
use crate::engine::handle::Engine;
use crate::error::Error;
use crate::error::FabricError;
use crate::flow::Policy;
use crate::idle::IdleStrategy;
use crate::link::{AppPath, ConnParts, ConnShared};
use crate::stats::ConnStats;

/// `SendBuf::idx` of a claim of ring space ([`Connection::claim`] on a direct path), not a
/// pool buffer.
const RING_CLAIM: u32 = u32::MAX;

mod buffers;
mod direct;
mod large;
mod listener;
mod polled;
mod send_error;
mod spare;
mod stash;
mod window;

pub use buffers::{Message, SendBuf};
pub use large::RecvIntoError;
pub use listener::Listener;
pub use send_error::SendError;

use direct::Direct;
use polled::Polled;
use spare::Wait;
use stash::Stash;

/// A connection's data path: one of two, each owning its state.
// Held inline, not boxed: the handle is built once and never moved on the data path, and a box
// would put a pointer chase in front of every call.
#[allow(clippy::large_enum_variant)]
enum Path {
    /// Through a poller and the application↔poller rings.
    Polled(Polled),
    /// The fabric's direct path, driven by the handle itself.
    Direct(Direct),
}

/// The fewest small messages a connection lets the application hold at once besides a message
/// in each buffer it can lend (more where it has more receive buffers and large slots; see
/// [`Error::TooManyHeld`]).
const MIN_HELD: usize = 256;

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
    path: Path,
    shared: Arc<ConnShared>,
    engine: Engine,
    tx_pool: PoolView,
    rx_pool: PoolView,
    /// The large slots: `LARGE_BIT | slot` in a `SendBuf` / `Message`.
    tx_large: PoolView,
    rx_large: PoolView,
    /// Where small received messages are held (see [`stash`]).
    stash: Stash,
    /// The largest message ([`max_message_size`](Self::max_message_size)).
    message_limit: usize,
    /// `send_copy` uses a large slot above this.
    large_threshold: usize,
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
        let pools = parts.pools;
        let path = match parts.path {
            // The polled path's window: the connection's policy, built once here.
            AppPath::Rings(rings) => Path::Polled(Polled::new(
                rings,
                &pools,
                Policy::for_connection(cfg, parts.depth),
                parts.bytes,
                cfg,
            )),
            // The fabric's setup sized its window (from the same configuration).
            AppPath::Direct(fabric) => Path::Direct(Direct::new(fabric, &pools, cfg.batch as u32)),
        };
        // Shown in the engine's counters file from its next publication on.
        let direct = matches!(path, Path::Direct(_));
        parts
            .shared
            .app
            .direct
            .store(direct, std::sync::atomic::Ordering::Relaxed);
        let fabric = parts.peer.split_once("://").map_or("", |(s, _)| s);
        engine.attach_counters(&parts.shared, fabric, &parts.peer);
        Connection {
            path,
            shared: parts.shared,
            tx_pool: pools.tx,
            rx_pool: pools.rx,
            // A fabric may settle a smaller limit with its peer (tcp's hello): its slots are
            // then that size.
            message_limit: if pools.tx_large.count() > 0 {
                cfg.message_limit().min(pools.tx_large.buf_size())
            } else {
                pools.tx.buf_size()
            },
            large_threshold: cfg.large_threshold(),
            tx_large: pools.tx_large,
            // Each held message takes a slot (its record; a small one's bytes too): as many as
            // the buffers and large slots that can be lent at once, and as many again (at
            // least `MIN_HELD`) for small messages.
            stash: {
                let lendable = pools.rx.count() as usize + pools.rx_large.count() as usize;
                Stash::new(lendable + lendable.max(MIN_HELD))
            },
            rx_large: pools.rx_large,
            idle: cfg.idle,
            peer: parts.peer,
            _keep: parts.keep,
            engine,
            _not_sync: PhantomData,
        }
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
        match &self.path {
            Path::Polled(p) => p.rx_is_empty(),
            Path::Direct(d) => d.rx_is_empty(),
        }
    }

    /// The data path found the peer breaking the protocol: the connection fails (the control
    /// thread reports it on its next tick and closes it).
    #[cold]
    fn fail(&self, e: FabricError) -> Error {
        self.shared.fail(e);
        self.down_error().unwrap_or(Error::Fabric(e))
    }

    /// Whether a buffer of `owner` may be sent here: it is this connection's and the connection
    /// is up (one compare and one load of the state; [`refuse`](Self::refuse) says why not).
    #[inline(always)]
    fn may_send(&self, owner: &Connection) -> bool {
        std::ptr::eq(owner, self) && self.shared.down().is_none()
    }

    /// Why a send of `buf` is refused: it belongs to another connection, or this one is down
    /// (the caller checked that one of the two holds).
    #[cold]
    #[inline(never)]
    fn refuse<'c>(&'c self, buf: SendBuf<'c>) -> SendError<'c> {
        let error = if !std::ptr::eq(buf.conn, self) {
            Error::ForeignBuffer
        } else {
            // A connection never comes back up once down.
            self.down_error().unwrap_or(Error::Disconnected)
        };
        SendError::Closed { buf, error }
    }

    /// Why the connection is down, for a data call that found it down (the caller saw the
    /// state change; a connection never comes back up).
    #[cold]
    #[inline(never)]
    fn down_now(&self) -> Error {
        self.down_error().unwrap_or(Error::Disconnected)
    }

    /// `Err` with the reason once the connection is down (every data call starts with it).
    #[inline(always)]
    fn check_up(&self) -> Result<(), Error> {
        if self.shared.down().is_some() {
            return Err(self.down_now());
        }
        Ok(())
    }

    /// The error of an `alloc` (or `alloc_large`) that found nothing free: the connection's
    /// down state, else `PoolExhausted` when the application holds all `count` of them
    /// (`all_held`), else `WouldBlock` (they come back as the peer consumes them).
    #[cold]
    fn alloc_error(&self, all_held: bool, count: u32) -> Error {
        if let Some(d) = self.shared.down() {
            return d.to_error();
        }
        if all_held {
            Error::PoolExhausted {
                count: count as usize,
            }
        } else {
            Error::WouldBlock
        }
    }

    /// The open ring claim's payload pointer and length (a `SendBuf` of `RING_CLAIM` exists
    /// only on a direct path; `dangling, 0` otherwise).
    #[inline(always)]
    fn ring_claim(&self) -> (NonNull<u8>, usize) {
        match &self.path {
            Path::Direct(d) => d.claim.get(),
            Path::Polled(_) => (NonNull::dangling(), 0),
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
        // A dead connection hands out nothing: one load of the state (the line is only written
        // when the connection goes down), its error out of line.
        if self.shared.down().is_some() {
            return Err(self.down_now());
        }
        // A thin dispatch, inlined into the caller: the direct path's fast case stays small
        // (its slow paths are out of line), the polled path is one call.
        match &self.path {
            Path::Direct(d) => d.alloc(self),
            Path::Polled(p) => p.alloc(self),
        }
    }

    /// [`alloc`](Self::alloc), waiting up to `timeout` for a buffer to come back.
    ///
    /// # Errors
    ///
    /// As `alloc`, with [`Error::Timeout`] instead of [`Error::WouldBlock`].
    // Always inlined, as `send_timeout`: with `#[inline]` the compiler left both calls in the
    // pingpong example's loops; inlined, its tm99 was lower in 10 of 12 interleaved rounds
    // (about 3-5 ns a round trip, near placement on the AMD guest).
    #[inline(always)]
    pub fn alloc_timeout(&self, timeout: Duration) -> Result<SendBuf<'_>, Error> {
        // The first try written out here: through a closure, `alloc` was a call. Each arm
        // builds its result: `other => other` copied the whole 80-byte result (the `Error` sets
        // its size) for a buffer handle that the fast case has in registers.
        match self.alloc() {
            Ok(buf) => Ok(buf),
            Err(Error::WouldBlock) => self.retry_wait(timeout, || self.alloc()),
            Err(e) => Err(e),
        }
    }

    /// The wait of a `*_timeout` call whose first try (`attempt`, made inline by the caller)
    /// would have blocked: calls `attempt` again until it gives anything but
    /// [`Error::WouldBlock`], idling per the engine's strategy before each try, for at most
    /// `timeout` (then [`Error::Timeout`]).
    ///
    /// Out of line, and nothing is set up for the first try. (A wait built before the first
    /// try, and the loop around it, made a message sent with `alloc_timeout` + `send_timeout`
    /// 167 instructions dearer than with `alloc` + `send`; now 36: callgrind, shm, one
    /// thread.)
    #[cold]
    #[inline(never)]
    fn retry_wait<T>(
        &self,
        timeout: Duration,
        mut attempt: impl FnMut() -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut wait = Wait::new(self.idle, timeout);
        loop {
            if !wait.idle(0) {
                return Err(Error::Timeout);
            }
            match attempt() {
                Err(Error::WouldBlock) => {}
                other => return other,
            }
        }
    }

    /// Takes `len` bytes to write a message in place, for zero-copy sends: on a direct path
    /// (shm) a message up to the inline threshold is claimed in the connection's record ring
    /// (its record reserved there, its bytes written in the connection's staging line, which
    /// `send` copies into the record with its header, in one burst: the line the peer spins on
    /// is written once, as `send_copy` writes it); a larger one, and every message on other
    /// fabrics, gets a pool buffer ([`alloc`](Self::alloc) with the length set). Fill it
    /// through [`as_mut_slice`](SendBuf::as_mut_slice) (or deref), then [`send`](Self::send)
    /// it; dropping it aborts (nothing is published).
    ///
    /// At most one ring claim is open at a time, and while it is open nothing else is sent on
    /// the connection: commit or drop it first.
    ///
    /// # Errors
    ///
    /// [`Error::ClaimOpen`] while a ring claim is open; [`Error::MessageTooLarge`] above
    /// [`max_message_size`](Self::max_message_size); [`Error::WouldBlock`] when the ring (or
    /// the pool) is full for now; otherwise as [`alloc`](Self::alloc).
    #[inline(always)]
    pub fn claim(&self, len: usize) -> Result<SendBuf<'_>, Error> {
        match &self.path {
            // It looks at the state itself, first (once: callgrind of `bench cost`).
            Path::Direct(d) => d.claim(self, len),
            Path::Polled(_) => self.claim_polled(len),
        }
    }

    /// [`claim`](Self::claim) on the polled path, out of line: with it inlined, `claim` was
    /// too large to be inlined into its caller, and the direct path's claim paid a call and
    /// a frame (callgrind of `bench cost`).
    #[inline(never)]
    fn claim_polled(&self, len: usize) -> Result<SendBuf<'_>, Error> {
        self.check_up()?;
        self.claim_buf(len)
    }

    /// [`claim`](Self::claim) of a pool buffer or large slot, with the length set.
    fn claim_buf(&self, len: usize) -> Result<SendBuf<'_>, Error> {
        if len > self.tx_pool.buf_size() {
            return self.claim_large(len);
        }
        let mut b = self.alloc()?;
        b.set_len(len)?;
        Ok(b)
    }

    /// Sends a message (zero copy: the buffer itself is handed to the poller; on a direct path
    /// (shm) a message up to the inline threshold is copied into a ring record and its buffer
    /// is free again at once, a larger one is sent by reference, and either is visible to the
    /// peer when `send` returns; a buffer from [`claim`](Self::claim) is committed in place). In
    /// run-to-completion mode it is posted when `batch` sends have queued, on [`flush`](Self::flush),
    /// or by the next poller cycle (`try_recv`, `recv_timeout`, [`Engine::poll`]); on `mem://`
    /// it is posted straight to the fabric before `send` returns when this thread gets the
    /// poller (no other thread runs it) and nothing is queued before it (see the crate docs,
    /// *run-to-completion without the rings*).
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
        // cost of a direct send in `perf annotate`).
        match &self.path {
            Path::Direct(d) => d.send(self, buf, false),
            Path::Polled(p) => p.send(self, buf, false),
        }
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
    /// On other fabrics with dedicated pollers (not [`IdleStrategy::Block`]) the message is
    /// written into the send ring to the poller but published with its run, one index store
    /// per run: by `flush`, the `batch`-th batched send in a row, the next plain `send`, a
    /// send or `alloc` that finds no credit or buffer, a receive call on this connection that
    /// finds nothing, and the drop. In run-to-completion mode it is [`send`](Self::send)
    /// (which already queues up to `batch` messages until [`flush`](Self::flush)), except
    /// that on `mem://` a batched send is always queued, and the run is posted straight to
    /// the fabric by `flush` or the `batch`-th (without a whole poller cycle).
    ///
    /// Use it for streams; a lone message wants [`send`](Self::send), which publishes at once.
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send).
    #[inline(always)]
    pub fn send_batched<'c>(&'c self, buf: SendBuf<'c>) -> Result<(), SendError<'c>> {
        // The same thin dispatch as `send` (a ring claim is committed and published as there).
        match &self.path {
            Path::Direct(d) => d.send(self, buf, true),
            Path::Polled(p) => p.send(self, buf, true),
        }
    }

    /// [`send`](Self::send), waiting up to `timeout` for credits (spinning or backing off per the
    /// engine's idle strategy; it never parks longer than the strategy's bound). With
    /// [`IdleStrategy::Block`] it spins for the spin phase, then parks with
    /// [`IdleStrategy::backoff`]'s bounds (1 µs doubling up to 1 ms): a credit coming back wakes
    /// nobody, so a sender waiting for one re-checks at least every millisecond.
    ///
    /// # Errors
    ///
    /// [`SendError::Timeout`] (buffer handed back) or [`SendError::Closed`].
    // Always inlined (see `alloc_timeout`); `recv_timeout` is not: inlined as well, the
    // example's tm99 was higher in 6 of 6 rounds.
    #[inline(always)]
    pub fn send_timeout<'c>(
        &'c self,
        buf: SendBuf<'c>,
        timeout: Duration,
    ) -> Result<(), SendError<'c>> {
        // The first try is `send` itself; the wait is out of line (see `retry_wait`). Each arm
        // builds its result: `other => other` copied the whole result (96 bytes) with 16-byte
        // loads over the 4-byte store of `Ok`'s tag, a store-forwarding stall on every send
        // (`perf annotate` of the pingpong example: about 60 % of `send_timeout`'s samples).
        match self.send(buf) {
            Ok(()) => Ok(()),
            Err(SendError::WouldBlock(buf)) => self.send_wait(buf, timeout),
            Err(e) => Err(e),
        }
    }

    /// [`send_timeout`](Self::send_timeout) after a first try that found no credit or room.
    #[cold]
    #[inline(never)]
    fn send_wait<'c>(&'c self, buf: SendBuf<'c>, timeout: Duration) -> Result<(), SendError<'c>> {
        let mut wait = Wait::new(self.idle, timeout);
        let mut buf = buf;
        loop {
            if !wait.idle(0) {
                return Err(SendError::Timeout(buf));
            }
            match self.send(buf) {
                Err(SendError::WouldBlock(b)) => buf = b,
                other => return other,
            }
        }
    }

    /// Pushes queued sends out now. On a direct path (shm) it publishes what
    /// [`send_batched`](Self::send_batched) wrote (`send` publishes at once). In
    /// run-to-completion mode this runs a poller cycle (on `mem://`: it posts the queued run
    /// straight to the fabric, and does nothing when nothing is queued); with dedicated pollers
    /// it publishes a [`send_batched`](Self::send_batched) run (they drain continuously).
    ///
    /// # Errors
    ///
    /// [`Error::Disconnected`] / [`Error::Fabric`] when the connection is down: what was
    /// queued may not reach the peer.
    #[inline(always)]
    pub fn flush(&self) -> Result<(), Error> {
        match &self.path {
            // One look at the state, after: publishing what a down connection's batch wrote
            // is harmless (the ring is this connection's own mapping), so the check before
            // would only repeat it.
            Path::Direct(d) => d.flush(),
            Path::Polled(p) => {
                self.check_up()?;
                p.flush(self);
            }
        }
        self.check_up()
    }

    /// Takes the next received message, if any (in run-to-completion mode, after running a poller
    /// cycle if none was waiting; on `mem://` it first takes one straight from the fabric,
    /// without a cycle). The message is read in place; dropping it recycles its buffer.
    ///
    /// On a direct path (shm) the slot of a message taken is given back to the sender before
    /// `try_recv` returns (one store to the receiver's own line): a sender whose window is full
    /// gets a credit per message taken. A call that finds nothing also publishes a pending
    /// [`send_batched`](Self::send_batched) run.
    ///
    /// A loop that spins on it calls [`std::hint::spin_loop`] after each call that found
    /// nothing, as [`recv_timeout`](Self::recv_timeout) does: without that `pause` the CPU
    /// runs the loop's next turns ahead while the message lands, and the turn that finds it
    /// starts after a pipeline flush (a ping-pong over shm: about 30 ns a round trip per side
    /// here, README).
    ///
    /// # Errors
    ///
    /// [`Error::Disconnected`] / [`Error::Fabric`] once the connection is down and every message
    /// received before is taken.
    #[inline(always)]
    pub fn try_recv(&self) -> Result<Option<Message<'_>>, Error> {
        // A thin dispatch, inlined into the caller: the direct path fills the message where
        // the caller's result lies.
        match &self.path {
            Path::Direct(d) => d.try_recv(self),
            Path::Polled(p) => p.try_recv(self),
        }
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
    /// measures both). A loop that spins on it calls [`std::hint::spin_loop`] after each call
    /// that delivered nothing (see [`try_recv`](Self::try_recv)).
    ///
    /// On a direct path (shm) the messages are read in place in the segment and nothing runs
    /// the poller; a receive call on this connection from inside the handler finds nothing.
    ///
    /// A handler that panics loses nothing: the message it was given is recycled during the
    /// unwind (its buffer, and on shm its ring space, go back to the peer then, not with a later
    /// receive), the ones not yet delivered stay queued.
    ///
    /// # Errors
    ///
    /// [`Error::Disconnected`] / [`Error::Fabric`] once the connection is down and every message
    /// received before has been delivered (a call that delivers messages returns `Ok`).
    pub fn poll(&self, mut handler: impl FnMut(&[u8]), limit: usize) -> Result<usize, Error> {
        match &self.path {
            Path::Direct(d) => d.poll(self, &mut handler, limit),
            Path::Polled(p) => p.poll(self, &mut handler, limit),
        }
    }

    /// Waits up to `timeout` for the next message.
    ///
    /// The wait idles per the engine's [`IdleStrategy`]. A [`BusySpin`](IdleStrategy::BusySpin)
    /// wait reads the clock first at its 64th try and then every 64th (a clock read takes as long
    /// as a cache-line transfer, and one at the first idle sat in nearly every echo's wait), so it
    /// may run up to about 128 tries past `timeout` (a few µs on shm); the other strategies
    /// start the deadline at the first try that found nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`], or [`Error::Disconnected`] / [`Error::Fabric`] (promptly: a dead peer is
    /// reported within a second by the control thread).
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message<'_>, Error> {
        let wait = Wait::new(self.idle, timeout);
        match &self.path {
            // The first try is the wait's first turn (a `Wait` reads no clock until its first
            // idle), taking the message as the direct wait does (see there).
            Path::Direct(d) => d.recv_wait(self, wait),
            Path::Polled(p) => {
                // A match, not `try_recv()?`: the `?` moved the message out of the first
                // result with wide loads over the narrow stores that had just built it, a
                // store-forwarding stall (a 2-thread shm ping-pong echoing from
                // `recv_timeout` took about 7 ns a round trip more).
                match self.try_recv() {
                    Ok(Some(m)) => return Ok(m),
                    Ok(None) => {}
                    Err(e) => return Err(e),
                }
                p.recv_wait(self, wait)
            }
        }
    }

    /// Waits up to `timeout` until a message is ready to receive, without taking it: then
    /// [`try_recv`](Self::try_recv) or [`poll`](Self::poll) finds at least one. It idles per
    /// the engine's [`IdleStrategy`] (with [`IdleStrategy::Block`] it sleeps until the
    /// arrival wakes it), so a batch receiver waits as cheaply as
    /// [`recv_timeout`](Self::recv_timeout) does (UCX's `ucp_worker_wait`, `epoll` over a
    /// socket).
    ///
    /// In run-to-completion mode it drives the engine while it waits (a polled connection's
    /// poller runs inside it, as inside `recv_timeout`).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use spinwire::{Engine, IdleStrategy};
    /// # fn main() -> Result<(), spinwire::Error> {
    /// let engine = Engine::builder().idle(IdleStrategy::block()).build()?;
    /// # let name = format!("shm://doc-wait-{}", std::process::id());
    /// let listener = engine.listen(&name)?;
    /// let client = engine.connect(&name)?;
    /// let server = listener.accept_timeout(Duration::from_secs(5))?;
    /// client.send_copy(b"tick").map_err(spinwire::Error::from)?;
    /// // Sleeps (after a short spin) until something arrives, then takes it all in place.
    /// server.wait_timeout(Duration::from_secs(5))?;
    /// let n = server.poll(|m| assert_eq!(m, b"tick"), 32)?;
    /// assert_eq!(n, 1);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`]; [`Error::Disconnected`] / [`Error::Fabric`] once the connection is
    /// down and nothing received before it is left to take.
    pub fn wait_timeout(&self, timeout: Duration) -> Result<(), Error> {
        let wait = Wait::new(self.idle, timeout);
        match &self.path {
            Path::Direct(d) => d.wait(self, wait),
            Path::Polled(p) => p.wait(self, wait),
        }
    }

    /// A snapshot of this connection's counters.
    pub fn stats(&self) -> ConnStats {
        match &self.path {
            Path::Direct(d) => d.stats(self),
            Path::Polled(p) => p.stats(self),
        }
    }

    /// [`send_copy`](Self::send_copy) (`batched`: [`send_copy_batched`](Self::send_copy_batched))
    /// on a direct path, of a message up to its inline threshold, straight into the ring;
    /// `false` when not sent that way.
    #[inline(always)]
    fn send_copy_direct(&self, data: &[u8], batched: bool) -> bool {
        match &self.path {
            Path::Direct(d) => d.try_send_copy_inline(self, data, batched),
            Path::Polled(_) => false,
        }
    }

    /// A `SendBuf` of buffer `idx` was dropped unsent.
    fn give_back(&self, idx: u32) {
        match &self.path {
            Path::Direct(d) => d.give_back(idx),
            Path::Polled(p) => p.give_back(idx),
        }
    }

    /// A received `Message` of buffer `idx` was dropped. Out of line, as the `Message` drop
    /// that calls it only for a pooled message is inlined (with this inlined too, the drop
    /// grew past the inliner's limit and cost a call per message, inline ones included).
    fn release_rx(&self, idx: u32) {
        if crate::desc::is_large(idx) {
            self.shared.app.large_received.add(1);
        }
        match &self.path {
            Path::Direct(d) => d.release(self, idx),
            Path::Polled(p) => p.release_wake(self, idx),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // A batch of sends goes out before the close is signalled.
        match &self.path {
            Path::Direct(d) => d.flush(),
            Path::Polled(p) => p.close(self),
        }
        self.shared.close();
        if self.engine.close_connection(self.shared.id) {
            if let Path::Polled(p) = &self.path {
                p.linger(self);
            }
        }
    }
}
