//! The receiving half of a direction: [`RxRing`] polls and validates records ([`RxMsg`]), and
//! [`Releaser`] returns held buffers to the sender. The protocol is described in
//! [`ring`](super::ring).
//!
//! The two are separate handles so that a buffer can be released (a received message dropped)
//! while a poll is handing messages to application code.

use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::error::{Field, WireError};
use super::layout::Dir;
use super::mapping::Mapping;
use super::ring::{ring_consumer, Bitmap, Pool, RelRing};
use crate::record::ring::{Consumer, Take};
use crate::record::Record;

/// A message polled from the record ring ([`RxRing::poll`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxMsg<'a> {
    /// A `DATA` record's payload, in place in the ring (valid for the handler call; a hostile
    /// peer can change the bytes while they are read, never their location).
    Inline(&'a [u8]),
    /// A `BUF_REF` record: `len` bytes in the sender's buffer `index`. Validated against the
    /// pool (`index < buffer_count`, `len <= buffer_size`); the caller takes it with
    /// [`Releaser::hold`] (which rejects a buffer already held) and returns it with
    /// [`Releaser::release`].
    Buffer {
        /// Buffer index (`< buffer_count`).
        index: u32,
        /// Payload length (`<= buffer_size`).
        len: u32,
    },
}

/// The receiving half of this side's direction: polls records.
///
/// `Send + !Sync`, methods take `&mut self`. Holds the mapping alive.
pub struct RxRing {
    map: Arc<Mapping>,
    ring: Consumer,
    inline_max: u32,
    pool: Pool,
    failed: Option<(Field, u64, u64)>,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: as for `TxRing`: pointers into the mapping kept alive by `map`; `!Sync` is kept.
unsafe impl Send for RxRing {}

impl std::fmt::Debug for RxRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxRing")
            .field("side", &self.map.side())
            .field("ring", &self.ring)
            .finish()
    }
}

impl RxRing {
    pub(crate) fn new(map: Arc<Mapping>, dir: Dir) -> Result<Self, WireError> {
        let p = *map.layout().params();
        let ring = ring_consumer(&map, dir, p.inline_max as usize)?;
        Ok(RxRing {
            ring,
            inline_max: p.inline_max,
            pool: Pool::new(&map, dir),
            failed: None,
            map,
            _not_sync: PhantomData,
        })
    }

    /// Size of each buffer in bytes.
    #[inline]
    pub fn buffer_size(&self) -> usize {
        self.pool.size as usize
    }

    /// Largest inline payload the peer may send.
    #[inline]
    pub fn inline_max(&self) -> usize {
        self.inline_max as usize
    }

    /// Ring position of the next record (bytes consumed so far).
    #[inline]
    pub fn position(&self) -> u64 {
        self.ring.position()
    }

    /// Bytes the peer says it published beyond our position (a racy hint, clamped to the
    /// ring's capacity; see [`Consumer::pending_hint`]).
    #[inline]
    pub fn pending_hint(&self) -> usize {
        self.ring.pending_hint()
    }

