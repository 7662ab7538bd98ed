//! The TCP fabric's data path: what a poller runs for each `tcp://` connection.
//!
//! The byte stream is a sequence of [records](crate::record): `DATA` (a message), `CREDIT`
//! (cumulative messages and record bytes delivered to the receiver's application, see
//! [`Flow`]), `HEARTBEAT` (liveness) and,
//! last, `CLOSE` when the sender failed the connection because of the receiver (its reason:
//! the receiver fails with [`FabricError::PeerAborted`] after what came before).
//!
//! **Send.** [`post_send`](crate::fabric::FabricConn::post_send) queues each message: a small one
//! (up to the inline threshold) is copied with its record header into the connection's *stage* (a
//! byte buffer) and its pool buffer is free at once; a larger one gets its 8-byte header (and
//! padding) in the stage and its payload stays in the send pool buffer.
//! [`flush`](crate::fabric::FabricConn::flush) then writes everything queued with **one `sendmsg`
//! per poller cycle** (a plain `send` when that is one run of the stage): an iovec list of stage
//! runs and payload slices, so consecutive small messages and credits coalesce into one entry.
//! While the application streams (the cycle was
//! offered a full batch and took it all), a write under [`STREAM_WRITE`] bytes waits for the
//! next cycle's batch instead: about 500 8-byte messages per `sendmsg` rather than 128. A
//! partial write keeps a byte offset into that list
//! (nothing is copied again); a pooled buffer is freed
//! ([`TxDone::free_buf`](crate::fabric::TxDone::free_buf)) once all its bytes are in the kernel.
//! Copying small messages once costs less than a 16-byte iovec entry per header plus one per
//! payload. A **large slot** (`LARGE_BIT | slot`) is queued like a pooled buffer
//! whatever its length: one `DATA` record, its header in the stage and its payload written straight
//! from the slot by the same `sendmsg` path, over as many cycles as partial writes take; the slot
//! is freed once all its bytes are in the kernel. Small and large messages share the one FIFO, so
//! their order holds.
//!
//! **Run-to-completion, direct** (`FabricConn::RTC_DIRECT`): the application thread that holds
//! the poller posts a `send` straight into `post_send` (its copy into the stage) and `flush`
//! (the `sendmsg`), and a `try_recv`/`recv_timeout` takes one message from `poll_rx` (one
//! `recv` into the current chunk, the message copied into the caller's slot) without the
//! rings or a pass. A ping-pong so makes one `send` and one successful `recv` per message,
//! as the raw loop does, and no `recv` that only returns `EAGAIN` after the message: a `recv`
//! that got fewer bytes than it asked for left the socket empty, so the `rx_pending` asked
//! right after says so (once) and no burst follows. A stream keeps the rings: a single
//! `post_send` is declined when nothing was received since the last one
//! ([`TcpConn::direct_run`]), so back-to-back sends queue in the send ring and go out a
//! batch per `sendmsg` as before.
//!
//! **Receive, in place.** The connection's receive pool ([`rx_chunks`]) is a set of *chunks*, each
//! large enough for at least two records of the largest size. One non-blocking `recv` per cycle
//! fills the free tail of the current chunk (the kernel's copy is the only one), and
//! [`poll_rx`](crate::fabric::FabricConn::poll_rx) parses the complete records at its front
//! ([`RecordReader::stream`](crate::record::RecordReader::stream)): a small message (up to the
//! inline threshold) is copied into the application's ring slot, a larger one is lent in place as
//! (chunk, offset, length) ([`RxSink::push_pooled_at`](crate::fabric::RxSink::push_pooled_at)).
//! Each chunk counts the messages lent from it; it is reused once every one came back
//! ([`release_rx`](crate::fabric::FabricConn::release_rx)) and the stream has moved on to another
//! chunk (a chunk whose records were all copied out is simply refilled from its start). A record
//! split across a chunk's end is moved (one copy of the partial tail, at most once per record: from
//! the start of a chunk every record fits) to the start of a free chunk before the next `recv`; at
//! a record boundary with less than a whole record of room left the stream just moves on to a free
//! chunk. A `recv` for a record of [`BIG_RECORD`](recv::BIG_RECORD) bytes or more stops at that
//! record's end, so the next record starts at a boundary and a large message is never moved. Lent
//! messages are bounded by the pool's chunk count (the application's release ring holds that many):
//! when they are all out, delivery waits, as it waits for ring room.
//!
//! **Receive, large messages** (when the connection has large slots). A `DATA` record of
//! up to half a chunk (`lend_max`: 32 KiB - 8 with the default 64-KiB chunks) is read into the
//! chunks and lent in place like a pooled one, even above the buffer size: one contiguous message,
//! no slot taken, at most one move. A longer one goes into a free **large receive slot**: once its
//! header is parsed (and checked against the connection's limit), the payload bytes already read
//! into the chunk (at most the rest of one `recv`, under a chunk) are copied to the slot's start,
//! and the rest is read by `recv`s straight into the slot (the kernel's copy is the only one); then
//! [`RxSink::push_large`](crate::fabric::RxSink::push_large) lends it, and the slot is free again
//! when `LARGE_BIT | slot` comes back through
//! [`release_rx`](crate::fabric::FabricConn::release_rx). With no free slot the stream stops at
//! that record's header and the socket is not read until the application drops a large message:
//! TCP's window holds the sender back, whose slots then stay in flight (its `alloc_large` reports
//! `WouldBlock`). Both sizes are read by the kernel's copy alone (plus that bounded prefix), so
//! there is no cliff in copies at the switch; the measurement across it (`bench`, 4 KiB .. 16 MiB)
//! is still to be taken.
//!
//! Small messages stay copied into the descriptor rather than lent: a lent message costs a
//! release-ring round trip and a reference count, which for a message of at most
//! [`INLINE_MAX`](crate::desc::INLINE_MAX) bytes is more than copying its bytes within the cache
//! line the ring slot takes anyway (this also keeps a chunk holding only small messages immediately
//! reusable). Measured informally (`bench rate --fabric tcp`, 2-s runs interleaved, on a heavily
//! loaded 2-core machine, so only a direction): lending 8- and 64-byte messages too was never
//! faster than copying them (64 B: 80-82 k msgs/s lent vs 124-151 k copied); to be re-measured on a
//! quiet machine.
//!
//! **Credits** ([`crate::flow`], sized in one place: `ConnSizes::policies`). Each direction has
//! a *byte window*: the receiver announces in its hello how many bytes of records (headers,
//! payloads, padding) may be in flight to it ([`rx_window`]: sixteen receive chunks, 1 MiB
//! at the defaults), and `post_send` takes a `DATA` record only while the peer's window has room
//! for it (a larger one while less than half the window is in flight, so records of any size
//! never deadlock); the rest waits in the application's send ring. The engine's message
//! window (`depth` messages, which `send` checks) stays beside it: set, it bounds messages
//! as on every fabric; unset, tcp makes it as many messages as the byte window holds 16-byte
//! records ([`depth_for`]), so the bytes bound a stream of small messages, and `send` checks
//! the peer's byte window too (`FabricConn::app_bytes`; the poller hands the bytes credited
//! back on with the messages): what the application may send is what `post_send` may post,
//! so nothing waits in the send ring for credits. Before, a stream of 64-KiB messages queued
//! a whole send pool (16 MiB) behind a 2-MiB window, and that footprint halved its
//! bandwidth (`bench rate --fabric tcp --size 64k --buffer-size 64k`, interleaved: 2.9-3.4
//! GB/s before, 5.4-5.6 after; the raw send/recv loop scattered between 1.9 and 4.5 in the
//! same hour). The receiver
//! consumes a `DATA` record only when its application's ring has a slot (and, for a lent
//! message, a chunk to lend from; for a large one, a free large slot) and then owes its bytes
//! and one message; it returns both cumulative counts in one `CREDIT` record, piggybacked on
//! its next write or alone once half of either window is owed: one record per 512 KiB of a
//! one-way stream at the defaults, where a window of 128 messages returned one per 64. That
//! record is written by the receive that made it owed (`poll_rx`), not left for the next
//! `flush`: run-to-completion's direct receive runs no pass while it finds messages. So at
//! most a window of bytes sits in the kernel buffers and the receiver's chunks: a slow receiver
//! back-pressures the sender (`WouldBlock` once its send pool or message window is used up),
//! and the kernel never queues without bound.
//!
//! **Untrusted peer.** Every header is validated: an unknown, reserved or unexpected type
//! (`BUF_REF`, `PAD`), a `DATA` payload above the connection's limit (the buffer size without
//! large slots), a malformed or zero length, reserved header bytes set, a
//! credit count that goes backwards or exceeds the messages sent, or a stream that ends inside a
//! record fail this connection with [`FabricError::Protocol`]. The end of stream is
//! [`FabricError::PeerClosed`] (after delivering what came before), as is a reset.
//!
//! This is the one fabric whose data path makes system calls: `recv` and `sendmsg` (`send`
//! when the write is one contiguous run of the stage),
//! non-blocking, at most one of each per connection per cycle (see `sys`; a streaming sender
//! writes every few cycles). Nothing else:
//! no allocation, lock, logging or waiting.

