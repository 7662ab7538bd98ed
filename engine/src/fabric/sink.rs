//! Where a fabric's data path meets the application's rings: [`RxSink`] (received messages
//! into free slots of the receive ring) and [`TxDone`] (freed send buffers and returned
//! credits).

use core::marker::PhantomData;
use core::mem::MaybeUninit;

use rings::{Producer, StampedWriteChunk};

use crate::desc::{PoolView, RxDesc, BUF_INLINE, BUF_PACKED, INLINE_MAX, OFF_BYTES, PACKED_HDR};
use crate::error::FabricError;
use crate::link::{owned_bit, FREE_BATCH};
use crate::record::copy::copy_bytes;

#[cfg(doc)]
use super::FabricConn;

/// Where a fabric delivers received messages: free slots of the application's receive ring.
///
/// Every push is checked: a pooled message must name a buffer of the receive pool and fit it, so
/// nothing a peer wrote can make the application read outside the pool.
pub struct RxSink<'a> {
    /// The free slots, as up to two runs (`first_len` from `first`, then `second_len` from
    /// `second`) of descriptors `stride` bytes apart: a slice's (`stride` is the size of a
    /// descriptor), or a stamped ring's (its slots hold a stamp too). Borrowed mutably for
    /// `'a`; written only through [`next_slot`](Self::next_slot).
    first: *mut MaybeUninit<RxDesc>,
    first_len: usize,
    second: *mut MaybeUninit<RxDesc>,
    second_len: usize,
    stride: usize,
    _slots: PhantomData<&'a mut [MaybeUninit<RxDesc>]>,
    /// Slots written (the claimer commits these).
    slots: usize,
    /// Messages delivered (more than `slots` once messages are packed).
    written: usize,
    /// With [`packing`](Self::packing): the last slot taken, while it holds only inline
    /// messages (null otherwise), and the end of its payload bytes in `data`; its content is
    /// in `scratch`, and in the slot itself but for the messages packed after its first
    /// (`dirty`), which [`finish_packed`](Self::finish_packed) writes.
    last: *mut RxDesc,
    last_end: usize,
    pack: bool,
    /// With [`packing`](Self::packing): where `last`'s content is built (the caller's,
    /// borrowed for `'a`; null without packing), to be written into `last` once, by
    /// [`finish_packed`](Self::finish_packed).
    scratch: *mut RxDesc,
    /// Messages were packed into `scratch` after `last`'s first: the slot is behind it.
    dirty: bool,
    bytes: u64,
    pool_count: u32,
    buf_size: u32,
    large_count: u32,
    large_size: u32,
}

// SAFETY: the raw runs stand for the `&'a mut` borrow of the free slots the sink had as
// slices (and has as `_slots`), and `scratch` for the `&'a mut` borrow `packing` took: moving
// the sink to another thread moves those borrows, as a `&mut [MaybeUninit<RxDesc>]` may move
// (`RxDesc` is plain data).
unsafe impl Send for RxSink<'_> {}
// SAFETY: a shared `&RxSink` reads the counts only; every slot access takes `&mut self`.
unsafe impl Sync for RxSink<'_> {}

impl core::fmt::Debug for RxSink<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RxSink")
            .field("room", &self.room())
            .field("written", &self.written)
            .finish()
    }
}

