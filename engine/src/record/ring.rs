//! A single-producer single-consumer byte ring of v2 [records](super) over a shared byte
//! region: the shm data path v2's wire ring (issue #10), testable on its own.
//!
//! # Layout
//!
//! The region ([`RingMemory`]; in shm the memfd segment, in tests a [`HeapRegion`]) holds no
//! pointers, only positions and records:
//!
//! | bytes | what |
//! |-------|------|
//! | `0..128` | producer position line: `u64` at 0, bytes published so far (a hint, see below) |
//! | `128..256` | consumer position line: `u64` at 128, bytes consumed so far |
//! | `256..256 + capacity` | the record area, `capacity` a power of two ([`MIN_CAPACITY`] ..= [`MAX_CAPACITY`]) |
//!
//! Positions are byte counters that never wrap (`u64`); position `p` lives at area offset
//! `p & (capacity - 1)`, and is always a multiple of 8. Records are 8-aligned and never
//! straddle the area's end: when one would not fit contiguously the producer fills the end with
//! a PAD record and writes the record at offset 0. A record may take at most half the area
//! ([`max_payload_for`]), so a PAD plus the record always fit in an empty ring.
//!
//! # Protocol
//!
//! * The producer [`claim`](Producer::claim)s `payload` bytes and writes them in place
//!   ([`Claim::payload_mut`]). [`Claim::commit`] publishes the record: the header word (`len`,
//!   `type`, `flags`, `aux`: one 8-byte atomic, so the `len` half, the commit flag, is written
//!   with the rest of the header, after the payload) is stored with `Release`.
//!   [`Claim::commit_batched`] writes the record without publishing it; [`Producer::publish`]
//!   then publishes the whole batch with one `Release` store, of the *first* record's header
//!   (the later headers were stored `Relaxed` before it; the consumer reads them only after it).
//! * The word right after the last published record is stored `0` before that `Release`
//!   (*zero-ahead*), so the word where the consumer looks next reads `0` ("not yet") until the
//!   producer publishes there, whatever earlier laps left at that offset. The producer keeps
//!   that word free: at most `capacity - 8` bytes are ever outstanding.
//! * The producer caches the consumer's position and re-reads it (`Acquire`) only when the
//!   cached window cannot hold the claim.
//! * The consumer [`poll`](Consumer::poll)s: it loads the header word at its position
//!   (`Acquire`), `0` meaning nothing more is published, validates it with the record codec
//!   ([`RecordHeader::parse`]) and against the ring's geometry, hands the record to the handler
//!   (a DATA payload in place), skips PAD records, and after the batch publishes its position
//!   once (`Release`). The consumer never writes the record area.
//!
//! Why zero-ahead rather than the consumer zeroing the length words it consumed: records have
//! variable sizes, so the next lap's headers fall on offsets where this lap held payload bytes
//! (say, records of 40 and 24 bytes, then one of 16: the consumer next looks at offset 16, in
//! the old 40-byte record's payload); only zeroing every consumed byte (Agrona's
//! `OneToOneRingBuffer`) or the word ahead of the producer keeps the commit flag clean. The word
//! ahead costs one store per batch and leaves the area read-only to the consumer.
//!
//! The producer position word is stored (`Release`) on every publication but the consumer does
//! not need it; it is there for observers (the control plane, [`Consumer::pending_hint`]).
//!
//! # Trust model
//!
//! Across processes the peer is untrusted. The consumer reads the header words atomically and
//! fixed-size payloads as one atomic word, so it never reads more than the record it checked;
//! it rejects, with a typed [`RingError`], any header the codec rejects, a record that runs past
//! the area's end, and a record ending beyond what an honest producer could have written (more
//! than `capacity - 8` bytes past the consumer's published position). Each poll does bounded
//! work (at most `capacity / 8` records, whatever `limit` is) and never waits. The producer
//! validates the consumer position it reads (8-aligned, monotonic, not beyond the producer).
//! DATA payloads are delivered in place: a hostile peer can change their bytes while the handler
//! reads them, as with today's shm buffers; they are data, not interpreted. After an error the
//! handle is failed (every later call returns the same error): fail the connection.
//!
//! # Threading
//!
//! [`Producer`] and [`Consumer`] are `Send + !Sync` and their methods take `&mut self`: one
//! thread at a time drives each end, as with [`rings`]. Nothing blocks, allocates, locks or
//! logs on the data path.
//!
//! # Testing
//!
//! `engine/tests/record_ring.rs` (FIFO stress with mixed sizes and batches, hostile input),
//! `engine/tests/record_ring_loom.rs` (loom model, `scripts/ci/loom.sh`), and
//! `cargo bench -p spinwire --bench record_ring`.
//!
//! # Example
//!
//! ```
//! use spinwire::record::ring;
//! use spinwire::record::Record;
//!
//! let (mut tx, mut rx) = ring::with_capacity(4096, 256)?;
//! let mut claim = tx.claim(5)?.expect("room");
//! claim.payload_mut().copy_from_slice(b"hello");
//! claim.commit();
//! assert!(tx.push_credit(7)?);
//!
//! let mut got = Vec::new();
//! let n = rx.poll(32, |rec| match rec {
//!     Record::Data(bytes) => got.push(bytes.to_vec()),
//!     other => assert_eq!(other, Record::Credit(7)),
//! })?;
//! assert_eq!(n, 2);
//! assert_eq!(got, [b"hello".to_vec()]);
//! # Ok::<(), spinwire::record::ring::RingError>(())
//! ```

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

