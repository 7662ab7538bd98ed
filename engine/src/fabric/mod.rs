//! Fabrics: the transports a poller is generic over, and the seam between them and the engine.
//!
//! A fabric has two halves that live in separate files:
//!
//! * **setup** (`fabric/<name>/setup.rs`, or a `setup/` directory, as rdma's): runs on the
//!   control thread. It performs rendezvous (shm: a Unix-socket hello plus memfd passing; RDMA:
//!   rdma_cm), creates the per-connection resources (shm: the segment; RDMA: the queue pair and
//!   the registered pool memory regions) and produces a [`FabricConn`] (or a direct path, see
//!   [below](#direct-paths)) plus the application's views of the pools ([`PoolView`]). The
//!   fabric's control half (`fabric/<name>/control.rs`, see [the control seam](#the-control-seam))
//!   then hands the connection to a poller through its command ring (a direct path goes to the
//!   application instead). Setup code makes syscalls;
//!   on the control thread it never waits on a peer (a handshake step that needs the peer's
//!   answer is a pending entry with a deadline, advanced when its descriptor is ready); on a
//!   connecting thread it blocks, bounded by the connect timeout.
//! * **datapath** (`fabric/<name>/datapath.rs`, or a `datapath/` directory, as rdma's): the
//!   [`Fabric`] and [`FabricConn`] implementations that a poller drives every cycle. No syscalls
//!   (except the RDMA doorbell write, which is an MMIO store, not a syscall, and the kernel-TCP
//!   fabric's non-blocking `recv` / `sendmsg`, at most one of each per connection per cycle,
//!   which are its data path), no locks, no allocation, no logging: count events, return
//!   [`FabricError`] on a peer's protocol violation.
//!
//! # The poller cycle, as a fabric sees it
//!
//! A poller owns one `F: Fabric` value (per-poller state: RDMA's completion queue shared by all of
//! that poller's connections; nothing for TCP) and a table of connections, each with a
//! `F::Conn: FabricConn`. One call of the poller's `do_work(now)` does:
//!
//! 1. drain at most a bounded number of commands (new connection, remove connection,
//!    [`Fabric::Command`] for the fabric itself, e.g. "here is the CQ of device X");
//! 2. [`Fabric::poll_shared`] once: RDMA polls its CQ in bursts (e.g. 32 `ibv_wc` into a stack
//!    array) and files each completion with its connection through [`ConnTable::get_mut`] (the
//!    `wr_id` carries the slot given to [`FabricConn::attached`]); TCP does nothing here;
//! 3. for every connection:
//!    * [`FabricConn::poll_rx`] delivers received messages into an [`RxSink`] (room for at most
//!      `min(batch, free slots of the application's receive ring)`; a fabric must not consume more
//!      from its peer than the sink has room for: that is how back-pressure reaches the sender);
//!    * [`FabricConn::post_send`] gets the application's send descriptors ([`TxDesc`], a batch
//!      of at most `batch`) and returns how many it accepted; the rest stay queued in the
//!      application's send ring and are offered again next cycle;
//!    * [`FabricConn::release_rx`] gets receive buffers the application dropped (RDMA: re-post
//!      them as receives);
//!    * [`FabricConn::reclaim`] reports send buffers that are free again ([`TxDone::free_buf`])
//!      and credits that came back ([`TxDone::credits`]);
//!    * [`FabricConn::flush`] publishes what was posted (RDMA: one doorbell for the chained work
//!      requests; TCP: one `sendmsg` of the coalesced records).
//!
//! Every `FabricError` fails only that connection: the poller removes it, marks it failed for the
//! application and reports it to the control thread, which emits an [`Event`](crate::Event).
//!
//! # Credits
//!
//! The engine counts credits per connection: the application may have at most `depth` messages
//! "in flight" (handed to `send`, credit not yet returned); `send` returns `WouldBlock` beyond.
//! A fabric returns a credit ([`TxDone::credits`]) only when the *receiver* has made room for one
//! more message: RDMA when the credit count piggybacked in
//! the peer's immediate data (or an explicit credit message when traffic is one-way) says a
//! receive buffer was re-posted. So the sender never has more in flight than the receiver has
//! buffers ready. (shm's direct path keeps the same `depth` window itself: a message counts until
//! the peer application consumed its record from the ring.)
//!
//! # Buffers
//!
//! Send buffers are owned by the application from `alloc` until `send`; then by the poller and
//! fabric until the fabric frees them through [`TxDone::free_buf`] (RDMA: on the send
//! completion; a fabric that copies small messages, [`FabricConn::copies`], right after the
//! copy). The
//! engine tracks ownership in a bitmap and rejects a buffer freed twice or never sent (a
//! [`FabricError::Protocol`]), so a hostile peer can never make two application handles alias one
//! buffer. Receive buffers go the other way: [`RxSink::push_pooled`] lends one to the application,
//! and its index comes back to [`FabricConn::release_rx`] when the `Message` is dropped;
//! [`RxSink::push_pooled_at`] lends a message at an offset inside a buffer, so one buffer can
//! carry several lent messages (TCP), each coming back with the buffer's index.
//!
//! # Direct paths
//!
//! A fabric whose two ends of the data path can be the two applications' threads (shm: each
//! direction's record ring in the shared segment has exactly one producer and one consumer)
//! gives the application a *direct path* instead of a [`FabricConn`]: one variant of
//! `DirectPath` (crate private; one line per such fabric, as in the poller's agent set). Its
//! setup builds the handle; its control half registers the connection without a poller
//! (`Registry::register_direct`) and keeps only what liveness and the close need (shm: the
//! rendezvous socket and a segment handle for the heartbeat words and the closed flag). The
//! `Connection` branches once per call between its poller path (the application↔poller rings)
//! and its direct path, whose calls dispatch statically and never block, lock, allocate or log.
//! A protocol violation found on a direct path fails the connection's shared state; the control
//! half reports it ([`Event::Error`](crate::Event)) and closes the connection on its next tick.
//! A direct-path fabric still has its [`Fabric`] in the poller's agent set (shm: one without
//! connections), so the control seam stays the same for every fabric.
//!
//! # The control seam
//!
//! The control thread's half of a fabric implements `FabricControl` (`fabric/control.rs`, crate
//! private): listen, install a connection, close one, the descriptors to watch and what to do
//! when they are ready (including those of handshakes in progress), a tick on every wake-up of
//! the control thread (draining the pollers' notices, expiring handshakes past their deadline,
//! heartbeats on the liveness beat) that says when the fabric next needs one, and shutdown; its
//! `FabricConnect` runs `connect` on the application's thread. The shared pieces live beside the
//! trait: a context with `emit()` for events, the generic listener and connection records, the
//! least-loaded poller choice, and one teardown model (a close is begun with a poller command
//! and finished when the poller retires the connection or the fabric's grace period ends). The
//! engine's control backend (`crate::control`) only dispatches: by endpoint scheme
//! ([`Fabric::NAME`]) for requests, to every fabric for the control loop. The control side may
//! use `dyn` (it is not the data path); the poller never does.
//!
//! # Adding a fabric (as `tcp` was)
//!
//! 1. One directory, `fabric/<name>/`: `datapath.rs` (or a `datapath/` directory, as rdma's)
//!    implements [`Fabric`] + [`FabricConn`] (`NAME` = the URL scheme), `setup.rs` (or a
//!    `setup/` directory) the rendezvous and resource creation, `control.rs` the control half
//!    (`FabricControl` on a `Registry`, plus a `FabricConnect`), `mod.rs` the module docs;
//!    declare it here (`mod <name>;`, behind its cargo feature if it has one).
//! 2. One line in the poller's agent set (`agent_set!` in `crate::poller`):
//!    `<name>: <Name>Fabric = <Name>Fabric::new(),` (with its `#[cfg]` if feature-gated). That
//!    gives every poller thread a `Poller<<Name>Fabric>` and the control thread its rings.
//! 3. One line in the dispatcher (`Dispatcher::new` in `crate::control`) that boxes the
//!    fabric's control half with `links.<name>`.
//! 4. The endpoint syntax of the new scheme in `crate::endpoint` (`Endpoint::parse`,
//!    `Endpoint::scheme`).
//!
//! Nothing else changes: the poller, the handles and the dispatcher are fabric-agnostic, and the
//! data path stays monomorphised (no `dyn`).

