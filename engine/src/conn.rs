//! The application's handles: [`Connection`], [`SendBuf`], [`Message`], [`Listener`], and
//! [`SendError`], which hands a [`SendBuf`] back.
//!
//! # Files
//!
//! - this file: [`Connection`] (send, receive, the batch receive [`poll`](Connection::poll),
//!   stats) and the application side's state it keeps in an `UnsafeCell`.
//! - `buffers`: [`SendBuf`] and [`Message`], the in-place views of a pool buffer.
//! - `listener`: [`Listener`].
//! - `send_error`: [`SendError`].

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::desc::{PoolView, TxDesc};
use crate::engine::Engine;
use crate::error::Error;
use crate::idle::{IdleStrategy, Idler};
use crate::link::{AppRings, ConnParts, ConnShared};
use crate::stats::ConnStats;

mod buffers;
mod listener;
mod send_error;

pub use buffers::{Message, SendBuf};
pub use listener::Listener;
pub use send_error::SendError;

struct AppSide {
    rings: AppRings,
    /// Buffers allocated and dropped unsent (reused first). Capacity = pool size: never grows.
    spare: Vec<u32>,
    /// Buffers the application holds as `SendBuf`s.
    held: u32,
    sent: u64,
    credits_seen: u64,
    unflushed: u32,
    received: u64,
    would_block: u64,
    alloc_failures: u64,
}

