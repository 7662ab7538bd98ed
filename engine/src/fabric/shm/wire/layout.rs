//! Segment layout: the negotiated [`Params`], their validation, and the byte offsets of every
//! structure in the shared segment ([`Layout`]).
//!
//! Both sides compute the layout *locally* from parameters they validated themselves; no offset is
//! ever read from the segment. The creator writes the parameters into the header and the attacher
//! checks that they match what it computed ([`crate::fabric::shm::wire::Segment::attach`]).
//!
//! ```text
//! offset 0      header line     magic, version, params, total length        (128 B)
//! offset 128    side A state    attached, closed, heartbeat, pid | doorbell  (128 B)
//! offset 256    side B state    attached, closed, heartbeat, pid | doorbell  (128 B)
//! then, for dir in [A->B, B->A]:
//!   ring        record ring region (crate::record::ring): producer position line,
//!               consumer position line, ring_capacity bytes of records      (region_size)
//!   rel tail    release-ring tail (written by the receiver)                  (128 B)
//!   rel head    release-ring head (written by the sender)                    (128 B)
//!   rel entries release_capacity x u32 buffer indices (written by receiver)  (padded to 128 B)
//!   buffers     buffer_count x buffer_size bytes (written by the sender)     (page aligned)
//! then, for dir in [A->B, B->A]:
//!   large       large_count x large_size bytes: large slots      (page aligned)
//! total length rounded up to the page size.
//! ```
//!
//! # Ring capacity and footprint
//!
//! Each direction's record ring holds at least `ring_depth` records of `inline_max` payload
//! (and so at least `ring_depth` messages of any size: a larger message travels as a 16-byte
//! `BUF_REF` record, a smaller one in a smaller `DATA` record). [`ring_capacity`] is the
//! smallest power of two that holds `ring_depth + 1` such records (the extra one covers the PAD
//! of a wrap) plus the 8-byte zero-ahead word, and at least twice the largest record (the
//! ring's own limit). Example: the defaults (depth 128, inline threshold 120: 128-byte records)
//! give a 32 KiB ring per direction; a connection's segment is then
//! `2 x (32 KiB + 256 B + release ring + buffer_count x buffer_size + large_count x
//! large_size)`, rounded to pages: with the engine's defaults (256 buffers of 4 KiB, 2 large
//! slots of 16 MiB) about 66 MiB, of which 64 MiB are the large slots. Only the 2 MiB before
//! the large slots are committed at setup; each direction's slots are committed on its first
//! large message.
//!
//! # Large slots
//!
//! A message above `buffer_size` travels in a large slot of the sender's direction, by a
//! `BUF_REF` record whose `buf` is `LARGE_BIT | slot` ([`crate::desc::LARGE_BIT`]): the
//! receiver reads it in place and returns the same index through the release ring, like a
//! buffer. Both ownership bitmaps and the release ring cover buffers and slots together.

use super::WireError;
use crate::record::ring::{region_size, MIN_CAPACITY};
use crate::record::RECORD_HEADER;

/// Padding unit that keeps independently written words apart (x86_64 adjacent-line prefetch pairs
/// 64-B lines, so 128 B, as crossbeam's `CachePadded`).
pub const CACHE_PAD: usize = 128;
/// Alignment of each buffer region and granularity of the segment length.
pub const PAGE_SIZE: usize = 4096;

/// Magic number at offset 0 of every segment: `b"SPWIRE\0"` followed by a format byte.
pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"SPWIRE\x00\x01");
/// Version of the segment format. Bumped on any incompatible layout change (3: the side-state
/// doorbell word, [`hdr::ST_BELL`], which a sender must ring).
pub const WIRE_VERSION: u32 = 3;

/// Smallest allowed [`Params::buffer_size`].
pub const MIN_BUFFER_SIZE: u32 = 64;
/// Largest allowed [`Params::buffer_size`] (16 MiB).
pub const MAX_BUFFER_SIZE: u32 = 1 << 24;
/// Largest allowed [`Params::buffer_count`].
pub const MAX_BUFFER_COUNT: u32 = 1 << 16;
/// Smallest allowed [`Params::ring_depth`].
pub const MIN_RING_DEPTH: u32 = 2;
/// Largest allowed [`Params::ring_depth`].
pub const MAX_RING_DEPTH: u32 = 1 << 16;
/// Largest allowed [`Params::inline_max`].
pub const MAX_INLINE: u32 = 4096;
/// Largest allowed [`Params::large_count`].
pub const MAX_LARGE_COUNT: u32 = 1 << 12;
/// Largest allowed [`Params::large_size`] (1 GiB).
pub const MAX_LARGE_SIZE: u32 = 1 << 30;
/// Largest segment this format will create or attach (64 GiB).
pub const MAX_SEGMENT_LEN: u64 = 1 << 36;