pub use super::region::{
    HeapRegion, RingMemory, CONSUMER_POSITION_OFFSET, MAX_CAPACITY, MIN_CAPACITY, POSITION_LINE,
    PRODUCER_POSITION_OFFSET, RING_HEADER_SIZE,
};
use super::region::{Ordering, Region};
use super::{
    Record, RecordError, RecordHeader, RecordType, MAX_PAYLOAD, RECORD_ALIGN, RECORD_HEADER,
};

/// Bytes of region a ring of `capacity` bytes of records needs (position lines included).
pub const fn region_size(capacity: usize) -> usize {
    RING_HEADER_SIZE + capacity
}

/// The largest DATA payload a ring of `capacity` bytes carries: a record takes at most half the
/// area (so a wrap's PAD and the record always fit once the consumer has caught up).
pub const fn max_payload_for(capacity: usize) -> usize {
    (capacity / 2).saturating_sub(RECORD_HEADER)
}

/// Failures of the record ring: setup errors, a caller error, and a peer violating the
/// protocol (the connection is then to be failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// The region cannot hold a ring.
    #[error("bad ring region: {reason} ({size_bytes} bytes)")]
    BadGeometry {
        /// What is wrong.
        reason: &'static str,
        /// The region's size.
        size_bytes: usize,
    },
    /// The maximum payload is above [`max_payload_for`] the capacity (or [`MAX_PAYLOAD`]).
    #[error("maximum payload {max} too large for a {capacity}-byte ring (at most {limit})")]
    BadLimit {
        /// The maximum asked for.
        max: usize,
        /// The ring's capacity.
        capacity: usize,
        /// The largest allowed.
        limit: usize,
    },
    /// A claim above the configured maximum payload (a caller error; the ring is unchanged).
    #[error("payload of {len} bytes exceeds the maximum {max}")]
    TooLong {
        /// Bytes asked for.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The peer published a record the codec rejects (or one running past the area's end).
    #[error("invalid record at ring position {position}")]
    Record {
        /// Ring position of the record.
        position: u64,
        /// What the codec found.
        #[source]
        source: RecordError,
    },
    /// The peer published a record ending beyond what an honest producer could have written
    /// (`capacity - 8` bytes past the consumer's published position).
    #[error("record at position {position} ({size} bytes) ends past the producer's limit {limit}")]
    Overrun {
        /// Ring position of the record.
        position: u64,
        /// Its size, padding included.
        size: usize,
        /// The furthest position an honest producer can have reached.
        limit: u64,
    },
    /// The consumer's position word is misaligned, went backwards or is past the producer.
    #[error("consumer position {value} is not an 8-aligned value in {low}..={high}")]
    BadConsumerPosition {
        /// The word read.
        value: u64,
        /// The last validated value.
        low: u64,
        /// The producer's position.
        high: u64,
    },
}

fn check_limit(capacity: usize, max: usize) -> Result<(), RingError> {
    let limit = max_payload_for(capacity).min(MAX_PAYLOAD);
    if max > limit {
        return Err(RingError::BadLimit {
            max,
            capacity,
            limit,
        });
    }
    Ok(())
}