use std::any::Any;
use std::net::TcpStream;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use crate::desc::PoolView;
use crate::error::FabricError;
use crate::fabric::Fabric;
use crate::flow::{CreditReturn, Policy, SendWindow};
use crate::record::{RecordType, RECORD_HEADER};

mod conn;
mod large;
mod recv;
mod send;
#[cfg(test)]
mod tests;

pub(crate) use recv::rx_chunks;

use super::MAX_RX_WINDOW;

/// Zero bytes for record padding after a pooled payload.
static ZEROS: [u8; 8] = [0; 8];

/// Room kept free in the stage for one `CREDIT` and one `HEARTBEAT` record.
const CTL_ROOM: usize = 32;

/// While the application streams (each cycle offers a full batch), `flush` writes once this
/// many bytes are queued, not every cycle: one `sendmsg` of 128 8-byte messages is 2 KiB, and
/// the syscall's fixed cost (and the loopback receive path it runs) dominates it. A cycle that
/// is offered less than a full batch (a ping-pong, the end of a burst, `Connection::flush`
/// with nothing new) writes everything at once, so latency and the flush contract are as
/// before; a deferred write goes out on the next cycle (and `close` writes it). Measured
/// against writing every cycle (`bench rate --fabric tcp`, defaults, 2-s runs interleaved on
/// the shared 2-core machine, all disturbed): 8 B 6.8 / 11.6 / 11.5 / 7.0 vs 6.1 / 7.1 / 9.1
/// / 5.1 M msgs/s, 64 B 9.9 / 17.4 / 19.8 vs 3.9 / 16.5 / 17.2 M msgs/s; 5 M 8-byte messages
/// took 9943 `sendmsg` calls (both sides) instead of 39298; `bench lat --size 8` RTT p50
/// unchanged (6.04 / 6.00 / 5.92 vs 5.98 / 6.15 / 6.02 µs before the byte window).
const STREAM_WRITE: usize = 8 << 10;

