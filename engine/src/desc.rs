//! Descriptors moved through the app <-> poller rings, and views of buffer pools.

use core::mem::MaybeUninit;
use core::ptr::NonNull;

/// Largest message a receive descriptor carries inline (copied out of the fabric's descriptor), so
/// that a small message costs no pool buffer and no buffer-return round trip. Messages up to
/// [`EngineBuilder::inline_threshold`](crate::EngineBuilder::inline_threshold) (capped here) travel
/// inline.
pub const INLINE_MAX: usize = 120;

/// `RxDesc::buf` value meaning "the payload is inline".
pub(crate) const BUF_INLINE: u32 = u32::MAX;

/// `RxDesc::buf` value meaning "several small messages are packed into `data`" (dedicated
/// pollers: see [`RxSink::packing`](crate::fabric::RxSink::packing)). The low 16 bits of
/// `len` are the first message's length (its bytes start `data`); the high 16 bits are how many
/// messages follow it, each a native-endian `u16` length and its bytes, back to back.
pub(crate) const BUF_PACKED: u32 = u32::MAX - 1;

/// Bytes of a packed message's length field.
pub(crate) const PACKED_HDR: usize = 2;

const _: () = assert!(INLINE_MAX <= u16::MAX as usize);

/// Set in a buffer index that names a slot of the connection's **large pool**
/// instead of a buffer of its ordinary pool: `LARGE_BIT | slot`, in the same direction. Such
/// indices travel wherever pool-buffer indices do ([`TxDesc::buf`], the free and release rings,
/// [`TxDone::free_buf`](crate::fabric::TxDone::free_buf), [`FabricConn::release_rx`](crate::fabric::FabricConn::release_rx));
/// [`RxSink::push_large`](crate::fabric::RxSink::push_large) lends a received one. A large slot
/// holds one message of up to `max_message_size` bytes
/// ([`EngineBuilder::max_message_size`](crate::EngineBuilder::max_message_size)).
///
/// The slot count is capped at [`MAX_LARGE_BUFFERS`](crate::config::MAX_LARGE_BUFFERS), so
/// `LARGE_BIT | slot` never equals the inline marker `u32::MAX`.
pub const LARGE_BIT: u32 = 1 << 31;

/// True when `idx` (a pool index, not the inline marker) names a large slot.
#[inline(always)]
pub const fn is_large(idx: u32) -> bool {
    idx & LARGE_BIT != 0
}

/// The large slot that `idx` names (`idx` with [`LARGE_BIT`] cleared).
#[inline(always)]
pub const fn large_slot(idx: u32) -> u32 {
    idx & !LARGE_BIT
}

/// Largest message a send descriptor carries inline ([`TxDesc::is_inline`]): with dedicated
/// pollers (not in run-to-completion mode) a message this small is copied into the send
/// ring's slot, whose line brings the poller the descriptor, the payload and the news that it
/// is there at once, and its buffer is the application's again at once (no free-ring round
/// trip). 16 bytes: the descriptor is 24 and its stamped slot 32, two to a cache line.
pub const TX_INLINE_MAX: usize = 16;

/// A send descriptor: application -> poller. The payload is in buffer `buf` of the connection's send
/// pool, or, with [`LARGE_BIT`] set, in slot `buf & !LARGE_BIT` of its large send pool, or, with
/// `buf == u32::MAX` ([`is_inline`](Self::is_inline)), in the descriptor itself (at most
/// [`TX_INLINE_MAX`] bytes; only for a fabric that takes them,
/// `FabricConn::INLINE_SENDS`).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct TxDesc {
    /// Buffer index in the send pool, `< pool.count()`; or `LARGE_BIT | slot` with
    /// `slot < large_pool.count()`; or `u32::MAX`: the payload is inline. Crate code never
    /// sets it to `u32::MAX` on a descriptor it did not build inline (see
    /// [`from_parts`](Self::from_parts)).
    pub(crate) buf: u32,
    /// Payload bytes, `<=` the buffer's (or the large slot's) size, or `<= TX_INLINE_MAX`
    /// inline.
    pub(crate) len: u32,
    /// The inline payload, as two words: moved whole, never byte by byte (built with narrow
    /// stores and copied with wide loads, or the reverse, a descriptor stalled each send on
    /// store forwarding: half of the application's time in `Polled::send` under `perf` of
    /// `bench rate --fabric mem --mode dedicated`). Left uninitialised in a pooled descriptor
    /// built by `from_parts`: zeroing it cost run-to-completion's streamed `poll` 1.5 ns a
    /// message (`bench cost --fabric mem --sizes 8`: 20.6 -> 22.1 ns), two stores per send
    /// and the ring slot's whole width read back.
    data: [MaybeUninit<u64>; 2],
}