/// The header word of a version-1 record: the header bytes as the region holds them.
#[inline(always)]
fn header_word(ty: RecordType, payload: usize) -> u64 {
    // `payload <= capacity / 2 <= 2^30`, so the length fits; the fallback is unreachable.
    u64::from_ne_bytes(RecordHeader::encode(ty, payload).unwrap_or([0; RECORD_HEADER]))
}

/// A ring over a new zeroed [`HeapRegion`] of `capacity` bytes of records, both ends in this
/// process.
///
/// # Errors
///
/// [`RingError::BadGeometry`] when `capacity` is not a power of two in
/// [`MIN_CAPACITY`]`..=`[`MAX_CAPACITY`]; [`RingError::BadLimit`] when `max_payload` exceeds
/// [`max_payload_for`]`(capacity)`.
pub fn with_capacity(
    capacity: usize,
    max_payload: usize,
) -> Result<(Producer, Consumer), RingError> {
    let size_bytes = region_size(capacity);
    if capacity > MAX_CAPACITY {
        return Err(RingError::BadGeometry {
            reason: "record area above the maximum capacity",
            size_bytes,
        });
    }
    let mem = Arc::new(HeapRegion::new(size_bytes));
    let region = Arc::new(region_of(mem)?);
    check_limit(region.capacity(), max_payload)?;
    Ok((
        Producer::new(Arc::clone(&region), max_payload),
        Consumer::new(region, max_payload),
    ))
}

#[cfg(not(loom))]
fn region_of(mem: Arc<HeapRegion>) -> Result<Region, RingError> {
    region_dyn(mem)
}

#[cfg(loom)]
fn region_of(mem: Arc<HeapRegion>) -> Result<Region, RingError> {
    Region::new(mem).map_err(|reason| RingError::BadGeometry {
        reason,
        size_bytes: 0,
    })
}

#[cfg(not(loom))]
fn region_dyn(mem: Arc<dyn RingMemory>) -> Result<Region, RingError> {
    let size_bytes = mem.size_bytes();
    Region::new(mem).map_err(|reason| RingError::BadGeometry { reason, size_bytes })
}

/// The producing end: claims space, writes records in place, publishes them.
///
/// `Send + !Sync`; see the [module docs](self) for the protocol.
pub struct Producer {
    region: Arc<Region>,
    /// Capacity of the record area (a power of two).
    cap: usize,
    max_payload: usize,
    /// Next free position, a multiple of 8. Invariant:
    /// `head_cache <= tail` and `tail + 8 <= head_cache + cap` (the zero-ahead word stays free).
    tail: u64,
    /// The last validated consumer position.
    head_cache: u64,
    /// Header word of the first committed but unpublished record (`0`: none), at `first_off`.
    first_word: u64,
    first_off: usize,
    failed: Option<RingError>,
    /// Loom only: the claim's payload is written here, then copied into the tracked words.
    #[cfg(loom)]
    stage: Vec<u8>,
    _not_sync: PhantomData<Cell<()>>,
}

impl fmt::Debug for Producer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("capacity", &self.cap)
            .field("tail", &self.tail)
            .field("head_cache", &self.head_cache)
            .field("unpublished", &(self.first_word != 0))
            .finish_non_exhaustive()
    }
}

impl Producer {
    fn new(region: Arc<Region>, max_payload: usize) -> Producer {
        Producer {
            cap: region.capacity(),
            region,
            max_payload,
            tail: 0,
            head_cache: 0,
            first_word: 0,
            first_off: 0,
            failed: None,
            #[cfg(loom)]
            stage: vec![0; max_payload],
            _not_sync: PhantomData,
        }
    }

    /// The producing end of a ring in `mem`, which must be zeroed (a fresh memfd, a new
    /// [`HeapRegion`]) and have exactly one producer. Reads nothing from the region.
    ///
    /// # Errors
    ///
    /// [`RingError::BadGeometry`], [`RingError::BadLimit`].
    #[cfg(not(loom))]
    pub fn attach(mem: Arc<dyn RingMemory>, max_payload: usize) -> Result<Producer, RingError> {
        let region = region_dyn(mem)?;
        check_limit(region.capacity(), max_payload)?;
        Ok(Producer::new(Arc::new(region), max_payload))
    }

    /// Capacity of the record area in bytes.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// The largest DATA payload this end claims.
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Position just past the last record written (published or not).
    pub fn position(&self) -> u64 {
        self.tail
    }