/// Per-poller state of the TCP fabric: none (every connection polls its own socket).
#[derive(Debug, Default)]
pub struct TcpFabric;

impl TcpFabric {
    /// The per-poller state.
    pub fn new() -> TcpFabric {
        TcpFabric
    }
}

impl Fabric for TcpFabric {
    const NAME: &'static str = "tcp";
    type Conn = TcpConn;
    type Command = ();

    fn on_command(&mut self, _command: ()) {}
}

/// A queued pooled message: the stage bytes before its payload end at `stage_end`.
#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    stage_end: usize,
    buf: u32,
    len: u32,
}

/// The sizes a connection is built with (from the configuration and the handshake).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnSizes {
    /// Messages up to this many bytes are copied (sent through the stage, received inline).
    pub(crate) copy_max: usize,
    /// This side's message window (the application's, which the engine holds: `depth`, or
    /// tcp's own default, [`depth_for`]).
    pub(crate) depth: usize,
    /// The peer's message window (from its hello): how many of its messages may be in flight
    /// to us, so credits go back at the latest when half of those are owed.
    pub(crate) peer_depth: usize,
    /// This side's byte window ([`rx_window`]), announced in its hello: bytes of the peer's
    /// records that may be in flight to us.
    pub(crate) rx_window: usize,
    /// The peer's byte window (from its hello): bytes of our records that may be in flight.
    pub(crate) peer_window: usize,
    /// The application's window is that byte window too ([`FabricConn::app_bytes`]): `depth`
    /// was not set, so tcp sizes the windows itself.
    ///
    /// [`FabricConn::app_bytes`]: crate::fabric::FabricConn::app_bytes
    pub(crate) app_bytes: bool,
    /// The engine's batch: a `post_send` offered this many descriptors found more queued
    /// (see [`TcpConn::streaming`]).
    pub(crate) batch: usize,
    /// The liveness timeout (zero: off).
    pub(crate) liveness: Duration,
    /// The connection's message limit (from the handshake): the largest DATA payload either
    /// side sends; above the buffer size only with large pools.
    pub(crate) max_payload: usize,
}

