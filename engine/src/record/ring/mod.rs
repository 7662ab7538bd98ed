//! A single-producer single-consumer byte ring of v2 [records](super) over a shared byte
//! region: the shm wire ring, testable on its own.
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
//! * [`Producer::claim_raw`] is a claim that outlives the borrow (a pointer to the payload, for
//!   a handle that keeps it open across calls); while it is open every other write fails with
//!   [`RingError::ClaimOpen`]. [`Producer::commit_raw`] publishes it (possibly shorter than
//!   claimed), [`Producer::abort_raw`] drops it (nothing is written).
//! * The consumer [`poll`](Consumer::poll)s: it loads the header word at its position
//!   (`Acquire`), `0` meaning nothing more is published, validates it with the record codec
//!   ([`RecordHeader::parse`](super::RecordHeader::parse)) and against the ring's geometry,
//!   hands the record to the handler (a DATA payload in place), skips PAD records, and after
//!   the batch publishes its position once (`Release`). A record handed to the handler is
//!   consumed, also if the handler unwinds (it is never handed over twice). The consumer never
//!   writes the record area.
//! * [`Consumer::poll_deferred`] is a poll that leaves the position unpublished, for a caller
//!   that takes one record per call and publishes when it chooses ([`Consumer::publish`]:
//!   once per run, when [`Consumer::may_be_empty`] says the ring ran empty or a run is
//!   complete; the engine's `try_recv` publishes after every record, since that look at the
//!   next header cost its ping-pong more than the store it saved). The producer gets the
//!   space back only at that publication, and the
//!   consumer's bound on an honest record's end is taken from the *published* position.
//! * [`Producer::try_put_data`] and [`Consumer::take_data`] are the one-record common cases of
//!   `claim` + `commit` and `poll_deferred(1, ..)`: a DATA record that needs no PAD and fits
//!   the free span as last seen (the producer's `room_end`), a published DATA record within
//!   every bound (the consumer's `span` past its published position). Each is a few compares
//!   against precomputed bounds; the failed state (and the producer's open raw claim) set the
//!   bound to 0, so they refuse everything then, and the caller falls back to the general
//!   call, which validates in full and reports. The stores and loads, and their ordering, are
//!   the general calls'.
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

use std::sync::Arc;

mod consumer;
mod error;
mod producer;

pub use consumer::{Consumer, Take};
pub use error::RingError;
pub use producer::{Claim, Producer};

use super::region::Region;
pub use super::region::{
    HeapRegion, RingMemory, CONSUMER_POSITION_OFFSET, MAX_CAPACITY, MIN_CAPACITY, POSITION_LINE,
    PRODUCER_POSITION_OFFSET, RING_HEADER_SIZE,
};
use super::{MAX_PAYLOAD, RECORD_HEADER};

/// Bytes of region a ring of `capacity` bytes of records needs (position lines included).
pub const fn region_size(capacity: usize) -> usize {
    RING_HEADER_SIZE + capacity
}

