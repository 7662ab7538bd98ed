//! The record format: one fabric-neutral codec for the records that the shm record
//! ring, RDMA frames and the `tcp://` byte stream carry.
//!
//! This module is the **specification**. It is a bottom-layer module: it imports nothing from the
//! rest of the crate, performs no I/O, never allocates and never panics on any input. The
//! `tcp://` fabric ([`crate::fabric::tcp`]) uses it as its stream framing. Its submodule
//! [`ring`] is the shared-memory record ring built on it (generic over a byte region,
//! loom-modelled), which the shm segment ([`crate::fabric::shm::wire`], version 2) holds, one
//! per direction, and the shm direct path drives from the applications' threads. The RDMA data
//! path sends frames of DATA records (one SEND per frame, split by the receiver with
//! [`FrameReader`]).
//!
//! # Records
//!
//! A record is an 8-byte header followed by its payload, padded with (ignored) bytes to the next
//! multiple of [`RECORD_ALIGN`] = 8. Several small messages therefore share a cache line (an
//! 8-byte message takes 16 bytes, not a 64-byte slot), and the next record starts at
//! `offset + align8(len)`. All integers are **little-endian**.
//!
//! | bytes | field   | meaning |
//! |-------|---------|---------|
//! | 0..4  | `len`   | `u32`: record length in bytes, header included, **without** padding (`>= 8`). `0` = not yet committed. The commit flag: written last. |
//! | 4     | `type`  | `u8`: [`RecordType`] (table below). `0` is never valid (zeroed memory is not a record). |
//! | 5     | `flags` | `u8`: reserved, must be `0` in version 1. |
//! | 6..8  | `aux`   | `u16`: type-specific; reserved, must be `0` for every version-1 type. |
//! | 8..len | payload | `len - 8` bytes, then padding up to `align8(len)`. |
//!
//! Why 8 bytes and not 16: an 8-byte header keeps an 8-byte message in 16 bytes (4 per cache
//! line) and every field a receiver needs fits. FIFO order is given by the ring or the byte
//! stream, so no per-record sequence number is needed; credits are returned by their own
//! CREDIT record once per batch rather than by a per-record field; a fragment's message id and
//! offset live in the FRAG payload. A 16-byte header would cost a quarter of the line for those
//! fields on every small message.
//!
//! | type | name        | payload | status |
//! |------|-------------|---------|--------|
//! | 1    | `DATA`      | the message bytes, inline (`0 ..= max` bytes) | v1 |
//! | 2    | `BUF_REF`   | `buf: u32`, `len: u32`: a message left zero-copy in pool buffer `buf` | v1 |
//! | 3    | `PAD`       | ignored: skip to the end of the ring (a wrap) or of the frame | v1 |
//! | 4    | `CREDIT`    | `credits: u64`, cumulative (so a repeated record is harmless) | v1 |
//! | 5    | `HEARTBEAT` | `seq: u64` | v1 |
//! | 6    | `FRAG`      | reserved (no version defines it; large messages travel through large slots) | reserved |
//! | 7    | `RNDV`      | `slot: u32`, `len: u32`, `addr: u64`, `rkey: u32`, `pad: u32` (24 bytes): a large message of `len` bytes in the sender's large slot `slot`, to be pulled with RDMA READ from `addr` with `rkey` (RDMA rendezvous) | v1 |
//! | 8    | `RNDV_DONE` | `slot: u32`, `pad: u32` (8 bytes): the receiver pulled the sender's large slot `slot`; the sender may reuse it | v1 |
//! | 9    | `CLOSE`     | `reason: u32`, `pad: u32` (8 bytes): the sender failed the connection because of the receiver and closes it; `reason` 2: the receiver was silent for the sender's liveness timeout, 3: it broke the protocol (the engine's `AbortReason`; other codes read as a plain close). The last record of a stream | v1 |
//! | 10..=255 | —       | unknown | error |
//!
//! CLOSE travels only on the `tcp://` stream (the shm segment carries the same codes in its
//! close mark). RNDV and RNDV_DONE travel only in RDMA frames (see `fabric::rdma`'s protocol docs); the
//! codec checks their size, the consumer everything else (the key, the address and length
//! against the region the peer announced at connect, the slot against its own accounting).
//! `pad` is written as zero and ignored.
//!
//! # The commit rule
//!
//! In shared memory the writer fills the payload first and then publishes the header with
//! `Release`; the reader loads it with `Acquire` and treats `len == 0` as "nothing published
//! yet". The [`ring`] stores the whole 8-byte header (8-aligned) as one atomic word, so `len`,
//! its low half, is written together with `type`/`flags`/`aux` and after the payload; it
//! keeps `len` reading `0` where the consumer looks next by zeroing the word after its last
//! record before each publication (*zero-ahead*; see [`ring`] for why zeroing only consumed
//! length words would not do). A byte stream or an RDMA receive buffer has no torn records:
//! there the codec only parses ([`RecordReader`]). The [`RecordWriter`] here writes into a plain
//! `&mut [u8]` (header last, in program order). [`RecordHeader`] holds the header checks, shared
//! by [`RecordReader`] and the ring.
//!
//! # Frames
//!
//! A frame (one RDMA SEND, or one unit of a TCP write) is an 8-byte frame header followed by
//! records:
//!
//! | bytes | field     | meaning |
//! |-------|-----------|---------|
//! | 0..4  | `len`     | `u32`: frame length, header included, a multiple of 8, `<=` the receive buffer |
//! | 4..6  | `count`   | `u16`: number of records (`>= 1`) |
//! | 6     | `version` | `u8`: [`VERSION`] = 1 |
//! | 7     | `flags`   | `u8`: reserved, `0` |
//!
//! Frames are bounded by the receive buffer size and a lone record still leaves at once (a frame
//! of one), so coalescing does not cost latency.
//!
//! # Validation (what a reader rejects)
//!
//! Everything read from a peer is hostile until checked. [`RecordReader`] and [`FrameReader`]
//! return a typed [`RecordError`] (never panic, never read out of bounds, never loop) when:
//! `len < 8` ([`RecordError::BadLength`]; in a stream `len == 0` is "not committed yet" instead);
//! a DATA payload exceeds the configured maximum ([`RecordError::TooLong`]; PAD is bounded by
//! the buffer, the fixed-size types by their size); the padded
//! record runs past the end of a frame ([`RecordError::Truncated`]); `type` is unknown
//! ([`RecordError::UnknownType`]) or reserved ([`RecordError::Unsupported`]); `flags` or `aux`
//! are nonzero ([`RecordError::Reserved`]); a fixed-size payload has the wrong size
//! ([`RecordError::BadPayload`]); the frame header is short, misaligned, longer than the buffer,
//! has an unknown version or flags, or a `count` that disagrees with the records found
//! ([`RecordError::BadFrame`], [`RecordError::CountMismatch`]). Semantic checks that need
//! connection state (a `BUF_REF` index within the pool, credits that never go backwards) belong
//! to the consumer, as today in the engine.
//!
//! After one successful parse a [`Record`] is a plain value: no accessor can panic (smoltcp's
//! `new_checked` idiom).
//!
//! # Byte streams (TCP)
//!
//! Records are self-delimiting. [`RecordReader::stream`] parses the complete records at the
//! front of a buffer and stops, without error, at a partial one; [`RecordReader::position`]
//! says how many bytes were consumed, and the caller keeps the rest until more bytes arrive.
//!
//! # Version and handshake
//!
//! The tcp hello and every RDMA frame carry [`VERSION`]; the shm segment's header carries its
//! own wire version, which covers its rings. New record types (FRAG) are added by the version
//! that defines them; a version-1 reader rejects them with [`RecordError::Unsupported`], never
//! misparses.
//!
//! # Where it is used
//!
//! * shm: the record ring ([`ring`]), an SPSC byte ring of records over a caller-supplied
//!   region (positions, never pointers, in shared memory), one per direction in the segment
//!   (`fabric/shm/wire`, 128-byte aligned, [`ring::region_size`]). Inline messages are `DATA`
//!   records, pooled and large ones `BUF_REF`; a release ring of buffer indices returns the
//!   buffers. The ring's typed [`ring::RingError`] surfaces as `WireError::Ring` (the
//!   connection fails). The applications' threads are its producer and consumer (the direct
//!   path): `send` writes the record, `Connection::claim` writes a message into the record
//!   itself ([`ring::Producer::claim_raw`]), `Connection::poll` reads the peer's records in
//!   place. The sender's window is counted against the consumer's published position.
//!   It is loom-modelled (`scripts/ci/loom.sh`), stress- and hostile-producer-tested
//!   (`engine/tests/record_ring.rs`) and benchmarked (`cargo bench -p spinwire --bench
//!   record_ring`).
//! * tcp: the stream framing; the hello carries [`VERSION`].
//! * RDMA: one frame of `DATA` records per SEND (post lists, selective signalling), split by
//!   the receiver with [`FrameReader`]; `RNDV` / `RNDV_DONE` for large messages.

