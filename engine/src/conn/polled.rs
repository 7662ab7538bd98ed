//! The polled path of a [`Connection`]: a poller (a dedicated thread, or this thread's own
//! [`Engine::poll`](crate::Engine::poll) in run-to-completion mode) drives the fabric, and the
//! application talks to it through the application↔poller rings ([`AppRings`]).
//!
//! [`Polled`] owns the application's ends of the rings, the spare lists (its buffers start in
//! the free ring and come back through it), the credit window ([`AppWindow`]: a message is in
//! flight from its `send` until the poller credits it back) and the counts.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use super::buffers::LentBuf;
use super::spare::{Counts, Spares};
use super::{Connection, Message, SendBuf, SendError};
use crate::config::Config;
use crate::desc::{
    is_large, packed_entry, RxDesc, TxDesc, BUF_INLINE, BUF_PACKED, INLINE_MAX, NO_WORDS,
    TX_INLINE_MAX,
};
use crate::error::Error;
use crate::flow::Policy;
use crate::idle::{IdleStrategy, Idler};
use crate::link::{AppRings, Pools, Posted, RtcConn};
use crate::poller::RtcGuard;
use crate::record::copy::copy_bytes;
use crate::stats::ConnStats;

use super::window::AppWindow;

mod bufs;
mod wait;

/// Longest a run-to-completion close drives the engine's poller for the connection's last
/// sends ([`Polled::linger`]): past any fabric's close grace, after which the fabric tears the
/// connection down and its poller lets go of it.
const CLOSE_LINGER: Duration = Duration::from_millis(250);

/// Longest sleep of a run-to-completion `recv_timeout` on its connection's bell while another
/// thread drives the poller (`Block`).
const RTC_BELL_SLEEP: Duration = Duration::from_millis(1);

/// The polled path's own state (see [`Polled::state`]).
struct PolledState {
    rings: AppRings,
    spare: Spares,
    /// Messages (and, for tcp, bytes) sent to the poller and not yet credited back.
    window: AppWindow,
    /// Sends queued since the last engine pass (run-to-completion mode), and their bytes of
    /// records ([`AppWindow::units`]; 0 without a byte window).
    unflushed: u32,
    unflushed_units: u64,
    /// Dedicated pollers: batched sends written into the send ring and not published yet
    /// (kept here, on this thread's own line, so that the publication points check it without
    /// loading the ring's shared tail line). A plain `send` publishes them with its own; the
    /// count left over then only costs the next publication point a look at the ring.
    deferred: u32,
    /// The packed descriptor at the receive ring's head ([`BUF_PACKED`]): messages of it left
    /// after the one taken last (0: none taken yet), and where the next one's length field is.
    packed_left: u32,
    packed_next: u32,
    counts: Counts,
}

impl PolledState {
    /// A batched send with dedicated pollers: written into the send ring and published with
    /// its run (one tail store, and one pull of that line by the poller, per run instead of
    /// per message), at the latest with the `batch`-th. `false`: the ring is full.
    ///
    /// Out of line, so that the plain send's code stays what it was before this path existed,
    /// plus one test: inlined into `send`, plain-send runs of `bench rate --fabric mem --mode
    /// dedicated --one-thread` measured 3-6 % below that build (medians; runs overlap).
    ///
    /// The descriptor comes as its fields (registers), not as a `TxDesc` or a `[_; 2]` of
    /// words (both passed in memory: the words were stored narrowly and loaded wide).
    ///
    /// # Safety
    ///
    /// As [`TxDesc::from_parts`]: with `buf == u32::MAX` both words `w0`, `w1` are initialised.
    #[inline(never)]
    unsafe fn push_batched(
        &mut self,
        buf: u32,
        len: u32,
        w0: MaybeUninit<u64>,
        w1: MaybeUninit<u64>,
        batch: u32,
    ) -> bool {
        // SAFETY: the caller's contract.
        let desc = unsafe { TxDesc::from_parts(buf, len, [w0, w1]) };
        if self.rings.tx.push_deferred(desc).is_err() {
            return false;
        }
        self.deferred += 1;
        if self.deferred >= batch {
            self.publish_run();
        }
        true
    }

    /// Publishes the `send_batched` run written into the send ring, if there is one.
    #[inline(always)]
    fn publish_run(&mut self) {
        if self.deferred != 0 {
            self.deferred = 0;
            self.rings.tx.publish_deferred();
        }
    }
}