/// Byte offsets inside the header (part of the wire format; for diagnostics and tests).
pub mod hdr {
    /// `u64`: [`super::SEGMENT_MAGIC`].
    pub const MAGIC: usize = 0;
    /// `u32`: [`super::WIRE_VERSION`].
    pub const VERSION: usize = 8;
    /// `u32`: `Params::buffer_size`.
    pub const BUFFER_SIZE: usize = 16;
    /// `u32`: `Params::buffer_count`.
    pub const BUFFER_COUNT: usize = 20;
    /// `u32`: `Params::ring_depth`.
    pub const RING_DEPTH: usize = 24;
    /// `u32`: `Params::inline_max`.
    pub const INLINE_MAX: usize = 28;
    /// `u64`: total segment length.
    pub const TOTAL_LEN: usize = 32;
    /// `u32`: `Params::large_size`.
    pub const LARGE_SIZE: usize = 40;
    /// `u32`: `Params::large_count`.
    pub const LARGE_COUNT: usize = 44;
    /// Offset of side A's state block; side B's follows one [`super::CACHE_PAD`] later.
    pub const SIDE_STATE: usize = 128;
    /// `u32` in a side-state block: 1 once the side attached.
    pub const ST_ATTACHED: usize = 0;
    /// `u32` in a side-state block: 0 while the side is open; once it closed, [`CLOSED`], or
    /// the code of the reason it failed the connection for (2: its peer was unresponsive, 3:
    /// its peer broke the protocol; the engine's `AbortReason`). Written once (the first mark
    /// wins).
    pub const ST_CLOSED: usize = 4;
    /// [`ST_CLOSED`]: closed without blaming the peer.
    pub const CLOSED: u32 = 1;
    /// `u64` in a side-state block: heartbeat counter.
    pub const ST_HEARTBEAT: usize = 8;
    /// `u32` in a side-state block: pid of the side.
    pub const ST_PID: usize = 16;
    /// `u32` in a side-state block, in its second 64-byte line (the first holds the heartbeat
    /// the control thread bumps): the side's doorbell as a *receiver* (`crate::doorbell`). The
    /// side sets `MAY_SLEEP` before it completes the handshake if it may sleep
    /// ([`IdleStrategy::Block`](crate::IdleStrategy::Block)) and `SLEEPING` around each sleep;
    /// its peer, after publishing records, rings it (a futex wake) when `SLEEPING` is set.
    pub const ST_BELL: usize = 64;
    /// End of the fixed header.
    pub const END: usize = 384;
}

/// Connection parameters that fix the segment layout. Negotiated over the control socket;
/// both sides validate them with [`Params::validate`] before computing a [`Layout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// Size of each buffer in bytes: a multiple of 64 in `MIN_BUFFER_SIZE ..= MAX_BUFFER_SIZE`.
    /// This is the largest message sent through a buffer.
    pub buffer_size: u32,
    /// Buffers per direction, in `1 ..= MAX_BUFFER_COUNT`. Each side owns the buffers of the
    /// direction it sends on.
    pub buffer_count: u32,
    /// Messages each direction's record ring holds at least (see [`ring_capacity`]): a power of
    /// two in `MIN_RING_DEPTH ..= MAX_RING_DEPTH`.
    pub ring_depth: u32,
    /// Largest payload sent inline (as a `DATA` record in the ring), in `0 ..= MAX_INLINE`.
    /// `0` sends every non-empty message by buffer reference.
    pub inline_max: u32,
    /// Size of each large slot in bytes: `0` when `large_count` is 0, else a
    /// multiple of 64 above `buffer_size`, at most [`MAX_LARGE_SIZE`]. The largest message.
    pub large_size: u32,
    /// Large slots per direction, in `0 ..= MAX_LARGE_COUNT`.
    pub large_count: u32,
}

