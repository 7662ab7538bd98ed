//! The TCP fabric's data path: what a poller runs for each `tcp://` connection.
//!
//! The byte stream is a sequence of [v2 records](crate::record): `DATA` (a message), `CREDIT`
//! (cumulative messages delivered to the receiver's application) and `HEARTBEAT` (liveness).
//!
//! **Send.** [`post_send`](FabricConn::post_send) queues each message: a small one (up to the
//! inline threshold) is copied with its record header into the connection's *stage* (a byte
//! buffer) and its pool buffer is free at once; a larger one gets its 8-byte header (and padding)
//! in the stage and its payload stays in the send pool buffer. [`flush`](FabricConn::flush)
//! then writes everything queued with **one `sendmsg` per poller cycle**: an iovec list of stage
//! runs and payload slices, so consecutive small messages and credits coalesce into one entry.
//! A partial write keeps a byte offset into that list (nothing is copied again); a pooled
//! buffer is freed ([`TxDone::free_buf`]) once all its bytes are in the kernel. Copying small
//! messages once costs less than a 16-byte iovec entry per header plus one per payload. A
//! **large slot** (`LARGE_BIT | slot`, issue #12) is queued like a pooled buffer whatever its
//! length: one `DATA` record, its header in the stage and its payload written straight from the
//! slot by the same `sendmsg` path, over as many cycles as partial writes take; the slot is
//! freed once all its bytes are in the kernel. Small and large messages share the one FIFO, so
//! their order holds.
//!
//! **Receive, in place.** The connection's receive pool ([`rx_chunks`]) is a set of *chunks*,
//! each large enough for at least two records of the largest size. One non-blocking `recv`
//! per cycle fills the free tail of the current chunk (the kernel's copy is the only one), and
//! [`poll_rx`](FabricConn::poll_rx) parses the complete records at its front
//! ([`RecordReader::stream`]): a small message (up to the inline threshold) is copied into the
//! application's ring slot, a larger one is lent in place as (chunk, offset, length)
//! ([`RxSink::push_pooled_at`]). Each chunk counts the messages lent from it; it is reused once
//! every one came back ([`release_rx`](FabricConn::release_rx)) and the stream has moved on to
//! another chunk (a chunk whose records were all copied out is simply refilled from its start).
//! A record split across a chunk's end is moved (one copy of the partial tail, at most once per
//! record: from the start of a chunk every record fits) to the start of a free chunk before the
//! next `recv`; at a record boundary with less than a whole record of room left the stream
//! just moves on to a free chunk. A `recv` for a record of [`BIG_RECORD`] bytes or more stops
//! at that record's end, so the next record starts at a boundary and a large message is never
//! moved. Lent messages are bounded by the pool's chunk count (the application's release ring
//! holds that many): when they are all out, delivery waits, as it waits for ring room.
//!
//! **Receive, large messages** (issue #12, when the connection has large slots). A `DATA`
//! record of up to half a chunk (`lend_max`: 32 KiB - 8 with the default 64-KiB chunks) is
//! read into the chunks and lent in place like a pooled one, even above the buffer size: one
//! contiguous message, no slot taken, at most one move. A longer one goes into a free **large
//! receive slot**: once its header is parsed (and checked against the connection's limit), the
//! payload bytes already read into the chunk (at most the rest of one `recv`, under a chunk)
//! are copied to the slot's start, and the rest is read by `recv`s straight into the slot (the
//! kernel's copy is the only one); then [`RxSink::push_large`] lends it, and the slot is free
//! again when `LARGE_BIT | slot` comes back through [`release_rx`](FabricConn::release_rx).
//! With no free slot the stream stops at that record's header and the socket is not read
//! until the application drops a large message: TCP's window holds the sender back, whose
//! slots then stay in flight (its `alloc_large` reports `WouldBlock`). Both sizes are read by
//! the kernel's copy alone (plus that bounded prefix), so there is no cliff in copies at the
//! switch; the measurement across it (`bench`, 4 KiB .. 16 MiB) is still to be taken.
//!
//! Small messages stay copied into the descriptor rather than lent: a lent message costs a
//! release-ring round trip and a reference count, which for a message of at most
//! [`INLINE_MAX`] bytes is more than copying its bytes within the cache line the ring slot
//! takes anyway (this also keeps a chunk holding only small messages immediately reusable).
//! Measured informally (`bench rate --fabric tcp`, 2-s runs interleaved, on a heavily loaded
//! 2-core machine, so only a direction): lending 8- and 64-byte messages too was never faster
//! than copying them (64 B: 80-82 k msgs/s lent vs 124-151 k copied); to be re-measured on a
//! quiet machine.
//!
//! **Credits.** The sender may have `depth` messages in flight (the engine counts them). The
//! receiver consumes a `DATA` record only when its application's ring has a slot (and, for a
//! lent message, a chunk to lend from; for a large one, a free large slot) and then owes one
//! credit; it returns the cumulative count
//! in a `CREDIT` record, piggybacked on its next write or alone once half the depth is owed. So
//! at most `depth` messages sit in the kernel buffers and the receive buffer: a slow receiver
//! back-pressures the sender, and the kernel never queues without bound.
//!
//! **Untrusted peer.** Every header is validated: an unknown, reserved or unexpected type
//! (`BUF_REF`, `PAD`), a `DATA` payload above the connection's limit (the buffer size without
//! large slots), a malformed or zero length, reserved header bytes set, a
//! credit count that goes backwards or exceeds the messages sent, or a stream that ends inside a
//! record fail this connection with [`FabricError::Protocol`]. The end of stream is
//! [`FabricError::PeerClosed`] (after delivering what came before), as is a reset.
//!
//! This is the one fabric whose data path makes system calls: `recv` and `sendmsg`,
//! non-blocking, at most one of each per connection per cycle (see `sys`). Nothing else:
//! no allocation, lock, logging or waiting.