/// The largest DATA payload a ring of `capacity` bytes carries: a record takes at most half the
/// area (so a wrap's PAD and the record always fit once the consumer has caught up).
pub const fn max_payload_for(capacity: usize) -> usize {
    (capacity / 2).saturating_sub(RECORD_HEADER)
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::record::region::Ordering;
    use crate::record::Record;

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
    fn deferred_poll_frees_space_only_when_published() {
        let (mut p, mut c) = with_capacity(64, 8).unwrap();
        // Three 16-byte records fill 48 of the 56 usable bytes.
        for i in 0..3u8 {
            assert!(p.push(&[i; 8]).unwrap());
        }
        assert!(!c.is_empty_hint());
        assert_eq!(c.poll_deferred(2, |_| {}).unwrap(), 2);
        assert_eq!(c.unpublished_bytes(), 32);
        assert!(!c.is_empty_hint());
        // Consumed but not published: the producer still sees the ring full.
        assert!(!p.push(&[9; 8]).unwrap());
        assert_eq!(p.consumer_position().unwrap(), 0);
        c.publish();
        assert_eq!(c.unpublished_bytes(), 0);
        assert_eq!(p.consumer_position().unwrap(), 32);
        assert!(p.push(&[3; 8]).unwrap());
        // Never handed over twice; the rest arrives in order, and `poll` publishes.
        let mut got = Vec::new();
        assert_eq!(
            c.poll(8, |r| {
                if let Record::Data(d) = r {
                    got.push(d[0])
                }
            })
            .unwrap(),
            2
        );
        assert_eq!(got, [2, 3]);
        assert!(c.is_empty_hint());
        assert_eq!(p.consumer_position().unwrap(), 64);
    }

    #[test]
    fn take_data_published_frees_each_record_at_once() {
        let (mut p, mut c) = with_capacity(64, 8).unwrap();
        for i in 0..3u8 {
            assert!(p.push(&[i; 8]).unwrap());
        }
        assert!(!p.push(&[9; 8]).unwrap());
        // Each take publishes its record's end once the handler has read it: the producer
        // sees the space at once, with the rest still waiting.
        for i in 0..2u8 {
            let mut got = None;
            assert_eq!(
                c.take_data_published(8, |d| got = Some(d.to_vec())),
                Take::Data
            );
            assert_eq!(got, Some(vec![i; 8]));
            assert_eq!(c.unpublished_bytes(), 0);
            assert_eq!(p.consumer_position().unwrap(), 16 * (u64::from(i) + 1));
        }
        assert!(p.push(&[3; 8]).unwrap());
        // A payload over `max` is left for the general call, unpublished and untouched.
        assert_eq!(c.take_data_published(4, |_| panic!("taken")), Take::Other);
        assert_eq!(p.consumer_position().unwrap(), 32);
        for i in 2..4u8 {
            assert_eq!(
                c.take_data_published(8, |d| assert_eq!(d, [i; 8])),
                Take::Data
            );
        }
        // Nothing published: nothing taken, the position where it was.
        assert_eq!(c.take_data_published(8, |_| panic!("taken")), Take::Empty);
        assert_eq!(p.consumer_position().unwrap(), 64);
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

    /// `try_put_copy` (its per-size-class paths up to 64 bytes, the general one above) does what
    /// `try_put_data` with a copy does: the same outcome at every step, the same records
    /// delivered, through wraps, batches and a full ring; and a class path's padding is zero.
    #[test]
    fn try_put_copy_matches_try_put_data() {
        let cap = 512;
        let max = max_payload_for(cap);
        let mem = Arc::new(HeapRegion::new(region_size(cap)));
        let mut pa = Producer::attach(mem.clone(), max).unwrap();
        let mut ca = Consumer::attach(mem.clone(), max).unwrap();
        let (mut pb, mut cb) = with_capacity(cap, max).unwrap();
        let src: Vec<u8> = (0..=255u8).cycle().take(max + 1).collect();
        let area = RING_HEADER_SIZE / 8;
        let (mut sent, mut small) = (0, 0);
        for step in 0..4000usize {
            // Every length up to `max` (so every class and the general path), at shifting
            // offsets into the source, batched every third step.
            let len = (step * 7) % (max + 1);
            let data = &src[step % 3..step % 3 + len.min(max - 2)];
            let batched = step % 3 == 0;
            let off = pa.position() as usize % cap;
            // SAFETY: `data` is a live slice outside the ring.
            let a = unsafe { pa.try_put_copy(data.as_ptr(), data.len(), batched) };
            let b = pb.try_put_data(data.len(), batched, |d| d.copy_from_slice(data));
            assert_eq!(a, b, "step {step}, len {}", data.len());
            if a {
                sent += 1;
                small += usize::from(data.len() <= 64);
                // The padding after a payload of up to 64 bytes, to the record's 8-byte end,
                // is zero.
                let end = off + 8 + data.len();
                let pad_end = if data.len() <= 64 {
                    (end + 7) & !7
                } else {
                    end
                };
                for byte in end..pad_end {
                    let w = mem.word(area + byte / 8).unwrap().load(Ordering::Relaxed);
                    assert_eq!(w.to_le_bytes()[byte % 8], 0, "step {step}, byte {byte}");
                }
            } else {
                // Full, or the record would wrap (a PAD first): take the general path, then
                // drain both rings and compare what they deliver.
                assert!(pa.push(data).unwrap() == pb.push(data).unwrap());
                pa.publish();
                pb.publish();
                let (mut ga, mut gb) = (Vec::new(), Vec::new());
                let take = |c: &mut Consumer, g: &mut Vec<Vec<u8>>| {
                    c.poll(usize::MAX, |r| {
                        if let Record::Data(d) = r {
                            g.push(d.to_vec())
                        }
                    })
                    .unwrap()
                };
                assert_eq!(take(&mut ca, &mut ga), take(&mut cb, &mut gb));
                assert_eq!(ga, gb, "step {step}");
            }
        }
        assert!(
            sent > 1000 && small > 500,
            "only {sent} records took the fast path, {small} of them by class"
        );
    }
}