    /// Bytes free according to the cached consumer position (a lower bound), the zero-ahead
    /// word excluded.
    pub fn free_bytes_cached(&self) -> usize {
        // Invariant: `tail + 8 <= head_cache + cap`.
        (self.head_cache + self.cap as u64 - self.tail) as usize - RECORD_ALIGN
    }

    /// Reserves a DATA record of `payload` bytes (`0 ..= max_payload`). `Ok(None)`: the ring is
    /// full for now (retry after the consumer polls). Writes a PAD record first when the record
    /// would not fit before the area's end. Dropping the claim writes nothing (a PAD already
    /// written stays, published with the next publication).
    ///
    /// # Errors
    ///
    /// [`RingError::TooLong`]; [`RingError::BadConsumerPosition`] (the peer broke the protocol;
    /// the producer is then failed).
    #[inline]
    pub fn claim(&mut self, payload: usize) -> Result<Option<Claim<'_>>, RingError> {
        if payload > self.max_payload {
            return Err(RingError::TooLong {
                len: payload,
                max: self.max_payload,
            });
        }
        self.reserve(RecordType::Data, payload)
    }

    #[inline(always)]
    fn reserve(&mut self, ty: RecordType, payload: usize) -> Result<Option<Claim<'_>>, RingError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        // `payload <= cap / 2 - 8`: no overflow, and `size <= cap / 2`.
        let size = (RECORD_HEADER + payload + RECORD_ALIGN - 1) & !(RECORD_ALIGN - 1);
        let off = self.tail as usize & (self.cap - 1);
        let pad = if off + size > self.cap {
            self.cap - off
        } else {
            0
        };
        // The record, the PAD before it, and the zero-ahead word after it.
        let need = (pad + size + RECORD_ALIGN) as u64;
        if self.tail + need > self.head_cache + self.cap as u64 && !self.refresh(need)? {
            return Ok(None);
        }
        if pad > 0 {
            self.stage_header(off, header_word(RecordType::Pad, pad - RECORD_HEADER));
            self.tail += pad as u64;
        }
        Ok(Some(Claim {
            p: self,
            ty,
            payload,
            size,
        }))
    }

    /// Re-reads the consumer's position; whether `need` bytes now fit.
    #[cold]
    fn refresh(&mut self, need: u64) -> Result<bool, RingError> {
        // Acquire: pairs with the consumer's Release store of its position after it finished
        // reading the records before it, so the bytes we are about to overwrite are no longer
        // read (the consumer's reads happen before our writes).
        let h = self.region.consumer_pos().load(Ordering::Acquire);
        if h % RECORD_ALIGN as u64 != 0 || h < self.head_cache || h > self.tail {
            let e = RingError::BadConsumerPosition {
                value: h,
                low: self.head_cache,
                high: self.tail,
            };
            self.failed = Some(e);
            return Err(e);
        }
        self.head_cache = h;
        Ok(self.tail + need <= h + self.cap as u64)
    }

    /// Records a committed header: the first of a batch is kept back for the publication, the
    /// others are stored now.
    #[inline(always)]
    fn stage_header(&mut self, off: usize, word: u64) {
        if self.first_word == 0 {
            self.first_off = off;
            self.first_word = word;
        } else {
            // Relaxed: this header (and its payload, written before it) is published by the
            // batch's first header's Release store in `publish`, which follows in program order;
            // the consumer reads it only after Acquire-loading that first header.
            self.region.word(off).store(word, Ordering::Relaxed);
        }
    }

    /// Publishes every record committed with [`Claim::commit_batched`] (and any PAD) with one
    /// `Release` store. Does nothing when nothing is pending.
    #[inline]
    pub fn publish(&mut self) {
        if self.first_word == 0 {
            return;
        }
        // Relaxed: zero-ahead. Ordered before the consumer's read of this word by the Release
        // below (the consumer reaches this word only after Acquire-loading a header of this
        // batch), so it reads 0 or a later header, never an earlier lap's bytes. The word is
        // free: `tail + 8 <= head_cache + cap`.
        self.region
            .word(self.tail as usize & (self.cap - 1))
            .store(0, Ordering::Relaxed);
        // Release: the commit. Every payload byte and header of the batch, and the zero-ahead
        // word, were written before in program order; the consumer's Acquire load of this
        // header makes them visible to it.
        self.region
            .word(self.first_off)
            .store(self.first_word, Ordering::Release);
        self.first_word = 0;
        // Release: observers that read the position (`pending_hint`, the control plane) see
        // the records before it. Not read by the consumer's data path.
        self.region
            .producer_pos()
            .store(self.tail, Ordering::Release);
    }

    /// Writes and publishes a record with an 8-byte payload.
    fn push_fixed(&mut self, ty: RecordType, bytes: [u8; 8]) -> Result<bool, RingError> {
        match self.reserve(ty, 8)? {
            Some(mut c) => {
                c.payload_mut().copy_from_slice(&bytes);
                c.commit();
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Writes and publishes a DATA record holding `data`; `Ok(false)` when the ring is full.
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim).
    pub fn push(&mut self, data: &[u8]) -> Result<bool, RingError> {
        match self.claim(data.len())? {
            Some(mut c) => {
                c.payload_mut().copy_from_slice(data);
                c.commit();
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Writes and publishes a CREDIT record (cumulative credits); `Ok(false)` when full.
    ///
    /// # Errors
    ///
    /// [`RingError::BadConsumerPosition`].
    pub fn push_credit(&mut self, credits: u64) -> Result<bool, RingError> {
        self.push_fixed(RecordType::Credit, credits.to_le_bytes())
    }

    /// Writes and publishes a HEARTBEAT record; `Ok(false)` when full.
    ///
    /// # Errors
    ///
    /// [`RingError::BadConsumerPosition`].
    pub fn push_heartbeat(&mut self, seq: u64) -> Result<bool, RingError> {
        self.push_fixed(RecordType::Heartbeat, seq.to_le_bytes())
    }

    /// Writes and publishes a BUF_REF record; `Ok(false)` when full.
    ///
    /// # Errors
    ///
    /// [`RingError::BadConsumerPosition`].
    pub fn push_buf_ref(&mut self, buf: u32, len: u32) -> Result<bool, RingError> {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&buf.to_le_bytes());
        b[4..].copy_from_slice(&len.to_le_bytes());
        self.push_fixed(RecordType::BufRef, b)
    }
}

impl Drop for Producer {
    /// Publishes what is still pending (one store; never waits).
    fn drop(&mut self) {
        self.publish();
    }
}

/// A claimed record: fill [`payload_mut`](Self::payload_mut), then [`commit`](Self::commit)
/// (visible now) or [`commit_batched`](Self::commit_batched) (visible at the next
/// [`Producer::publish`]). Dropping it writes nothing.
pub struct Claim<'p> {
    p: &'p mut Producer,
    ty: RecordType,
    payload: usize,
    /// Record size, padding included.
    size: usize,
}

impl fmt::Debug for Claim<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("type", &self.ty)
            .field("payload", &self.payload)
            .field("position", &self.p.tail)
            .finish()
    }
}

