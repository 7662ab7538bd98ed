//! The ring's producing end: [`Producer`] and its [`Claim`].

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use super::error::RingError;
#[cfg(not(loom))]
use super::{check_limit, region_dyn, RingMemory};
use crate::record::region::{Ordering, Region};
use crate::record::{RecordHeader, RecordType, RECORD_ALIGN, RECORD_HEADER};

mod raw;

/// The bytes a DATA record of `payload` bytes takes in the area: header, payload and the
/// padding to [`RECORD_ALIGN`]. Wraps (no panic) for a payload within 15 bytes of
/// `usize::MAX`; every caller refuses a payload over the ring's maximum before it uses the size.
#[inline(always)]
const fn padded(payload: usize) -> usize {
    (RECORD_HEADER + RECORD_ALIGN - 1).wrapping_add(payload) & !(RECORD_ALIGN - 1)
}

/// The header word of a version-1 record: the header bytes as the region holds them.
#[inline(always)]
fn header_word(ty: RecordType, payload: usize) -> u64 {
    // `payload <= capacity / 2 <= 2^30`, so the length fits; the fallback is unreachable.
    u64::from_ne_bytes(RecordHeader::encode(ty, payload).unwrap_or([0; RECORD_HEADER]))
}

/// The producing end: claims space, writes records in place, publishes them.
///
/// `Send + !Sync`; see the [module docs](super) for the protocol.
pub struct Producer {
    /// This end's copy of the region (see [`Region`]'s `Clone`).
    region: Region,
    /// Capacity of the record area (a power of two).
    cap: usize,
    max_payload: usize,
    /// Next free position, a multiple of 8. Invariant:
    /// `head_cache <= tail` and `tail + 8 <= head_cache + cap` (the zero-ahead word stays free).
    tail: u64,
    /// The last validated consumer position.
    head_cache: u64,
    /// `head_cache + cap`: the end of the free span, against which
    /// [`try_put_data`](Producer::try_put_data) checks its record; `0` while a raw claim is
    /// open or once failed, so that its one range compare also refuses those cases (they go
    /// to [`claim`](Producer::claim), which reports them): no separate state check per record.
    room_end: u64,
    /// Header word of the first committed but unpublished record (`0`: none), at `first_off`.
    first_word: u64,
    first_off: usize,
    failed: Option<RingError>,
    /// The payload size of the open raw claim ([`Producer::claim_raw`]), if any: no other
    /// record is written until it is committed or aborted.
    raw: Option<usize>,
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
    pub(super) fn new(region: Arc<Region>, max_payload: usize) -> Producer {
        Producer {
            cap: region.capacity(),
            region: Region::clone(&region),
            max_payload,
            tail: 0,
            head_cache: 0,
            room_end: region.capacity() as u64,
            first_word: 0,
            first_off: 0,
            failed: None,
            raw: None,
            #[cfg(loom)]
            stage: vec![0; max_payload],
            _not_sync: PhantomData,
        }
    }

    /// The producing end of a ring in `mem`, which must be zeroed (a fresh memfd, a new
    /// [`HeapRegion`](super::HeapRegion)) and have exactly one producer. Reads nothing from the
    /// region.
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
        if self.raw.is_some() {
            return Err(RingError::ClaimOpen);
        }
        // `payload <= cap / 2 - 8`: no overflow, and `size <= cap / 2`.
        let size = padded(payload);
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

    /// The common case of [`claim`](Self::claim) + write + [`Claim::commit`] (or
    /// [`Claim::commit_batched`] when `batched`) in one step: when a DATA record of `payload`
    /// bytes fits before the area's end and in the free span known from the cached consumer
    /// position, `fill` writes its payload in place (exactly `payload` bytes, their previous
    /// contents unspecified) and the record is committed; `true`. `false`, nothing written:
    /// anything else (a PAD needed first, the cached position to re-read, a payload over the
    /// maximum, an open raw claim, a failed producer): use `claim`, which handles or reports
    /// it.
    ///
    /// Three compares against precomputed bounds instead of `claim`'s state checks and PAD
    /// computation (callgrind of `bench cost`: see `Producer::room_end`).
    #[inline(always)]
    pub fn try_put_data<F>(&mut self, payload: usize, batched: bool, fill: F) -> bool
    where
        F: FnOnce(&mut [u8]),
    {
        let size = padded(payload);
        if !self.fits_fast(payload, size) {
            return false;
        }
        // The record is in the area and the free span, checked above (what `reserve` checks
        // for `Claim::payload_mut`).
        let mut claim = Claim {
            p: self,
            ty: RecordType::Data,
            payload,
            size,
        };
        fill(claim.payload_mut());
        self.commit_data(payload, size, batched);
        true
    }