pub(crate) mod control;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod shm;
pub mod tcp;

use core::mem::MaybeUninit;

use rings::Producer;

use crate::desc::{RxDesc, TxDesc, BUF_INLINE, INLINE_MAX, OFF_BYTES};
use crate::error::FabricError;
use crate::link::{owned_bit, PollerConn, FREE_BATCH};

pub use crate::desc::PoolView;

/// The fabrics whose connections have a *direct path*: the application's
/// [`Connection`](crate::Connection) drives the fabric's data path itself, with no poller and
/// no application↔poller rings (shm: both ends of each record ring are the two applications'
/// threads). One variant per such fabric, as in the poller's agent set; the connection
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

    /// Sends `len` bytes of send-pool buffer `idx` (owned by the caller, validated);
    /// `batched`: not published until [`flush`](Self::flush) (or the next unbatched send, or
    /// a full window or ring).
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
    #[inline]
    pub(crate) fn claim(&self, len: usize) -> Result<Option<core::ptr::NonNull<u8>>, FabricError> {
        match self {
            DirectPath::Shm(d) => d.claim(len),
        }
    }

    /// Publishes the open claim as a `len`-byte message.
    #[inline]
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

    /// The next received message into `desc`, in place (a pooled one held until released);
    /// `Ok(false)`: none.
    #[inline]
    pub(crate) fn recv_into(&self, desc: &mut RxDesc) -> Result<bool, FabricError> {
        match self {
            DirectPath::Shm(d) => d.recv_into(desc),
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

    /// Whether the peer marked the connection closed in the data path's shared state.
    #[inline]
    pub(crate) fn peer_closed(&self) -> bool {
        match self {
            DirectPath::Shm(d) => d.peer_closed(),
        }
    }
}

/// Per-poller state of a fabric (RDMA: the completion queue shared by the poller's connections).
///
/// Owned and driven by exactly one poller; see the [module docs](self) for the cycle.
pub trait Fabric: Send + Sized + 'static {
    /// Short name for thread names and errors (`"shm"`, `"rdma"`).
    const NAME: &'static str;

    /// Per-connection data-path state.
    type Conn: FabricConn;

    /// A command the control thread sends to this poller's fabric state (RDMA: attach a device's
    /// completion queue). shm has none (`()`).
    type Command: Send + 'static;

    /// Handles a [`Self::Command`], on the poller thread.
    fn on_command(&mut self, command: Self::Command);

    /// Polls completion sources shared by several connections, once per cycle, and returns the
    /// work done. RDMA polls its CQ here and files completions with their connections; shm has no
    /// shared source (the default does nothing).
    #[inline]
    fn poll_shared(&mut self, conns: &mut ConnTable<'_, Self::Conn>) -> usize {
        let _ = conns;
        0
    }
}