impl<'a> RxSink<'a> {
    pub(crate) fn new(
        first: &'a mut [MaybeUninit<RxDesc>],
        second: &'a mut [MaybeUninit<RxDesc>],
        pool: &PoolView,
    ) -> RxSink<'a> {
        RxSink {
            first_len: first.len(),
            first: first.as_mut_ptr(),
            second_len: second.len(),
            second: second.as_mut_ptr(),
            stride: core::mem::size_of::<RxDesc>(),
            _slots: PhantomData,
            slots: 0,
            written: 0,
            last: core::ptr::null_mut(),
            last_end: 0,
            pack: false,
            scratch: core::ptr::null_mut(),
            dirty: false,
            bytes: 0,
            pool_count: pool.count(),
            buf_size: u32::try_from(pool.buf_size()).unwrap_or(u32::MAX),
            large_count: 0,
            large_size: 0,
        }
    }

    /// A sink over the free slots a stamped receive ring claimed (the application's, with
    /// dedicated pollers and run-to-completion alike); the claimer commits the first
    /// [`written`](Self::written) of them once the sink is gone.
    #[inline(always)]
    pub(crate) fn stamped(
        chunk: &'a mut StampedWriteChunk<'_, RxDesc>,
        pool: &PoolView,
    ) -> RxSink<'a> {
        let [(first, first_len), (second, second_len)] = chunk.runs();
        RxSink {
            first,
            first_len,
            second,
            second_len,
            stride: StampedWriteChunk::<RxDesc>::STRIDE,
            _slots: PhantomData,
            ..RxSink::new(&mut [], &mut [], pool)
        }
    }

    /// The sink also lends slots of the connection's large receive pool
    /// ([`push_large`](Self::push_large)).
    pub(crate) fn with_large(mut self, large: &PoolView) -> RxSink<'a> {
        self.large_count = large.count();
        self.large_size = u32::try_from(large.buf_size()).unwrap_or(u32::MAX);
        self
    }

    /// Small inline messages delivered one after another share a slot, as many as its 120
    /// bytes hold (each after the first with a 2-byte length): for dedicated pollers, whose
    /// application reads each slot's lines from the poller's core, so that a stream of small
    /// messages moves a fraction of a line per message instead of one. The application's
    /// receive takes them out one by one ([`BUF_PACKED`]).
    ///
    /// A slot's first message is written into the slot and into `scratch`; the messages packed
    /// after it go into `scratch` only, and the slot is written from it once, when it is done:
    /// when the next slot is taken, or at [`finish`](Self::finish), which gives the claimer the
    /// count of slots to commit. The application spins on the stamp of the very slot a pass
    /// fills, which shares the slot's first line with its header and first messages: packed in
    /// place, every message took the line back from the application's core, and the
    /// application's next look took it again. A lone message (a ping-pong's) is written once,
    /// in place, as soon as it is there. Measured (`bench rate|lat --fabric mem --mode
    /// dedicated --one-thread --size 8`, interleaved with the in-place packing, 3-5 rounds):
    /// 3-5 % more messages a second, 4-7 % with `--app-batch 32`, the round trip unchanged
    /// (628-637 / 629-632 ns); a slot written only once, from the scratch, the lone message
    /// too, gave 5 % / 9 % but a round trip 1.6 % longer (636-655 ns).
    #[inline]
    pub(crate) fn packing(mut self, scratch: &'a mut MaybeUninit<RxDesc>) -> RxSink<'a> {
        self.pack = true;
        self.scratch = scratch.as_mut_ptr();
        self
    }

    /// How many more messages fit, at least (packed ones take no slot of their own).
    #[inline]
    pub fn room(&self) -> usize {
        self.first_len + self.second_len - self.slots
    }

    /// Messages delivered so far.
    #[inline]
    pub fn written(&self) -> usize {
        self.written
    }

    /// Slots written so far: the first ones of the sink's, in order (fewer than
    /// [`written`](Self::written) when messages were packed). The claimer gets the final
    /// count from [`finish`](Self::finish).
    #[cfg(test)]
    pub(crate) fn slots(&self) -> usize {
        self.slots
    }

    /// Room for a `len`-byte inline message in the last slot written, packed after what it
    /// holds: the offset of its length field in `data`. `None`: it takes a slot of its own.
    #[inline(always)]
    fn pack_at(&self, len: usize) -> Option<usize> {
        let at = self.last_end;
        (!self.last.is_null() && at + PACKED_HDR + len <= INLINE_MAX).then_some(at)
    }

    /// Where a slot's first inline message is written: with packing, `scratch` (the slot
    /// packed before it written out first; `wrote_inline` copies the message into the slot
    /// too); else the slot itself, `p`.
    #[inline(always)]
    fn first_target(&mut self, pack: bool, p: *mut RxDesc) -> *mut RxDesc {
        if pack {
            self.finish_packed();
            self.scratch
        } else {
            p
        }
    }

    /// Writes the slot built in `scratch` (if one is, and messages were packed into it after
    /// its first) into its ring slot, `last`: its header and the payload bytes it holds.
    /// Nothing packs into it afterwards.
    #[inline(always)]
    fn finish_packed(&mut self) {
        if !self.last.is_null() && self.dirty {
            // SAFETY: `last` (set only with packing, which sets `scratch`) is a slot this sink
            // took and still borrows, `scratch` the caller's descriptor borrowed for `'a`; its
            // header and first `last_end` bytes of `data` were written with the slot's
            // messages.
            unsafe { write_back(self.scratch, self.last, self.last_end) };
        }
        self.last = core::ptr::null_mut();
    }

    /// Counts a `len`-byte message that [`pack_copy`] or [`pack_with`] packed at `at` into
    /// the last slot.
    #[inline(always)]
    fn packed(&mut self, at: usize, len: usize) {
        self.last_end = at + PACKED_HDR + len;
        self.dirty = true;
        self.written += 1;
        self.bytes += len as u64;
    }

    /// A `len`-byte inline message took slot `p` (the next one): counted, and with
    /// [`packing`](Self::packing) the slot the next small messages may join.
    #[inline(always)]
    fn wrote_inline(&mut self, pack: bool, p: *mut RxDesc, len: usize) {
        self.slots += 1;
        self.written += 1;
        self.bytes += len as u64;
        if pack {
            // SAFETY: the message went into `scratch` (`first_target`), header and `len` bytes;
            // `p` is the slot this sink just took and borrows; the two do not overlap.
            unsafe { write_back(self.scratch, p, len) };
            self.dirty = false;
            self.last = p;
            self.last_end = len;
        }
    }

    #[inline]
    fn next_slot(&mut self) -> Result<&mut MaybeUninit<RxDesc>, FabricError> {
        let i = self.slots;
        let (run, k) = if i < self.first_len {
            (self.first, i)
        } else if i - self.first_len < self.second_len {
            (self.second, i - self.first_len)
        } else {
            return Err(FabricError::Protocol(
                "receive sink overflow (fabric ignored room())",
            ));
        };
        // SAFETY: `k` is below its run's length, so the descriptor `k * stride` bytes into the
        // run is one of the free slots this sink borrows mutably for `'a` (see the fields);
        // the returned borrow of `self` keeps it unique.
        Ok(unsafe { &mut *run.cast::<u8>().add(k * self.stride).cast() })
    }

    /// Delivers a message by copying `payload` into the descriptor.
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when the sink is full or `payload` is longer than
    /// [`INLINE_MAX`] or the pool's buffer size.
    #[inline(always)]
    pub fn push_inline(&mut self, payload: &[u8]) -> Result<(), FabricError> {
        let len = payload.len();
        if len > INLINE_MAX || len > self.buf_size as usize {
            return Err(FabricError::Protocol(
                "inline message longer than the inline limit",
            ));
        }
        if let Some(at) = self.pack_at(len) {
            // SAFETY: `scratch` holds the packed slot (`last` is not null); `at` from `pack_at`.
            unsafe { pack_copy(self.scratch, at, payload) };
            self.packed(at, len);
            return Ok(());
        }
        let pack = self.pack;
        let p = self.next_slot()?.as_mut_ptr();
        let w = self.first_target(pack, p);
        // SAFETY: `w` points to a writable descriptor we own (a claimed ring slot, or the
        // packing scratch); fields are written through raw pointers without reading, and
        // `len <= INLINE_MAX` bytes are copied into `data`, which does not overlap `payload`
        // (ring or scratch memory vs. fabric memory).
        unsafe {
            core::ptr::addr_of_mut!((*w).len).write(len as u32);
            core::ptr::addr_of_mut!((*w).buf).write(BUF_INLINE);
            let data = core::ptr::addr_of_mut!((*w).data).cast::<u8>();
            // `copy_bytes`: no `memcpy` call for a small message (tcp's receive).
            copy_bytes(payload.as_ptr(), data, len);
        }
        self.wrote_inline(pack, p, len);
        Ok(())
    }

    /// Delivers a `len`-byte message inline, written straight into the next slot by `fill`
    /// (one copy from the fabric's memory to the application's ring, no staging buffer). `fill`
    /// gets exactly `len` uninitialised bytes and must return `Ok(len)` having initialised all of
    /// them; anything else fails the push (nothing is delivered).
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when `len` exceeds the inline limit or the buffer size, when
    /// there is no room, or when `fill` does not report `len` bytes written; `fill`'s own error.
    #[inline(always)]
    pub fn push_inline_with<F>(&mut self, len: usize, fill: F) -> Result<(), FabricError>
    where
        F: FnOnce(&mut [MaybeUninit<u8>]) -> Result<usize, FabricError>,
    {
        if len > INLINE_MAX || len > self.buf_size as usize {
            return Err(FabricError::Protocol(
                "inline message longer than the inline limit",
            ));
        }
        if let Some(at) = self.pack_at(len) {
            // SAFETY: `scratch` holds the packed slot (`last` is not null); `at` from `pack_at`.
            unsafe { pack_with(self.scratch, at, len, fill)? };
            self.packed(at, len);
            return Ok(());
        }
        let pack = self.pack;
        let p = self.next_slot()?.as_mut_ptr();
        let w = self.first_target(pack, p);
        // SAFETY: `w` points to a writable descriptor we own (a claimed ring slot, or the
        // packing scratch); `data` is an array of `MaybeUninit<u8>`, valid in any state, so a
        // unique reference to it is sound, and `len <= INLINE_MAX` keeps the sub-slice in
        // bounds.
        let data = unsafe { &mut (&mut *core::ptr::addr_of_mut!((*w).data))[..len] };
        if fill(data)? != len {
            return Err(FabricError::Protocol("inline payload copy came up short"));
        }
        // SAFETY: as above; the header fields are written without reading. The slot counts as
        // written only now, after `fill` initialised its `len` payload bytes.
        unsafe {
            core::ptr::addr_of_mut!((*w).len).write(len as u32);
            core::ptr::addr_of_mut!((*w).buf).write(BUF_INLINE);
        }
        self.wrote_inline(pack, p, len);
        Ok(())
    }

    /// Delivers a message that stays in receive-pool buffer `buf` (`len` bytes); the buffer comes
    /// back through [`FabricConn::release_rx`] when the application drops the message.
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when the sink is full, `buf` is not a buffer of the receive pool or
    /// `len` exceeds the buffer size.
    #[inline]
    pub fn push_pooled(&mut self, buf: u32, len: u32) -> Result<(), FabricError> {
        self.push_pooled_at(buf, 0, len)
    }

    /// Delivers a message that stays in receive-pool buffer `buf`, `len` bytes from byte `off`
    /// (so several messages can be lent from one buffer, each released through
    /// [`FabricConn::release_rx`] with the buffer's index when the application drops it).
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when the sink is full, `buf` is not a buffer of the receive pool or
    /// `off + len` exceeds the buffer size.
    #[inline]
    pub fn push_pooled_at(&mut self, buf: u32, off: u32, len: u32) -> Result<(), FabricError> {
        if buf >= self.pool_count {
            return Err(FabricError::Protocol("receive buffer index out of range"));
        }
        if u64::from(off) + u64::from(len) > u64::from(self.buf_size) {
            return Err(FabricError::Protocol(
                "message length exceeds the buffer size",
            ));
        }
        let slot = self.next_slot()?;
        let p = slot.as_mut_ptr();
        // SAFETY: `p` points to a writable slot we own; the header fields are written without
        // reading; the offset goes into the first `OFF_BYTES` bytes of `data` (in bounds:
        // `OFF_BYTES <= INLINE_MAX`; `write_unaligned`, as `data` is a byte array), the rest of
        // `data` stays uninitialised, which `MaybeUninit<u8>` allows.
        unsafe {
            core::ptr::addr_of_mut!((*p).len).write(len);
            core::ptr::addr_of_mut!((*p).buf).write(buf);
            core::ptr::addr_of_mut!((*p).data)
                .cast::<[u8; OFF_BYTES]>()
                .write_unaligned(off.to_ne_bytes());
        }
        self.slots += 1;
        self.written += 1;
        self.finish_packed();
        self.bytes += u64::from(len);
        Ok(())
    }

    /// Delivers a large message that stays in slot `slot` of the large receive pool
    /// (`len` bytes from its start); `LARGE_BIT | slot` comes back through
    /// [`FabricConn::release_rx`] when the application drops the message.
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when the sink is full, `slot` is not a slot of the large
    /// receive pool or `len` exceeds the slot size.
    #[inline]
    pub fn push_large(&mut self, slot: u32, len: u32) -> Result<(), FabricError> {
        if slot >= self.large_count {
            return Err(FabricError::Protocol("large receive slot out of range"));
        }
        if len > self.large_size {
            return Err(FabricError::Protocol(
                "large message length exceeds the slot size",
            ));
        }
        let slot_desc = self.next_slot()?;
        let p = slot_desc.as_mut_ptr();
        // SAFETY: as in `push_pooled_at`: a writable slot we own, fields written without
        // reading, the offset (0) into the first `OFF_BYTES` bytes of `data`.
        unsafe {
            core::ptr::addr_of_mut!((*p).len).write(len);
            core::ptr::addr_of_mut!((*p).buf).write(crate::desc::LARGE_BIT | slot);
            core::ptr::addr_of_mut!((*p).data)
                .cast::<[u8; OFF_BYTES]>()
                .write_unaligned(0u32.to_ne_bytes());
        }
        self.slots += 1;
        self.written += 1;
        self.finish_packed();
        self.bytes += u64::from(len);
        Ok(())
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Ends the sink's use: the slot still being packed is written into the ring (see
    /// [`packing`](Self::packing)), and the sink's borrow of the slots ends, so that the
    /// claimer can commit them. Returns the sink's final counts.
    ///
    /// Not a `Drop`: with one, a run-to-completion receive's sink (which never packs) was kept
    /// in memory instead of registers, about 90 instructions a receive (callgrind of `bench
    /// cost --fabric mem`'s round trip).
    #[inline(always)]
    pub(crate) fn finish(mut self) -> SinkTotals {
        self.finish_packed();
        SinkTotals {
            written: self.written,
            slots: self.slots,
            room: self.room(),
            bytes: self.bytes,
        }
    }
}

/// What an [`RxSink`] delivered, from [`RxSink::finish`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct SinkTotals {
    /// Messages delivered.
    pub(crate) written: usize,
    /// Slots written: the first ones of the sink's, in order.
    pub(crate) slots: usize,
    /// Free slots the sink had left (packed messages take none).
    pub(crate) room: usize,
    /// Payload bytes delivered.
    pub(crate) bytes: u64,
}