/// One connection: send with [`alloc`](Connection::alloc) + [`send`](Connection::send), receive with
/// [`try_recv`](Connection::try_recv) / [`recv_timeout`](Connection::recv_timeout), or in batches
/// with [`poll`](Connection::poll).
///
/// `Send` but not `Sync`: move it to the thread that uses it; it is never shared. Buffers and
/// messages borrow it, so they cannot outlive it or travel to another thread. Dropping it closes
/// the connection (the peer sees [`Error::Disconnected`]); messages already queued by `send` are
/// posted first on a best-effort basis.
pub struct Connection {
    app: UnsafeCell<AppSide>,
    shared: Arc<ConnShared>,
    engine: Engine,
    tx_pool: PoolView,
    rx_pool: PoolView,
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
        let count = parts.tx_pool.count() as usize;
        Connection {
            app: UnsafeCell::new(AppSide {
                rings: parts.rings,
                spare: Vec::with_capacity(count),
                held: 0,
                sent: 0,
                credits_seen: 0,
                unflushed: 0,
                received: 0,
                would_block: 0,
                alloc_failures: 0,
            }),
            shared: parts.shared,
            tx_pool: parts.tx_pool,
            rx_pool: parts.rx_pool,
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

    /// The largest message `send` accepts (the buffer size).
    pub fn max_message_size(&self) -> usize {
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
        // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
        unsafe { self.app() }.rings.rx.is_empty()
    }

    #[inline]
    fn drive_poller(&self) -> usize {
        if self.run_to_completion {
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
    #[inline]
    pub fn alloc(&self) -> Result<SendBuf<'_>, Error> {
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
        Ok(SendBuf {
            conn: self,
            idx,
            len: 0,
            ptr: self.tx_pool.buf_ptr(idx),
            cap: self.tx_pool.buf_size(),
        })
    }

    /// [`alloc`](Self::alloc), waiting up to `timeout` for a buffer to come back.
    ///
    /// # Errors
    ///
    /// As `alloc`, with [`Error::Timeout`] instead of [`Error::WouldBlock`].
    pub fn alloc_timeout(&self, timeout: Duration) -> Result<SendBuf<'_>, Error> {
        let deadline = Instant::now() + timeout;
        let mut idler = Idler::new(self.idle);
        let mut spins = 0u32;
        loop {
            match self.alloc() {
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

    #[inline]
    fn take_buf(&self) -> Option<u32> {
        // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
        let app = unsafe { self.app() };
        let idx = match app.spare.pop() {
            Some(i) => i,
            None => app.rings.free.pop().ok()?,
        };
        // The poller only frees buffers of this pool; checked anyway since `SendBuf` relies on it.
        if idx >= self.tx_pool.count() {
            return None;
        }
        app.held += 1;
        Some(idx)
    }

    /// Sends a message (zero copy: the buffer itself is handed to the poller). In
    /// run-to-completion mode it is posted when `batch` sends have queued, on [`flush`](Self::flush),
    /// or by the next poller cycle (`try_recv`, `recv_timeout`, [`Engine::poll`]).
    ///
    /// # Errors
    ///
    /// [`SendError::WouldBlock`] (buffer handed back) when `depth` messages are in flight: the
    /// receiver has no room for more yet. [`SendError::Closed`] when the connection is down or
    /// the buffer belongs to another connection.
    #[inline]
    pub fn send<'c>(&'c self, buf: SendBuf<'c>) -> Result<(), SendError<'c>> {
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
        if !self.has_credit() {
            self.drive_poller();
            if !self.has_credit() {
                // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
                unsafe { self.app() }.would_block += 1;
                return Err(SendError::WouldBlock(buf));
            }
        }
        let desc = TxDesc {
            buf: buf.idx,
            len: buf.len,
        };
        // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
        let app = unsafe { self.app() };
        if app.rings.tx.push(desc).is_err() {
            // The send ring holds the whole pool, so this cannot happen; treat it as back-pressure.
            app.would_block += 1;
            return Err(SendError::WouldBlock(buf));
        }
        std::mem::forget(buf);
        app.held -= 1;
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

    /// Pushes queued sends out now. In run-to-completion mode this runs a poller cycle; with
    /// dedicated pollers it does nothing (they drain continuously).
    pub fn flush(&self) {
        if self.run_to_completion {
            // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
            unsafe { self.app() }.unflushed = 0;
            self.engine.poll();
        }
    }

    /// Takes the next received message, if any (in run-to-completion mode, after running a poller
    /// cycle if none was waiting). The message is read in place; dropping it recycles its buffer.
    ///
    /// # Errors
    ///
    /// [`Error::Disconnected`] / [`Error::Fabric`] once the connection is down and every message
    /// received before is taken.
    #[inline]
    pub fn try_recv(&self) -> Result<Option<Message<'_>>, Error> {
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
    /// A handler that panics loses nothing: the message it was given is recycled during the
    /// unwind, the ones not yet delivered stay queued.
    ///
    /// # Errors
    ///
    /// [`Error::Disconnected`] / [`Error::Fabric`] once the connection is down and every message
    /// received before has been delivered (a call that delivers messages returns `Ok`).
    pub fn poll(&self, mut handler: impl FnMut(&[u8]), limit: usize) -> Result<usize, Error> {
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
    fn drain_rx(&self, handler: &mut impl FnMut(&[u8]), limit: usize) -> usize {
        let mut n = 0;
        while n < limit {
            let desc = {
                // SAFETY: no other `AppSide` reference is live, and this one ends before the
                // handler runs (the handler may call back into this connection).
                let app = unsafe { self.app() };
                let Ok(desc) = app.rings.rx.pop() else {
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
        let desc = app.rings.rx.pop().ok()?;
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
        // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
        let app = unsafe { self.app() };
        app.held -= 1;
        // `spare` has capacity for the whole pool and holds only buffers we own: no reallocation.
        app.spare.push(idx);
    }

    fn release_rx(&self, idx: u32) {
        // The release ring holds the whole receive pool; a peer delivering a buffer twice could
        // overflow it, in which case the buffer is simply not returned (the peer's loss).
        // SAFETY: no other `AppSide` reference is live; none is taken while this one is used.
        let _ = unsafe { self.app() }.rings.release.push(idx);
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if self.run_to_completion {
            self.engine.poll();
        }
        self.shared.close();
        self.engine.close_connection(self.shared.id);
    }
}
