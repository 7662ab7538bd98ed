//! The ring's consuming end: [`Consumer`].

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use super::error::RingError;
#[cfg(not(loom))]
use super::{check_limit, region_dyn, RingMemory};
use crate::record::region::{Ordering, Region};
use crate::record::{Record, RecordError, RecordHeader, RecordType, RECORD_ALIGN, RECORD_HEADER};

/// Bytes of a cache line: the record area starts on a line (the region is page-aligned and
/// its position lines take 256 bytes).
const CACHE_LINE: usize = 64;

/// The consuming end: polls published records and hands them to a handler in place.
///
/// `Send + !Sync`; see the [module docs](super) for the protocol and the trust model.
pub struct Consumer {
    /// This end's copy of the region (see [`Region`]'s `Clone`).
    region: Region,
    cap: usize,
    max_payload: usize,
    /// Next record position (a multiple of 8).
    pos: u64,
    /// The position last published to the producer (`published <= pos`): by [`poll`] at the
    /// end of its batch, by [`publish`] after [`poll_deferred`]. Honest records end within
    /// `published + cap - 8`.
    ///
    /// [`poll`]: Consumer::poll
    /// [`publish`]: Consumer::publish
    /// [`poll_deferred`]: Consumer::poll_deferred
    published: u64,
    /// `cap - 8`: no honest record ends beyond `published + span` (see [`poll`](Consumer::poll));
    /// `0` once the consumer is failed or [`poison`](Consumer::poison)ed, so that
    /// [`take_data`](Consumer::take_data)'s range check refuses every record (each is at least
    /// 8 bytes, and `published <= pos`) and hands it to `poll_deferred`, which reports the
    /// failure: no separate failed check per record.
    span: u64,
    failed: Option<RingError>,
    /// Loom only: DATA payloads are copied out of the tracked words into this.
    #[cfg(loom)]
    stage: Vec<u8>,
    _not_sync: PhantomData<Cell<()>>,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("capacity", &self.cap)
            .field("position", &self.pos)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// What [`Consumer::take_data`] found at the position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Take {
    /// A DATA record, handed over and consumed.
    Data,
    /// Nothing published at the position.
    Empty,
    /// Something for [`Consumer::poll_deferred`]; nothing consumed.
    Other,
}

impl Consumer {
    pub(super) fn new(region: Arc<Region>, max_payload: usize) -> Consumer {
        Consumer {
            cap: region.capacity(),
            region: Region::clone(&region),
            max_payload,
            pos: 0,
            published: 0,
            span: (region.capacity() - RECORD_ALIGN) as u64,
            failed: None,
            #[cfg(loom)]
            stage: vec![0; max_payload],
            _not_sync: PhantomData,
        }
    }

    /// The consuming end of a ring in `mem` (zeroed, exactly one consumer). Reads nothing from
    /// the region.
    ///
    /// # Errors
    ///
    /// [`RingError::BadGeometry`], [`RingError::BadLimit`].
    #[cfg(not(loom))]
    pub fn attach(mem: Arc<dyn RingMemory>, max_payload: usize) -> Result<Consumer, RingError> {
        let region = region_dyn(mem)?;
        check_limit(region.capacity(), max_payload)?;
        Ok(Consumer::new(Arc::new(region), max_payload))
    }

    /// Capacity of the record area in bytes.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Position of the next record to read (bytes consumed so far).
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Bytes the producer says it has published beyond our position, clamped to the capacity.
    /// A racy hint for observers (it may lag the records, and a hostile producer can make it
    /// anything in range); [`poll`](Self::poll) does not use it.
    pub fn pending_hint(&self) -> usize {
        // Relaxed: a hint; nothing is read on the strength of it.
        let p = self.region.producer_pos().load(Ordering::Relaxed);
        (p.saturating_sub(self.pos) as usize).min(self.cap)
    }