impl Params {
    /// Checks every field against the limits documented on it.
    ///
    /// # Errors
    /// [`WireError::InvalidParams`] naming the first field out of range.
    pub fn validate(&self) -> Result<(), WireError> {
        let bad = |what: &'static str, value: u32| {
            Err(WireError::InvalidParams {
                what,
                value: u64::from(value),
            })
        };
        if !(MIN_BUFFER_SIZE..=MAX_BUFFER_SIZE).contains(&self.buffer_size)
            || self.buffer_size % 64 != 0
        {
            return bad("buffer_size", self.buffer_size);
        }
        if !(1..=MAX_BUFFER_COUNT).contains(&self.buffer_count) {
            return bad("buffer_count", self.buffer_count);
        }
        if !(MIN_RING_DEPTH..=MAX_RING_DEPTH).contains(&self.ring_depth)
            || !self.ring_depth.is_power_of_two()
        {
            return bad("ring_depth", self.ring_depth);
        }
        if self.inline_max > MAX_INLINE {
            return bad("inline_max", self.inline_max);
        }
        if self.large_count > MAX_LARGE_COUNT {
            return bad("large_count", self.large_count);
        }
        let large_ok = if self.large_count == 0 {
            self.large_size == 0
        } else {
            self.large_size > self.buffer_size
                && self.large_size <= MAX_LARGE_SIZE
                && self.large_size % 64 == 0
        };
        if !large_ok {
            return bad("large_size", self.large_size);
        }
        Ok(())
    }
}

/// Capacity in bytes of each direction's record ring for `ring_depth` records of up to
/// `inline_max` payload bytes (see the [module docs](self#ring-capacity-and-footprint)).
/// Callers pass validated [`Params`] (so the result is at most 512 MiB).
pub const fn ring_capacity(ring_depth: u32, inline_max: u32) -> usize {
    // A record of `inline_max` payload, and never less than a BUF_REF record (16 bytes).
    let rec = (RECORD_HEADER + inline_max as usize).div_ceil(8) * 8;
    let rec = if rec < 16 { 16 } else { rec };
    let need = (ring_depth as usize + 1) * rec + 8;
    let cap = need.next_power_of_two();
    let min = if 2 * rec > MIN_CAPACITY {
        (2 * rec).next_power_of_two()
    } else {
        MIN_CAPACITY
    };
    if cap < min {
        min
    } else {
        cap
    }
}

/// Direction of traffic. Side A (the segment creator) sends on [`Dir::AToB`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dir {
    /// Written by side A, read by side B.
    AToB = 0,
    /// Written by side B, read by side A.
    BToA = 1,
}

/// Byte offsets of one direction's structures, relative to the segment base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirLayout {
    /// The record ring region ([`crate::record::ring`]): producer position line at `ring`,
    /// consumer position line at `ring + 128`, then [`Layout::ring_capacity`] bytes of records.
    pub ring: usize,
    /// `AtomicU64`: release-ring tail, written by the receiver of this direction.
    pub rel_tail: usize,
    /// `AtomicU64`: release-ring head, written by the sender of this direction.
    pub rel_head: usize,
    /// First of `release_capacity` `AtomicU32` release entries (buffer indices).
    pub rel_entries: usize,
    /// First of `buffer_count` buffers of `buffer_size` bytes each.
    pub buffers: usize,
    /// First of `large_count` large slots of `large_size` bytes each (page aligned).
    pub large: usize,
}

/// The full segment layout computed from validated [`Params`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    params: Params,
    release_capacity: u32,
    ring_capacity: usize,
    dirs: [DirLayout; 2],
    total_len: usize,
}

const fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