/// Copies a packed slot's header and the first `end` bytes of its `data` from `from` to `to`,
/// with accesses of the widths they were written with where it matters (the two header
/// fields, each a `u32` store: one 8-byte load over both would not be forwarded from them).
///
/// # Safety
///
/// `from` is valid for reads and `to` for writes of an `RxDesc`, they do not overlap,
/// `end <= INLINE_MAX`, and `from`'s header and first `end` bytes of `data` are initialised.
#[inline(always)]
unsafe fn write_back(from: *const RxDesc, to: *mut RxDesc, end: usize) {
    // SAFETY: the caller's contract; every field is reached through raw pointers.
    unsafe {
        core::ptr::addr_of_mut!((*to).len).write(core::ptr::addr_of!((*from).len).read());
        core::ptr::addr_of_mut!((*to).buf).write(core::ptr::addr_of!((*from).buf).read());
        copy_bytes(
            core::ptr::addr_of!((*from).data).cast::<u8>(),
            core::ptr::addr_of_mut!((*to).data).cast::<u8>(),
            end,
        );
    }
}

/// Packs `payload` into the inline descriptor at `desc` (its length field at `at`, its bytes
/// after it) and marks the descriptor packed ([`BUF_PACKED`], one more message in the high
/// half of `len`). Out of line and not a method: the plain push stays as short as it was, and
/// the sink, a local of a run-to-completion receive, stays in registers.
///
/// # Safety
///
/// `desc` is the descriptor the caller's sink packs (its scratch copy of a slot that holds
/// inline messages only), and `at + PACKED_HDR + payload.len() <= INLINE_MAX`.
#[inline(never)]
unsafe fn pack_copy(desc: *mut RxDesc, at: usize, payload: &[u8]) {
    // SAFETY: the caller's contract: the bytes written lie in `data`; `payload` is fabric
    // memory, not the ring's.
    unsafe {
        let data = core::ptr::addr_of_mut!((*desc).data).cast::<u8>();
        copy_bytes(payload.as_ptr(), data.add(at + PACKED_HDR), payload.len());
        mark_packed(desc, at, payload.len());
    }
}

