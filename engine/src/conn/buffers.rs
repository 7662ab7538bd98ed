//! The in-place buffers of a [`Connection`]: [`SendBuf`] (a send-pool buffer being filled) and
//! [`Message`] (a received message, read in place). Both borrow their connection and give their
//! buffer back when dropped.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use super::stash::{self, RECORD};
use super::{Connection, RING_CLAIM};
use crate::desc::{is_large, large_slot, RxDesc, BUF_INLINE};
use crate::error::Error;
use crate::record::copy::copy_bytes;

/// A send buffer of a connection's pool, written in place, or (from
/// [`Connection::claim`] on a direct path) the payload of a record claimed in the connection's
/// ring, staged until the commit. Derefs to the message bytes (`len` of them); [`as_mut_slice`](Self::as_mut_slice)
/// exposes the whole buffer for writing.
///
/// Dropping it without sending returns it to the pool (a ring claim is aborted: nothing is
/// published).
pub struct SendBuf<'c> {
    pub(super) conn: &'c Connection,
    /// The buffer (low half) and the message length (high half), in one word: both are always
    /// written and read as the whole word, so a read of the pair right after `set_len` or
    /// `copy_from` is forwarded from that store. (Two `u32` fields were written narrowly, the
    /// length alone, and read back as one 8-byte load by `send`: a store-forwarding stall,
    /// about a quarter of the sender's time in `perf` of `bench cost`.)
    ///
    /// The buffer is `< tx_pool.count()`; `LARGE_BIT | slot` for a large slot (`slot <
    /// tx_large.count()`); or `RING_CLAIM` for the connection's open ring claim (whose pointer
    /// and length the connection keeps: one claim is open at a time). The length is
    /// `<= capacity()`.
    word: u64,
}

impl<'c> SendBuf<'c> {
    /// A handle of buffer `idx` of `conn` holding a `len`-byte message.
    #[inline(always)]
    pub(super) fn new(conn: &'c Connection, idx: u32, len: u32) -> SendBuf<'c> {
        SendBuf {
            conn,
            word: u64::from(idx) | u64::from(len) << 32,
        }
    }

    /// The buffer index (see the field).
    #[inline(always)]
    pub(super) fn idx(&self) -> u32 {
        self.word as u32
    }

    /// The message length.
    #[inline(always)]
    pub(super) fn msg_len(&self) -> u32 {
        (self.word >> 32) as u32
    }

    /// Both at once, from one load of the word.
    #[inline(always)]
    pub(super) fn parts(&self) -> (u32, u32) {
        let w = self.word;
        (w as u32, (w >> 32) as u32)
    }

    #[inline(always)]
    fn put_len(&mut self, len: u32) {
        self.word = (self.word & 0xffff_ffff) | u64::from(len) << 32;
    }
}

// 16 bytes, so that it is passed and moved in two registers. With the pointer and the
// capacity in it (32 bytes) it was moved through the stack with wide loads over fields its
// owner had just written narrowly (`alloc` the index, `copy_from` the length), which stall on
// store forwarding: the largest single cost of alloc + copy_from + send in `perf annotate`
// of `bench cost`. Both are derived instead (one multiply, or the open claim's).
const _: () = assert!(std::mem::size_of::<SendBuf<'static>>() == 16);

impl std::fmt::Debug for SendBuf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBuf")
            .field("buf", &self.idx())
            .field("len", &self.msg_len())
            .finish()
    }
}