/// The data-path half of one connection, driven by its poller. See the [module docs](self).
///
/// Every method runs on the poller thread: no syscalls, locks, allocation or logging.
pub trait FabricConn: Send + 'static {
    /// The connection was put in slot `slot` of its poller's table (RDMA: encode it in `wr_id` so
    /// [`Fabric::poll_shared`] can find the connection through [`ConnTable::get_mut`]).
    #[inline]
    fn attached(&mut self, slot: u32) {
        let _ = slot;
    }

    /// Cheap hint: `false` when there is certainly nothing to receive, so the poller can skip
    /// setting up a receive pass (e.g. one load of a ring's next header word). A fabric that
    /// cannot tell returns `true` (the default).
    #[inline]
    fn rx_pending(&mut self) -> bool {
        true
    }

    /// Cheap hint: `true` when [`reclaim`](FabricConn::reclaim) and [`flush`](FabricConn::flush)
    /// certainly have nothing to do now (no send buffers or credits to collect, nothing waiting
    /// to be published). Together with [`rx_pending`](FabricConn::rx_pending) `false` and empty
    /// application rings it lets the poller skip the connection's pass. A fabric that cannot tell
    /// returns `false` (the default).
    #[inline]
    fn quiescent(&mut self) -> bool {
        false
    }

    /// Cheap hint: `true` when [`post_send`](FabricConn::post_send) copies a `len`-byte message
    /// (inline in the fabric's own records) and frees its buffer right there with
    /// [`TxDone::free_copied`]. The engine then does not track that buffer in its ownership bitmap
    /// (nothing but the fabric's own copy can free it). The default is `false`: every buffer is
    /// tracked and freed through [`TxDone::free_buf`].
    #[inline]
    fn copies(&self, len: u32) -> bool {
        let _ = len;
        false
    }

    /// Delivers received messages into `sink`, at most [`RxSink::room`], and returns how many.
    ///
    /// # Errors
    ///
    /// A [`FabricError`] fails this connection (e.g. the peer wrote an invalid descriptor).
    fn poll_rx(&mut self, sink: &mut RxSink<'_>) -> Result<usize, FabricError>;

    /// Posts a batch of sends and returns how many (a prefix of `descs`) were accepted; the rest
    /// are offered again next cycle. Each `desc.buf < pool count` and `desc.len <= buf_size` (the
    /// engine checked). A fabric that copies a message (inline) frees its buffer at once through
    /// `done`.
    ///
    /// # Errors
    ///
    /// A [`FabricError`] fails this connection.
    fn post_send(&mut self, descs: &[TxDesc], done: &mut TxDone<'_>) -> Result<usize, FabricError>;

    /// Returns receive buffers the application has dropped (in the order dropped).
    ///
    /// # Errors
    ///
    /// A [`FabricError`] fails this connection.
    fn release_rx(&mut self, bufs: &[u32]) -> Result<(), FabricError>;

    /// Reports send buffers that are free again and credits that came back, and returns the work
    /// done (events handled).
    ///
    /// # Errors
    ///
    /// A [`FabricError`] fails this connection (e.g. the peer released a buffer it never got).
    fn reclaim(&mut self, done: &mut TxDone<'_>) -> Result<usize, FabricError>;

    /// Publishes everything posted this cycle (RDMA: the doorbell; TCP: the write).
    ///
    /// # Errors
    ///
    /// A [`FabricError`] fails this connection.
    fn flush(&mut self) -> Result<(), FabricError>;

    /// Cheap liveness check, called every few thousand cycles and at least every 10 ms of the
    /// coarse clock (which advances on the control thread's liveness beat), with the coarse
    /// time in ns (RDMA: sends a
    /// heartbeat on an idle connection and fails one whose peer went silent with
    /// [`FabricError::PeerUnresponsive`]). The control thread watches sockets; this catches
    /// what is visible only in the data path.
    ///
    /// # Errors
    ///
    /// [`FabricError::PeerClosed`] or another [`FabricError`] fails this connection.
    #[inline]
    fn check_peer(&mut self, now_ns: u64) -> Result<(), FabricError> {
        let _ = now_ns;
        Ok(())
    }

    /// The connection is being removed (application closed it, engine shutdown): publish a
    /// "closed" mark if the fabric has one. Runs on the poller; must not block.
    #[inline]
    fn close(&mut self) {}
}

/// The connection table of one poller, as [`Fabric::poll_shared`] sees it.
pub struct ConnTable<'a, C> {
    pub(crate) slots: &'a mut [Option<Box<PollerConn<C>>>],
}

impl<C> core::fmt::Debug for ConnTable<'_, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ConnTable")
            .field("slots", &self.slots.len())
            .finish()
    }
}