/// Receive chunks a connection's byte window spans ([`rx_window`]).
const WINDOW_CHUNKS: usize = 16;

/// A receiver's byte window with receive chunks of `chunk` bytes: [`WINDOW_CHUNKS`] chunks
/// (1 MiB at the default 64-KiB chunks), at most [`MAX_RX_WINDOW`].
/// The receiver reads into one chunk at a time and stops reading while that chunk holds
/// records its application has no ring room for; the rest of a window waits in the two
/// kernels' socket buffers, which TCP bounds. Sixteen chunks keep a one-way stream going while
/// credits travel back (one `CREDIT` record per half window, 512 KiB: 32768 records of 8-byte
/// messages) with room for several records of the largest message lent from the chunks; the
/// kernel's receive buffer autotunes to several MiB (`tcp_rmem`'s maximum), so the rest of
/// the window waits there. Measured (`bench rate --fabric tcp`, 2-s runs interleaved on the shared 2-core
/// machine, all disturbed, so a direction only): 16 chunks beat 4 (256 KiB) in 6 of 8 pairs
/// at 8 and 64 bytes (e.g. 64 B: 5.9 and 3.3 vs 1.6 and 2.3 M msgs/s).
pub(crate) fn rx_window(chunk: usize) -> usize {
    chunk
        .saturating_mul(WINDOW_CHUNKS)
        .min(MAX_RX_WINDOW as usize)
}

/// The application's message window of a tcp connection: the engine's `depth` when it was set
/// ([`EngineBuilder::depth`](crate::EngineBuilder::depth)), else as many messages as the byte
/// window holds records of the smallest kind (16 bytes: a header and up to 8 payload bytes),
/// so that the byte window, not a message count, bounds a stream of small messages (65536 at
/// the defaults). At most [`MAX_BUFFERS`](crate::config::MAX_BUFFERS) (the hello's bound).
pub(crate) fn depth_for(depth: usize, depth_set: bool, rx_window: usize) -> usize {
    if depth_set {
        depth
    } else {
        (rx_window / (2 * RECORD_HEADER)).clamp(depth, crate::config::MAX_BUFFERS)
    }
}

impl ConnSizes {
    /// The connection's window policies, `(this side's sends, the peer's sends)`: the one place
    /// the tcp windows are chosen. Both count bytes of records, the peer's `rx_window` for ours
    /// and ours for the peer's; credits go back on their own once half a window is owed. The
    /// message windows (`depth`, `peer_depth`) are the engine's; see [`Flow`].
    fn policies(&self) -> (Policy, Policy) {
        (
            Policy::bytes(self.peer_window),
            Policy::bytes(self.rx_window),
        )
    }
}