pub(crate) mod copy;
mod error;
mod frame;
mod header;
mod reader;
mod region;
pub mod ring;
mod types;
mod writer;

pub use error::RecordError;
pub use frame::FrameReader;
pub use header::RecordHeader;
pub use reader::RecordReader;
pub use region::{HeapRegion, RingMemory};
pub use types::{Record, RecordType};
pub use writer::{Claim, RecordWriter};

/// Record and frame alignment in bytes: every record starts at a multiple of 8.
pub const RECORD_ALIGN: usize = 8;
/// Size of a record header.
pub const RECORD_HEADER: usize = 8;
/// Size of a frame header.
pub const FRAME_HEADER: usize = 8;
/// The format version this codec speaks.
pub const VERSION: u8 = 1;
/// The largest payload any configuration may allow (16 MiB, the large-message ceiling).
pub const MAX_PAYLOAD: usize = 16 << 20;

const BUF_REF_PAYLOAD: usize = 8;
const U64_PAYLOAD: usize = 8;
/// Payload bytes of an RNDV record.
pub const RNDV_PAYLOAD: usize = 24;
/// Payload bytes of an RNDV_DONE record.
pub const RNDV_DONE_PAYLOAD: usize = 8;
/// Payload bytes of a CLOSE record.
pub const CLOSE_PAYLOAD: usize = 8;