impl<C> ConnTable<'_, C> {
    /// The connection in `slot` (as given to [`FabricConn::attached`]), if any.
    #[inline]
    pub fn get_mut(&mut self, slot: u32) -> Option<&mut C> {
        match self.slots.get_mut(slot as usize) {
            Some(Some(conn)) => Some(&mut conn.fabric),
            _ => None,
        }
    }

    /// Number of slots (occupied or not).
    #[inline]
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when the table has no slots.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// Where a fabric delivers received messages: free slots of the application's receive ring.
///
/// Every push is checked: a pooled message must name a buffer of the receive pool and fit it, so
/// nothing a peer wrote can make the application read outside the pool.
pub struct RxSink<'a> {
    first: &'a mut [MaybeUninit<RxDesc>],
    second: &'a mut [MaybeUninit<RxDesc>],
    written: usize,
    bytes: u64,
    pool_count: u32,
    buf_size: u32,
    large_count: u32,
    large_size: u32,
}

impl core::fmt::Debug for RxSink<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RxSink")
            .field("room", &self.room())
            .field("written", &self.written)
            .finish()
    }
}

impl<'a> RxSink<'a> {
    pub(crate) fn new(
        first: &'a mut [MaybeUninit<RxDesc>],
        second: &'a mut [MaybeUninit<RxDesc>],
        pool: &PoolView,
    ) -> RxSink<'a> {
        RxSink {
            first,
            second,
            written: 0,
            bytes: 0,
            pool_count: pool.count(),
            buf_size: u32::try_from(pool.buf_size()).unwrap_or(u32::MAX),
            large_count: 0,
            large_size: 0,
        }
    }

    /// The sink also lends slots of the connection's large receive pool
    /// ([`push_large`](Self::push_large)).
    pub(crate) fn with_large(mut self, large: &PoolView) -> RxSink<'a> {
        self.large_count = large.count();
        self.large_size = u32::try_from(large.buf_size()).unwrap_or(u32::MAX);
        self
    }

    /// How many more messages fit.
    #[inline]
    pub fn room(&self) -> usize {
        self.first.len() + self.second.len() - self.written
    }

    /// Messages delivered so far.
    #[inline]
    pub fn written(&self) -> usize {
        self.written
    }

    #[inline]
    fn next_slot(&mut self) -> Result<&mut MaybeUninit<RxDesc>, FabricError> {
        let i = self.written;
        let slot = if i < self.first.len() {
            self.first.get_mut(i)
        } else {
            self.second.get_mut(i - self.first.len())
        };
        slot.ok_or(FabricError::Protocol(
            "receive sink overflow (fabric ignored room())",
        ))
    }

    /// Delivers a message by copying `payload` into the descriptor.
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when the sink is full or `payload` is longer than
    /// [`INLINE_MAX`] or the pool's buffer size.
    #[inline]
    pub fn push_inline(&mut self, payload: &[u8]) -> Result<(), FabricError> {
        let len = payload.len();
        if len > INLINE_MAX || len > self.buf_size as usize {
            return Err(FabricError::Protocol(
                "inline message longer than the inline limit",
            ));
        }
        let slot = self.next_slot()?;
        let p = slot.as_mut_ptr();
        // SAFETY: `p` points to a writable slot we own (a claimed ring slot); fields are written
        // through raw pointers without reading, and `len <= INLINE_MAX` bytes are copied into
        // `data`, which does not overlap `payload` (ring memory vs. fabric memory).
        unsafe {
            core::ptr::addr_of_mut!((*p).len).write(len as u32);
            core::ptr::addr_of_mut!((*p).buf).write(BUF_INLINE);
            let data = core::ptr::addr_of_mut!((*p).data).cast::<u8>();
            core::ptr::copy_nonoverlapping(payload.as_ptr(), data, len);
        }
        self.written += 1;
        self.bytes += len as u64;
        Ok(())
    }

    /// Delivers a `len`-byte message inline, written straight into the next slot by `fill`
    /// (one copy from the fabric's memory to the application's ring, no staging buffer). `fill`
    /// gets exactly `len` uninitialised bytes and must return `Ok(len)` having initialised all of
    /// them; anything else fails the push (nothing is delivered).
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when `len` exceeds the inline limit or the buffer size, when
    /// there is no room, or when `fill` does not report `len` bytes written; `fill`'s own error.
    #[inline]
    pub fn push_inline_with<F>(&mut self, len: usize, fill: F) -> Result<(), FabricError>
    where
        F: FnOnce(&mut [MaybeUninit<u8>]) -> Result<usize, FabricError>,
    {
        if len > INLINE_MAX || len > self.buf_size as usize {
            return Err(FabricError::Protocol(
                "inline message longer than the inline limit",
            ));
        }
        let slot = self.next_slot()?;
        let p = slot.as_mut_ptr();
        // SAFETY: `p` points to a writable slot we own (a claimed ring slot); `data` is an array
        // of `MaybeUninit<u8>`, valid in any state, so a unique reference to it is sound, and
        // `len <= INLINE_MAX` keeps the sub-slice in bounds.
        let data = unsafe { &mut (&mut *core::ptr::addr_of_mut!((*p).data))[..len] };
        if fill(data)? != len {
            return Err(FabricError::Protocol("inline payload copy came up short"));
        }
        // SAFETY: as above; the header fields are written without reading. The slot counts as
        // written only now, after `fill` initialised its `len` payload bytes.
        unsafe {
            core::ptr::addr_of_mut!((*p).len).write(len as u32);
            core::ptr::addr_of_mut!((*p).buf).write(BUF_INLINE);
        }
        self.written += 1;
        self.bytes += len as u64;
        Ok(())
    }

    /// Delivers a message that stays in receive-pool buffer `buf` (`len` bytes); the buffer comes
    /// back through [`FabricConn::release_rx`] when the application drops the message.
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when the sink is full, `buf` is not a buffer of the receive pool or
    /// `len` exceeds the buffer size.
    #[inline]
    pub fn push_pooled(&mut self, buf: u32, len: u32) -> Result<(), FabricError> {
        self.push_pooled_at(buf, 0, len)
    }

    /// Delivers a message that stays in receive-pool buffer `buf`, `len` bytes from byte `off`
    /// (so several messages can be lent from one buffer, each released through
    /// [`FabricConn::release_rx`] with the buffer's index when the application drops it).
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when the sink is full, `buf` is not a buffer of the receive pool or
    /// `off + len` exceeds the buffer size.
    #[inline]
    pub fn push_pooled_at(&mut self, buf: u32, off: u32, len: u32) -> Result<(), FabricError> {
        if buf >= self.pool_count {
            return Err(FabricError::Protocol("receive buffer index out of range"));
        }
        if u64::from(off) + u64::from(len) > u64::from(self.buf_size) {
            return Err(FabricError::Protocol(
                "message length exceeds the buffer size",
            ));
        }
        let slot = self.next_slot()?;
        let p = slot.as_mut_ptr();
        // SAFETY: `p` points to a writable slot we own; the header fields are written without
        // reading; the offset goes into the first `OFF_BYTES` bytes of `data` (in bounds:
        // `OFF_BYTES <= INLINE_MAX`; `write_unaligned`, as `data` is a byte array), the rest of
        // `data` stays uninitialised, which `MaybeUninit<u8>` allows.
        unsafe {
            core::ptr::addr_of_mut!((*p).len).write(len);
            core::ptr::addr_of_mut!((*p).buf).write(buf);
            core::ptr::addr_of_mut!((*p).data)
                .cast::<[u8; OFF_BYTES]>()
                .write_unaligned(off.to_ne_bytes());
        }
        self.written += 1;
        self.bytes += u64::from(len);
        Ok(())
    }

    /// Delivers a large message (issue #12) that stays in slot `slot` of the large receive pool
    /// (`len` bytes from its start); `LARGE_BIT | slot` comes back through
    /// [`FabricConn::release_rx`] when the application drops the message.
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when the sink is full, `slot` is not a slot of the large
    /// receive pool or `len` exceeds the slot size.
    #[inline]
    pub fn push_large(&mut self, slot: u32, len: u32) -> Result<(), FabricError> {
        if slot >= self.large_count {
            return Err(FabricError::Protocol("large receive slot out of range"));
        }
        if len > self.large_size {
            return Err(FabricError::Protocol(
                "large message length exceeds the slot size",
            ));
        }
        let slot_desc = self.next_slot()?;
        let p = slot_desc.as_mut_ptr();
        // SAFETY: as in `push_pooled_at`: a writable slot we own, fields written without
        // reading, the offset (0) into the first `OFF_BYTES` bytes of `data`.
        unsafe {
            core::ptr::addr_of_mut!((*p).len).write(len);
            core::ptr::addr_of_mut!((*p).buf).write(crate::desc::LARGE_BIT | slot);
            core::ptr::addr_of_mut!((*p).data)
                .cast::<[u8; OFF_BYTES]>()
                .write_unaligned(0u32.to_ne_bytes());
        }
        self.written += 1;
        self.bytes += u64::from(len);
        Ok(())
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Where a fabric reports freed send buffers and returned credits.
///
/// Freed buffers are collected and handed to the application in batches (one ring publication
/// per batch, not per buffer).
pub struct TxDone<'a> {
    pub(crate) free: &'a mut Producer<u32>,
    pub(crate) owned: &'a mut [u64],
    pub(crate) credits: u64,
    pub(crate) freed: u64,
    /// Collected buffers: scratch owned by the connection (not re-zeroed per cycle).
    pending: &'a mut [u32; FREE_BATCH],
    npending: usize,
    /// Ordinary send buffers, then large slots, in `owned` (`crate::link::owned_bit`).
    count: u32,
    large: u32,
}