use std::any::Any;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use crate::desc::{is_large, large_slot, PoolView, TxDesc, INLINE_MAX};
use crate::error::FabricError;
use crate::fabric::{Fabric, FabricConn, RxSink, TxDone};
use crate::link::Pools;
use crate::record::{self, Record, RecordError, RecordReader, RecordType, RECORD_HEADER};

use super::sys::{self, Iov, IovList};

/// Zero bytes for record padding after a pooled payload.
static ZEROS: [u8; 8] = [0; 8];

/// Room kept free in the stage for one `CREDIT` and one `HEARTBEAT` record.
const CTL_ROOM: usize = 32;

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
    /// The engine's credit depth (this side's sends in flight; the peer's too).
    pub(crate) depth: usize,
    /// The peer's credit depth (from its hello): how many of its messages may be in flight to
    /// us, so credits go back at the latest when half of those are owed.
    pub(crate) peer_depth: usize,
    /// The liveness timeout (zero: off).
    pub(crate) liveness: Duration,
    /// The connection's message limit (from the handshake): the largest DATA payload either
    /// side sends; above the buffer size only with large pools.
    pub(crate) max_payload: usize,
}

/// A large record being received into a large slot (issue #12).
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
    /// DATA records queued so far (the bound for the peer's credit count).
    msgs_sent: u64,
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
    /// until `got == total`, then the message is delivered ([`RxSink::push_large`]).
    large_rx: Option<LargeRx>,
    /// Where parsed records go.
    rx: Delivery,
    /// The delivered count last put in a CREDIT record.
    credit_sent: u64,
    /// Owed credits that make a CREDIT record worth sending on its own.
    credit_batch: u64,

    // ---- liveness ----
    liveness_ns: u64,
    /// Bytes received so far (the peer's proof of life), and when that last moved.
    heard: u64,
    heard_seen: (u64, u64),
    /// Calls of `poll_rx` (when it is not called, this side is not reading: no silence counts).
    rx_polls: u64,
    rx_polls_seen: u64,
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

#[inline]
fn record_err(e: RecordError) -> FabricError {
    FabricError::Protocol(match e {
        RecordError::BadLength { .. } => "tcp record length below the header",
        RecordError::TooLong { .. } => "tcp record longer than the maximum message size",
        RecordError::UnknownType { .. } => "tcp record of unknown type",
        RecordError::Unsupported { .. } => "tcp record type not supported",
        RecordError::Reserved { .. } => "tcp record with reserved fields set",
        RecordError::BadPayload { .. } => "tcp control record of the wrong size",
        _ => "invalid tcp record",
    })
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

/// Records of at least this many bytes are read with a `recv` that stops at their end (see the
/// module docs): above 16 KiB one more `recv` (about a microsecond) costs less than the move of
/// a partial record that reading on could cause (16 KiB copied at ~16 GB/s).
pub(crate) const BIG_RECORD: usize = 16 << 10;

/// Smallest receive chunk: 64 KiB lets one `recv` carry thousands of small records.
const MIN_CHUNK: usize = 64 << 10;

/// The receive pool of a connection with `buffers` buffers of `buf_size` bytes: `(chunk bytes,
/// chunks)`. A chunk holds at least two records of the largest size (so a record split at a
/// chunk's end is moved at most once, and large messages mostly fit without a move), at least
/// [`MIN_CHUNK`]. There is one chunk more than buffers: as on the other fabrics, an
/// application holding fewer lent messages than it has buffers still receives the next one
/// (its held messages pin at most `buffers - 1` chunks, one is being read, and one is free for
/// the move of a split record). The memory is touched only as chunks are used (freed chunks are
/// reused most recent first).
pub(crate) fn rx_chunks(buf_size: usize, buffers: usize) -> Option<(usize, u32)> {
    let max_record = record::record_size(buf_size)?;
    let chunk = max_record
        .checked_mul(2)?
        .max(MIN_CHUNK)
        .checked_next_multiple_of(64)?;
    let count = u32::try_from(buffers.max(1).checked_add(1)?).ok()?;
    Some((chunk, count))
}

/// The receive side's delivery state: the receive chunks and the credit counts.
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
    /// DATA records delivered (cumulative).
    delivered: u64,
    /// Cumulative credits the peer returned; credits not yet reported to the engine.
    credits_in: u64,
    credits_unreported: u64,
    /// The large receive slots (empty without large messages).
    large: PoolView,
    /// Which large slots are in use (being read, or lent to the application).
    large_out: Box<[bool]>,
    /// Free large slots (a stack).
    large_free: Box<[u32]>,
    large_free_len: usize,
}

impl Delivery {
    /// Start of chunk `c`. Every index used here is `cur` or from the free stack, all
    /// `< count`; the check (a never-taken branch) keeps this sound for any index.
    #[inline]
    fn chunk_ptr(&self, c: u32) -> *mut u8 {
        self.rx_pool.buf_ptr(c).as_ptr()
    }

    /// Takes a free chunk.
    #[inline]
    fn take_free(&mut self) -> Option<u32> {
        self.free_len = self.free_len.checked_sub(1)?;
        Some(self.free[self.free_len])
    }