    /// Hands up to `limit` messages to `handler`, in order, then publishes the consumer
    /// position once (the sender gets the space back). Returns how many were handed over
    /// (`0`: nothing published). `PAD` records are skipped; `CREDIT` and `HEARTBEAT` records
    /// (not used on this wire) are ignored. Bounded work: never waits.
    ///
    /// # Errors
    /// [`WireError::Ring`] for a record the ring rejects; [`WireError::Corrupt`] for a
    /// `BUF_REF` naming a buffer outside the pool or longer than a buffer (the messages before
    /// it were handed over). The handle is then failed.
    #[inline]
    pub fn poll<F>(&mut self, limit: usize, handler: F) -> Result<usize, WireError>
    where
        F: FnMut(RxMsg<'_>),
    {
        let r = self.poll_deferred(limit, handler);
        self.ring.publish();
        r
    }

    /// [`poll`](Self::poll) without publishing the consumer position: the sender gets the
    /// space back at the next [`publish`](Self::publish) or `poll` (see
    /// [`Consumer::poll_deferred`]).
    ///
    /// # Errors
    /// As [`poll`](Self::poll).
    #[inline(always)]
    pub fn poll_deferred<F>(&mut self, limit: usize, mut handler: F) -> Result<usize, WireError>
    where
        F: FnMut(RxMsg<'_>),
    {
        if let Some((what, value, position)) = self.failed {
            return Err(WireError::corrupt(what, value, position));
        }
        let pool = &self.pool;
        let mut bad = None;
        let mut n = 0;
        let start = self.ring.position();
        let r = self.ring.poll_deferred(
            limit,
            #[inline(always)]
            |rec| {
                if bad.is_some() {
                    return;
                }
                match rec {
                    Record::Data(b) => {
                        n += 1;
                        handler(RxMsg::Inline(b));
                    }
                    Record::BufRef { buf, len } => {
                        if pool.check(buf).is_err() {
                            bad = Some((Field::BufRefIndex, u64::from(buf), start));
                        } else if len > pool.size_of(buf) {
                            bad = Some((Field::BufRefLen, u64::from(len), start));
                        } else {
                            n += 1;
                            handler(RxMsg::Buffer { index: buf, len });
                        }
                    }
                    _ => {}
                }
            },
        );
        if let Err(source) = r {
            return Err(WireError::Ring { source });
        }
        if let Some(b) = bad {
            self.failed = Some(b);
            // `take_inline` checks no `failed` of its own: the ring refuses it every record.
            self.ring.poison();
            return Err(WireError::corrupt(b.0, b.1, b.2));
        }
        Ok(n)
    }

    /// The common case of [`poll`](Self::poll)`(1, ..)`: a `DATA` payload of at most `max`
    /// bytes handed to `handler` in place, and the consumer position published once it
    /// returned ([`Take::Data`]), or nothing published ([`Take::Empty`]); anything else
    /// ([`Take::Other`], nothing consumed: a `BUF_REF`, a record to validate in full, a failed
    /// handle) is for `poll_deferred`. See [`Consumer::take_data_published`].
    #[inline(always)]
    pub fn take_inline<F>(&mut self, max: usize, handler: F) -> Take
    where
        F: FnOnce(&[u8]),
    {
        self.ring.take_data_published(max, handler)
    }

    /// Publishes the consumer position if it moved (one `Release` store): the sender may reuse
    /// the space of every record consumed so far.
    #[inline]
    pub fn publish(&mut self) {
        self.ring.publish();
    }

    /// Bytes consumed and not yet published to the sender.
    #[inline]
    pub fn unpublished_bytes(&self) -> usize {
        self.ring.unpublished_bytes()
    }

    /// Raw pointer to buffer `index` of the sender's pool, for reading a received buffer in
    /// place (the engine's `Message`). Valid while any handle of the segment is alive; reading
    /// through it is allowed only while the buffer is held.
    ///
    /// # Errors
    /// [`WireError::BadBufferIndex`].
    #[inline]
    pub fn buffer_ptr(&self, index: u32) -> Result<NonNull<u8>, WireError> {
        self.pool.check(index)?;
        Ok(self.pool.ptr(index))
    }
}

/// The release half of this side's receiving direction: which of the sender's buffers this
/// side holds, and the release ring that returns them.
///
/// `Send + !Sync`, methods take `&mut self`. Holds the mapping alive.
pub struct Releaser {
    map: Arc<Mapping>,
    rel: RelRing,
    /// Next release entry to write.
    rel_tail: u64,
    /// Last tail published with `publish_releases`.
    rel_published: u64,
    /// Last validated release head. Invariant: `rel_head_cache <= rel_tail <= rel_head_cache + cap`.
    rel_head_cache: u64,
    pool: Pool,
    /// Bit set = the receiver holds the buffer (delivered, not yet released).
    held: Bitmap,
    held_count: u32,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: as for `TxRing`: pointers into the mapping kept alive by `map`; `!Sync` is kept.
unsafe impl Send for Releaser {}

impl std::fmt::Debug for Releaser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Releaser")
            .field("side", &self.map.side())
            .field("held", &self.held_count)
            .field("rel_tail", &self.rel_tail)
            .finish()
    }
}

impl Releaser {
    pub(crate) fn new(map: Arc<Mapping>, dir: Dir) -> Self {
        Releaser {
            rel: RelRing::new(&map, dir),
            rel_tail: 0,
            rel_published: 0,
            rel_head_cache: 0,
            held: Bitmap::new(Pool::new(&map, dir).bits()),
            pool: Pool::new(&map, dir),
            held_count: 0,
            map,
            _not_sync: PhantomData,
        }
    }