/// [`pack_copy`] with the bytes written by `fill` (as [`RxSink::push_inline_with`]'s): the
/// descriptor changes only once `fill` has written all `len` of them.
///
/// # Safety
///
/// As [`pack_copy`], for `len` bytes.
#[inline(never)]
unsafe fn pack_with<F>(desc: *mut RxDesc, at: usize, len: usize, fill: F) -> Result<(), FabricError>
where
    F: FnOnce(&mut [MaybeUninit<u8>]) -> Result<usize, FabricError>,
{
    let start = at + PACKED_HDR;
    // SAFETY: `data` is an array of `MaybeUninit<u8>`, valid in any state, of the descriptor
    // the caller borrows, so a unique reference to it is sound; `start + len <= INLINE_MAX`
    // (the contract).
    let data = unsafe { &mut (&mut *core::ptr::addr_of_mut!((*desc).data))[start..start + len] };
    if fill(data)? != len {
        return Err(FabricError::Protocol("inline payload copy came up short"));
    }
    // SAFETY: the caller's contract.
    unsafe { mark_packed(desc, at, len) };
    Ok(())
}

/// Writes the length field of a message packed at `at` and counts it in the descriptor.
///
/// # Safety
///
/// As [`pack_copy`]'s.
#[inline(always)]
unsafe fn mark_packed(desc: *mut RxDesc, at: usize, len: usize) {
    // SAFETY: the length field lies in `data` (the caller's contract); `len` and `buf` were
    // written with the slot's first message, and are read and written through raw pointers.
    unsafe {
        let data = core::ptr::addr_of_mut!((*desc).data).cast::<u8>();
        data.add(at)
            .cast::<[u8; PACKED_HDR]>()
            .write_unaligned((len as u16).to_ne_bytes());
        core::ptr::addr_of_mut!((*desc).buf).write(BUF_PACKED);
        let l = core::ptr::addr_of_mut!((*desc).len);
        l.write(l.read() + (1 << 16));
    }
}