    /// Makes chunk `next` (from [`take_free`](Self::take_free)) the current one; the old one is
    /// free at once if nothing of it is lent, else when its last message comes back.
    #[inline]
    fn switch_to(&mut self, next: u32) {
        let old = std::mem::replace(&mut self.cur, next);
        if self.refs[old as usize] == 0 {
            self.push_free(old);
        }
    }

    /// Takes a free large receive slot.
    #[inline]
    fn take_large(&mut self) -> Option<u32> {
        self.large_free_len = self.large_free_len.checked_sub(1)?;
        let s = self.large_free[self.large_free_len];
        self.large_out[s as usize] = true;
        Some(s)
    }

    /// The application dropped large message `slot`: the slot is free again.
    #[inline]
    fn release_large(&mut self, slot: u32) -> Result<(), FabricError> {
        match self.large_out.get_mut(slot as usize) {
            Some(out) if *out => *out = false,
            _ => {
                return Err(FabricError::Protocol(
                    "released a large receive slot not lent",
                ))
            }
        }
        // At most `count` slots are free at once: there is room.
        if let Some(top) = self.large_free.get_mut(self.large_free_len) {
            *top = slot;
            self.large_free_len += 1;
        }
        Ok(())
    }

    #[inline]
    fn push_free(&mut self, c: u32) {
        // Each chunk is at most once on the stack, which has room for all of them.
        if let Some(slot) = self.free.get_mut(self.free_len) {
            *slot = c;
            self.free_len += 1;
        }
    }

    /// Handles one parsed record (from the current chunk).
    #[inline]
    fn deliver(
        &mut self,
        rec: Record<'_>,
        sink: &mut RxSink<'_>,
        msgs_sent: u64,
    ) -> Result<Deliver, FabricError> {
        match rec {
            Record::Data(payload) => {
                if sink.room() == 0 {
                    return Ok(Deliver::Blocked);
                }
                if payload.len() <= self.copy_max {
                    sink.push_inline(payload)?;
                } else {
                    if self.lent >= self.rx_pool.count() {
                        return Ok(Deliver::Blocked);
                    }
                    // The record was parsed from the current chunk, so its payload lies in it:
                    // `off + len <= chunk_size` (which `push_pooled_at` checks again).
                    let off =
                        (payload.as_ptr() as usize).wrapping_sub(self.chunk_ptr(self.cur) as usize);
                    let off = u32::try_from(off)
                        .map_err(|_| FabricError::Protocol("tcp record offset out of range"))?;
                    sink.push_pooled_at(self.cur, off, payload.len() as u32)?;
                    self.refs[self.cur as usize] += 1;
                    self.lent += 1;
                }
                self.delivered += 1;
            }
            Record::Credit(c) => {
                if c < self.credits_in || c > msgs_sent {
                    return Err(FabricError::Protocol(
                        "tcp credit count goes backwards or exceeds the messages sent",
                    ));
                }
                self.credits_unreported += c - self.credits_in;
                self.credits_in = c;
            }
            Record::Heartbeat(_) => {}
            _ => {
                return Err(FabricError::Protocol(
                    "tcp record type not valid on a stream",
                ))
            }
        }
        Ok(Deliver::Done)
    }
}