impl SendBuf<'_> {
    /// The buffer's capacity: the largest message (for a ring claim, the length claimed).
    #[inline]
    pub fn capacity(&self) -> usize {
        if !is_large(self.idx()) {
            self.conn.tx_pool.buf_size()
        } else if self.idx() == RING_CLAIM {
            self.conn.ring_claim().1
        } else {
            self.conn.tx_large.buf_size()
        }
    }

    /// The start of the buffer (or of the ring claim's staging line).
    #[inline(always)]
    fn ptr(&self) -> NonNull<u8> {
        self.ptr_cap().0
    }

    /// The start of the buffer and its capacity, from one dispatch on the kind (with
    /// [`ptr`](Self::ptr) and [`capacity`](Self::capacity) apart, `copy_from` tested the kind
    /// twice: callgrind of `bench cost`'s claim stage).
    #[inline(always)]
    fn ptr_cap(&self) -> (NonNull<u8>, usize) {
        let idx = self.idx();
        if !is_large(idx) {
            // SAFETY: `idx < count` (the field's invariant: every constructor checks it).
            let p = unsafe { self.conn.tx_pool.buf_ptr_unchecked(idx) };
            (p, self.conn.tx_pool.buf_size())
        } else if idx == RING_CLAIM {
            self.conn.ring_claim()
        } else {
            // SAFETY: `slot < large count` (the field's invariant: `take_large` checks it).
            let p = unsafe { self.conn.tx_large.buf_ptr_unchecked(large_slot(idx)) };
            (p, self.conn.tx_large.buf_size())
        }
    }

    /// The whole buffer, for writing in place; then [`set_len`](Self::set_len).
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let (ptr, cap) = self.ptr_cap();
        // SAFETY: `ptr .. ptr + cap` is this buffer of the send pool, kept mapped by the
        // connection this borrows; the buffer is owned by this handle alone (the poller hands a
        // buffer out once and the engine's ownership bitmap rejects double frees; on a direct
        // path the wire layer's in-flight bitmap does), and by protocol the peer only reads it.
        // For a ring claim it is the connection's staging line (its own allocation, `cap <=`
        // its size), whose bytes the commit copies into the claimed record: nothing else
        // writes or reads it while the claim is open (the ring refuses every other write,
        // `RingError::ClaimOpen`), and the connection allows one open claim.
        unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), cap) }
    }

    /// Sets the message length.
    ///
    /// # Errors
    ///
    /// [`Error::MessageTooLarge`] when `len` exceeds the capacity.
    #[inline]
    pub fn set_len(&mut self, len: usize) -> Result<(), Error> {
        let cap = self.capacity();
        if len > cap {
            return Err(Error::MessageTooLarge {
                size: len,
                max: cap,
            });
        }
        self.put_len(len as u32);
        Ok(())
    }

    /// Copies `data` into the buffer and sets the length.
    ///
    /// # Errors
    ///
    /// [`Error::MessageTooLarge`] when `data` is longer than the capacity.
    #[inline]
    pub fn copy_from(&mut self, data: &[u8]) -> Result<(), Error> {
        let (ptr, cap) = self.ptr_cap();
        if data.len() > cap {
            return Err(Error::MessageTooLarge {
                size: data.len(),
                max: cap,
            });
        }
        // SAFETY: `data.len() <= cap` bytes into this buffer (see `as_mut_slice`), which does
        // not overlap `data` (a shared borrow cannot alias the buffer this handle owns).
        unsafe { copy_bytes(data.as_ptr(), ptr.as_ptr(), data.len()) };
        self.put_len(data.len() as u32);
        Ok(())
    }

    /// Whether this is a ring claim: [`Connection::claim`] of a message up to the inline
    /// threshold on a direct path (shm): its record reserved in the connection's ring, its
    /// bytes written in the connection's staging line and copied into the record with its
    /// header by [`Connection::send`]. One is open per connection at a time; any other
    /// `SendBuf` is a pool buffer or a large slot.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use spinwire::Engine;
    /// # fn main() -> Result<(), spinwire::Error> {
    /// let engine = Engine::builder().build()?;
    /// # let name = format!("shm://doc-ring-claim-{}", std::process::id());
    /// let listener = engine.listen(&name)?;
    /// let client = engine.connect(&name)?;
    /// let _server = listener.accept_timeout(Duration::from_secs(5))?;
    /// let small = client.claim(8)?;
    /// assert!(small.is_ring_claim());
    /// drop(small); // aborted: nothing is published
    /// let large = client.claim(4000)?; // above the inline threshold: a pool buffer
    /// assert!(!large.is_ring_claim());
    /// # Ok(())
    /// # }
    /// ```
    #[inline(always)]
    pub fn is_ring_claim(&self) -> bool {
        self.idx() == RING_CLAIM
    }
}

impl Deref for SendBuf<'_> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: as in `as_mut_slice`; `len <= cap`.
        unsafe { std::slice::from_raw_parts(self.ptr().as_ptr(), self.msg_len() as usize) }
    }
}

impl DerefMut for SendBuf<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.msg_len() as usize;
        &mut self.as_mut_slice()[..len]
    }
}

impl Drop for SendBuf<'_> {
    fn drop(&mut self) {
        self.conn.give_back(self.idx());
    }
}

/// A received message, read in place. Derefs to its bytes; dropping it recycles its buffer.
///
/// One pointer, to the message's record (the connection, a pointer, the length, the buffer)
/// in a slot of the connection's stash (see `Error::TooManyHeld` for how many can be held): a
/// message in a pool buffer or a large slot is read where the peer wrote it, one that arrived
/// inline is in the slot, after the record.
///
/// A handle of one word is moved through `Result<Option<Message>>`, `?` and `if let` as one
/// 8-byte load of the 8-byte store that made it. The 24-byte handle it replaced was copied by
/// those moves with a 16-byte load over the narrow stores that had just written it, a
/// store-forwarding stall per message that doubled the round trip of a receive loop written
/// with `if let Ok(Some(m))` or `?` (a `match` on the result escaped it).
pub struct Message<'c> {
    /// The record, at the start of the stash slot the message holds (an inline message's
    /// payload follows it there); valid and this message's until it drops.
    held: NonNull<Held>,
    _conn: PhantomData<&'c Connection>,
}