impl core::fmt::Debug for TxDone<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TxDone")
            .field("credits", &self.credits)
            .field("freed", &self.freed)
            .finish()
    }
}

impl<'a> TxDone<'a> {
    /// `owned` is the bitmap of `count` ordinary send buffers followed by `large` large slots.
    pub(crate) fn new(
        free: &'a mut Producer<u32>,
        owned: &'a mut [u64],
        pending: &'a mut [u32; FREE_BATCH],
        count: u32,
        large: u32,
    ) -> TxDone<'a> {
        TxDone {
            free,
            owned,
            credits: 0,
            freed: 0,
            pending,
            npending: 0,
            count,
            large,
        }
    }

    /// Marks send buffer (or large slot) `buf` as held by the fabric, or not. `buf` was
    /// validated against the pools.
    #[inline]
    pub(crate) fn mark_owned(&mut self, buf: u32, held: bool) {
        if let Some((word, bit)) = owned_bit(buf, self.count, self.large) {
            if let Some(w) = self.owned.get_mut(word) {
                if held {
                    *w |= bit;
                } else {
                    *w &= !bit;
                }
            }
        }
    }

    /// Send buffer `buf` is free again (its message was copied, completed, or released by the peer).
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when `buf` is not a buffer the fabric holds (out of range, never
    /// sent, or freed twice): a peer releasing what it never got.
    #[inline]
    pub fn free_buf(&mut self, buf: u32) -> Result<(), FabricError> {
        let (word, bit) = owned_bit(buf, self.count, self.large).ok_or(FabricError::Protocol(
            "peer released a send buffer it does not hold",
        ))?;
        match self.owned.get_mut(word) {
            Some(w) if *w & bit != 0 => *w &= !bit,
            _ => {
                return Err(FabricError::Protocol(
                    "peer released a send buffer it does not hold",
                ))
            }
        }
        if self.npending == FREE_BATCH {
            self.publish()?;
        }
        self.pending[self.npending] = buf;
        self.npending += 1;
        self.freed += 1;
        Ok(())
    }

    /// Send buffer `buf` is free again because [`post_send`](FabricConn::post_send) copied its
    /// message, and [`FabricConn::copies`] said so for its length: the engine never marked it as
    /// held, so there is no ownership to check. Only for that case; every other free goes through
    /// [`free_buf`](Self::free_buf).
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] if the application's free ring overflows (broken accounting).
    #[inline]
    pub fn free_copied(&mut self, buf: u32) -> Result<(), FabricError> {
        debug_assert!(
            owned_bit(buf, self.count, self.large)
                .is_some_and(|(word, bit)| self.owned.get(word).is_some_and(|w| w & bit == 0)),
            "free_copied on a tracked buffer"
        );
        if self.npending == FREE_BATCH {
            self.publish()?;
        }
        self.pending[self.npending] = buf;
        self.npending += 1;
        self.freed += 1;
        Ok(())
    }

    /// `n` credits came back: the receiver made room for `n` more messages.
    #[inline]
    pub fn credits(&mut self, n: u64) {
        self.credits += n;
    }

    /// Hands the collected buffers to the application (one ring publication).
    #[inline]
    pub(crate) fn publish(&mut self) -> Result<(), FabricError> {
        if self.npending > 0 {
            // The free ring holds every buffer of the pool, so it cannot be full while these were
            // out (each was checked against the ownership bitmap above).
            // One buffer (a single small send per cycle, the latency case): a plain push, not
            // the slice copy (two `memcpy` calls).
            let all = if self.npending == 1 {
                self.free.push(self.pending[0]).is_ok()
            } else {
                self.free.push_slice(&self.pending[..self.npending]) == self.npending
            };
            self.npending = 0;
            if !all {
                return Err(FabricError::Protocol(
                    "free ring overflow (buffer accounting broken)",
                ));
            }
        }
        Ok(())
    }
}