/// The length of the record whose first bytes are `buf`, padded, once its whole header is
/// there (and was checked by [`check_partial`]), at most `max_record`.
#[inline]
fn partial_len(buf: &[u8], max_record: usize) -> Option<usize> {
    if buf.len() < RECORD_HEADER {
        return None;
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    Some((len + pad_of(len)).min(max_record))
}

/// The reader stopped at a partial record: its header (when complete) must announce a
/// record the stream may carry, else the peer could stall the connection (a zero length,
/// a control record with a huge length, a `PAD`).
#[inline]
fn check_partial(buf: &[u8], max_payload: usize) -> Result<(), FabricError> {
    if buf.len() < RECORD_HEADER {
        return Ok(());
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let ok = match RecordType::from_u8(buf[4]) {
        Some(RecordType::Data) => len >= RECORD_HEADER && len - RECORD_HEADER <= max_payload,
        Some(RecordType::Credit | RecordType::Heartbeat) => len == RECORD_HEADER + 8,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(FabricError::Protocol("tcp record header is invalid"))
    }
}

/// The payload length of the `DATA` record whose header starts `buf` when it goes into a large
/// slot (longer than `lend_max`); `None` for any other record, or before its header is
/// complete (the record reader checks those).
///
/// # Errors
///
/// [`FabricError::Protocol`] for a `DATA` record above the connection's limit `max_payload`, or
/// one with reserved header bytes set.
#[inline]
fn large_data(
    buf: &[u8],
    lend_max: usize,
    max_payload: usize,
) -> Result<Option<usize>, FabricError> {
    if buf.len() < RECORD_HEADER || buf[4] != RecordType::Data as u8 {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let Some(payload) = len.checked_sub(RECORD_HEADER) else {
        return Ok(None);
    };
    if payload <= lend_max {
        return Ok(None);
    }
    if payload > max_payload {
        return Err(FabricError::Protocol(
            "tcp record longer than the connection's message limit",
        ));
    }
    if buf[5..8] != [0; 3] {
        return Err(FabricError::Protocol("tcp record with reserved fields set"));
    }
    Ok(Some(payload))
}

enum Deliver {
    /// Delivered (or a control record handled).
    Done,
    /// No room (application ring or receive pool): stop before this record.
    Blocked,
}

impl TcpConn {
    pub(crate) fn new(
        sock: Arc<TcpStream>,
        pools: Arc<dyn Any + Send + Sync>,
        views: Pools,
        sizes: ConnSizes,
    ) -> TcpConn {
        let Pools {
            tx: tx_pool,
            rx: rx_pool,
            tx_large,
            rx_large,
        } = views;
        let buf_size = tx_pool.buf_size();
        let copy_max = sizes.copy_max.min(INLINE_MAX).min(buf_size);
        let depth = sizes.depth.max(1);
        // The stage holds at most `depth` queued messages (credits bound them): each a copied
        // record or a header plus padding, and the control records.
        let small = record::record_size(copy_max).unwrap_or(INLINE_MAX + 16);
        let stage = (depth * small.max(16) + CTL_ROOM).max(64 << 10);
        let max_record = record::record_size(buf_size).unwrap_or(buf_size + 16);
        // `rx_pool` comes from `rx_chunks` (setup): at least 2 chunks of two whole records.
        let count = rx_pool.count();
        let chunk_size = rx_pool.buf_size();
        debug_assert!(count >= 2 && chunk_size >= 2 * max_record);
        // Without large slots nothing above the buffer size is accepted. With them, records of
        // up to half a chunk are read into the chunks like smaller ones (one contiguous lent
        // message, no slot needed: a record that does not fit the rest of a chunk is moved at
        // most once, as it fits a whole chunk from its start); longer ones go into a large slot.
        // A large record is read with its padding into a slot (setup sizes them `align8(limit)`):
        // capped here too, so the slot writes in `parse`/`fill_large` stay in the slot whatever
        // the sizes given.
        let max_payload = if rx_large.count() > 0 {
            sizes
                .max_payload
                .min(rx_large.buf_size() / 8 * 8)
                .max(buf_size)
        } else {
            buf_size
        };
        let lend_max = (chunk_size / 2 - RECORD_HEADER)
            .min(record::MAX_PAYLOAD)
            .min(max_payload)
            .max(buf_size);
        let lend_record = record::record_size(lend_max).unwrap_or(max_record);
        let large_count = rx_large.count();
        let fd = sock.as_raw_fd();
        TcpConn {
            sock,
            fd,
            _pools: pools,
            tx_pool,
            tx_large,
            max_payload,
            lend_max,
            lend_record,
            copy_max,
            stage: vec![0u8; stage].into_boxed_slice(),
            stage_len: 0,
            stage_written: 0,
            entries: vec![
                Entry::default();
                (tx_pool.count() as usize + tx_large.count() as usize)
                    .max(1)
                    .next_power_of_two()
            ]
            .into_boxed_slice(),
            free_head: 0,
            wr: 0,
            tail: 0,
            payload_written: 0,
            msgs_sent: 0,
            tx_dead: false,
            chunk_size,
            head: 0,
            tail_rx: 0,
            max_record,
            eof: false,
            large_rx: None,
            rx: Delivery {
                copy_max,
                rx_pool,
                // Chunk 0 first; the others on the free stack, lowest on top.
                cur: 0,
                refs: vec![0u32; count as usize].into_boxed_slice(),
                lent: 0,
                free: (1..count).rev().collect(),
                free_len: count.saturating_sub(1) as usize,
                delivered: 0,
                credits_in: 0,
                credits_unreported: 0,
                large: rx_large,
                large_out: vec![false; large_count as usize].into_boxed_slice(),
                // Slot 0 on top.
                large_free: (0..large_count).rev().collect(),
                large_free_len: large_count as usize,
            },
            credit_sent: 0,
            credit_batch: (sizes.peer_depth as u64 / 2).max(1),
            liveness_ns: u64::try_from(sizes.liveness.as_nanos()).unwrap_or(u64::MAX),
            heard: 0,
            heard_seen: (0, 0),
            rx_polls: 0,
            rx_polls_seen: 0,
            wrote: 0,
            wrote_seen: (0, 0),
            checked_ns: 0,
            heartbeat_due: false,
            heartbeats: 0,
        }
    }

    /// The socket (for the setup side's shutdown).
    pub(crate) fn socket(&self) -> &Arc<TcpStream> {
        &self.sock
    }

    #[inline]
    fn entry(&self, pos: u64) -> Entry {
        let mask = self.entries.len() as u64 - 1;
        self.entries[(pos & mask) as usize]
    }

    /// Anything queued that the kernel has not taken yet.
    #[inline]
    fn unwritten(&self) -> bool {
        self.stage_written < self.stage_len || self.wr != self.tail
    }

    /// Appends `bytes` to the stage (the caller checked the room).
    #[inline]
    fn stage_put(&mut self, bytes: &[u8]) {
        let end = self.stage_len + bytes.len();
        self.stage[self.stage_len..end].copy_from_slice(bytes);
        self.stage_len = end;
    }

    /// Queues the control records that are due: owed credits (when data goes out anyway, or
    /// enough are owed) and a heartbeat.
    #[inline]
    fn queue_control(&mut self) {
        let owed = self.rx.delivered - self.credit_sent;
        if owed > 0
            && (owed >= self.credit_batch || self.unwritten())
            && self.stage.len() - self.stage_len >= 16
        {
            let h = header(RecordType::Credit, 8);
            self.stage_put(&h);
            let c = self.rx.delivered.to_le_bytes();
            self.stage_put(&c);
            self.credit_sent = self.rx.delivered;
        }
        if self.heartbeat_due && self.stage.len() - self.stage_len >= 16 {
            self.heartbeat_due = false;
            self.heartbeats += 1;
            let h = header(RecordType::Heartbeat, 8);
            self.stage_put(&h);
            let s = self.heartbeats.to_le_bytes();
            self.stage_put(&s);
        }
    }

    /// Builds the gather list of everything unwritten, in stream order.
    #[inline]
    fn gather(&self, iov: &mut IovList) {
        let stage = self.stage.as_ptr();
        let mut at = self.stage_written;
        let mut pos = self.wr;
        let mut first = true;
        while pos != self.tail {
            let e = self.entry(pos);
            if at < e.stage_end {
                // SAFETY: `at < stage_end <= stage_len <= stage.len()`.
                let base = unsafe { stage.add(at) };
                if !iov.push(Iov {
                    base,
                    len: e.stage_end - at,
                }) {
                    return;
                }
            }
            at = at.max(e.stage_end);
            let skip = if first { self.payload_written } else { 0 };
            first = false;
            let len = e.len as usize;
            if skip < len {
                // SAFETY: `e.buf < count` and `len <= buf_size`, or `e.buf` is `LARGE_BIT |
                // slot` with `slot < large count` and `len <=` the slot size (checked by the
                // engine before `post_send`), so the range lies in the send pool or the large
                // send pool, which `_pools` keeps alive; the poller owns the buffer until it is
                // freed after the write.
                let base = unsafe { self.payload_ptr(e.buf).add(skip) };
                if !iov.push(Iov {
                    base,
                    len: len - skip,
                }) {
                    return;
                }
            }
            let pad = pad_of(len);
            let pad_done = skip.saturating_sub(len);
            if pad > pad_done
                && !iov.push(Iov {
                    base: ZEROS.as_ptr(),
                    len: pad - pad_done,
                })
            {
                return;
            }
            pos = pos.wrapping_add(1);
        }
        if at < self.stage_len {
            // SAFETY: `at < stage_len <= stage.len()`.
            let base = unsafe { stage.add(at) };
            iov.push(Iov {
                base,
                len: self.stage_len - at,
            });
        }
    }

    /// Start of send buffer `buf`: a pool buffer, or with
    /// [`LARGE_BIT`](crate::desc::LARGE_BIT) a large slot.
    ///
    /// # Safety
    ///
    /// `buf` is a valid index of its pool (the engine checks every send descriptor).
    #[inline]
    unsafe fn payload_ptr(&self, buf: u32) -> *const u8 {
        if is_large(buf) {
            // SAFETY: by the caller's contract, `slot < tx_large.count()`.
            unsafe { self.tx_large.buf_ptr_unchecked(large_slot(buf)).as_ptr() }
        } else {
            // SAFETY: by the caller's contract, `buf < tx_pool.count()`.
            unsafe { self.tx_pool.buf_ptr_unchecked(buf).as_ptr() }
        }
    }

    /// Accounts `n` bytes the kernel took, in [`gather`](Self::gather)'s order.
    #[inline]
    fn consume(&mut self, mut n: usize) {
        self.wrote += n as u64;
        while self.wr != self.tail {
            let e = self.entry(self.wr);
            if self.stage_written < e.stage_end {
                let k = n.min(e.stage_end - self.stage_written);
                self.stage_written += k;
                n -= k;
                if self.stage_written < e.stage_end {
                    return;
                }
            }
            let total = e.len as usize + pad_of(e.len as usize);
            let k = n.min(total - self.payload_written);
            self.payload_written += k;
            n -= k;
            if self.payload_written < total {
                return;
            }
            self.payload_written = 0;
            self.wr = self.wr.wrapping_add(1);
        }
        self.stage_written = (self.stage_written + n).min(self.stage_len);
    }

    /// The unparsed bytes of the current chunk.
    #[inline]
    fn unparsed(&self) -> &[u8] {
        // SAFETY: `head <= tail_rx <= chunk_size`, inside the current chunk, which the pool
        // (kept alive by `_pools`) holds; those bytes are the fabric's alone: lent messages lie
        // before `head`, and nothing writes the chunk while this borrow of `self` lives.
        unsafe {
            std::slice::from_raw_parts(
                self.rx.chunk_ptr(self.rx.cur).add(self.head),
                self.tail_rx - self.head,
            )
        }
    }

    /// Delivers the complete records in `[head..tail_rx]` of the current chunk; returns the
    /// messages delivered and whether delivery stopped for lack of room.
    #[inline]
    fn parse(&mut self, sink: &mut RxSink<'_>) -> Result<(usize, bool), FabricError> {
        let before = sink.written();
        let mut blocked = false;
        loop {
            if let Some(l) = self.large_rx {
                if l.got < l.total {
                    // The rest of it comes from the socket straight into the slot (`fill`).
                    break;
                }
                if sink.room() == 0 {
                    blocked = true;
                    break;
                }
                sink.push_large(l.slot, l.len)?;
                self.large_rx = None;
                self.rx.delivered += 1;
            }
            let head = self.head;
            if head == self.tail_rx {
                break;
            }
            // One record at a time (a reader per record costs a few loads), so that `head`
            // always marks what was consumed.
            // SAFETY: as in `unparsed`; the slice does not borrow `self`, because delivering
            // (which updates `self.rx`) needs it, but nothing writes these bytes meanwhile:
            // only `fill` does, and not during `parse`.
            let buf = unsafe {
                std::slice::from_raw_parts(
                    self.rx.chunk_ptr(self.rx.cur).add(head),
                    self.tail_rx - head,
                )
            };
            if let Some(payload) = large_data(buf, self.lend_max, self.max_payload)? {
                // A large record: into a free large slot, or wait here (the socket is not read
                // meanwhile: TCP's window holds the sender back).
                if sink.room() == 0 {
                    blocked = true;
                    break;
                }
                let Some(slot) = self.rx.take_large() else {
                    blocked = true;
                    break;
                };
                let total = payload + pad_of(payload);
                // What of it was read into the chunk already (at most a chunk) is copied;
                // the rest is read from the socket into the slot.
                let k = (buf.len() - RECORD_HEADER).min(total);
                // SAFETY: `slot < large count` (from the free stack), the slot holds at least
                // `align8(max_payload) >= total >= k` bytes (`new` caps `max_payload`) and is
                // the fabric's (not lent); the source
                // is `k` unparsed bytes of the current chunk; pools do not overlap.
                unsafe {
                    core::ptr::copy_nonoverlapping(
                        buf.as_ptr().add(RECORD_HEADER),
                        self.rx.large.buf_ptr_unchecked(slot).as_ptr(),
                        k,
                    );
                }
                self.head = head + RECORD_HEADER + k;
                self.large_rx = Some(LargeRx {
                    slot,
                    len: payload as u32,
                    got: k,
                    total,
                });
                continue;
            }
            let mut reader = RecordReader::stream(buf, self.lend_max).map_err(record_err)?;
            let Some(rec) = reader.next_record().map_err(record_err)? else {
                check_partial(buf, self.lend_max)?;
                break;
            };
            let used = reader.position();
            match self.rx.deliver(rec, sink, self.msgs_sent)? {
                Deliver::Done => self.head = head + used,
                Deliver::Blocked => {
                    blocked = true;
                    break;
                }
            }
        }
        Ok((sink.written() - before, blocked))
    }

    /// Makes room in the current chunk for the next `recv`, or moves on to a free chunk (see
    /// the module docs). Returns the end of the range to `recv` into (`> tail_rx`), or `None`
    /// when there is nowhere to read: every other chunk still holds lent messages.
    #[inline]
    fn make_room(&mut self) -> Option<usize> {
        let size = self.chunk_size;
        if self.head == self.tail_rx {
            if self.rx.refs[self.rx.cur as usize] == 0 {
                // Nothing lent from here: start the chunk over.
                self.head = 0;
                self.tail_rx = 0;
            } else if size - self.tail_rx < self.max_record {
                // A record boundary with less than a whole record of room: move on (nothing to
                // copy); with no free chunk, read on into the tail.
                if let Some(next) = self.rx.take_free() {
                    self.rx.switch_to(next);
                    self.head = 0;
                    self.tail_rx = 0;
                }
            }
            return (self.tail_rx < size).then_some(size);
        }
        // A partial record at `head`: its end, when its header is there; else assume the
        // largest record.
        let known = partial_len(self.unparsed(), self.lend_record);
        let need = known.unwrap_or(self.max_record);
        if self.head + need > size {
            // It cannot complete in this chunk: move its bytes to the start of a free one
            // (once: from offset 0 every record fits, `chunk_size >= 2 * max_record`).
            let next = self.rx.take_free()?;
            let n = self.tail_rx - self.head;
            // SAFETY: the source is the unparsed bytes of the current chunk (the fabric's), the
            // destination the start of chunk `next`, free (nothing lent from it, not current),
            // `n < max_record <= chunk_size` bytes; different chunks do not overlap.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    self.rx.chunk_ptr(self.rx.cur).add(self.head),
                    self.rx.chunk_ptr(next),
                    n,
                );
            }
            self.rx.switch_to(next);
            self.head = 0;
            self.tail_rx = n;
        }
        let end = match known {
            // A big record: read only to its end (then the next record starts at a boundary).
            Some(len) if len >= BIG_RECORD => (self.head + len).min(size),
            _ => size,
        };
        (self.tail_rx < end).then_some(end)
    }

    /// One non-blocking `recv` of the rest of the large record being read, straight into its
    /// slot (the kernel's copy is the only one).
    #[inline]
    fn fill_large(&mut self, mut l: LargeRx) -> Result<bool, FabricError> {
        // SAFETY: `slot < large count` (taken from the free stack), `got < total <=` the slot
        // size (`new` caps `max_payload` so that `align8(max_payload)` fits): the unread rest of a slot that only the fabric touches until
        // the message is delivered.
        let free = unsafe {
            std::slice::from_raw_parts_mut(
                self.rx.large.buf_ptr_unchecked(l.slot).as_ptr().add(l.got),
                l.total - l.got,
            )
        };
        match sys::recv(self.fd, free) {
            Ok(0) => {
                self.eof = true;
                Err(FabricError::Protocol("tcp stream ended inside a record"))
            }
            Ok(n) => {
                l.got += n;
                self.large_rx = Some(l);
                self.heard += n as u64;
                Ok(true)
            }
            Err(libc::EAGAIN | libc::EINTR) => Ok(false),
            Err(e) => {
                self.eof = true;
                Err(sock_err(e))
            }
        }
    }

    /// One non-blocking `recv` into the current chunk (or the large slot being filled);
    /// `Ok(false)` when nothing came.
    #[inline]
    fn fill(&mut self) -> Result<bool, FabricError> {
        if let Some(l) = self.large_rx {
            if l.got < l.total {
                return self.fill_large(l);
            }
            // Complete, waiting for ring room: read nothing more until it is delivered.
            return Ok(false);
        }
        let Some(end) = self.make_room() else {
            return Ok(false);
        };
        // SAFETY: `tail_rx < end <= chunk_size`: the free tail of the current chunk, which the
        // pool holds; only the fabric touches it (lent messages lie before `head <= tail_rx`),
        // and no other borrow of it is live.
        let free = unsafe {
            std::slice::from_raw_parts_mut(
                self.rx.chunk_ptr(self.rx.cur).add(self.tail_rx),
                end - self.tail_rx,
            )
        };
        match sys::recv(self.fd, free) {
            Ok(0) => {
                self.eof = true;
                if self.head != self.tail_rx {
                    return Err(FabricError::Protocol("tcp stream ended inside a record"));
                }
                Err(FabricError::PeerClosed)
            }
            Ok(n) => {
                self.tail_rx += n;
                self.heard += n as u64;
                Ok(true)
            }
            Err(libc::EAGAIN | libc::EINTR) => Ok(false),
            Err(e) => {
                self.eof = true;
                Err(sock_err(e))
            }
        }
    }
}

impl FabricConn for TcpConn {
    #[inline]
    fn rx_pending(&mut self) -> bool {
        // A socket can only be asked (a syscall); after its end only buffered bytes remain.
        !self.eof || self.head != self.tail_rx || self.large_rx.is_some()
    }

    #[inline]
    fn quiescent(&mut self) -> bool {
        !self.unwritten()
            && self.free_head == self.wr
            && self.rx.credits_unreported == 0
            && !self.heartbeat_due
            && self.rx.delivered - self.credit_sent < self.credit_batch
    }

    #[inline]
    fn copies(&self, len: u32) -> bool {
        // Exactly `post_send`'s test.
        len as usize <= self.copy_max
    }

    #[inline]
    fn poll_rx(&mut self, sink: &mut RxSink<'_>) -> Result<usize, FabricError> {
        self.rx_polls += 1;
        let (mut n, blocked) = self.parse(sink)?;
        if blocked || self.eof || sink.room() == 0 {
            return Ok(n);
        }
        if self.fill()? {
            n += self.parse(sink)?.0;
        }
        Ok(n)
    }

    #[inline]
    fn post_send(&mut self, descs: &[TxDesc], done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        if self.tx_dead {
            // The application sees the disconnect once the poller retires the connection.
            return Ok(0);
        }
        let mut n = 0;
        let cap = self.entries.len() as u64;
        for d in descs {
            let len = d.len as usize;
            let room = self.stage.len() - self.stage_len;
            // A large slot is always written from the slot (the engine marked it held).
            if !is_large(d.buf) && self.copies(d.len) {
                let need = RECORD_HEADER + len + pad_of(len);
                if room < need + CTL_ROOM {
                    break;
                }
                let h = header(RecordType::Data, len);
                self.stage_put(&h);
                // SAFETY: the engine checked `d.buf < count` and `len <= buf_size`; the poller
                // owns the buffer now (the application gave it up in `send`); the pool stays
                // mapped while `_pools` lives.
                let payload = unsafe {
                    std::slice::from_raw_parts(self.tx_pool.buf_ptr_unchecked(d.buf).as_ptr(), len)
                };
                let end = self.stage_len + len;
                self.stage[self.stage_len..end].copy_from_slice(payload);
                self.stage_len = end;
                self.stage_put(&ZEROS[..pad_of(len)]);
                // Copied: free at once (`copies` said so, the engine did not mark it held).
                done.free_copied(d.buf)?;
            } else {
                if room < RECORD_HEADER + CTL_ROOM || self.tail.wrapping_sub(self.free_head) >= cap
                {
                    break;
                }
                let h = header(RecordType::Data, len);
                self.stage_put(&h);
                let mask = cap - 1;
                self.entries[(self.tail & mask) as usize] = Entry {
                    stage_end: self.stage_len,
                    buf: d.buf,
                    len: d.len,
                };
                self.tail = self.tail.wrapping_add(1);
            }
            self.msgs_sent += 1;
            n += 1;
        }
        Ok(n)
    }

    #[inline]
    fn release_rx(&mut self, bufs: &[u32]) -> Result<(), FabricError> {
        for &b in bufs {
            let rx = &mut self.rx;
            if is_large(b) {
                rx.release_large(large_slot(b))?;
                continue;
            }
            match rx.refs.get_mut(b as usize) {
                Some(r) if *r > 0 => *r -= 1,
                _ => return Err(FabricError::Protocol("released a receive buffer not lent")),
            }
            rx.lent -= 1;
            if rx.refs[b as usize] == 0 && b != rx.cur {
                rx.push_free(b);
            }
        }
        Ok(())
    }

    #[inline]
    fn reclaim(&mut self, done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        let mut work = 0;
        while self.free_head != self.wr {
            let e = self.entry(self.free_head);
            done.free_buf(e.buf)?;
            self.free_head = self.free_head.wrapping_add(1);
            work += 1;
        }
        if self.rx.credits_unreported > 0 {
            done.credits(self.rx.credits_unreported);
            self.rx.credits_unreported = 0;
            work += 1;
        }
        Ok(work)
    }

    #[inline]
    fn flush(&mut self) -> Result<(), FabricError> {
        if self.tx_dead {
            return Ok(());
        }
        if self.stage_written == self.stage_len && self.wr == self.tail {
            // Everything is in the kernel: start the stage over.
            self.stage_len = 0;
            self.stage_written = 0;
        }
        self.queue_control();
        if !self.unwritten() {
            return Ok(());
        }
        let mut iov = IovList::new();
        self.gather(&mut iov);
        if iov.len() == 0 {
            return Ok(());
        }
        // SAFETY: `gather` describes stage bytes (owned by `self`), payloads of send-pool
        // buffers the poller owns until they are freed after this write, and the static padding.
        match unsafe { sys::sendmsg(self.fd, &iov) } {
            Ok(n) => {
                debug_assert!(n <= iov.bytes());
                self.consume(n);
            }
            Err(libc::EAGAIN | libc::EINTR) => {}
            Err(e) => {
                // Reported once; the queued buffers go back (`reclaim` frees `[free_head,
                // tail)`), and every later flush has nothing to write.
                self.tx_dead = true;
                self.wr = self.tail;
                self.payload_written = 0;
                self.stage_len = 0;
                self.stage_written = 0;
                return Err(sock_err(e));
            }
        }
        if self.stage_written == self.stage_len && self.wr == self.tail {
            self.stage_len = 0;
            self.stage_written = 0;
        }
        Ok(())
    }

    #[inline]
    fn check_peer(&mut self, now_ns: u64) -> Result<(), FabricError> {
        if self.liveness_ns == 0 || self.eof {
            return Ok(());
        }
        // This poller itself did not run for a while: it cannot tell the peer's silence from
        // its own. And while it is not reading (the application's ring is full, or bytes wait
        // to be delivered) the peer's bytes stay in the kernel: that is not silence either.
        let stalled = now_ns.saturating_sub(self.checked_ns) > self.liveness_ns / 2;
        self.checked_ns = now_ns;
        let reading = self.rx_polls != self.rx_polls_seen && self.head == self.tail_rx;
        self.rx_polls_seen = self.rx_polls;
        if self.heard != self.heard_seen.0 || stalled || !reading || self.heard_seen.1 == 0 {
            self.heard_seen = (self.heard, now_ns);
        } else {
            let silent = now_ns.saturating_sub(self.heard_seen.1);
            if silent >= self.liveness_ns {
                return Err(FabricError::PeerUnresponsive {
                    silent_for: Duration::from_nanos(silent),
                });
            }
        }
        if self.wrote != self.wrote_seen.0 || self.wrote_seen.1 == 0 {
            self.wrote_seen = (self.wrote, now_ns);
        } else if now_ns.saturating_sub(self.wrote_seen.1) >= self.liveness_ns / 4 {
            self.heartbeat_due = true;
            self.wrote_seen = (self.wrote, now_ns);
        }
        Ok(())
    }

    fn close(&mut self) {
        // The last queued bytes, best effort, then our end of stream.
        let _ = self.flush();
        sys::shutdown_write(self.fd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::MaybeUninit;

    use crate::desc::RxDesc;

    #[test]
    fn receive_chunks_hold_two_whole_records_and_one_more_than_the_buffers() {
        assert_eq!(rx_chunks(4096, 256), Some((MIN_CHUNK, 257)));
        assert_eq!(rx_chunks(8, 1), Some((MIN_CHUNK, 2)));
        let (chunk, n) = rx_chunks(40_000, 8).unwrap();
        assert_eq!(n, 9);
        assert!(chunk >= 2 * record::record_size(40_000).unwrap() && chunk % 64 == 0);
        let (chunk, _) = rx_chunks(1 << 20, 4).unwrap();
        assert_eq!(
            chunk,
            (2 * ((1 << 20) + RECORD_HEADER)).next_multiple_of(64)
        );
    }

    #[test]
    fn large_headers_are_recognised_and_checked_against_the_limit() {
        let h = |payload: usize, ty: u8| {
            let mut b = [0u8; 8];
            b[0..4].copy_from_slice(&((RECORD_HEADER + payload) as u32).to_le_bytes());
            b[4] = ty;
            b
        };
        let data = RecordType::Data as u8;
        assert_eq!(
            large_data(&h(100, data), 1000, 5000),
            Ok(None),
            "lent in place"
        );
        assert_eq!(
            large_data(&h(1000, data), 1000, 5000),
            Ok(None),
            "the lend limit"
        );
        assert_eq!(large_data(&h(1001, data), 1000, 5000), Ok(Some(1001)));
        assert_eq!(
            large_data(&h(5000, data), 1000, 5000),
            Ok(Some(5000)),
            "the limit"
        );
        assert!(
            large_data(&h(5001, data), 1000, 5000).is_err(),
            "above the limit"
        );
        assert_eq!(
            large_data(&h(5001, data)[..7], 1000, 5000),
            Ok(None),
            "partial header"
        );
        let credit = RecordType::Credit as u8;
        assert_eq!(
            large_data(&h(5001, credit), 1000, 5000),
            Ok(None),
            "the reader's"
        );
        let mut reserved = h(2000, data);
        reserved[7] = 1;
        assert!(large_data(&reserved, 1000, 5000).is_err(), "reserved bytes");
    }

    #[test]
    fn pooled_descriptors_carry_their_offset_and_the_sink_checks_the_bounds() {
        let mut mem = vec![0u8; 4 * 256];
        // SAFETY: `mem` holds 4 buffers of 256 bytes and outlives the view.
        let pool =
            unsafe { PoolView::new(std::ptr::NonNull::new(mem.as_mut_ptr()).unwrap(), 256, 4) };
        let mut slots = [MaybeUninit::<RxDesc>::uninit(); 4];
        let mut sink = RxSink::new(&mut slots, &mut [], &pool);
        sink.push_pooled_at(3, 200, 56).unwrap();
        sink.push_pooled(1, 256).unwrap();
        assert!(
            sink.push_pooled_at(0, 200, 57).is_err(),
            "past the buffer end"
        );
        assert!(sink.push_pooled_at(0, u32::MAX, 2).is_err(), "no overflow");
        assert!(sink.push_pooled_at(4, 0, 1).is_err(), "buffer out of range");
        assert_eq!(sink.written(), 2);
        // SAFETY: the sink initialised the first two slots.
        let (a, b) = unsafe { (slots[0].assume_init(), slots[1].assume_init()) };
        assert_eq!((a.buf(), a.offset(), a.len()), (Some(3), 200, 56));
        assert_eq!((b.buf(), b.offset(), b.len()), (Some(1), 0, 256));
    }
}
