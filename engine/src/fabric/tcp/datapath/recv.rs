//! The receive side: the receive chunks, one `recv` per cycle into the current one, the
//! parsing of complete records at its front and their delivery (copied or lent in place), and
//! the validation of a partial record's header.

use crate::error::FabricError;
use crate::fabric::RxSink;
use crate::record::{self, Record, RecordError, RecordReader, RecordType, RECORD_HEADER};

use super::super::sys;
use super::large::large_data;
use super::{pad_of, sock_err, Deliver, Delivery, Flow, LargeRx, TcpConn};

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

/// Records of at least this many bytes are read with a `recv` that stops at their end (see the
/// module docs): above 16 KiB one more `recv` (about a microsecond) costs less than the move of
/// a partial record that reading on could cause (16 KiB copied at ~16 GB/s).
pub(crate) const BIG_RECORD: usize = 16 << 10;

/// Smallest receive chunk: 64 KiB lets one `recv` carry thousands of small records.
pub(super) const MIN_CHUNK: usize = 64 << 10;

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
    #[inline]
    pub(super) fn push_free(&mut self, c: u32) {
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
        flow: &mut Flow,
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
                flow.on_consumed(payload.len());
            }
            Record::Credit(c) => flow.on_credit(c)?,
            Record::Heartbeat(_) => {}
            // The peer failed the connection because of this side: everything it sent before
            // was parsed (and delivered) first.
            Record::Close { reason } => return Err(FabricError::peer_close(reason)),
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
        Some(RecordType::Credit | RecordType::Heartbeat | RecordType::Close) => {
            len == RECORD_HEADER + 8
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(FabricError::Protocol("tcp record header is invalid"))
    }
}

/// The common records without the general reader: a complete `DATA` record of at most
/// `lend_max` bytes or a `CREDIT` record at the front of `buf`, with the bytes it uses (`None`:
/// anything else, or not complete, is the general reader's). Every byte of the header is
/// checked as [`RecordHeader::parse_word`](crate::record::RecordHeader::parse_word) does: the
/// type, zero flags and aux (the header's upper half is the type alone), the length.
///
/// Measured (callgrind, `bench cost --fabric tcp --sizes 8 --iters 20000`, collected in the
/// round trips only): a delivering `try_recv` (a ping-pong's record and the credit riding on
/// it) 792 -> 613 instructions, `parse` 459 -> 280 of it.
#[inline(always)]
fn small_record(buf: &[u8], lend_max: usize) -> Option<(Record<'_>, usize)> {
    let word = u64::from_le_bytes(*buf.first_chunk::<RECORD_HEADER>()?);
    let len = word as u32 as usize;
    let ty = word >> 32;
    if ty == RecordType::Data as u64 {
        // `len < 8` wraps to a huge payload and fails the compare (the general reader reports
        // it).
        let used = len + pad_of(len);
        if len.wrapping_sub(RECORD_HEADER) > lend_max || used > buf.len() {
            return None;
        }
        return Some((Record::Data(&buf[RECORD_HEADER..len]), used));
    }
    if ty == RecordType::Credit as u64 && len == RECORD_HEADER + 8 {
        let c = buf.get(RECORD_HEADER..len)?.first_chunk::<8>()?;
        return Some((Record::Credit(u64::from_le_bytes(*c)), len));
    }
    None
}

impl TcpConn {
    /// Whether received bytes wait to be delivered: unparsed bytes in the chunk, or a large
    /// record being received.
    #[inline(always)]
    pub(super) fn buffered(&self) -> bool {
        self.head != self.tail_rx || self.large_rx.is_some()
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
    pub(super) fn parse(&mut self, sink: &mut RxSink<'_>) -> Result<(usize, bool), FabricError> {
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
                self.flow.on_consumed(l.len as usize);
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
            let (rec, used) = if let Some(small) = small_record(buf, self.lend_max) {
                small
            } else if let Some(payload) = large_data(buf, self.lend_max, self.max_payload)? {
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
            } else {
                let mut reader = RecordReader::stream(buf, self.lend_max).map_err(record_err)?;
                let Some(rec) = reader.next_record().map_err(record_err)? else {
                    check_partial(buf, self.lend_max)?;
                    break;
                };
                (rec, reader.position())
            };
            match self.rx.deliver(rec, sink, &mut self.flow)? {
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

    /// One non-blocking `recv` into the current chunk (or the large slot being filled);
    /// `Ok(false)` when nothing came.
    #[inline]
    pub(super) fn fill(&mut self) -> Result<bool, FabricError> {
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
        self.recvs += 1;
        match sys::recv(self.fd, free) {
            Ok(0) => {
                self.eof = true;
                if self.head != self.tail_rx {
                    return Err(FabricError::Protocol("tcp stream ended inside a record"));
                }
                Err(FabricError::PeerClosed)
            }
            Ok(n) => {
                // Fewer bytes than asked: the socket was empty right then.
                self.rx_drained = n < end - self.tail_rx;
                self.tail_rx += n;
                self.heard += n as u64;
                Ok(true)
            }
            // Not remembered as `rx_drained`: a run-to-completion receiver's next direct look,
            // one spin later, must ask the socket again (a cycle runs only after every 8th empty
            // look; remembered, every other look skipped its `recv`).
            Err(libc::EAGAIN | libc::EINTR) => Ok(false),
            Err(e) => {
                self.eof = true;
                Err(sock_err(e))
            }
        }
    }
}