const _: () = assert!(core::mem::size_of::<TxDesc>() == 24);
const _: () = assert!(TX_INLINE_MAX == 16);

/// The payload words of a pooled descriptor ([`TxDesc::from_parts`]): not used, not written.
pub(crate) const NO_WORDS: [MaybeUninit<u64>; 2] = [MaybeUninit::uninit(); 2];

impl TxDesc {
    /// A descriptor of a message of `len` bytes in send buffer (or large slot) `buf` (with
    /// `buf == u32::MAX`, an inline one of `len` zero bytes).
    #[inline(always)]
    pub const fn new(buf: u32, len: u32) -> TxDesc {
        TxDesc {
            buf,
            len,
            data: [MaybeUninit::new(0); 2],
        }
    }

    /// The buffer index (see [`TxDesc`]).
    #[inline(always)]
    pub fn buf(&self) -> u32 {
        self.buf
    }

    /// The payload length.
    #[inline(always)]
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True for an empty message.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A descriptor carrying the `len`-byte message at `src` inline: the [`TX_INLINE_MAX`]
    /// bytes from `src` are copied (two word loads, whatever `len`), of which the first `len`
    /// are the message.
    ///
    /// # Safety
    ///
    /// As [`inline_words`](Self::inline_words).
    #[cfg(test)]
    #[inline(always)]
    pub(crate) unsafe fn inline_from(src: *const u8, len: u32) -> TxDesc {
        // SAFETY: the caller's contract; `inline_words` initialises both words.
        unsafe { TxDesc::from_parts(BUF_INLINE, len, TxDesc::inline_words(src)) }
    }

    /// The words an inline descriptor of the message at `src` carries
    /// ([`from_parts`](Self::from_parts) with `u32::MAX` builds it): the [`TX_INLINE_MAX`]
    /// bytes from `src`, two word loads. Both are initialised.
    ///
    /// # Safety
    ///
    /// `src` is valid for reads of `TX_INLINE_MAX` initialised bytes (a pool buffer at least
    /// that long: the bytes past the message are carried along and never read as payload).
    #[inline(always)]
    pub(crate) unsafe fn inline_words(src: *const u8) -> [MaybeUninit<u64>; 2] {
        // SAFETY: the caller's contract: 16 readable, initialised bytes at `src`.
        unsafe {
            [
                MaybeUninit::new(load_word(src)),
                MaybeUninit::new(load_word(src.add(8))),
            ]
        }
    }

    /// A descriptor of its fields: with `buf == u32::MAX` the first `len <= TX_INLINE_MAX`
    /// bytes of `data` are the message ([`inline_words`](Self::inline_words)); otherwise
    /// `data` is unused ([`NO_WORDS`]). Scalars in, so that a caller that picks between an
    /// inline and a pooled descriptor keeps it in registers (built in memory by either arm of
    /// an `if`, it was stored narrowly and loaded wide by the ring's write: a store-forwarding
    /// stall per send, behind the slot's own miss).
    ///
    /// # Safety
    ///
    /// With `buf == u32::MAX`, both words of `data` are initialised (the inline payload is
    /// read from them).
    #[inline(always)]
    pub(crate) const unsafe fn from_parts(
        buf: u32,
        len: u32,
        data: [MaybeUninit<u64>; 2],
    ) -> TxDesc {
        TxDesc { buf, len, data }
    }

    /// True when the payload is in the descriptor (`buf == u32::MAX`).
    #[inline(always)]
    pub fn is_inline(&self) -> bool {
        self.buf == BUF_INLINE
    }

    /// Where an inline descriptor's payload starts (its first `len` bytes are initialised
    /// when [`is_inline`](Self::is_inline); the pointer is valid while the descriptor is).
    #[inline(always)]
    pub(crate) fn data_ptr(&self) -> *const u8 {
        self.data.as_ptr().cast::<u8>()
    }

    /// An inline descriptor's payload (`None` for a pooled one, or a length past
    /// [`TX_INLINE_MAX`], which the poller rejects).
    #[inline(always)]
    pub fn inline_payload(&self) -> Option<&[u8]> {
        if !self.is_inline() || self.len as usize > TX_INLINE_MAX {
            return None;
        }
        // SAFETY: an inline descriptor's two words are initialised: `new` writes them, and
        // `from_parts` requires them with `buf == u32::MAX`; the field is crate-private and
        // crate code never turns a pooled descriptor into an inline one. `len <=
        // TX_INLINE_MAX` is checked above.
        Some(unsafe {
            core::slice::from_raw_parts(self.data.as_ptr().cast::<u8>(), self.len as usize)
        })
    }
}