impl Layout {
    /// Validates `params` and computes every offset.
    ///
    /// # Errors
    /// [`WireError::InvalidParams`] if `params` fail [`Params::validate`] or the segment would
    /// exceed [`MAX_SEGMENT_LEN`].
    pub fn new(params: &Params) -> Result<Self, WireError> {
        params.validate()?;
        // Buffers and large slots come back through the same release ring.
        let release_capacity = (params.buffer_count + params.large_count).next_power_of_two();
        let ring_capacity = ring_capacity(params.ring_depth, params.inline_max);
        // All factors are bounded by the limits above (< 2^17 * 2^24), so u64 math cannot
        // overflow; the sum is checked against MAX_SEGMENT_LEN before converting to usize.
        let buffers_len = u64::from(params.buffer_size) * u64::from(params.buffer_count);
        let large_len = u64::from(params.large_size) * u64::from(params.large_count);
        let mut off: u64 = hdr::END as u64;
        let mut dirs = [DirLayout {
            ring: 0,
            rel_tail: 0,
            rel_head: 0,
            rel_entries: 0,
            buffers: 0,
            large: 0,
        }; 2];
        let mut offsets = [0u64; 5];
        for d in &mut dirs {
            offsets[0] = off;
            off += round_up(region_size(ring_capacity), CACHE_PAD) as u64;
            offsets[1] = off;
            off += CACHE_PAD as u64;
            offsets[2] = off;
            off += CACHE_PAD as u64;
            offsets[3] = off;
            off += round_up(release_capacity as usize * 4, CACHE_PAD) as u64;
            off = off.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64;
            offsets[4] = off;
            off += buffers_len;
            off = off.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64;
            if off > MAX_SEGMENT_LEN || off > isize::MAX as u64 {
                return Err(WireError::InvalidParams {
                    what: "segment length",
                    value: off,
                });
            }
            *d = DirLayout {
                ring: offsets[0] as usize,
                rel_tail: offsets[1] as usize,
                rel_head: offsets[2] as usize,
                rel_entries: offsets[3] as usize,
                buffers: offsets[4] as usize,
                large: 0,
            };
        }
        // The large slots of both directions come last, so that everything before them (rings,
        // release rings, buffers) is one prefix to pre-fault.
        for d in &mut dirs {
            d.large = off as usize;
            off += large_len;
            off = off.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64;
            if off > MAX_SEGMENT_LEN || off > isize::MAX as u64 {
                return Err(WireError::InvalidParams {
                    what: "segment length",
                    value: off,
                });
            }
        }
        Ok(Self {
            params: *params,
            release_capacity,
            ring_capacity,
            dirs,
            total_len: off as usize,
        })
    }

    /// The validated parameters this layout was computed from.
    #[inline]
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Total segment length in bytes (a multiple of [`PAGE_SIZE`]).
    #[inline]
    pub fn total_len(&self) -> usize {
        self.total_len
    }

    /// Where the part of the segment that holds only large slots starts: everything before it
    /// is pre-faulted at mapping time; the slots fault in as they are first used.
    #[inline]
    pub fn large_start(&self) -> usize {
        if self.params.large_count == 0 {
            self.total_len
        } else {
            self.dirs[0].large
        }
    }

    /// Capacity of each release ring: `buffer_count + large_count` rounded up to a power of two.
    #[inline]
    pub fn release_capacity(&self) -> u32 {
        self.release_capacity
    }

    /// Capacity in bytes of each direction's record ring ([`ring_capacity`]).
    #[inline]
    pub fn ring_capacity(&self) -> usize {
        self.ring_capacity
    }

    /// Offsets of one direction's structures.
    #[inline]
    pub fn dir(&self, dir: Dir) -> &DirLayout {
        &self.dirs[dir as usize]
    }