// One word, and so is `Option<Message>` (the pointer's niche): what `try_recv`'s result,
// `?` and `if let` move (the type's docs).
const _: () = assert!(
    std::mem::size_of::<Message<'static>>() == std::mem::size_of::<usize>()
        && std::mem::size_of::<Option<Message<'static>>>() == std::mem::size_of::<usize>()
);

/// A held message's record: written by the receive that hands the message out, read by its
/// handle.
#[repr(C)]
pub(super) struct Held {
    conn: NonNull<Connection>,
    /// The first byte: in the receive pool, a large slot, or the stash slot this message owns.
    ptr: NonNull<u8>,
    len: u32,
    /// `BUF_INLINE` (a stash slot), a receive buffer, or `LARGE_BIT | slot`: what the drop
    /// gives back.
    buf: u32,
}

// A stash slot keeps room for the record of the message it holds.
const _: () = assert!(
    std::mem::size_of::<Held>() <= RECORD && std::mem::align_of::<Held>() <= RECORD,
    "a stash slot's record room holds a `Held`"
);

impl std::fmt::Debug for Message<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message").field("len", &self.len()).finish()
    }
}

impl<'c> Message<'c> {
    /// The message in descriptor `desc` (as the poller delivered it), held in stash slot
    /// `slot` (taken by the caller; the message owns it): an inline one is copied into the
    /// slot, a pooled one points into the receive pool or a large slot.
    ///
    /// # Safety
    ///
    /// As [`pooled`](Self::pooled) for a pooled `desc`; `slot` was taken from `conn`'s stash
    /// and is owned by the caller.
    #[inline(always)]
    pub(super) unsafe fn from_desc(
        conn: &'c Connection,
        desc: &RxDesc,
        slot: NonNull<u8>,
    ) -> Message<'c> {
        if desc.buf == BUF_INLINE {
            // SAFETY: the poller's `RxSink::push_inline` initialised `len <= INLINE_MAX` bytes
            // of `data`; the slot has room for `INLINE_MAX` and does not overlap it.
            unsafe { Message::copied(conn, desc.data.as_ptr().cast(), desc.len, slot) }
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { Message::pooled(conn, desc.buf, desc.len, desc.offset(), slot) }
        }
    }

    /// The `len` bytes at `src` copied into stash slot `slot`'s payload, as an inline message.
    ///
    /// # Safety
    ///
    /// `slot` was taken from `conn`'s stash and is owned by the caller; `len <= INLINE_MAX`
    /// bytes at `src` are initialised and do not overlap the slot.
    #[inline(always)]
    pub(super) unsafe fn copied(
        conn: &'c Connection,
        src: *const u8,
        len: u32,
        slot: NonNull<u8>,
    ) -> Message<'c> {
        // SAFETY: the caller's contract; a stash slot's payload holds `INLINE_MAX` bytes.
        unsafe {
            copy_bytes(src, stash::payload(slot).as_ptr(), len as usize);
            Message::inline(conn, slot, len)
        }
    }

    /// The inline message of `len` bytes in stash slot `slot`'s payload; dropping it gives the
    /// slot back.
    ///
    /// # Safety
    ///
    /// `slot` was taken from `conn`'s stash, is owned by the caller, and the first `len`
    /// bytes of its payload are initialised.
    #[inline(always)]
    pub(super) unsafe fn inline(conn: &'c Connection, slot: NonNull<u8>, len: u32) -> Message<'c> {
        // SAFETY: the caller's contract; the payload lies in the slot, after the record.
        unsafe { Message::held(conn, slot, stash::payload(slot), len, BUF_INLINE) }
    }

    /// The message of `len` bytes at offset `off` of receive buffer `buf`, or of large slot
    /// `buf` (`LARGE_BIT | slot`), held in stash slot `slot`; dropping it releases the buffer
    /// and gives the slot back.
    ///
    /// # Safety
    ///
    /// `buf` (or its large slot) was checked against the pool (`buf < count`, `off + len <=`
    /// the buffer's size) and is lent to this side until released; `slot` was taken from
    /// `conn`'s stash and is owned by the caller.
    #[inline(always)]
    pub(super) unsafe fn pooled(
        conn: &'c Connection,
        buf: u32,
        len: u32,
        off: u32,
        slot: NonNull<u8>,
    ) -> Message<'c> {
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { pooled_ptr(conn, buf, off) };
        // SAFETY: the caller's contract, as in `inline`.
        unsafe { Message::held(conn, slot, ptr, len, buf) }
    }

    /// Writes the record of a message (`len` bytes at `ptr`, `buf` given back when it drops)
    /// at the start of stash slot `slot`, and returns the message.
    ///
    /// # Safety
    ///
    /// `slot` was taken from `conn`'s stash and is owned by the caller; `ptr` points to `len`
    /// initialised bytes that stay valid and unwritten by this side until the message drops
    /// (its payload in `slot`, with `buf == BUF_INLINE`; or buffer `buf`, lent to this side).
    #[inline(always)]
    unsafe fn held(
        conn: &'c Connection,
        slot: NonNull<u8>,
        ptr: NonNull<u8>,
        len: u32,
        buf: u32,
    ) -> Message<'c> {
        let held = slot.cast::<Held>();
        // SAFETY: the slot is the caller's, its first `RECORD` bytes kept for this record
        // (aligned: slots are cache-line aligned), apart from the payload.
        unsafe {
            held.as_ptr().write(Held {
                conn: NonNull::from(conn),
                ptr,
                len,
                buf,
            })
        };
        Message {
            held,
            _conn: PhantomData,
        }
    }

    /// The message bytes (same as deref).
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        self
    }
}