impl PartialEq for TxDesc {
    fn eq(&self, other: &TxDesc) -> bool {
        self.buf == other.buf
            && self.len == other.len
            && self.inline_payload() == other.inline_payload()
    }
}

impl Eq for TxDesc {}

impl core::fmt::Debug for TxDesc {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TxDesc")
            .field("buf", &self.buf)
            .field("len", &self.len)
            .field("inline", &self.inline_payload())
            .finish()
    }
}

/// A receive descriptor: poller -> application. Either the payload is inline (`buf == u32::MAX`,
/// first `len` bytes of `data` initialised) or it is in buffer `buf` of the receive pool, at
/// byte offset [`offset`](Self::offset) (kept in the first 4 bytes of `data`, which a pooled
/// descriptor does not otherwise use). A dedicated poller may also pack several small inline
/// messages into one (`BUF_PACKED`), which the application's receive takes apart.
///
/// 128 bytes, so a 64-byte message (plus its header) is delivered inline. In the receive ring
/// (a [`rings::StampedRing`]) it follows its slot's 8-byte stamp at the start of a cache line:
/// the stamp, the header and a message of up to 48 bytes share one line, which brings the
/// application a small message and the news that it is there.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct RxDesc {
    pub(crate) len: u32,
    pub(crate) buf: u32,
    pub(crate) data: [MaybeUninit<u8>; INLINE_MAX],
}

/// Bytes of `RxDesc::data` that hold a pooled descriptor's offset.
pub(crate) const OFF_BYTES: usize = 4;

const _: () = assert!(core::mem::size_of::<RxDesc>() == 128);
const _: () = assert!(OFF_BYTES <= INLINE_MAX);

impl RxDesc {
    /// The payload length.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True for an empty message.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The receive-pool buffer, or `None` when the payload is inline.
    #[inline]
    pub fn buf(&self) -> Option<u32> {
        (self.buf != BUF_INLINE).then_some(self.buf)
    }

    /// Where the payload starts in its receive-pool buffer (0 when inline). `offset + len` is
    /// at most the buffer size ([`RxSink::push_pooled_at`](crate::fabric::RxSink::push_pooled_at)
    /// checks it).
    #[inline]
    pub fn offset(&self) -> u32 {
        if self.buf == BUF_INLINE {
            return 0;
        }
        // SAFETY: a pooled descriptor is only ever written by `RxSink::push_pooled_at`, which
        // initialises the first `OFF_BYTES` bytes of `data` with the offset (the fields are
        // crate-private, so nothing else builds one); `OFF_BYTES <= INLINE_MAX`.
        let b = unsafe {
            self.data
                .as_ptr()
                .cast::<[u8; OFF_BYTES]>()
                .read_unaligned()
        };
        u32::from_ne_bytes(b)
    }
}

impl core::fmt::Debug for RxDesc {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RxDesc")
            .field("len", &self.len)
            .field("buf", &self.buf())
            .field("offset", &self.offset())
            .finish()
    }
}

/// The next message of packed descriptor `desc` (the receive ring's head), given what was taken
/// of it (`left`, `next`: the consumer's cursor, updated): where its bytes are, its length, and
/// whether it was the descriptor's last (the slot may be released).
///
/// # Safety
///
/// `desc` was written by an [`RxSink`](crate::fabric::RxSink) as a packed descriptor
/// ([`BUF_PACKED`]), and `left`/`next` are what the earlier calls for it left (both 0 before
/// the first).
#[inline(always)]
pub(crate) unsafe fn packed_entry(
    desc: &RxDesc,
    left: &mut u32,
    next: &mut u32,
) -> (*const u8, u32, bool) {
    let data = desc.data.as_ptr().cast::<u8>();
    if *left == 0 {
        // The first message: the descriptor's later lines, which hold the rest, are asked
        // for now, so that their transfers from the poller's core overlap rather than follow
        // one another as the takes reach them (`bench rate --fabric mem --mode dedicated
        // --one-thread`: the stall on the second line was a tenth of `try_recv`'s samples).
        rings::prefetch::prefetch_read_rest(desc);
        let len = desc.len & 0xffff;
        *left = desc.len >> 16;
        *next = len;
        return (data, len, false);
    }
    let at = *next as usize;
    debug_assert!(at + PACKED_HDR <= INLINE_MAX);
    // SAFETY: the sink wrote a length field at `at` and that many bytes after it, inside
    // `data` (`RxSink::pack_at`), for each of the `desc.len >> 16` messages after the first.
    unsafe {
        let len = u32::from(u16::from_ne_bytes(
            data.add(at).cast::<[u8; PACKED_HDR]>().read_unaligned(),
        ));
        *next = (at + PACKED_HDR) as u32 + len;
        *left -= 1;
        (data.add(at + PACKED_HDR), len, *left == 0)
    }
}