/// The stream bytes of a `DATA` record of `len` payload bytes: header, payload and padding.
#[inline(always)]
fn record_units(len: usize) -> u64 {
    crate::record::stream_bytes(len)
}

/// A connection's flow control, one [`crate::flow`] half per direction, in bytes, beside the
/// engine's message count.
///
/// What counts as in flight, either way: a `DATA` record queued by the sender and not yet
/// credited back, whether it is still in the sender's stage, in either kernel, in the
/// receiver's chunks or waiting for ring room. A credit stands for a record delivered to the
/// receiving application (copied, or lent in place: the lent message's chunk is not returned
/// by the credit, the receive pool bounds lending on its own), counted twice: as one message
/// (the engine's window, which the application's `send` checks) and as the record's bytes (the
/// byte window, which `post_send` checks). A `CREDIT` record carries both cumulative counts,
/// each mod 2^32: messages in its low half, bytes in its high half. Both windows are below
/// 2^31 ([`MAX_RX_WINDOW`], `MAX_BUFFERS`), so the sender recovers the
/// full counts from its own; a report that goes backwards reads as one far beyond what was
/// sent and is refused.
#[derive(Debug)]
struct Flow {
    /// This side's sends in bytes of records, against the peer's byte window.
    send: SendWindow,
    /// This side's `DATA` records queued, and those the peer credited (cumulative): the
    /// engine's message window, which the engine holds itself (it lets at most `depth`
    /// messages be in flight), so the fabric only validates the peer's count.
    sent_msgs: u64,
    credited_msgs: u64,
    /// Credits the peer returned that the engine has not been told of yet (`reclaim`):
    /// messages, and bytes of records (reported only with `app_bytes`).
    unreported: u64,
    unreported_bytes: u64,
    /// The peer's sends: bytes of `DATA` records delivered to the application (consumed), and
    /// those not yet put in a `CREDIT` record.
    recv: CreditReturn,
    /// The same records counted as messages, with the peer's message window's return batch.
    recv_msgs: CreditReturn,
}

impl Flow {
    fn new(sizes: &ConnSizes) -> Flow {
        let (send, recv) = sizes.policies();
        Flow {
            send: send.send_window(),
            sent_msgs: 0,
            credited_msgs: 0,
            unreported: 0,
            unreported_bytes: 0,
            recv: recv.credit_return(),
            recv_msgs: Policy::messages(sizes.peer_depth).credit_return(),
        }
    }

    /// Whether a `DATA` record of `len` payload bytes fits the byte window now.
    #[inline(always)]
    fn has_room(&self, len: usize) -> bool {
        self.send.has_room(record_units(len))
    }

    /// A `DATA` record of `len` payload bytes was queued.
    #[inline(always)]
    fn on_sent(&mut self, len: usize) {
        self.send.on_sent(record_units(len));
        self.sent_msgs += 1;
    }

    /// A `DATA` record of `len` payload bytes was delivered to the application.
    #[inline(always)]
    fn on_consumed(&mut self, len: usize) {
        self.recv.on_consumed(record_units(len));
        self.recv_msgs.on_consumed(1);
    }

    /// Whether a `CREDIT` record should go out now: half of either window is owed, or some
    /// are owed and `piggyback` (something is written anyway).
    #[inline(always)]
    fn credit_due(&self, piggyback: bool) -> bool {
        self.recv.due(piggyback) || self.recv_msgs.due(false)
    }

    /// Marks everything owed as returned and gives the `CREDIT` record's payload.
    #[inline(always)]
    fn take_credit(&mut self) -> u64 {
        let bytes = self.recv.take() as u32;
        let msgs = self.recv_msgs.take() as u32;
        (u64::from(bytes) << 32) | u64::from(msgs)
    }