    /// Whether a DATA record of `payload` bytes (`size` with padding) and the zero-ahead word
    /// after it fit before the area's end and in the free span known from the cached consumer
    /// position, with no PAD needed: three compares against precomputed bounds (`room_end` is
    /// 0 while a raw claim is open or once failed, so they refuse those cases too).
    #[inline(always)]
    fn fits_fast(&self, payload: usize, size: usize) -> bool {
        let off = self.tail as usize & (self.cap - 1);
        payload <= self.max_payload
            && off + size <= self.cap
            && self.tail + (size + RECORD_ALIGN) as u64 <= self.room_end
    }

    /// Commits the DATA record of `payload` bytes (`size` with padding) written in place at
    /// the tail (checked by [`fits_fast`](Self::fits_fast)): into a batch when `batched` or
    /// one is pending, else published alone.
    #[inline(always)]
    fn commit_data(&mut self, payload: usize, size: usize, batched: bool) {
        if !batched && self.first_word == 0 {
            // Alone: the stores `commit` would make, without staging the header to publish it
            // (`stage_header` + `publish` kept it back and cleared it again; `publish` went out
            // of line: 17 instructions and a call per message in callgrind of `bench cost`).
            self.publish_alone(payload, size);
            return;
        }
        // Into a batch (or closing one): staged, published with the batch's first header.
        let claim = Claim {
            p: self,
            ty: RecordType::Data,
            payload,
            size,
        };
        if batched {
            claim.commit_batched();
        } else {
            claim.commit();
        }
    }

    /// [`try_put_data`](Self::try_put_data) of a payload copied from `src` (`len` bytes): the
    /// same outcome and the same record (up to 64 bytes, its padding zeroed).
    ///
    /// A payload of up to 64 bytes goes by its record's size class, one branch on the number
    /// of 8-byte words: in each class the record's size, the zero-ahead word's offset and
    /// every store of the payload are constants, so that no store's address waits for `len`.
    /// A receiver that answers with a message as long as the one it took learns that length
    /// from the peer's header, the line it was spinning on; with the copy's and the zero-ahead
    /// word's addresses computed from it, the reply's stores waited for it too (a 2-thread shm
    /// ping-pong whose echo is `send_copy(&m)`: about 10 ns a round trip more than with a
    /// length known at compile time). The branch is predicted instead.
    ///
    /// # Safety
    ///
    /// `src` is valid for reads of `len` bytes and does not overlap the ring's region.
    #[inline(always)]
    pub unsafe fn try_put_copy(&mut self, src: *const u8, len: usize, batched: bool) -> bool {
        #[cfg(not(loom))]
        {
            // SAFETY: the caller's contract, and `len` in the arm's class.
            unsafe {
                match len.wrapping_sub(1) >> 3 {
                    0 => return self.try_put_words::<1>(src, len, batched),
                    1 => return self.try_put_words::<2>(src, len, batched),
                    2 => return self.try_put_words::<3>(src, len, batched),
                    3 => return self.try_put_words::<4>(src, len, batched),
                    4 => return self.try_put_words::<5>(src, len, batched),
                    5 => return self.try_put_words::<6>(src, len, batched),
                    6 => return self.try_put_words::<7>(src, len, batched),
                    7 => return self.try_put_words::<8>(src, len, batched),
                    _ => {}
                }
            }
        }
        self.try_put_data(
            len,
            batched,
            #[inline(always)]
            |dst| {
                // SAFETY: `dst` is `len` bytes of the record; the caller's contract for `src`.
                unsafe { super::super::copy::copy_bytes(src, dst.as_mut_ptr(), dst.len()) }
            },
        )
    }

    /// [`try_put_copy`](Self::try_put_copy) of a payload of `W` words: `8 * (W - 1) < len <=
    /// 8 * W`.
    ///
    /// # Safety
    ///
    /// As `try_put_copy`, and `len` in that range.
    #[cfg(not(loom))]
    #[inline(always)]
    unsafe fn try_put_words<const W: usize>(
        &mut self,
        src: *const u8,
        len: usize,
        batched: bool,
    ) -> bool {
        let size = RECORD_HEADER + 8 * W;
        if !self.fits_fast(len, size) {
            return false;
        }
        // SAFETY: the record is in the area and in the producer's free span (checked above);
        // `src` and `len` per the caller's contract.
        unsafe { self.store_words::<W>(src, len) };
        self.commit_data(len, size, batched);
        true
    }