    /// Offset of a side's state block (`Side::A` = 0, `Side::B` = 1).
    #[inline]
    pub(crate) fn side_state(&self, side_index: usize) -> usize {
        hdr::SIDE_STATE + side_index * CACHE_PAD
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(buffer_size: u32, buffer_count: u32, ring_depth: u32, inline_max: u32) -> Params {
        Params {
            buffer_size,
            buffer_count,
            ring_depth,
            inline_max,
            large_size: 0,
            large_count: 0,
        }
    }

    #[test]
    fn ring_capacity_holds_depth_records() {
        use crate::record::ring::max_payload_for;
        for (depth, inline) in [(2, 0), (2, 7), (64, 120), (128, 120), (1024, 4096), (4, 40)] {
            let cap = ring_capacity(depth, inline);
            assert!(cap.is_power_of_two());
            let rec = crate::record::record_size(inline as usize).unwrap().max(16);
            assert!(cap >= (depth as usize + 1) * rec + 8, "{depth} {inline}");
            assert!(max_payload_for(cap) >= inline as usize);
        }
        assert_eq!(ring_capacity(128, 120), 32 << 10);
    }

    #[test]
    fn validate_rejects_each_field() {
        assert!(p(4096, 256, 128, 64).validate().is_ok());
        let cases = [
            (p(0, 1, 2, 0), "buffer_size"),
            (p(100, 1, 2, 0), "buffer_size"),
            (p(MAX_BUFFER_SIZE + 64, 1, 2, 0), "buffer_size"),
            (p(64, 0, 2, 0), "buffer_count"),
            (p(64, MAX_BUFFER_COUNT + 1, 2, 0), "buffer_count"),
            (p(64, 1, 1, 0), "ring_depth"),
            (p(64, 1, 3, 0), "ring_depth"),
            (p(64, 1, MAX_RING_DEPTH * 2, 0), "ring_depth"),
            (p(64, 1, 2, MAX_INLINE + 1), "inline_max"),
        ];
        for (params, field) in cases {
            match params.validate() {
                Err(WireError::InvalidParams { what, .. }) => assert_eq!(what, field, "{params:?}"),
                other => panic!("{params:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn layout_is_aligned_and_disjoint() {
        for params in [
            p(64, 1, 2, 0),
            p(4096, 256, 128, 64),
            p(64, 3, 4, 96),
            p(1 << 20, 64, 1024, 4096),
            Params {
                large_size: 3 << 20,
                large_count: 5,
                ..p(4096, 256, 128, 64)
            },
        ] {
            let l = Layout::new(&params).unwrap();
            assert_eq!(l.total_len() % PAGE_SIZE, 0);
            let mut regions = vec![(0usize, hdr::END)];
            for dir in [Dir::AToB, Dir::BToA] {
                let d = l.dir(dir);
                for off in [d.ring, d.rel_tail, d.rel_head, d.rel_entries] {
                    assert_eq!(off % CACHE_PAD, 0);
                }
                assert_eq!(d.buffers % PAGE_SIZE, 0);
                let cap = l.release_capacity() as usize;
                regions.push((d.ring, d.ring + region_size(l.ring_capacity())));
                regions.push((d.rel_tail, d.rel_tail + 8));
                regions.push((d.rel_head, d.rel_head + 8));
                regions.push((d.rel_entries, d.rel_entries + cap * 4));
                regions.push((
                    d.buffers,
                    d.buffers + (params.buffer_size * params.buffer_count) as usize,
                ));
                if params.large_count > 0 {
                    assert_eq!(d.large % PAGE_SIZE, 0);
                    regions.push((
                        d.large,
                        d.large + (params.large_size * params.large_count) as usize,
                    ));
                }
            }
            regions.sort();
            for w in regions.windows(2) {
                assert!(w[0].1 <= w[1].0, "{params:?}: overlap {w:?}");
            }
            assert!(regions.last().unwrap().1 <= l.total_len());
            assert!(l.release_capacity().is_power_of_two());
            assert!(l.release_capacity() >= params.buffer_count);
        }
    }

    #[test]
    fn large_slots_are_validated_and_laid_out_after_the_buffers() {
        let with = |large_size, large_count| Params {
            large_size,
            large_count,
            ..p(4096, 16, 64, 120)
        };
        assert!(with(0, 0).validate().is_ok());
        assert!(with(1 << 20, 2).validate().is_ok());
        for (bad, what) in [
            (with(1 << 20, 0), "large_size"),
            (with(0, 2), "large_size"),
            (with(4096, 2), "large_size"),
            ((with((1 << 20) + 8, 2)), "large_size"),
            (with(MAX_LARGE_SIZE + 64, 1), "large_size"),
            (with(1 << 20, MAX_LARGE_COUNT + 1), "large_count"),
        ] {
            match bad.validate() {
                Err(WireError::InvalidParams { what: w, .. }) => assert_eq!(w, what, "{bad:?}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let params = with(1 << 20, 3);
        let l = Layout::new(&params).unwrap();
        assert_eq!(l.release_capacity(), 32);
        let a = l.dir(Dir::AToB);
        let b = l.dir(Dir::BToA);
        assert_eq!(a.large % PAGE_SIZE, 0);
        assert!(a.large >= b.buffers + 16 * 4096);
        assert!(b.large >= a.large + 3 * (1 << 20));
        assert!(b.large + 3 * (1 << 20) <= l.total_len());
        // Everything before the first large slot is pre-faulted; the slots are not.
        assert_eq!(l.large_start(), a.large);
        assert_eq!(
            Layout::new(&with(0, 0)).unwrap().large_start(),
            Layout::new(&with(0, 0)).unwrap().total_len()
        );
    }

    #[test]
    fn layout_rejects_oversized_segment() {
        let params = p(MAX_BUFFER_SIZE, MAX_BUFFER_COUNT, 2, 0);
        assert!(matches!(
            Layout::new(&params),
            Err(WireError::InvalidParams {
                what: "segment length",
                ..
            })
        ));
    }
}