    /// The peer's `CREDIT` record carried `c` (see [`Flow`]).
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when either count goes backwards or exceeds what was sent,
    /// or one moves without the other.
    #[inline]
    fn on_credit(&mut self, c: u64) -> Result<(), FabricError> {
        const BAD: FabricError =
            FabricError::Protocol("tcp credit count goes backwards or exceeds what was sent");
        let msgs = u64::from((c as u32).wrapping_sub(self.credited_msgs as u32));
        let bytes = u64::from(((c >> 32) as u32).wrapping_sub(self.send.credited() as u32));
        if msgs > self.sent_msgs - self.credited_msgs || (msgs == 0) != (bytes == 0) {
            return Err(BAD);
        }
        self.send.credit(bytes).map_err(|_| BAD)?;
        self.credited_msgs += msgs;
        self.unreported += msgs;
        self.unreported_bytes += bytes;
        Ok(())
    }
}

/// A large record being received into a large slot.
#[derive(Clone, Copy, Debug)]
struct LargeRx {
    /// The large receive slot (without `LARGE_BIT`).
    slot: u32,
    /// Payload bytes.
    len: u32,
    /// Bytes of payload and padding in the slot so far; `total` in all.
    got: usize,
    total: usize,
}
/// One TCP connection's data-path state.
pub struct TcpConn {
    sock: Arc<TcpStream>,
    fd: RawFd,
    /// Keeps the pools mapped.
    _pools: Arc<dyn Any + Send + Sync>,
    tx_pool: PoolView,
    /// The large send slots (empty without large messages).
    tx_large: PoolView,
    /// Largest DATA payload accepted from the peer: the connection's message limit.
    max_payload: usize,
    /// DATA payloads up to this are read into the receive chunks (and lent there); longer ones
    /// go into a large receive slot. `buffer_size <= lend_max <= max_payload`.
    lend_max: usize,
    /// `record_size(lend_max)`: the largest record read into a chunk.
    lend_record: usize,
    copy_max: usize,

    // ---- send side ----
    /// Bytes queued for the stream: record headers, small messages, padding, control records.
    stage: Box<[u8]>,
    /// Bytes of `stage` in use; `stage_written <= stage_len`.
    stage_len: usize,
    /// Bytes of `stage` the kernel has taken.
    stage_written: usize,
    /// Pooled messages: a FIFO, power-of-two capacity, positions `free_head <= wr <= tail`
    /// (wrapping u64 counters). `[free_head, wr)`: written, buffers to free; `[wr, tail)`:
    /// queued; entry `wr` has `payload_written` bytes of its payload (and padding) written.
    entries: Box<[Entry]>,
    free_head: u64,
    wr: u64,
    tail: u64,
    payload_written: usize,
    /// The engine's batch ([`ConnSizes::batch`]).
    batch: usize,
    /// The last `post_send` was offered a full batch and took all of it: the application is
    /// streaming and more is queued behind, so `flush` may leave a small write for the next
    /// cycle ([`STREAM_WRITE`]).
    streaming: bool,
    /// [`rx_pending`](crate::fabric::FabricConn::rx_pending) was asked since the last `flush`
    /// and the last accepted single `post_send` (a receive is under way), and a message was
    /// delivered since that post: run-to-completion's direct send of one message is taken
    /// only after one of them (see [`TcpConn::direct_run`]).
    rx_asked: bool,
    received: bool,
    /// A `post_send` since the last `flush` took something: a second call for the same write
    /// (the rest of a batch that wrapped around the send ring) is never declined.
    posted: bool,
    /// A write failed (the peer reset or closed the connection): what was queued is dropped
    /// (its buffers freed), nothing more is queued or written, and `flush` has nothing to do,
    /// so the poller can retire the connection once everything received is delivered.
    tx_dead: bool,