/// Where a fabric reports freed send buffers and returned credits.
///
/// Freed buffers are collected and handed to the application in batches (one ring publication
/// per batch, not per buffer).
pub struct TxDone<'a> {
    pub(crate) free: &'a mut Producer<u32>,
    pub(crate) owned: &'a mut [u64],
    pub(crate) credits: u64,
    /// Bytes of records credited back ([`credit_bytes`](Self::credit_bytes)).
    pub(crate) credited_bytes: u64,
    pub(crate) freed: u64,
    /// Collected buffers: scratch owned by the connection (not re-zeroed per cycle).
    pending: &'a mut [u32; FREE_BATCH],
    npending: usize,
    /// Ordinary send buffers, then large slots, in `owned` (`crate::link::owned_bit`).
    count: u32,
    large: u32,
}

impl core::fmt::Debug for TxDone<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TxDone")
            .field("credits", &self.credits)
            .field("freed", &self.freed)
            .finish()
    }
}

impl<'a> TxDone<'a> {
    /// `owned` is the bitmap of `count` ordinary send buffers followed by `large` large slots.
    pub(crate) fn new(
        free: &'a mut Producer<u32>,
        owned: &'a mut [u64],
        pending: &'a mut [u32; FREE_BATCH],
        count: u32,
        large: u32,
    ) -> TxDone<'a> {
        TxDone {
            free,
            owned,
            credits: 0,
            credited_bytes: 0,
            freed: 0,
            pending,
            npending: 0,
            count,
            large,
        }
    }

    /// Marks send buffer (or large slot) `buf` as held by the fabric, or not. `buf` was
    /// validated against the pools.
    #[inline]
    pub(crate) fn mark_owned(&mut self, buf: u32, held: bool) {
        if let Some((word, bit)) = owned_bit(buf, self.count, self.large) {
            if let Some(w) = self.owned.get_mut(word) {
                if held {
                    *w |= bit;
                } else {
                    *w &= !bit;
                }
            }
        }
    }

    /// Send buffer `buf` is free again (its message was copied, completed, or released by the peer).
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when `buf` is not a buffer the fabric holds (out of range, never
    /// sent, or freed twice): a peer releasing what it never got.
    #[inline(always)]
    pub fn free_buf(&mut self, buf: u32) -> Result<(), FabricError> {
        let (word, bit) = owned_bit(buf, self.count, self.large).ok_or(FabricError::Protocol(
            "peer released a send buffer it does not hold",
        ))?;
        match self.owned.get_mut(word) {
            Some(w) if *w & bit != 0 => *w &= !bit,
            _ => {
                return Err(FabricError::Protocol(
                    "peer released a send buffer it does not hold",
                ))
            }
        }
        if self.npending == FREE_BATCH {
            self.publish()?;
        }
        self.pending[self.npending] = buf;
        self.npending += 1;
        self.freed += 1;
        Ok(())
    }

    /// Send buffer `buf` is free again because [`post_send`](FabricConn::post_send) copied its
    /// message, and [`FabricConn::copies`] said so for its length: the engine never marked it as
    /// held, so there is no ownership to check. Only for that case; every other free goes through
    /// [`free_buf`](Self::free_buf).
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] if the application's free ring overflows (broken accounting).
    #[inline]
    pub fn free_copied(&mut self, buf: u32) -> Result<(), FabricError> {
        debug_assert!(
            owned_bit(buf, self.count, self.large)
                .is_some_and(|(word, bit)| self.owned.get(word).is_some_and(|w| w & bit == 0)),
            "free_copied on a tracked buffer"
        );
        if self.npending == FREE_BATCH {
            self.publish()?;
        }
        self.pending[self.npending] = buf;
        self.npending += 1;
        self.freed += 1;
        Ok(())
    }

    /// Takes `buf` back out if it is the one buffer collected (freed by the `post_send` that
    /// just posted it, as a copy): the caller keeps it instead of handing it through the free
    /// ring. `false` (nothing changed) otherwise.
    #[inline]
    pub(crate) fn take_only(&mut self, buf: u32) -> bool {
        if self.npending == 1 && self.pending[0] == buf {
            self.npending = 0;
            self.freed -= 1;
            true
        } else {
            false
        }
    }

    /// `n` credits came back: the receiver made room for `n` more messages.
    #[inline]
    pub fn credits(&mut self, n: u64) {
        self.credits += n;
    }

    /// `n` bytes of records came back, for a fabric that bounds the application's window in
    /// bytes too ([`FabricConn::app_bytes`](crate::fabric::FabricConn::app_bytes)).
    #[inline]
    pub fn credit_bytes(&mut self, n: u64) {
        self.credited_bytes += n;
    }

    /// The credits collected: `(messages, bytes)`.
    #[inline(always)]
    pub(crate) fn returned(&self) -> (u64, u64) {
        (self.credits, self.credited_bytes)
    }

    /// Hands the collected buffers to the application (one ring publication).
    #[inline]
    pub(crate) fn publish(&mut self) -> Result<(), FabricError> {
        if self.npending > 0 {
            // The free ring holds every buffer of the pool, so it cannot be full while these were
            // out (each was checked against the ownership bitmap above).
            // One buffer (a single small send per cycle, the latency case): a plain push, not
            // the slice copy (two `memcpy` calls).
            let all = if self.npending == 1 {
                self.free.push(self.pending[0]).is_ok()
            } else {
                self.free.push_slice(&self.pending[..self.npending]) == self.npending
            };
            self.npending = 0;
            if !all {
                return Err(FabricError::Protocol(
                    "free ring overflow (buffer accounting broken)",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