    /// Hands up to `limit` published records to `handler`, in order (DATA payloads in place,
    /// valid for the call), skipping PAD records, then publishes the new position. Returns the
    /// number of records handed over (`0`: nothing published). Does at most `capacity / 8`
    /// records' work whatever `limit` is, and never waits.
    ///
    /// # Errors
    ///
    /// [`RingError::Record`] and [`RingError::Overrun`]: the producer broke the protocol (the
    /// records before the bad one were handed over and consumed); the consumer is then failed.
    #[inline]
    pub fn poll<F>(&mut self, limit: usize, handler: F) -> Result<usize, RingError>
    where
        F: FnMut(Record<'_>),
    {
        let r = self.poll_deferred(limit, handler);
        self.publish();
        r
    }

    /// [`poll`](Self::poll) without publishing the new position: the records handed over are
    /// consumed (never handed over again) but their space goes back to the producer only at
    /// the next [`publish`](Self::publish) (or `poll`). For a caller that takes one record per
    /// call and publishes when it chooses (the engine's `try_recv`, for what
    /// [`take_data`](Self::take_data) leaves, publishes right after).
    ///
    /// # Errors
    ///
    /// As [`poll`](Self::poll).
    #[inline(always)]
    pub fn poll_deferred<F>(&mut self, limit: usize, mut handler: F) -> Result<usize, RingError>
    where
        F: FnMut(Record<'_>),
    {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let cap = self.cap;
        // An honest producer keeps the word at `published + cap - 8` free (it has seen no
        // position beyond `published`), so no record ends beyond it. This bounds the work to one
        // lap: at most `cap / 8` iterations (each consumes >= 8 bytes).
        let limit_pos = self.published + (cap - RECORD_ALIGN) as u64;
        let mut n = 0usize;
        let result = loop {
            if n >= limit {
                break Ok(());
            }
            let off = self.pos as usize & (cap - 1);
            let guard = self.region.track_read(off);
            // Acquire: pairs with the producer's Release store of the header (or of its batch's
            // first header, which it reached before this one): the payload and header written
            // before that store are visible from here on.
            let word = self.region.word(off).load(Ordering::Acquire);
            guard.end();
            // The header's bytes as the little-endian word they encode (the producer stored
            // them with `from_ne_bytes`).
            let word = u64::from_le(word);
            if word as u32 == 0 {
                break Ok(());
            }
            let position = self.pos;
            let header = match RecordHeader::parse_word(word, off, self.max_payload) {
                Ok(h) => h,
                Err(source) => break Err(RingError::Record { position, source }),
            };
            let size = header.size();
            if size > cap - off {
                break Err(RingError::Record {
                    position,
                    source: RecordError::Truncated {
                        offset: off,
                        need: size,
                        have: cap - off,
                    },
                });
            }
            if position + size as u64 > limit_pos {
                break Err(RingError::Overrun {
                    position,
                    size,
                    limit: limit_pos,
                });
            }
            // Consumed from here on, also if the handler unwinds: a record is handed over once.
            // (The producer gets the space back only when the position is published below.)
            let next = position + size as u64;
            match header.record_type() {
                RecordType::Pad => self.pos = next,
                RecordType::Data => {
                    self.pos = next;
                    let len = header.payload_len();
                    #[cfg(not(loom))]
                    {
                        // SAFETY: `off + 8 + len <= off + size <= cap`, checked above. The
                        // record is published and we have not published our position past it,
                        // so the producer (in this process) does not write it until we do.
                        let payload = unsafe { self.region.bytes(off + RECORD_HEADER, len) };
                        handler(Record::Data(payload));
                    }
                    #[cfg(loom)]
                    {
                        let mut stage = std::mem::take(&mut self.stage);
                        stage.resize(len, 0);
                        self.region.read_bytes(off + RECORD_HEADER, &mut stage);
                        handler(Record::Data(&stage));
                        self.stage = stage;
                    }
                    n += 1;
                }
                _ => {
                    // Fixed-size types: one bounded atomic copy of the 8-byte payload (in range:
                    // `size == 16 <= cap - off`), only when the header says 8 bytes.
                    let mut fixed = [0u8; 8];
                    if header.payload_len() == 8 {
                        let guard = self.region.track_read(off + RECORD_HEADER);
                        // Relaxed: ordered after the Acquire above, which made the payload
                        // visible.
                        fixed = self
                            .region
                            .word(off + RECORD_HEADER)
                            .load(Ordering::Relaxed)
                            .to_ne_bytes();
                        guard.end();
                    }
                    match header.decode(off, &fixed) {
                        Ok(rec) => {
                            self.pos = next;
                            handler(rec);
                        }
                        Err(source) => break Err(RingError::Record { position, source }),
                    }
                    n += 1;
                }
            }
        };
        match result {
            Ok(()) => Ok(n),
            Err(e) => {
                self.failed = Some(e);
                self.span = 0;
                Err(e)
            }
        }
    }

    /// The common case of [`poll_deferred`](Self::poll_deferred)`(1, ..)` alone, for a caller
    /// that takes one record per call (the engine's `try_recv`): when the record at the
    /// position is a published DATA record of at most `max` payload bytes that passes every
    /// check `poll_deferred` makes, hands its payload to `handler` in place, consumes it
    /// (the position is left unpublished, as by `poll_deferred`) and returns
    /// [`Take::Data`]; [`Take::Empty`] when nothing is published there; [`Take::Other`] for
    /// anything else, consuming nothing: a PAD or another type, a longer payload, a record
    /// that fails a check, a failed or [`poison`](Self::poison)ed consumer. The caller then
    /// takes it with `poll_deferred`, which validates it in full and reports what is wrong.
    ///
    /// One header load, one compare of the header's upper half, three range compares against
    /// precomputed bounds: the per-record checks of `poll_deferred` (the failed state, the
    /// type dispatch) folded into what the word must equal and the range compares (callgrind
    /// of `bench cost`: see `Consumer::span`).
    #[inline(always)]
    pub fn take_data<F>(&mut self, max: usize, handler: F) -> Take
    where
        F: FnOnce(&[u8]),
    {
        self.take::<false, F>(max, handler)
    }

    /// [`take_data`](Self::take_data), and the position published once `handler` returned
    /// (one `Release` store of the position in hand, with no compare: a take always moves
    /// it), for a caller that publishes after every record.
    #[inline(always)]
    pub fn take_data_published<F>(&mut self, max: usize, handler: F) -> Take
    where
        F: FnOnce(&[u8]),
    {
        self.take::<true, F>(max, handler)
    }

    #[inline(always)]
    fn take<const PUBLISH: bool, F>(&mut self, max: usize, handler: F) -> Take
    where
        F: FnOnce(&[u8]),
    {
        let cap = self.cap;
        let off = self.pos as usize & (cap - 1);
        let guard = self.region.track_read(off);
        // Acquire: as in `poll_deferred`.
        let word = u64::from_le(self.region.word(off).load(Ordering::Acquire));
        guard.end();
        let len = word as u32 as usize;
        if len == 0 {
            return Take::Empty;
        }
        // `len < 8` wraps to a huge payload and fails the compare.
        let payload = len.wrapping_sub(RECORD_HEADER);
        let size = (len + RECORD_ALIGN - 1) & !(RECORD_ALIGN - 1);
        // DATA with zero flags and aux (what `RecordHeader::parse_word` accepts at once); the
        // payload within both limits; the record within the area's end and within `span` of
        // the published position (`span` is 0 once failed, so nothing passes then).
        if word >> 32 != RecordType::Data as u64
            || payload > max.min(self.max_payload)
            || size > cap - off
            || self.pos + size as u64 > self.published + self.span
        {
            return Take::Other;
        }
        let next = self.pos + size as u64;
        self.pos = next;
        #[cfg(not(loom))]
        {
            // SAFETY: `off + 8 + payload <= off + size <= cap`, checked above. The record is
            // published and our published position is not past it, so the producer does not
            // write it until we publish.
            handler(unsafe { self.region.bytes(off + RECORD_HEADER, payload) });
        }
        #[cfg(loom)]
        {
            let mut stage = std::mem::take(&mut self.stage);
            stage.resize(payload, 0);
            self.region.read_bytes(off + RECORD_HEADER, &mut stage);
            handler(&stage);
            self.stage = stage;
        }
        if PUBLISH {
            // Release: the handler's reads of the record happen before the producer's writes
            // over it.
            self.region.consumer_pos().store(next, Ordering::Release);
            self.published = next;
        }
        Take::Data
    }

    /// Makes [`take_data`](Self::take_data) refuse every record from now on (it returns
    /// [`Take::Other`]), for a caller that found the stream broken above the ring (an
    /// invalid `BUF_REF`) and fails the ring's reader with its own error.
    #[inline]
    pub fn poison(&mut self) {
        self.span = 0;
    }

    /// Bytes consumed and not yet published to the producer.
    #[inline]
    pub fn unpublished_bytes(&self) -> usize {
        (self.pos - self.published) as usize
    }

    /// Publishes the position (one `Release` store), if it moved since the last publication:
    /// the producer may reuse the space of every record consumed so far.
    #[inline]
    pub fn publish(&mut self) {
        if self.pos != self.published {
            // Release: our reads of every record before `pos` happen before the producer's
            // writes over them (it Acquire-loads this word before reusing the space).
            self.region
                .consumer_pos()
                .store(self.pos, Ordering::Release);
            self.published = self.pos;
        }
    }

    /// [`is_empty_hint`](Self::is_empty_hint) without reading a cache line this end has not
    /// read yet: `true` when the position starts a new 64-byte line of the area (the ring may
    /// be empty; the word there is looked at by the next poll), else the hint. For the same
    /// decision as the hint, publishing once per run after
    /// [`poll_deferred`](Self::poll_deferred): the line after a record that ends a line is the
    /// one the producer has just written (its zero-ahead word), and reading it right after
    /// the record was a second line transfer per message on a ping-pong's critical path,
    /// where publishing is a store to this side's own line. (The engine no longer asks: it
    /// publishes after every record, since on an AMD EPYC guest even the look within the line
    /// already read cost its 8-B ping-pong 15-25 ns a round trip.)
    #[inline]
    pub fn may_be_empty(&self) -> bool {
        self.pos as usize % CACHE_LINE == 0 || self.is_empty_hint()
    }

    /// Whether nothing is published at the position right now (the header word there reads
    /// `0`, or is a PAD's, which an aborted claim can leave as the last record): a racy hint
    /// (the producer may publish the next moment), for deciding when to
    /// [`publish`](Self::publish) after [`poll_deferred`](Self::poll_deferred); publishing
    /// early is always safe. Reads one word (the one the next poll reads first); validates
    /// nothing.
    #[inline]
    pub fn is_empty_hint(&self) -> bool {
        let off = self.pos as usize & (self.cap - 1);
        let guard = self.region.track_read(off);
        // Relaxed: a hint; nothing is read on the strength of it (a poll re-loads the word with
        // Acquire).
        let word = self.region.word(off).load(Ordering::Relaxed);
        guard.end();
        let b = word.to_ne_bytes();
        b[..4] == [0; 4] || b[4] == RecordType::Pad as u8
    }
}