    // ---- receive side ----
    /// Bytes per receive chunk.
    chunk_size: usize,
    /// Unparsed bytes are `[head..tail_rx]` of the current chunk (`rx.cur`); everything before
    /// `head` was delivered.
    head: usize,
    tail_rx: usize,
    /// A whole record of the largest size, padded.
    max_record: usize,
    /// The peer's end of stream (or reset) was seen; nothing more is read.
    eof: bool,
    /// The large record being read into a large slot, if any: the socket is read into the slot
    /// until `got == total`, then the message is delivered
    /// ([`RxSink::push_large`](crate::fabric::RxSink::push_large)).
    large_rx: Option<LargeRx>,
    /// Where parsed records go.
    rx: Delivery,
    /// The last `recv` (in this `poll_rx`) returned fewer bytes than it asked for, so the
    /// socket was empty right then: the next `rx_pending`, if nothing else was called
    /// between, says so once (see [`TcpConn::rx_pending`]).
    rx_drained: bool,

    // ---- flow control, both directions ----
    /// The application's message window ([`depth_for`]).
    depth: usize,
    /// The application's byte window ([`FabricConn::app_bytes`]): the peer's byte window, or
    /// `None` when `depth` was set.
    ///
    /// [`FabricConn::app_bytes`]: crate::fabric::FabricConn::app_bytes
    app_bytes: Option<u64>,
    flow: Flow,

    // ---- liveness ----
    liveness_ns: u64,
    /// Bytes received so far (the peer's proof of life), and when that last moved.
    heard: u64,
    heard_seen: (u64, u64),
    /// `recv` calls on the socket (when there are none, this side is not reading: no silence
    /// counts). A partial record waiting for its rest is read on, so its silence counts.
    recvs: u64,
    recvs_seen: u64,
    /// Bytes written so far, and when that last moved (a heartbeat goes out after a quarter of
    /// the timeout of silence).
    wrote: u64,
    wrote_seen: (u64, u64),
    checked_ns: u64,
    heartbeat_due: bool,
    heartbeats: u64,
}

impl std::fmt::Debug for TcpConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpConn")
            .field("fd", &self.fd)
            .field("stage_len", &self.stage_len)
            .field("queued", &(self.tail - self.wr))
            .field("unparsed", &(self.tail_rx - self.head))
            .finish_non_exhaustive()
    }
}

/// The errno of a failed socket call as a connection failure: a reset or a broken pipe is the
/// peer going away; the rest are I/O errors.
#[inline]
fn sock_err(errno: i32) -> FabricError {
    match errno {
        libc::ECONNRESET | libc::EPIPE | libc::ENOTCONN | libc::ESHUTDOWN => {
            FabricError::PeerClosed
        }
        e => FabricError::Io(e),
    }
}

/// Writes a record header (`len` = header + payload, without padding).
#[inline]
fn header(ty: RecordType, payload: usize) -> [u8; 8] {
    let len = (RECORD_HEADER + payload) as u32;
    let l = len.to_le_bytes();
    [l[0], l[1], l[2], l[3], ty as u8, 0, 0, 0]
}

#[inline]
fn pad_of(len: usize) -> usize {
    (8 - (len % 8)) % 8
}

/// The receive side's delivery state: the receive chunks and the large receive slots.
struct Delivery {
    copy_max: usize,
    /// The receive chunks (the application reads lent messages through the same view).
    rx_pool: PoolView,
    /// The chunk the stream is being read into.
    cur: u32,
    /// Messages lent from each chunk and not yet released.
    refs: Box<[u32]>,
    /// Messages lent in all (at most `rx_pool.count()`, the release ring's capacity).
    lent: u32,
    /// Chunks that hold nothing lent and are not `cur` (a stack).
    free: Box<[u32]>,
    free_len: usize,
    /// The large receive slots (empty without large messages).
    large: PoolView,
    /// Which large slots are in use (being read, or lent to the application).
    large_out: Box<[bool]>,
    /// Free large slots (a stack).
    large_free: Box<[u32]>,
    large_free_len: usize,
}
enum Deliver {
    /// Delivered (or a control record handled).
    Done,
    /// No room (application ring or receive pool): stop before this record.
    Blocked,
}