impl Deref for Message<'_> {
    type Target = [u8];
    #[inline(always)]
    fn deref(&self) -> &[u8] {
        let h = self.held.as_ptr();
        // SAFETY: the record is this message's until it drops (written when it was handed
        // out); its `ptr` points to `len` initialised bytes that the message owns or is lent
        // (its stash slot, or a pool buffer or large slot checked on delivery and held until
        // this message drops), in memory the connection it borrows keeps alive. A peer
        // violating the protocol by rewriting a shared buffer can only change the bytes seen,
        // not their location.
        unsafe { std::slice::from_raw_parts((*h).ptr.as_ptr(), (*h).len as usize) }
    }
}

impl Drop for Message<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        let h = self.held.as_ptr();
        // SAFETY: the record is this message's (as in `deref`); `conn` is the connection the
        // message borrows, alive for the message's lifetime.
        let (conn, buf) = unsafe { ((*h).conn.as_ref(), (*h).buf) };
        conn.stash.give_back(self.held.cast());
        if buf != BUF_INLINE {
            conn.release_rx(buf);
        }
    }
}

/// A received buffer lent to a batch handler, which reads it in place: dropping it (also on
/// unwind) releases the buffer. (A `Message` without the record: the handler gets the bytes.)
pub(super) struct LentBuf<'c> {
    conn: &'c Connection,
    buf: u32,
    ptr: NonNull<u8>,
    len: u32,
}

impl<'c> LentBuf<'c> {
    /// The `len` bytes at offset `off` of receive buffer `buf` (or large slot `LARGE_BIT |
    /// slot`), released when this drops.
    ///
    /// # Safety
    ///
    /// As [`Message::pooled`]'s for `buf`, `len` and `off`.
    #[inline(always)]
    pub(super) unsafe fn new(conn: &'c Connection, buf: u32, len: u32, off: u32) -> LentBuf<'c> {
        LentBuf {
            conn,
            buf,
            // SAFETY: the caller's contract, passed on.
            ptr: unsafe { pooled_ptr(conn, buf, off) },
            len,
        }
    }

    /// The message bytes.
    #[inline(always)]
    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` bytes of a buffer checked on delivery and lent to this
        // side until this drops, in memory the connection it borrows keeps alive.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len as usize) }
    }
}

impl Drop for LentBuf<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.conn.release_rx(self.buf);
    }
}

/// Where the bytes at offset `off` of receive buffer `buf` (or large slot `LARGE_BIT | slot`)
/// of `conn` lie.
///
/// # Safety
///
/// As [`Message::pooled`]: `buf` (or its slot) and `off` checked against the pool.
#[inline(always)]
unsafe fn pooled_ptr(conn: &Connection, buf: u32, off: u32) -> NonNull<u8> {
    if is_large(buf) {
        // SAFETY: `slot < count` (the caller's contract).
        unsafe { conn.rx_large.buf_ptr_unchecked(large_slot(buf)) }
    } else {
        // SAFETY: `buf < count` and `off <= buf_size` (the caller's contract): inside the
        // buffer.
        unsafe {
            let base = conn.rx_pool.buf_ptr_unchecked(buf);
            NonNull::new_unchecked(base.as_ptr().add(off as usize))
        }
    }
}