/// The polled path; see the [module docs](self).
pub(super) struct Polled {
    state: UnsafeCell<PolledState>,
    /// Run-to-completion: this thread drives the poller inside `send`/`recv`.
    run_to_completion: bool,
    /// In run-to-completion mode, an engine pass posts the queued sends after this many.
    batch: u32,
    /// The engine's strategy is `Block`: its poller may sleep, so what this side hands it
    /// (a send, a released buffer) wakes it ([`ConnShared::wake_poller`]).
    ///
    /// [`ConnShared::wake_poller`]: crate::link::ConnShared::wake_poller
    block: bool,
    /// Run-to-completion without the rings (not `Block`): `send` posts straight to the fabric
    /// and `try_recv`/`poll` take straight from it, through the poller's half of the
    /// connection, when the fabric offers that ([`RtcConn`]); otherwise, and whenever the
    /// poller is busy elsewhere, the rings as before.
    ///
    /// Not with `Block`: there a send also has to wake whoever sleeps in the poller, and a
    /// delivery ring the receiver's bell, which the pass does.
    direct: bool,
    /// Dedicated pollers (not `Block`): a batched send is written into the send ring but
    /// published with its run ([`Connection::send_batched`]), one tail store per run.
    defer_batched: bool,
    /// Dedicated pollers, and the fabric takes inline descriptors: a message of at most
    /// [`TX_INLINE_MAX`] bytes goes through the send ring in its descriptor. Its slot brings
    /// the poller the payload (no line of the buffer to fetch from this thread's cache), and the
    /// buffer is free again at once (no free-ring round trip). Measured (`bench lat`/`rate
    /// --fabric mem --mode dedicated --one-thread --size 8`, interleaved, 3 rounds): RTT p50
    /// 813-872 -> 676-703 ns, 9.4 -> 14.1-14.6 M msgs/s. Not in run-to-completion mode, where
    /// the poller is this thread and there is no line to save: there the larger slot and the
    /// copy cost `bench cost --fabric mem --sizes 8`'s streamed `try_recv` 24.0 -> 27.2 ns.
    inline_sends: bool,
}

impl Polled {
    pub(super) fn new(
        rings: AppRings,
        pools: &Pools,
        policy: Policy,
        bytes: Option<u64>,
        cfg: &Config,
    ) -> Polled {
        // `TxDesc::inline_words` reads `TX_INLINE_MAX` bytes of the buffer, whatever the length.
        let inline_sends =
            rings.inline_sends && !cfg.run_to_completion() && pools.tx.buf_size() >= TX_INLINE_MAX;
        Polled {
            state: UnsafeCell::new(PolledState {
                rings,
                spare: Spares::empty(pools),
                window: AppWindow::new(policy, bytes),
                unflushed: 0,
                unflushed_units: 0,
                deferred: 0,
                packed_left: 0,
                packed_next: 0,
                counts: Counts::default(),
            }),
            run_to_completion: cfg.run_to_completion(),
            batch: cfg.batch as u32,
            block: matches!(cfg.idle, IdleStrategy::Block { .. }),
            direct: cfg.run_to_completion() && !matches!(cfg.idle, IdleStrategy::Block { .. }),
            defer_batched: !cfg.run_to_completion()
                && !matches!(cfg.idle, IdleStrategy::Block { .. }),
            inline_sends,
        }
    }