impl<'p> Claim<'p> {
    /// The payload bytes, in place in the ring (their previous contents are unspecified).
    #[inline(always)]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        #[cfg(not(loom))]
        {
            let off = self.p.tail as usize & (self.p.cap - 1);
            // SAFETY: the record `off .. off + size` lies inside the area (`reserve` wrapped with
            // a PAD when it would not fit) and in the producer's free span `tail .. head + cap`,
            // which the consumer does not read until it is published (it stops at the `0`
            // header word at `tail`). The borrow of `self` keeps the slice unique.
            unsafe { self.p.region.bytes_mut(off + RECORD_HEADER, self.payload) }
        }
        #[cfg(loom)]
        {
            &mut self.p.stage[..self.payload]
        }
    }

    /// Bytes of payload claimed.
    pub fn len(&self) -> usize {
        self.payload
    }

    /// True for an empty payload.
    pub fn is_empty(&self) -> bool {
        self.payload == 0
    }

    /// Writes the record (header staged) and hands the producer back.
    #[inline(always)]
    fn write(self) -> &'p mut Producer {
        let Claim {
            p,
            ty,
            payload,
            size,
        } = self;
        let off = p.tail as usize & (p.cap - 1);
        #[cfg(loom)]
        {
            let stage = std::mem::take(&mut p.stage);
            p.region.write_bytes(off + RECORD_HEADER, &stage[..payload]);
            p.stage = stage;
        }
        p.stage_header(off, header_word(ty, payload));
        p.tail += size as u64;
        p
    }

    /// Writes the record and publishes it together with any batched ones before it.
    #[inline]
    pub fn commit(self) {
        self.write().publish();
    }

    /// Writes the record without publishing it: it becomes visible at the next
    /// [`Producer::publish`] or [`commit`](Self::commit), in order.
    #[inline]
    pub fn commit_batched(self) {
        self.write();
    }
}