    /// Buffers currently held by the receiver (delivered and not yet released).
    #[inline]
    pub fn held(&self) -> u32 {
        self.held_count
    }

    /// Takes buffer `index` of a received `BUF_REF` ([`RxMsg::Buffer`]): this side holds it
    /// until [`release`](Self::release).
    ///
    /// # Errors
    /// [`WireError::BadBufferIndex`]; [`WireError::Corrupt`] ([`Field::BufRefHeld`]) when this
    /// side already holds it (the peer sent it twice without a release).
    #[inline]
    pub fn hold(&mut self, index: u32) -> Result<(), WireError> {
        let bit = self.pool.check(index)?;
        if self.held.get(bit) {
            return Err(WireError::corrupt(
                Field::BufRefHeld,
                u64::from(index),
                self.rel_tail,
            ));
        }
        self.held.set(bit);
        self.held_count += 1;
        Ok(())
    }

    /// Shared view of the first `len` bytes of held buffer `index`, read in place (zero copy).
    ///
    /// The protocol gives the sender no write access while the receiver holds the buffer, but a
    /// hostile peer may still write it: treat the bytes as untrusted input that can change while
    /// read (parse, don't trust; never derive memory-safety facts from them).
    ///
    /// # Errors
    /// [`WireError::BadBufferIndex`], [`WireError::BufferNotHeld`], or
    /// [`WireError::PayloadTooLarge`] if `len > buffer_size`.
    #[inline]
    pub fn buffer(&self, index: u32, len: usize) -> Result<&[u8], WireError> {
        let bit = self.pool.check(index)?;
        if !self.held.get(bit) {
            return Err(WireError::BufferNotHeld { index });
        }
        if len > self.pool.size_of(index) as usize {
            return Err(WireError::PayloadTooLarge {
                len,
                max: self.pool.size_of(index) as usize,
            });
        }
        let p = self.pool.ptr(index);
        // SAFETY: the buffer lies inside the mapping kept alive by `self.map` and `len` is within
        // it; see the method docs for what concurrent peer writes mean for the contents.
        Ok(unsafe { std::slice::from_raw_parts(p.as_ptr(), len) })
    }

    /// Returns held buffer `index` to the sender (staged; visible after
    /// [`Releaser::publish_releases`]). The receiver must not read the buffer afterwards.
    ///
    /// # Errors
    /// [`WireError::BadBufferIndex`], [`WireError::BufferNotHeld`] for caller mistakes;
    /// [`WireError::Corrupt`] if the release head read from the segment is invalid or the ring
    /// overflows (impossible with an honest sender, see [`Field::ReleaseOverflow`]).
    #[inline]
    pub fn release(&mut self, index: u32) -> Result<(), WireError> {
        let bit = self.pool.check(index)?;
        if !self.held.get(bit) {
            return Err(WireError::BufferNotHeld { index });
        }
        if self.rel_tail - self.rel_head_cache >= self.rel.cap {
            let h = self.rel.head().load(Ordering::Acquire);
            if h < self.rel_head_cache || h > self.rel_published {
                return Err(WireError::corrupt(Field::ReleaseHead, h, self.rel_tail));
            }
            self.rel_head_cache = h;
            if self.rel_tail - h >= self.rel.cap {
                return Err(WireError::corrupt(
                    Field::ReleaseOverflow,
                    self.rel_tail - h,
                    self.rel_tail,
                ));
            }
        }
        self.rel
            .entry(self.rel_tail)
            .store(index, Ordering::Relaxed);
        self.rel_tail += 1;
        self.held.clear(bit);
        self.held_count -= 1;
        Ok(())
    }

    /// Publishes all staged releases with one `Release` store (skipped if none are staged).
    #[inline]
    pub fn publish_releases(&mut self) {
        if self.has_unpublished_releases() {
            self.rel.tail().store(self.rel_tail, Ordering::Release);
            self.rel_published = self.rel_tail;
        }
    }

    /// Whether [`Releaser::release`]s are waiting for [`Releaser::publish_releases`].
    #[inline]
    pub fn has_unpublished_releases(&self) -> bool {
        self.rel_tail != self.rel_published
    }
}