/// A view of a buffer pool: `count` buffers of `buf_size` bytes, contiguous from `base`.
///
/// The memory is owned elsewhere (a shared-memory mapping, a registered memory region) and kept
/// alive by whoever holds the view; the view itself is just coordinates.
#[derive(Debug, Clone, Copy)]
pub struct PoolView {
    base: NonNull<u8>,
    buf_size: usize,
    count: u32,
}

// SAFETY: a `PoolView` is coordinates of memory that is shared between threads by design; every
// access through it goes through `unsafe` code whose callers own the buffer they touch.
unsafe impl Send for PoolView {}
// SAFETY: as above; `&PoolView` only exposes the coordinates.
unsafe impl Sync for PoolView {}

impl PoolView {
    /// A view of `count` buffers of `buf_size` bytes from `base`.
    ///
    /// # Safety
    ///
    /// `base .. base + buf_size * count` must be valid for reads (and writes, if the pool is
    /// written through this view) for as long as the view or any copy of it is used, and
    /// `buf_size * count` must not overflow `isize`.
    pub unsafe fn new(base: NonNull<u8>, buf_size: usize, count: u32) -> PoolView {
        PoolView {
            base,
            buf_size,
            count,
        }
    }

    /// A view of no buffers (a connection without a large pool).
    pub fn empty() -> PoolView {
        PoolView {
            base: NonNull::dangling(),
            buf_size: 0,
            count: 0,
        }
    }

    /// Bytes per buffer.
    #[inline]
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// Number of buffers.
    #[inline]
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Start of buffer `idx`, or `None` when `idx >= count`.
    #[inline]
    pub fn get(&self, idx: u32) -> Option<NonNull<u8>> {
        // SAFETY: `idx < count` is checked first.
        (idx < self.count).then(|| unsafe { self.buf_ptr_unchecked(idx) })
    }

    /// Start of buffer `idx`.
    ///
    /// # Panics
    ///
    /// If `idx >= count` (in every build: an out-of-range index never yields an out-of-bounds
    /// pointer). Use [`get`](Self::get) to test an index, or
    /// [`buf_ptr_unchecked`](Self::buf_ptr_unchecked) where the index is already validated.
    #[inline(always)]
    pub fn buf_ptr(&self, idx: u32) -> NonNull<u8> {
        assert!(
            idx < self.count,
            "buffer index {idx} out of range (pool of {} buffers)",
            self.count
        );
        // SAFETY: `idx < count` was just asserted.
        unsafe { self.buf_ptr_unchecked(idx) }
    }

    /// Start of buffer `idx`, without the range check.
    ///
    /// # Safety
    ///
    /// `idx < count` must hold.
    #[inline]
    pub unsafe fn buf_ptr_unchecked(&self, idx: u32) -> NonNull<u8> {
        debug_assert!(idx < self.count);
        // SAFETY: `idx < count` (the caller's contract), so the offset stays inside the pool,
        // which the constructor's contract says is one valid allocation.
        unsafe { self.base.add(idx as usize * self.buf_size) }
    }
}

/// One 8-byte load from `src`, kept one: two of them side by side are not merged into a 16-byte
/// load (which the compiler does with plain reads). A load over the application's narrower
/// store of the payload just before (an 8-byte message's one word) cannot be forwarded from it
/// and waits for that store to reach the cache: a third of a dedicated-poller `send`'s samples.
///
/// # Safety
///
/// `src` is valid for reads of 8 initialised bytes (no alignment needed).
#[inline(always)]
unsafe fn load_word(src: *const u8) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        let w: u64;
        // SAFETY: the caller's contract: 8 readable bytes at `src`; `mov` needs no alignment,
        // reads nothing else, and touches neither the stack nor the flags.
        unsafe {
            core::arch::asm!(
                "mov {w}, qword ptr [{p}]",
                w = out(reg) w,
                p = in(reg) src,
                options(nostack, preserves_flags, readonly, pure),
            );
        }
        w
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract; unaligned reads need no alignment.
    unsafe {
        src.cast::<u64>().read_unaligned()
    }
}
