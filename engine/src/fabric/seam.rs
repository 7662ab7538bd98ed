//! The poller's seam: [`Fabric`] (per-poller state), [`FabricConn`] (one connection's data path)
//! and [`ConnTable`] (a poller's connections, as [`Fabric::poll_shared`] sees them). See
//! [the module docs](crate::fabric) for the cycle.

use std::sync::Arc;

use crate::desc::TxDesc;
use crate::error::{AbortReason, FabricError};
use crate::link::PollerConn;
use crate::wake::{PollerWake, WaitSet};

use super::{RxSink, TxDone};

/// Per-poller state of a fabric (RDMA: the completion queue shared by the poller's connections).
///
/// Owned and driven by exactly one poller; see the [module docs](crate::fabric) for the cycle.
pub trait Fabric: Send + Sized + 'static {
    /// Short name for thread names and errors (`"shm"`, `"rdma"`).
    const NAME: &'static str;

    /// Per-connection data-path state.
    type Conn: FabricConn;

    /// A command the control thread sends to this poller's fabric state (RDMA: attach a device's
    /// completion queue). shm has none (`()`).
    type Command: Send + 'static;

    /// Whether a connection's receive completions arrive through
    /// [`poll_shared`](Fabric::poll_shared) only (RDMA: one CQ per poller), so that a connection's
    /// half cannot find them by itself. Run-to-completion's direct receive
    /// ([`FabricConn::RTC_DIRECT`]) then runs the shared poll first when the half has nothing
    /// pending, filing what it finds with every connection as the cycle's step 2 does. The
    /// default: `false` (each connection reads its own source).
    const SHARED_COMPLETIONS: bool = false;

    /// Handles a [`Self::Command`], on the poller thread.
    fn on_command(&mut self, command: Self::Command);

    /// A connection was just put in the poller's table ([`FabricConn::attached`]), before the
    /// next [`poll_shared`](Fabric::poll_shared): RDMA looks at the completions it parked for
    /// QPs not attached yet. The default: nothing.
    #[inline]
    fn conn_attached(&mut self) {}

    /// Polls completion sources shared by several connections, once per cycle, and returns the
    /// work done. RDMA polls its CQ here and files completions with their connections; shm has no
    /// shared source (the default does nothing).
    #[inline]
    fn poll_shared(&mut self, conns: &mut ConnTable<'_, Self::Conn>) -> usize {
        let _ = conns;
        0
    }

    /// `true` when the last [`poll_shared`](Fabric::poll_shared) stopped at its per-cycle bound
    /// with completions possibly left in the shared source, so a connection cannot tell yet
    /// that it has everything the peer sent (read only while a connection drains after its
    /// peer closed). The default: `false` (no shared source).
    #[inline]
    fn backlog(&self) -> bool {
        false
    }

    /// [`IdleStrategy::Block`](crate::IdleStrategy::Block): the poller announced that it
    /// sleeps and asks the fabric to arm its shared sources (RDMA: request a completion
    /// notification, add the completion channel's descriptor to `set`) and to re-check them
    /// after arming (RDMA: poll the CQ once more, filing what it finds with `conns`); `false`
    /// when work is pending or was done (the poller does not sleep). Not on
    /// the data path (an idle poller about to sleep): system calls are fine. The default: `true`
    /// (no shared source).
    #[inline]
    fn arm(&mut self, conns: &mut ConnTable<'_, Self::Conn>, set: &mut WaitSet) -> bool {
        let _ = (conns, set);
        true
    }

    /// After a sleep that [`arm`](Fabric::arm) prepared: consume what woke it (RDMA: take and
    /// acknowledge the channel's events). The default: nothing.
    #[inline]
    fn woke(&mut self) {}
}