/// The consuming end: polls published records and hands them to a handler in place.
///
/// `Send + !Sync`; see the [module docs](self) for the protocol and the trust model.
pub struct Consumer {
    region: Arc<Region>,
    cap: usize,
    max_payload: usize,
    /// Next record position (a multiple of 8); published after each poll that moved it.
    pos: u64,
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

impl Consumer {
    fn new(region: Arc<Region>, max_payload: usize) -> Consumer {
        Consumer {
            cap: region.capacity(),
            region,
            max_payload,
            pos: 0,
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
    pub fn poll<F>(&mut self, limit: usize, mut handler: F) -> Result<usize, RingError>
    where
        F: FnMut(Record<'_>),
    {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let cap = self.cap;
        let start = self.pos;
        // `start` is our published position; an honest producer keeps the word at
        // `start + cap - 8` free, so no record of this batch ends beyond it. This bounds the
        // batch to one lap: at most `cap / 8` iterations (each consumes >= 8 bytes).
        let limit_pos = start + (cap - RECORD_ALIGN) as u64;
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
            let bytes = word.to_ne_bytes();
            if bytes[..4] == [0; 4] {
                break Ok(());
            }
            let position = self.pos;
            let header = match RecordHeader::parse(bytes, off, self.max_payload) {
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
            match header.record_type() {
                RecordType::Pad => {}
                RecordType::Data => {
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
                        Ok(rec) => handler(rec),
                        Err(source) => break Err(RingError::Record { position, source }),
                    }
                    n += 1;
                }
            }
            self.pos = position + size as u64;
        };
        if self.pos != start {
            // Release: our reads of every record before `pos` happen before the producer's
            // writes over them (it Acquire-loads this word before reusing the space).
            self.region
                .consumer_pos()
                .store(self.pos, Ordering::Release);
        }
        match result {
            Ok(()) => Ok(n),
            Err(e) => {
                self.failed = Some(e);
                Err(e)
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn geometry_and_limits() {
        assert!(with_capacity(64, max_payload_for(64)).is_ok());
        assert!(matches!(
            with_capacity(64, max_payload_for(64) + 1),
            Err(RingError::BadLimit { .. })
        ));
        assert!(matches!(
            with_capacity(96, 8),
            Err(RingError::BadGeometry { .. })
        ));
        assert!(matches!(
            with_capacity(16, 0),
            Err(RingError::BadGeometry { .. })
        ));
        let (mut p, _c) = with_capacity(64, 8).unwrap();
        assert!(matches!(
            p.claim(9),
            Err(RingError::TooLong { len: 9, max: 8 })
        ));
    }

    #[test]
    fn wrap_writes_pad_and_zero_ahead() {
        let mem = Arc::new(HeapRegion::new(region_size(64)));
        let max = max_payload_for(64);
        assert_eq!(max, 24);
        let mut p = Producer::attach(mem.clone(), max).unwrap();
        let mut c = Consumer::attach(mem.clone(), max).unwrap();
        let area = RING_HEADER_SIZE / 8;
        // Records of 32 and 24 bytes (0..56); a 16-byte one must wrap: PAD 56..64, then 0..16,
        // which needs the consumer past 24.
        assert!(p.push(&[1; 24]).unwrap());
        assert!(p.push(&[2; 16]).unwrap());
        assert!(!p.push(&[3; 8]).unwrap());
        assert_eq!(p.free_bytes_cached(), 0);
        assert_eq!(c.poll(8, |_| {}).unwrap(), 2);
        assert!(p.push(&[3; 8]).unwrap());
        assert!(p.push(&[4; 8]).unwrap());
        // The word after the last record (offset 32, the old second header) was zeroed ahead.
        assert_eq!(mem.word(area + 4).unwrap().load(Ordering::Relaxed), 0);
        let mut got = Vec::new();
        let n = c
            .poll(8, |r| {
                if let Record::Data(d) = r {
                    got.push(d.to_vec())
                }
            })
            .unwrap();
        assert_eq!(n, 2);
        assert_eq!(got, [vec![3; 8], vec![4; 8]]);
        assert_eq!(c.position(), 64 + 32);
        assert_eq!(c.pending_hint(), 0);
    }
}