    /// Writes the payload of a DATA record of `len` bytes at the tail from `src`, in `W`
    /// whole words (`8 * (W - 1) < len <= 8 * W`), the last one's bytes past `len` zero.
    ///
    /// # Safety
    ///
    /// The record (`RECORD_HEADER + 8 * W` bytes at the tail) is in the area and in the
    /// producer's free span; `src` is valid for reads of `len` bytes and does not overlap the
    /// region; `len` is in the class.
    #[cfg(not(loom))]
    #[inline(always)]
    unsafe fn store_words<const W: usize>(&mut self, src: *const u8, len: usize) {
        let off = self.tail as usize & (self.cap - 1);
        // SAFETY: the record `off .. off + RECORD_HEADER + 8 * W` is in the area and in the
        // producer's free span, which the consumer does not read until it is published; `src`
        // holds `len` readable bytes and `len` is in the class (the caller's contract).
        unsafe {
            let dst = self
                .region
                .bytes_mut(off + RECORD_HEADER, 8 * W)
                .as_mut_ptr()
                .cast::<u64>();
            for i in 0..W - 1 {
                dst.add(i)
                    .write_unaligned(src.add(8 * i).cast::<u64>().read_unaligned());
            }
            dst.add(W - 1)
                .write_unaligned(super::super::copy::last_word(src, len, W).to_le());
        }
    }

    /// Writes the DATA record of `payload` bytes (`size` with padding) whose payload is in
    /// place at the tail (loom: in the stage) and publishes it: the zero-ahead word, the
    /// header (`Release`) and the position, the stores [`Claim::commit`] makes when no batch is
    /// pending (the caller checked `first_word == 0`, and that the record and the word after
    /// it are in the area and the free span).
    #[inline(always)]
    fn publish_alone(&mut self, payload: usize, size: usize) {
        debug_assert_eq!(self.first_word, 0);
        let off = self.tail as usize & (self.cap - 1);
        #[cfg(loom)]
        {
            let stage = std::mem::take(&mut self.stage);
            self.region
                .write_bytes(off + RECORD_HEADER, &stage[..payload]);
            self.stage = stage;
        }
        let tail = self.tail + size as u64;
        // Relaxed: the zero-ahead word, ordered before the consumer's read of it by the Release
        // below, as in `publish` (the word is free: checked by the caller).
        self.region
            .word(tail as usize & (self.cap - 1))
            .store(0, Ordering::Relaxed);
        // The header word as `header_word` encodes it (the length fits: `payload <= cap / 2`),
        // without its fallback's compare.
        let word = (RECORD_HEADER + payload) as u64 | (RecordType::Data as u64) << 32;
        debug_assert_eq!(
            u64::from_ne_bytes(word.to_le_bytes()),
            header_word(RecordType::Data, payload)
        );
        // Release: the commit (the payload was written before), as in `publish`.
        self.region
            .word(off)
            .store(u64::from_ne_bytes(word.to_le_bytes()), Ordering::Release);
        self.tail = tail;
        // Release: for observers, as in `publish`.
        self.region.producer_pos().store(tail, Ordering::Release);
    }

    /// A raw claim was closed: [`try_put_data`](Self::try_put_data) may write again, unless the
    /// producer failed meanwhile (`room_end` stays 0 then).
    #[inline]
    fn reopen(&mut self) {
        if self.failed.is_none() {
            self.room_end = self.head_cache + self.cap as u64;
        }
    }

    /// Re-reads (and validates) the consumer's position and returns it: every record ending at
    /// or before it has been consumed. For credit accounting on top of the ring.
    ///
    /// # Errors
    ///
    /// [`RingError::BadConsumerPosition`] (the producer is then failed).
    #[inline]
    pub fn consumer_position(&mut self) -> Result<u64, RingError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        self.refresh(0)?;
        Ok(self.head_cache)
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
            self.room_end = 0;
            return Err(e);
        }
        self.head_cache = h;
        if self.raw.is_none() {
            self.room_end = h + self.cap as u64;
        }
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

    /// Whether records committed with [`Claim::commit_batched`] (or a PAD) wait for
    /// [`publish`](Self::publish).
    #[inline]
    pub fn is_pending(&self) -> bool {
        self.first_word != 0
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