    /// The polled path's state.
    ///
    /// An `unsafe fn` rather than `&mut self` methods: the public API takes `&self` so that
    /// several [`SendBuf`]s and [`Message`]s can borrow the connection at once, and an
    /// `UnsafeCell` read costs nothing on the data path.
    ///
    /// # Safety
    ///
    /// The returned reference must be the only live reference to the state: the caller drops
    /// it before anything that may call `state` again (another method of this connection, a
    /// `SendBuf`/`Message` drop, a `poll` handler). Threads cannot overlap: `Connection` is
    /// `!Sync` and every handle borrowing it is `!Send`. The poller holds the other ends of
    /// the rings and never this state, so an engine pass ([`Engine::poll`](crate::Engine::poll),
    /// which runs no application code) may run while it is live.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    unsafe fn state(&self) -> &mut PolledState {
        // SAFETY: the caller guarantees that no other reference to the state is live.
        unsafe { &mut *self.state.get() }
    }

    /// In run-to-completion mode, one engine pass (which serves this connection); else
    /// nothing (dedicated pollers serve it).
    #[inline]
    fn drive(&self, conn: &Connection) -> usize {
        if self.run_to_completion {
            conn.engine.poll()
        } else {
            0
        }
    }

    /// Runs `f` on the poller's half of the connection, taking the run-to-completion poller for
    /// it (one compare-and-swap); `None` when another thread has the poller or the fabric's
    /// half is not registered (not a direct fabric, not served yet, or retired).
    #[inline]
    fn with_direct<R>(
        &self,
        conn: &Connection,
        f: impl FnOnce(&mut dyn RtcConn) -> R,
    ) -> Option<R> {
        if !conn.shared.rtc.is_registered() {
            return None;
        }
        conn.engine.rtc_guard()?.direct(&conn.shared, f)
    }

    /// [`Connection::send`] (`batched`: [`Connection::send_batched`]): the checks, the window,
    /// then the send ring; run-to-completion on a direct fabric, a plain send is posted straight
    /// to the fabric, and a batched one queued in the ring until [`flush`](Self::flush) or the
    /// `batch`-th, which posts the run straight to the fabric.
    #[inline]
    pub(super) fn send<'c>(
        &'c self,
        conn: &'c Connection,
        buf: SendBuf<'c>,
        batched: bool,
    ) -> Result<(), SendError<'c>> {
        if !conn.may_send(buf.conn) {
            return Err(conn.refuse(buf));
        }
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        let units = unsafe { self.state() }.window.units(buf.len());
        if !self.has_credit(conn, units) {
            self.drive(conn);
            // SAFETY: no other reference to the state is live; none is taken while this one is used.
            let s = unsafe { self.state() };
            // The cycle posted the queued run: the next run counts from here. Counted on, the next
            // window's first send made a run of its own (rdma: each window 1 + 127 SENDs).
            (s.unflushed, s.unflushed_units) = (0, 0);
            if !self.has_credit(conn, units) {
                return Err(self.no_credit(conn, buf));
            }
        }
        let (idx, len) = buf.parts();
        // SAFETY: no other reference to the state is live; none is taken while this one is used
        // (the engine pass below runs no application code).
        let s = unsafe { self.state() };
        if self.direct && !batched && !conn.shared.rtc.is_stream() {
            let posted = self
                .with_direct(conn, |h| {
                    // SAFETY: `idx` is a pool index (`< MAX_BUFFERS`) or `LARGE_BIT | slot`
                    // (`slot < MAX_LARGE_BUFFERS`), never `u32::MAX` (a polled connection
                    // never hands out the ring-claim marker, which only the shm direct path
                    // uses): a pooled descriptor.
                    h.send_one(unsafe { TxDesc::from_parts(idx, len, NO_WORDS) })
                })
                .unwrap_or(Posted::No);
            if posted != Posted::No {
                std::mem::forget(buf);
                if posted == Posted::Free {
                    // Copied into the fabric: the buffer is free again at once.
                    s.spare.copied(idx);
                } else {
                    s.spare.sent(idx);
                }
                s.window.on_sent(units);
                return Ok(());
            }
        }
        let inline = self.inline_sends && len as usize <= TX_INLINE_MAX && !is_large(idx);
        let (buf_field, w0, w1) = if inline {
            // SAFETY: `idx` is an ordinary buffer of the pool (`idx < count`, `SendBuf`'s
            // invariant), at least `TX_INLINE_MAX` bytes long (`inline_sends` checked it) and
            // initialised (pool memory is zero-filled when mapped), holding the `len <=
            // TX_INLINE_MAX` bytes of the message at its start.
            let [w0, w1] =
                unsafe { TxDesc::inline_words(conn.tx_pool.buf_ptr_unchecked(idx).as_ptr()) };
            (BUF_INLINE, w0, w1)
        } else {
            // A pool index or a large slot's, never the inline marker: no payload words.
            let [w0, w1] = NO_WORDS;
            (idx, w0, w1)
        };
        // With the inline marker the words are initialised (`inline_words`); otherwise
        // `buf_field` is `idx`, never `u32::MAX` (above): `from_parts`' contract either way.
        let pushed = if batched && self.defer_batched {
            // SAFETY: see above.
            unsafe { s.push_batched(buf_field, len, w0, w1, self.batch) }
        } else {
            // SAFETY: see above.
            let desc = unsafe { TxDesc::from_parts(buf_field, len, [w0, w1]) };
            s.rings.tx.push(desc).is_ok()
        };
        if !pushed {
            // The send ring holds the whole pool, so this cannot happen; treat it as back-pressure.
            s.publish_run();
            s.counts.would_block += 1;
            conn.shared.app.would_block.add(1);
            return Err(SendError::WouldBlock(buf));
        }
        std::mem::forget(buf);
        if inline {
            // In the descriptor: the buffer is ours again at once.
            s.spare.copied(idx);
        } else {
            s.spare.sent(idx);
        }
        s.window.on_sent(units);
        if self.block {
            // A fence and two loads per send, only for an engine whose poller may sleep.
            conn.shared.wake_poller();
        }
        if self.run_to_completion {
            s.unflushed += 1;
            s.unflushed_units += units;
            if s.unflushed >= self.batch || s.unflushed_units >= s.window.post_every() {
                s.unflushed = 0;
                s.unflushed_units = 0;
                self.post_queued(conn);
            }
        }
        Ok(())
    }

    /// `send` found no credit: a sender waiting for credits publishes its batched run (the
    /// credits come back for it), and the buffer goes back in the error. Out of line, the
    /// handle arriving in registers: inline, the error was built by a 16-byte load of the
    /// handle's two 8-byte spills, a store-forwarding stall per refused send behind the
    /// pending stores (a third of `Polled::send`'s samples under `perf` of `bench rate --fabric
    /// mem --mode dedicated --one-thread`, where about a third of the sends are refused).
    #[cold]
    #[inline(never)]
    fn no_credit<'c>(&self, conn: &Connection, buf: SendBuf<'c>) -> SendError<'c> {
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        let s = unsafe { self.state() };
        s.publish_run();
        s.counts.would_block += 1;
        conn.shared.app.would_block.add(1);
        SendError::WouldBlock(buf)
    }

    /// Whether the window has room for a message of `units` ([`AppWindow::units`]).
    #[inline(always)]
    fn has_credit(&self, conn: &Connection, units: u64) -> bool {
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        unsafe { self.state() }.window.has_room(units, &conn.shared)
    }

    /// [`Connection::flush`]: in run-to-completion mode an engine pass posts the queued sends;
    /// dedicated pollers drain continuously.
    #[inline(always)]
    pub(super) fn flush(&self, conn: &Connection) {
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        unsafe { self.state() }.publish_run();
        if self.run_to_completion {
            // SAFETY: no other reference to the state is live; none is taken while this one is used.
            let s = unsafe { self.state() };
            s.unflushed = 0;
            s.unflushed_units = 0;
            if self.direct
                && conn.shared.rtc.is_registered()
                && s.rings.tx.slots() == s.rings.tx.capacity()
            {
                // Nothing queued: the sends were posted directly (and a direct fabric keeps
                // nothing back for a pass to publish).
                return;
            }
            self.post_queued(conn);
        }
    }

    /// Run-to-completion: posts what waits in the send ring, straight to the fabric on a
    /// direct one (one batch, no whole pass), else (or when the poller is busy elsewhere, or
    /// the fabric did not take it all) by an engine pass.
    #[inline]
    fn post_queued(&self, conn: &Connection) {
        if self.direct && self.with_direct(conn, |h| h.post_queued(usize::MAX)) == Some(true) {
            return;
        }
        conn.engine.poll();
    }

    /// [`Connection::try_recv`]. With dedicated pollers this thread has no engine work to do:
    /// a delivered message is taken, and an empty ring on a live connection answers `None`,
    /// inline; everything else (run-to-completion's direct take and engine pass, a full
    /// stash, a connection gone down) is [`try_recv_general`](Self::try_recv_general).
    #[inline(always)]
    pub(super) fn try_recv<'c>(
        &'c self,
        conn: &'c Connection,
    ) -> Result<Option<Message<'c>>, Error> {
        if !self.run_to_completion && !conn.stash.is_full() {
            if let Some(m) = self.pop_rx(conn) {
                return Ok(Some(m));
            }
            if conn.shared.down().is_none() {
                return Ok(None);
            }
        }
        self.try_recv_general(conn)
    }

    /// [`try_recv`](Self::try_recv) in run-to-completion mode, and what its dedicated-poller
    /// fast case leaves.
    #[inline]
    fn try_recv_general<'c>(&'c self, conn: &'c Connection) -> Result<Option<Message<'c>>, Error> {
        if conn.stash.is_full() {
            return self.recv_stash_full(conn);
        }
        if let Some(m) = self.pop_rx(conn) {
            return Ok(Some(m));
        }
        let work = if self.direct && conn.shared.rtc.is_registered() {
            // One ownership compare-and-swap for the direct take and, when it finds nothing,
            // the cycle (not one each: an empty call paid two).
            match conn.engine.rtc_guard() {
                Some(mut g) => {
                    if let Some(m) = self.recv_direct(conn, &mut g) {
                        return Ok(Some(m));
                    }
                    g.poll_after_empty_take(conn.engine.now_ns())
                }
                // Another thread runs the poller (and serves this connection).
                None => 0,
            }
        } else {
            self.drive(conn)
        };
        if work > 0 {
            if let Some(m) = self.pop_rx(conn) {
                return Ok(Some(m));
            }
        }
        if let Some(d) = conn.shared.down() {
            // Anything delivered before the state changed is still ours.
            if let Some(m) = self.pop_rx(conn) {
                return Ok(Some(m));
            }
            return Err(d.to_error());
        }
        Ok(None)
    }

    /// The application holds every stash slot: an error if a message is waiting (it stays
    /// queued), else what an empty receive returns.
    #[cold]
    #[inline(never)]
    fn recv_stash_full<'c>(&'c self, conn: &'c Connection) -> Result<Option<Message<'c>>, Error> {
        if self.rx_is_empty() {
            self.drive(conn);
        }
        if !self.rx_is_empty() {
            return Err(Error::TooManyHeld {
                max: conn.stash.capacity(),
            });
        }
        match conn.shared.down() {
            Some(d) => Err(d.to_error()),
            None => Ok(None),
        }
    }

    /// The next delivered message, in a stash slot when it is inline. `None` also when every
    /// slot is held (the caller checked).
    #[inline(always)]
    fn pop_rx<'c>(&'c self, conn: &'c Connection) -> Option<Message<'c>> {
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        let s = unsafe { self.state() };
        // Read where it lies in the ring (only the payload's bytes are copied, into the slot),
        // then released: the 120-byte descriptor is not copied out. The ring first: an empty
        // one (every run-to-completion direct receive looks) takes no slot to give back. The
        // ring is stamped: the check loads the slot's stamp, in the line that brings a small
        // message's descriptor and payload (see `link::conn_pair`).
        let Ok(desc) = s.rings.rx.peek() else {
            // A receive that finds nothing publishes a batched send run (a reply may wait on it).
            s.publish_run();
            return None;
        };
        let slot = conn.stash.take()?;
        s.counts.received += 1;
        // The inline case first, as `Message::from_desc` has it (a packed descriptor costs
        // the others no compare).
        let m = if desc.buf == BUF_INLINE {
            // SAFETY: the poller's `RxSink` initialised `len <= INLINE_MAX` bytes of `data`;
            // the slot is ours and does not overlap the ring.
            unsafe { Message::copied(conn, desc.data.as_ptr().cast(), desc.len, slot) }
        } else if desc.buf == BUF_PACKED {
            // SAFETY: the poller's sink packed `desc`; the state is what the earlier takes of
            // it left.
            let (src, len, last) =
                unsafe { packed_entry(desc, &mut s.packed_left, &mut s.packed_next) };
            // SAFETY: `len <= INLINE_MAX` bytes at `src` lie in `desc.data` (`packed_entry`);
            // the slot is ours and overlaps no descriptor.
            let m = unsafe { Message::copied(conn, src, len, slot) };
            if !last {
                // More of it to take: the slot stays the ring's head.
                return Some(m);
            }
            m
        } else {
            // SAFETY: the slot is ours; the poller's sink checked a pooled descriptor's
            // buffer, offset and length, and the buffer is lent to us until released.
            unsafe { Message::from_desc(conn, desc, slot) }
        };
        s.rings.rx.release(1);
        Some(m)
    }

    /// The next message straight from the fabric (run-to-completion, [`RtcConn::recv_one`]),
    /// in a stash slot when it is inline; `g`: the poller, held by the caller.
    #[inline]
    fn recv_direct<'c>(
        &'c self,
        conn: &'c Connection,
        g: &mut RtcGuard<'_>,
    ) -> Option<Message<'c>> {
        if !conn.shared.rtc.is_registered() {
            return None;
        }
        let slot = conn.stash.take()?;
        let mut desc = MaybeUninit::<RxDesc>::uninit();
        let Some(desc) = self.take_direct(conn, g, &mut desc) else {
            conn.stash.give_back(slot);
            return None;
        };
        // SAFETY: the slot is ours; the sink checked a pooled descriptor's buffer, offset and
        // length, and the buffer is lent to us until released.
        Some(unsafe { Message::from_desc(conn, desc, slot) })
    }

    /// One message straight from the fabric ([`RtcConn::recv_one`]) into `desc`, counted;
    /// `g`: the poller, held by the caller. `None`: nothing taken.
    #[inline(always)]
    fn take_direct<'d>(
        &self,
        conn: &Connection,
        g: &mut RtcGuard<'_>,
        desc: &'d mut MaybeUninit<RxDesc>,
    ) -> Option<&'d RxDesc> {
        if g.direct_rx(&conn.shared, |h| h.recv_one(desc)) != Some(true) {
            return None;
        }
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        unsafe { self.state() }.counts.received += 1;
        // SAFETY: `recv_one` delivered into `desc` through a sink, which wrote its `len` and
        // `buf` (and the payload or offset; `data` may stay uninitialised, as `MaybeUninit`).
        Some(unsafe { desc.assume_init_ref() })
    }

    /// [`Connection::poll`]: at most one engine pass, only when the messages waiting do not
    /// fill `limit`. Run-to-completion on a direct fabric: a burst straight from the fabric
    /// first (into the receive ring, one publication, drained at once: the handler runs without
    /// the poller held, and one that panics leaves the rest there), the pass only when that
    /// found nothing.
    pub(super) fn poll(
        &self,
        conn: &Connection,
        handler: &mut impl FnMut(&[u8]),
        limit: usize,
    ) -> Result<usize, Error> {
        let mut n = self.drain_rx(conn, handler, limit);
        if n < limit {
            let work = if self.direct && conn.shared.rtc.is_registered() {
                // One ownership compare-and-swap for the take and, when it finds nothing, the
                // cycle; released before the handler runs.
                match conn.engine.rtc_guard() {
                    Some(mut g) if limit - n == 1 => {
                        // One message wanted: taken straight from the fabric into a local
                        // descriptor, as `try_recv` takes it, not pushed into the receive ring
                        // by a burst and drained from there (`bench cost --fabric mem`: a
                        // round trip through `poll(.., 1)` took about 11 ns more than through
                        // `try_recv`).
                        let mut desc = MaybeUninit::<RxDesc>::uninit();
                        if let Some(desc) = self.take_direct(conn, &mut g, &mut desc) {
                            drop(g);
                            // SAFETY: the sink checked a pooled descriptor's buffer, offset and
                            // length, and the buffer is lent to us until released.
                            unsafe { hand_over(conn, handler, desc) };
                            return Ok(n + 1);
                        }
                        g.poll_after_empty_take(conn.engine.now_ns())
                    }
                    Some(mut g) => match g.direct_rx(&conn.shared, |h| h.recv_burst(limit - n)) {
                        Some(burst) if burst > 0 => burst,
                        _ => g.poll_after_empty_take(conn.engine.now_ns()),
                    },
                    // Another thread runs the poller (and serves this connection).
                    None => 0,
                }
            } else {
                self.drive(conn)
            };
            if work > 0 {
                n += self.drain_rx(conn, handler, limit - n);
            }
        }
        if n == 0 {
            if let Some(d) = conn.shared.down() {
                // Anything delivered before the state changed is still ours.
                n = self.drain_rx(conn, handler, limit);
                if n == 0 {
                    return Err(d.to_error());
                }
            }
        }
        Ok(n)
    }

    #[inline]
    fn drain_rx(&self, conn: &Connection, handler: &mut impl FnMut(&[u8]), limit: usize) -> usize {
        let mut n = 0;
        while n < limit {
            let desc = {
                // SAFETY: no other reference to the state is live, and this one ends before
                // the handler runs (the handler may call back into this connection).
                let s = unsafe { self.state() };
                let Ok(head) = s.rings.rx.peek() else {
                    // A receive that finds nothing publishes a batched send run.
                    s.publish_run();
                    break;
                };
                s.counts.received += 1;
                if head.buf == BUF_PACKED {
                    // The next message of it, copied out as an inline descriptor of its own
                    // (the handler may receive on this connection, which takes the next).
                    // SAFETY: the poller's sink packed `head`; the state is what the earlier
                    // takes of it left.
                    let (src, len, last) =
                        unsafe { packed_entry(head, &mut s.packed_left, &mut s.packed_next) };
                    let mut one = RxDesc {
                        len,
                        buf: BUF_INLINE,
                        data: [MaybeUninit::uninit(); INLINE_MAX],
                    };
                    // SAFETY: `len <= INLINE_MAX` bytes at `src` lie in `head.data`
                    // (`packed_entry`), and `one` is a local.
                    unsafe { copy_bytes(src, one.data.as_mut_ptr().cast(), len as usize) };
                    if last {
                        s.rings.rx.release(1);
                    }
                    one
                } else {
                    let one = *head;
                    s.rings.rx.release(1);
                    one
                }
            };
            n += 1;
            // SAFETY: the poller's sink checked a pooled descriptor's buffer, offset and
            // length, and the buffer is lent to us until released.
            unsafe { hand_over(conn, handler, &desc) };
        }
        n
    }

    /// [`Connection::stats`]: the poller's counts of the fabric's side, the application's of
    /// its own.
    pub(super) fn stats(&self, conn: &Connection) -> ConnStats {
        let c = &conn.shared.counters;
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        let s = unsafe { self.state() };
        s.window.reload(&conn.shared);
        ConnStats {
            rx_msgs: c.rx_msgs.get(),
            rx_bytes: c.rx_bytes.get(),
            tx_msgs: c.tx_msgs.get(),
            tx_bytes: c.tx_bytes.get(),
            tx_stalls: c.tx_stalls.get(),
            sent: s.window.sent(),
            received: s.counts.received,
            would_block: s.counts.would_block,
            alloc_failures: s.counts.alloc_failures,
            sleeps: s.counts.sleeps,
            sleeps_unrung: s.counts.sleeps_unrung,
            in_flight: s.window.in_flight(),
        }
    }

    /// Whether no received message waits in the ring from the poller.
    pub(super) fn rx_is_empty(&self) -> bool {
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        let s = unsafe { self.state() };
        let empty = s.rings.rx.is_empty();
        if empty {
            // About to wait: a batched send run goes out first (a reply may wait on it).
            s.publish_run();
        }
        empty
    }

    /// The connection is dropped: in run-to-completion mode a last engine pass posts what
    /// `send` queued.
    pub(super) fn close(&self, conn: &Connection) {
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        unsafe { self.state() }.publish_run();
        if self.run_to_completion {
            conn.engine.poll();
        }
    }

    /// The close was asked for. Run-to-completion: nothing may run this engine's poller again
    /// (no thread of the application need ever call in), so the close drives it until the
    /// poller has let go of the connection: what the application queued is posted and, where
    /// the fabric lingers (RDMA: until every send completed, so the disconnect flushes none of
    /// it), settled. Bounded by [`CLOSE_LINGER`]; another thread running the poller meanwhile
    /// serves it too.
    #[cold]
    pub(super) fn linger(&self, conn: &Connection) {
        if !self.run_to_completion {
            return;
        }
        let deadline = Instant::now() + CLOSE_LINGER;
        let mut idler = Idler::new(IdleStrategy::backoff());
        while !conn.shared.is_retired() && Instant::now() < deadline {
            idler.idle(conn.engine.poll());
        }
    }
}

/// Runs `handler` on the message in descriptor `desc` (inline, or pooled: its buffer released
/// when the handler returns, or unwinds).
///
/// # Safety
///
/// An inline `desc` has `len <= INLINE_MAX` initialised bytes of `data`; a pooled one's buffer,
/// offset and length were checked by the sink, and the buffer is lent to this side until
/// released.
#[inline(always)]
unsafe fn hand_over(conn: &Connection, handler: &mut impl FnMut(&[u8]), desc: &RxDesc) {
    if desc.buf == BUF_INLINE {
        // SAFETY: the caller's contract: `len` initialised bytes of `data`.
        handler(unsafe {
            std::slice::from_raw_parts(desc.data.as_ptr().cast::<u8>(), desc.len as usize)
        });
    } else {
        // Dropping the message (also on unwind) recycles its buffer.
        // SAFETY: the caller's contract, passed on.
        let m = unsafe { LentBuf::new(conn, desc.buf, desc.len, desc.offset()) };
        handler(m.bytes());
    }
}