/// The data-path half of one connection, driven by its poller. See the [module docs](crate::fabric).
///
/// Every method runs on the poller thread: no syscalls, locks, allocation or logging.
pub trait FabricConn: Send + 'static {
    /// Run-to-completion without the rings: when the application thread is the poller, its
    /// `send` posts straight into [`post_send`](FabricConn::post_send) (one descriptor) and its
    /// `try_recv` takes one message straight from [`poll_rx`](FabricConn::poll_rx) (a sink of
    /// one slot), between passes, in the order the rings would have kept. A fabric opts in when
    /// its methods are cheap to call that way for one message (`mem://`: a record written or
    /// read in place). The default: `false` (every message goes through the rings and a pass).
    const RTC_DIRECT: bool = false;

    /// With [`RTC_DIRECT`](Self::RTC_DIRECT): [`post_one`](Self::post_one) is for a
    /// ping-pong's send, and declines a stream's (nothing delivered since the last send), which
    /// goes through the send ring and leaves batched. After such a decline the application's
    /// sends skip the direct way (the run-to-completion guard's compare-and-swap, the lookup of
    /// the half, the decline) until a message is delivered on the connection again. The
    /// default: `false` (`post_one` is asked for every send).
    const DIRECT_SEND_AFTER_RECV: bool = false;

    /// [`post_send`](Self::post_send) takes descriptors whose payload is in the descriptor
    /// ([`TxDesc::is_inline`], at most [`TX_INLINE_MAX`](crate::desc::TX_INLINE_MAX) bytes), and
    /// copies it into its own records: such a descriptor names no buffer, so there is nothing to
    /// free for it. The application then sends a message that small that way through the send
    /// ring. The default: `false` (every descriptor names a buffer; the poller fails a
    /// connection whose send ring holds an inline one).
    const INLINE_SENDS: bool = false;

    /// The connection was put in slot `slot` of its poller's table (RDMA: encode it in `wr_id` so
    /// [`Fabric::poll_shared`] can find the connection through [`ConnTable::get_mut`]).
    #[inline]
    fn attached(&mut self, slot: u32) {
        let _ = slot;
    }

    /// [`IdleStrategy::Block`](crate::IdleStrategy::Block): the connection's poller, which may
    /// sleep, gives the connection its wake-up once, when it starts serving it (before it ever
    /// sleeps). A fabric whose peer side can hand this poller work without a descriptor
    /// (`mem://`: the peer's poller) registers it where that side finds it. The default:
    /// nothing.
    #[inline]
    fn attach_wake(&mut self, wake: &Arc<PollerWake>) {
        let _ = wake;
    }

    /// [`IdleStrategy::Block`](crate::IdleStrategy::Block): the poller announced that it
    /// sleeps; add what wakes this connection to `set` (TCP: the socket, readable, and writable
    /// while a write is pending) and re-check it after arming: `false` when work is pending
    /// already (the poller does not sleep). Not on the data path: system calls are fine. The
    /// default polls: it bounds the sleep to [`WaitSet::POLL_INTERVAL`] (a fabric that cannot be
    /// woken still makes progress, at that latency).
    #[inline]
    fn arm(&mut self, set: &mut WaitSet) -> bool {
        set.limit(WaitSet::POLL_INTERVAL);
        true
    }

    /// Cheap hint: `false` when there is certainly nothing to receive, so the poller can skip
    /// setting up a receive pass (e.g. one load of a ring's next header word). A fabric that
    /// cannot tell returns `true` (the default).
    #[inline]
    fn rx_pending(&mut self) -> bool {
        true
    }

    /// Cheaper hint, right after [`poll_rx`](Self::poll_rx) delivered: whether more messages
    /// wait (the rest of a burst). Need not report anything else [`rx_pending`](Self::rx_pending)
    /// would (a close, a failure): the next receive or pass sees those. The default asks
    /// `rx_pending`.
    #[inline]
    fn rx_more(&mut self) -> bool {
        self.rx_pending()
    }

    /// Cheap hint, right after [`poll_rx`](Self::poll_rx) delivered: whether a unit of the
    /// fabric's is delivered in part, and what it holds goes back only once the rest is (RDMA: a
    /// frame split over several calls, whose receive buffer is re-posted, and its records'
    /// credit owed, with its last record). Run-to-completion's direct receive then moves on
    /// into the receive ring, as far as the ring has room, so that it goes back at this take
    /// as in the pass. The default: `false`.
    #[inline]
    fn rx_split(&mut self) -> bool {
        false
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

    /// The application's send window of this connection in messages, when the fabric sizes it
    /// itself (tcp: its own default when `depth` was not set, its byte window bounding what is
    /// in flight). Asked once, when the connection is built. The default, `None`, is the
    /// engine's [`depth`](crate::EngineBuilder::depth).
    #[inline]
    fn app_depth(&self) -> Option<usize> {
        None
    }

    /// The application's send window of this connection in bytes of records
    /// (each message its record: header, payload, padding), beside its message window, when the
    /// fabric bounds it so (tcp without a `depth` set: its byte window, so that what the
    /// application has sent and not yet seen credited never exceeds what the peer may have in
    /// flight). The fabric then reports the bytes that come back with
    /// [`TxDone::credit_bytes`]. Asked once, when the connection is built. The default, `None`:
    /// the message window alone.
    #[inline]
    fn app_bytes(&self) -> Option<u64> {
        None
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
    /// engine checked), or, with [`INLINE_SENDS`](Self::INLINE_SENDS), the descriptor is inline
    /// (`desc.len <= TX_INLINE_MAX`, checked too). A fabric that copies a message from a buffer
    /// frees that buffer at once through `done`.
    ///
    /// # Errors
    ///
    /// A [`FabricError`] fails this connection.
    fn post_send(&mut self, descs: &[TxDesc], done: &mut TxDone<'_>) -> Result<usize, FabricError>;

    /// [`poll_rx`](Self::poll_rx) into a sink with room for one message: run-to-completion's
    /// direct receive ([`RTC_DIRECT`](Self::RTC_DIRECT)), where a fabric may inline its whole
    /// receive (the pass's bursts keep `poll_rx`). The default calls `poll_rx`.
    ///
    /// # Errors
    ///
    /// As [`poll_rx`](Self::poll_rx).
    #[inline]
    fn poll_rx_one(&mut self, sink: &mut RxSink<'_>) -> Result<usize, FabricError> {
        self.poll_rx(sink)
    }

    /// After a direct receive ([`RTC_DIRECT`](Self::RTC_DIRECT)) delivered: what the pass's
    /// [`flush`](Self::flush) does for the receive side, for a fabric whose credits go back
    /// there (RDMA: an explicit credit message once due, rendezvous acknowledgements owed), so
    /// that a receiver whose every take finds a message, and so runs no pass, still returns
    /// them. The default: nothing (mem and tcp return credits in `poll_rx` itself).
    ///
    /// # Errors
    ///
    /// As [`flush`](Self::flush).
    #[inline]
    fn rx_taken(&mut self) -> Result<(), FabricError> {
        Ok(())
    }

    /// [`post_send`](Self::post_send) of one message: run-to-completion's direct send
    /// ([`RTC_DIRECT`](Self::RTC_DIRECT)), where a fabric may inline its whole send (the pass's
    /// batches keep `post_send`). The default calls `post_send`.
    ///
    /// # Errors
    ///
    /// As [`post_send`](Self::post_send).
    #[inline]
    fn post_one(&mut self, desc: &TxDesc, done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        self.post_send(std::slice::from_ref(desc), done)
    }

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

    /// The application closed the connection; `queued`: some of what it sent still waits in
    /// its send ring (no credit or room for it yet). `true` once the connection can be torn down
    /// without losing what the fabric still has in flight. Called once per cycle, after the
    /// connection's service pass, while the closing connection lingers on its poller; it may
    /// post what it needs to find that out (a signalled send), and never blocks. The control
    /// thread's close grace bounds the wait. RDMA: nothing queued and every posted send
    /// completed (the peer holds it; a disconnect would flush what is still queued). The
    /// default: `true` (that one last pass is all a close gets: what it posted is the peer's).
    #[inline]
    fn settled(&mut self, queued: bool) -> bool {
        let _ = queued;
        true
    }

    /// This side failed the connection because of its peer (`reason`: the peer went silent or
    /// broke the protocol): tell the peer why, if the fabric can, so that it sees
    /// [`FabricError::PeerAborted`] rather than a plain close. Called once, right before
    /// [`close`](FabricConn::close); best effort (a peer that reads nothing more never learns
    /// it). Runs on the poller; must not block. The default: nothing (the peer sees a close).
    #[inline]
    fn abort(&mut self, reason: AbortReason) {
        let _ = reason;
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