/// The payload of an RNDV record (little-endian; `pad` zero), for writers that build frames
/// in place rather than through [`RecordWriter`].
#[inline]
pub const fn rndv_payload(slot: u32, len: u32, addr: u64, rkey: u32) -> [u8; RNDV_PAYLOAD] {
    let mut b = [0u8; RNDV_PAYLOAD];
    let s = slot.to_le_bytes();
    let l = len.to_le_bytes();
    let a = addr.to_le_bytes();
    let k = rkey.to_le_bytes();
    let mut i = 0;
    while i < 4 {
        b[i] = s[i];
        b[4 + i] = l[i];
        b[16 + i] = k[i];
        i += 1;
    }
    let mut i = 0;
    while i < 8 {
        b[8 + i] = a[i];
        i += 1;
    }
    b
}

/// `n` rounded up to the record alignment (`None` on overflow).
#[inline]
pub const fn align8(n: usize) -> Option<usize> {
    match n.checked_add(RECORD_ALIGN - 1) {
        Some(v) => Some(v & !(RECORD_ALIGN - 1)),
        None => None,
    }
}

/// Bytes one record with a `payload`-byte payload takes on the wire, padding included.
///
/// `None` when `payload` exceeds [`MAX_PAYLOAD`].
#[inline]
pub const fn record_size(payload: usize) -> Option<usize> {
    if payload > MAX_PAYLOAD {
        return None;
    }
    align8(RECORD_HEADER + payload)
}

/// Bytes one record with a `len`-byte payload takes on a byte stream: header, payload and
/// padding ([`record_size`] without its limit check; `len` comes from a descriptor's `u32`). The unit of a byte
/// window counted in records (tcp's, and the application's window beside it).
#[inline(always)]
pub(crate) const fn stream_bytes(len: usize) -> u64 {
    ((RECORD_HEADER + RECORD_ALIGN - 1).wrapping_add(len) & !(RECORD_ALIGN - 1)) as u64
}

#[inline]
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

#[inline]
fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    let s = b.get(at..at.checked_add(2)?)?;
    Some(u16::from_le_bytes([s[0], s[1]]))
}

#[inline]
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    let s = b.get(at..at.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Some(u64::from_le_bytes(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_is_little_endian() {
        let mut b = [0u8; 32];
        let mut w = RecordWriter::new(&mut b, 64).unwrap();
        w.push_data(b"abc").unwrap();
        let out = w.finish().unwrap();
        assert_eq!(out.len(), 16);
        assert_eq!(&out[..8], &[11, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(&out[8..11], b"abc");
        assert_eq!(&out[11..16], &[0; 5]);
    }

    #[test]
    fn align8_and_sizes() {
        assert_eq!(align8(0), Some(0));
        assert_eq!(align8(1), Some(8));
        assert_eq!(align8(8), Some(8));
        assert_eq!(align8(usize::MAX), None);
        assert_eq!(record_size(0), Some(8));
        assert_eq!(record_size(8), Some(16));
        assert_eq!(record_size(MAX_PAYLOAD + 1), None);
    }
}
