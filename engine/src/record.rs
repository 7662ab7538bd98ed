//! The data path v2 record format: one fabric-neutral codec for the records that the shm record
//! ring, RDMA frames and the planned `tcp://` byte stream carry (issue #10).
//!
//! This module is the **specification**. It is a bottom-layer module: it imports nothing from the
//! rest of the crate, performs no I/O, never allocates and never panics on any input. The
//! `tcp://` fabric ([`crate::fabric::tcp`]) uses it as its stream framing; today's shm and RDMA wires
//! ([`crate::fabric::shm::wire`], the RDMA immediate-data protocol) are unchanged. See
//! [the plan](#plan-wiring-it-in) below and the crate docs' "Data path v2 plan".
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
//! | 6    | `FRAG`      | reserved for large messages (#12): message id, offset, total length, bytes | reserved |
//! | 7    | `RNDV`      | reserved for rendezvous (#12): address, rkey, length, message id | reserved |
//! | 8..=255 | —        | unknown | error |
//!
//! # The commit rule
//!
//! In shared memory the writer fills the payload and the `type`/`flags`/`aux` bytes first and
//! then stores the `len` word with `Release`; the reader loads `len` with `Acquire` and treats
//! `0` as "nothing published yet". The consumed region is zeroed again (or the ring position
//! scheme guarantees `len` reads `0`) before the producer reuses it. A byte stream or an RDMA
//! receive buffer has no torn records: there the codec only parses ([`RecordReader`]). The
//! [`RecordWriter`] here writes into a plain `&mut [u8]` (header last, in program order); the
//! shared-memory ring will perform the `Release` store of the length itself.
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
//! Both ends will exchange [`VERSION`] and their maximum record payload in the connection
//! handshake (shm hello / rdma_cm private data / TCP hello) before any record flows; a frame
//! also carries the version. New record types (FRAG, RNDV) are added by the version that defines
//! them; a version-1 reader rejects them with [`RecordError::Unsupported`], never misparses.
//!
//! # Plan: wiring it in
//!
//! Next step, shm (`fabric/shm/wire`): the descriptor ring of 64-byte slots is replaced by a
//! single-producer byte ring of records in the segment. The producer claims `align8(len)` bytes,
//! writes the record and stores `len` with `Release` last; at the ring's end it writes a `PAD`
//! record and wraps. It caches the consumer's published position and reloads it only when the
//! cached window is exhausted. The consumer loads `len` with `Acquire`, drains everything
//! committed up to a batch limit, and publishes its position once per batch. Inline messages
//! become `DATA` records; pooled ones `BUF_REF`. The separate release ring of buffer indices and
//! the credit counter become `CREDIT` records sent once per batch on the reverse ring (the
//! receiving poller still only consumes what its application's receive ring can hold, so
//! back-pressure is unchanged), and the heartbeat word becomes a `HEARTBEAT` record. In
//! run-to-completion mode `Connection::send` writes the `DATA` record straight into the wire
//! ring (no application→poller descriptor hop), since the application thread is then the only
//! producer. RDMA: the records queued on a connection are coalesced into one frame per SEND
//! (post lists, selective signalling); the receiver splits it with [`FrameReader`] and the
//! application reads each message in place in the receive buffer.

use std::fmt;

/// Record and frame alignment in bytes: every record starts at a multiple of 8.
pub const RECORD_ALIGN: usize = 8;
/// Size of a record header.
pub const RECORD_HEADER: usize = 8;
/// Size of a frame header.
pub const FRAME_HEADER: usize = 8;
/// The format version this codec speaks.
pub const VERSION: u8 = 1;
/// The largest payload any configuration may allow (16 MiB, the large-message ceiling of #12).
pub const MAX_PAYLOAD: usize = 16 << 20;

const BUF_REF_PAYLOAD: usize = 8;
const U64_PAYLOAD: usize = 8;

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

/// The record types (the `type` byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u8)]
pub enum RecordType {
    /// Inline message bytes.
    Data = 1,
    /// A message left zero-copy in a pool buffer: `buf: u32`, `len: u32`.
    BufRef = 2,
    /// Padding: skip to the end of the ring or frame.
    Pad = 3,
    /// Credits returned (cumulative `u64`), once per batch.
    Credit = 4,
    /// Liveness (`u64` sequence).
    Heartbeat = 5,
    /// Reserved: a fragment of a large message (issue #12).
    Frag = 6,
    /// Reserved: a rendezvous descriptor (issue #12).
    Rndv = 7,
}

impl RecordType {
    /// The type for a `type` byte, if it is one of the table's.
    pub fn from_u8(b: u8) -> Option<RecordType> {
        Some(match b {
            1 => RecordType::Data,
            2 => RecordType::BufRef,
            3 => RecordType::Pad,
            4 => RecordType::Credit,
            5 => RecordType::Heartbeat,
            6 => RecordType::Frag,
            7 => RecordType::Rndv,
            _ => return None,
        })
    }
}

/// One parsed, validated record. Borrowed payloads point into the buffer that was parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Record<'a> {
    /// An inline message.
    Data(&'a [u8]),
    /// A message in pool buffer `buf`, `len` bytes (the consumer checks both against its pool).
    BufRef {
        /// Buffer index.
        buf: u32,
        /// Message length.
        len: u32,
    },
    /// Padding (its bytes are not exposed).
    Pad,
    /// Cumulative credits returned by the peer.
    Credit(u64),
    /// A heartbeat with its sequence number.
    Heartbeat(u64),
}

impl Record<'_> {
    /// The record's type.
    pub fn record_type(&self) -> RecordType {
        match self {
            Record::Data(_) => RecordType::Data,
            Record::BufRef { .. } => RecordType::BufRef,
            Record::Pad => RecordType::Pad,
            Record::Credit(_) => RecordType::Credit,
            Record::Heartbeat(_) => RecordType::Heartbeat,
        }
    }
}

/// A record or frame that violates the format (or a writer without room).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// A record length below the header size.
    #[error("record at offset {offset}: length {len} is below the 8-byte header")]
    BadLength {
        /// Offset of the record.
        offset: usize,
        /// The `len` field.
        len: u32,
    },
    /// A payload longer than the configured maximum.
    #[error("record at offset {offset}: payload of {len} bytes exceeds the maximum {max}")]
    TooLong {
        /// Offset of the record.
        offset: usize,
        /// Payload length.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The (padded) record runs past the end of the frame or buffer.
    #[error("record at offset {offset}: needs {need} bytes, {have} remain")]
    Truncated {
        /// Offset of the record.
        offset: usize,
        /// Bytes the record needs (padded).
        need: usize,
        /// Bytes left.
        have: usize,
    },
    /// A `type` byte outside the table.
    #[error("record at offset {offset}: unknown type {ty}")]
    UnknownType {
        /// Offset of the record.
        offset: usize,
        /// The `type` byte.
        ty: u8,
    },
    /// A type reserved for a later version (FRAG, RNDV).
    #[error("record at offset {offset}: type {ty:?} is not supported by format version 1")]
    Unsupported {
        /// Offset of the record.
        offset: usize,
        /// The type.
        ty: RecordType,
    },
    /// Nonzero reserved `flags` or `aux`.
    #[error("record at offset {offset}: reserved fields set (flags {flags:#x}, aux {aux:#x})")]
    Reserved {
        /// Offset of the record.
        offset: usize,
        /// The `flags` byte.
        flags: u8,
        /// The `aux` field.
        aux: u16,
    },
    /// A fixed-size payload of the wrong size.
    #[error("record at offset {offset}: {ty:?} payload is {len} bytes, expected {expected}")]
    BadPayload {
        /// Offset of the record.
        offset: usize,
        /// The type.
        ty: RecordType,
        /// Payload length found.
        len: usize,
        /// Payload length the type has.
        expected: usize,
    },
    /// A bad frame header.
    #[error("bad frame header: {reason} (len {len}, buffer {have} bytes)")]
    BadFrame {
        /// What is wrong.
        reason: &'static str,
        /// The frame's `len` field (0 when the header itself is short).
        len: u32,
        /// Bytes in the buffer.
        have: usize,
    },
    /// The frame's `count` disagrees with the records it holds.
    #[error("frame says {count} records, holds {found}")]
    CountMismatch {
        /// The `count` field.
        count: u16,
        /// Records found (so far).
        found: usize,
    },
    /// A writer has no room for the record.
    #[error("no room: record needs {need} bytes, {have} free")]
    NoSpace {
        /// Bytes the record needs (padded).
        need: usize,
        /// Bytes free.
        have: usize,
    },
    /// A reader or writer configured with a maximum above [`MAX_PAYLOAD`].
    #[error("maximum payload {max} exceeds the format's limit {MAX_PAYLOAD}")]
    BadLimit {
        /// The maximum asked for.
        max: usize,
    },
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

/// What [`RecordReader`] does at the end of its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// A frame or ring region: every byte belongs to a complete record.
    Exact,
    /// A byte stream: a partial (or uncommitted) record at the end waits for more bytes.
    Stream,
}

/// Parses records from a byte buffer, validating each header; an iterator of
/// `Result<Record, RecordError>` that stops after the first error.
///
/// `buf` must start at a record boundary (offset 0 is aligned by definition).
pub struct RecordReader<'a> {
    buf: &'a [u8],
    pos: usize,
    max_payload: usize,
    tail: Tail,
    failed: bool,
    count: usize,
}

impl fmt::Debug for RecordReader<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordReader")
            .field("len", &self.buf.len())
            .field("pos", &self.pos)
            .field("max_payload", &self.max_payload)
            .finish_non_exhaustive()
    }
}

impl<'a> RecordReader<'a> {
    /// A reader of a region that holds only complete records (a frame's body, a drained ring
    /// span): a partial record at the end is [`RecordError::Truncated`].
    ///
    /// # Errors
    ///
    /// [`RecordError::BadLimit`] when `max_payload > MAX_PAYLOAD`.
    pub fn exact(buf: &'a [u8], max_payload: usize) -> Result<Self, RecordError> {
        Self::new(buf, max_payload, Tail::Exact)
    }

    /// A reader of the front of a byte stream: it stops (`None`) at a partial record or an
    /// uncommitted (`len == 0`) header; [`position`](Self::position) tells how much was
    /// consumed.
    ///
    /// # Errors
    ///
    /// [`RecordError::BadLimit`] when `max_payload > MAX_PAYLOAD`.
    pub fn stream(buf: &'a [u8], max_payload: usize) -> Result<Self, RecordError> {
        Self::new(buf, max_payload, Tail::Stream)
    }

    fn new(buf: &'a [u8], max_payload: usize, tail: Tail) -> Result<Self, RecordError> {
        if max_payload > MAX_PAYLOAD {
            return Err(RecordError::BadLimit { max: max_payload });
        }
        Ok(RecordReader {
            buf,
            pos: 0,
            max_payload,
            tail,
            failed: false,
            count: 0,
        })
    }

    /// Bytes consumed by the complete records returned so far (a multiple of 8).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Records returned so far.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Whether every byte was consumed.
    pub fn is_done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// Parses the record at the current position.
    ///
    /// `Ok(None)`: end of buffer (exact), or a partial / uncommitted record (stream).
    ///
    /// # Errors
    ///
    /// Any [`RecordError`] of the validation rules; the reader then stays failed.
    pub fn next_record(&mut self) -> Result<Option<Record<'a>>, RecordError> {
        if self.failed {
            return Ok(None);
        }
        let r = self.parse();
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    fn parse(&mut self) -> Result<Option<Record<'a>>, RecordError> {
        let offset = self.pos;
        let have = self.buf.len().saturating_sub(offset);
        if have == 0 {
            return Ok(None);
        }
        let stream = self.tail == Tail::Stream;
        if have < RECORD_HEADER {
            if stream {
                return Ok(None);
            }
            return Err(RecordError::Truncated {
                offset,
                need: RECORD_HEADER,
                have,
            });
        }
        // `have >= 8`, so these reads are in bounds; `?`-free fallbacks keep it panic-free.
        let len = u32_at(self.buf, offset).unwrap_or(0);
        if len == 0 && stream {
            return Ok(None);
        }
        if (len as usize) < RECORD_HEADER {
            return Err(RecordError::BadLength { offset, len });
        }
        let payload_len = len as usize - RECORD_HEADER;
        let ty_byte = self.buf[offset + 4];
        let flags = self.buf[offset + 5];
        let aux = u16_at(self.buf, offset + 6).unwrap_or(0);
        let ty = RecordType::from_u8(ty_byte).ok_or(RecordError::UnknownType {
            offset,
            ty: ty_byte,
        })?;
        if flags != 0 || aux != 0 {
            return Err(RecordError::Reserved { offset, flags, aux });
        }
        // The maximum bounds message payloads; PAD is bounded by the buffer, the fixed-size
        // types by their size.
        if ty == RecordType::Data && payload_len > self.max_payload {
            return Err(RecordError::TooLong {
                offset,
                len: payload_len,
                max: self.max_payload,
            });
        }
        let need = align8(len as usize).unwrap_or(usize::MAX);
        if need > have {
            if stream {
                return Ok(None);
            }
            return Err(RecordError::Truncated { offset, need, have });
        }
        let start = offset + RECORD_HEADER;
        let payload = &self.buf[start..start + payload_len];
        let fixed = |expected: usize| {
            if payload_len == expected {
                Ok(())
            } else {
                Err(RecordError::BadPayload {
                    offset,
                    ty,
                    len: payload_len,
                    expected,
                })
            }
        };
        let rec = match ty {
            RecordType::Data => Record::Data(payload),
            RecordType::BufRef => {
                fixed(BUF_REF_PAYLOAD)?;
                Record::BufRef {
                    buf: u32_at(payload, 0).unwrap_or(0),
                    len: u32_at(payload, 4).unwrap_or(0),
                }
            }
            RecordType::Pad => Record::Pad,
            RecordType::Credit => {
                fixed(U64_PAYLOAD)?;
                Record::Credit(u64_at(payload, 0).unwrap_or(0))
            }
            RecordType::Heartbeat => {
                fixed(U64_PAYLOAD)?;
                Record::Heartbeat(u64_at(payload, 0).unwrap_or(0))
            }
            RecordType::Frag | RecordType::Rndv => {
                return Err(RecordError::Unsupported { offset, ty });
            }
        };
        self.pos = offset + need;
        self.count += 1;
        Ok(Some(rec))
    }
}

impl<'a> Iterator for RecordReader<'a> {
    type Item = Result<Record<'a>, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

/// A validated frame: its header checked, its records parsed on demand by [`records`](Self::records)
/// or all at once by [`for_each`](Self::for_each).
#[derive(Debug, Clone, Copy)]
pub struct FrameReader<'a> {
    body: &'a [u8],
    count: u16,
    max_payload: usize,
}

impl<'a> FrameReader<'a> {
    /// Checks the frame header at the start of `buf` (an RDMA receive buffer's filled bytes, or
    /// a TCP buffer holding at least one whole frame). Bytes after the frame are not looked at.
    ///
    /// # Errors
    ///
    /// [`RecordError::BadFrame`] for a short, misaligned or oversized frame, an unknown version
    /// or nonzero flags or a zero count; [`RecordError::BadLimit`].
    pub fn new_checked(buf: &'a [u8], max_payload: usize) -> Result<Self, RecordError> {
        if max_payload > MAX_PAYLOAD {
            return Err(RecordError::BadLimit { max: max_payload });
        }
        let have = buf.len();
        let bad = |reason, len| Err(RecordError::BadFrame { reason, len, have });
        let Some(len) = u32_at(buf, 0) else {
            return bad("shorter than the frame header", 0);
        };
        if have < FRAME_HEADER {
            return bad("shorter than the frame header", len);
        }
        let count = u16_at(buf, 4).unwrap_or(0);
        let version = buf[6];
        let flags = buf[7];
        if (len as usize) < FRAME_HEADER + RECORD_HEADER {
            return bad("length below one record", len);
        }
        if len as usize % RECORD_ALIGN != 0 {
            return bad("length not a multiple of 8", len);
        }
        if len as usize > have {
            return bad("length beyond the buffer", len);
        }
        if version != VERSION {
            return bad("unknown version", len);
        }
        if flags != 0 {
            return bad("reserved flags set", len);
        }
        if count == 0 {
            return bad("zero records", len);
        }
        Ok(FrameReader {
            body: &buf[FRAME_HEADER..len as usize],
            count,
            max_payload,
        })
    }

    /// The frame's length in bytes, header included (where the next frame of a stream starts).
    pub fn len(&self) -> usize {
        FRAME_HEADER + self.body.len()
    }

    /// Always false: a checked frame holds at least one record.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The `count` field.
    pub fn count(&self) -> u16 {
        self.count
    }

    /// The records, each validated. The iterator's own errors cover the body; the count is
    /// checked by [`for_each`](Self::for_each), or by the caller against
    /// [`RecordReader::count`].
    pub fn records(&self) -> RecordReader<'a> {
        RecordReader {
            buf: self.body,
            pos: 0,
            max_payload: self.max_payload,
            tail: Tail::Exact,
            failed: false,
            count: 0,
        }
    }

    /// Parses every record and hands each to `f`, then checks the count. Returns the number of
    /// records. On an error some records may already have been handed to `f`; the whole frame
    /// is then to be treated as a protocol violation.
    ///
    /// # Errors
    ///
    /// The first [`RecordError`] found, or [`RecordError::CountMismatch`].
    pub fn for_each(&self, mut f: impl FnMut(Record<'a>)) -> Result<usize, RecordError> {
        let mut r = self.records();
        let mut n = 0usize;
        while let Some(rec) = r.next_record()? {
            n += 1;
            if n > usize::from(self.count) {
                return Err(RecordError::CountMismatch {
                    count: self.count,
                    found: n,
                });
            }
            f(rec);
        }
        if n != usize::from(self.count) {
            return Err(RecordError::CountMismatch {
                count: self.count,
                found: n,
            });
        }
        Ok(n)
    }
}

/// Writes records into a byte buffer, in place: [`claim`](Self::claim) a payload, fill it,
/// [`commit`](Claim::commit). In [frame mode](Self::frame) it reserves the frame header and
/// [`finish`](Self::finish) writes it.
pub struct RecordWriter<'a> {
    buf: &'a mut [u8],
    /// Next free byte; a multiple of 8, `<= buf.len()`.
    pos: usize,
    count: usize,
    max_payload: usize,
    frame: bool,
}

impl fmt::Debug for RecordWriter<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordWriter")
            .field("cap", &self.buf.len())
            .field("pos", &self.pos)
            .field("count", &self.count)
            .field("frame", &self.frame)
            .finish_non_exhaustive()
    }
}

impl<'a> RecordWriter<'a> {
    /// A writer of bare records (a ring span, a TCP send buffer) from the start of `buf`.
    ///
    /// # Errors
    ///
    /// [`RecordError::BadLimit`] when `max_payload > MAX_PAYLOAD`.
    pub fn new(buf: &'a mut [u8], max_payload: usize) -> Result<Self, RecordError> {
        if max_payload > MAX_PAYLOAD {
            return Err(RecordError::BadLimit { max: max_payload });
        }
        Ok(RecordWriter {
            buf,
            pos: 0,
            count: 0,
            max_payload,
            frame: false,
        })
    }

    /// A writer of one frame: the first 8 bytes are reserved for the frame header.
    ///
    /// # Errors
    ///
    /// [`RecordError::BadLimit`]; [`RecordError::NoSpace`] when `buf` cannot hold the header.
    pub fn frame(buf: &'a mut [u8], max_payload: usize) -> Result<Self, RecordError> {
        let mut w = Self::new(buf, max_payload)?;
        if w.buf.len() < FRAME_HEADER {
            return Err(RecordError::NoSpace {
                need: FRAME_HEADER,
                have: w.buf.len(),
            });
        }
        w.pos = FRAME_HEADER;
        w.frame = true;
        Ok(w)
    }

    /// Bytes written so far (frame header included in frame mode).
    pub fn len(&self) -> usize {
        self.pos
    }

    /// True when no record was written.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Records written.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Bytes still free.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Reserves a `payload`-byte DATA record; the returned [`Claim`] exposes the payload for
    /// writing in place. Dropping the claim without committing writes nothing.
    ///
    /// # Errors
    ///
    /// [`RecordError::TooLong`], [`RecordError::NoSpace`], or [`RecordError::CountMismatch`]
    /// when a frame already holds `u16::MAX` records.
    pub fn claim(&mut self, payload: usize) -> Result<Claim<'_, 'a>, RecordError> {
        self.reserve(RecordType::Data, payload)
    }

    fn reserve(&mut self, ty: RecordType, payload: usize) -> Result<Claim<'_, 'a>, RecordError> {
        if ty == RecordType::Data && payload > self.max_payload {
            return Err(RecordError::TooLong {
                offset: self.pos,
                len: payload,
                max: self.max_payload,
            });
        }
        if self.frame && self.count >= usize::from(u16::MAX) {
            return Err(RecordError::CountMismatch {
                count: u16::MAX,
                found: self.count + 1,
            });
        }
        let have = self.remaining();
        // DATA: `payload <= MAX_PAYLOAD`; the fixed types are 8 bytes; PAD is `<= have`. So the
        // record length fits in the `u32` length word whenever it fits in the buffer below.
        let need = RECORD_HEADER
            .checked_add(payload)
            .and_then(align8)
            .unwrap_or(usize::MAX);
        if need > have || need > u32::MAX as usize {
            return Err(RecordError::NoSpace { need, have });
        }
        Ok(Claim {
            w: self,
            ty,
            payload,
        })
    }

    fn put_fixed(&mut self, ty: RecordType, bytes: &[u8]) -> Result<(), RecordError> {
        let mut c = self.reserve(ty, bytes.len())?;
        c.payload_mut().copy_from_slice(bytes);
        c.commit();
        Ok(())
    }

    /// Writes a DATA record holding `data`.
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim).
    pub fn push_data(&mut self, data: &[u8]) -> Result<(), RecordError> {
        self.put_fixed(RecordType::Data, data)
    }

    /// Writes a BUF_REF record.
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim).
    pub fn push_buf_ref(&mut self, buf: u32, len: u32) -> Result<(), RecordError> {
        let mut b = [0u8; BUF_REF_PAYLOAD];
        b[..4].copy_from_slice(&buf.to_le_bytes());
        b[4..].copy_from_slice(&len.to_le_bytes());
        self.put_fixed(RecordType::BufRef, &b)
    }

    /// Writes a CREDIT record (cumulative credits).
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim).
    pub fn push_credit(&mut self, credits: u64) -> Result<(), RecordError> {
        self.put_fixed(RecordType::Credit, &credits.to_le_bytes())
    }

    /// Writes a HEARTBEAT record.
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim).
    pub fn push_heartbeat(&mut self, seq: u64) -> Result<(), RecordError> {
        self.put_fixed(RecordType::Heartbeat, &seq.to_le_bytes())
    }

    /// Fills the rest of the buffer with one PAD record (a ring's wrap). Does nothing when the
    /// buffer is full.
    ///
    /// # Errors
    ///
    /// [`RecordError::NoSpace`] when the rest exceeds what one length word can describe.
    pub fn pad_to_end(&mut self) -> Result<(), RecordError> {
        let rest = self.remaining();
        if rest == 0 {
            return Ok(());
        }
        // `rest` is a multiple of 8 only if the buffer length is; round down to stay inside.
        let rest = rest & !(RECORD_ALIGN - 1);
        if rest < RECORD_HEADER {
            return Ok(());
        }
        let c = self.reserve(RecordType::Pad, rest - RECORD_HEADER)?;
        c.commit();
        Ok(())
    }

    /// Frame mode: writes the frame header and returns the frame's bytes. Bare mode: returns the
    /// records written.
    ///
    /// # Errors
    ///
    /// [`RecordError::CountMismatch`] for a frame without records (a frame holds at least one).
    pub fn finish(self) -> Result<&'a [u8], RecordError> {
        let RecordWriter {
            buf,
            pos,
            count,
            frame,
            ..
        } = self;
        if frame {
            if count == 0 {
                return Err(RecordError::CountMismatch { count: 0, found: 0 });
            }
            // `pos <= buf.len()`; a frame longer than 4 GiB cannot be described: refuse it.
            let len = u32::try_from(pos).map_err(|_| RecordError::BadFrame {
                reason: "frame longer than u32::MAX",
                len: u32::MAX,
                have: pos,
            })?;
            buf[0..4].copy_from_slice(&len.to_le_bytes());
            // `count <= u16::MAX` by `reserve`.
            buf[4..6].copy_from_slice(&(count as u16).to_le_bytes());
            buf[6] = VERSION;
            buf[7] = 0;
        }
        Ok(&buf[..pos])
    }
}

/// A reserved record: write the payload in place, then [`commit`](Self::commit) (the header,
/// length word last). Dropping it aborts: nothing is written.
pub struct Claim<'w, 'a> {
    w: &'w mut RecordWriter<'a>,
    ty: RecordType,
    payload: usize,
}

impl fmt::Debug for Claim<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("type", &self.ty)
            .field("payload", &self.payload)
            .finish()
    }
}

impl Claim<'_, '_> {
    /// The payload bytes, in place (their previous contents are unspecified).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.w.pos + RECORD_HEADER;
        // In bounds: `reserve` checked `pos + align8(8 + payload) <= buf.len()`.
        &mut self.w.buf[start..start + self.payload]
    }

    /// Publishes the record: writes type, flags, aux, then the length word, and advances the
    /// writer. Padding bytes are zeroed so no stale data leaves the process.
    pub fn commit(self) {
        let at = self.w.pos;
        let len = RECORD_HEADER + self.payload;
        let need = (len + RECORD_ALIGN - 1) & !(RECORD_ALIGN - 1);
        self.w.buf[at + len..at + need].fill(0);
        self.w.buf[at + 4] = self.ty as u8;
        self.w.buf[at + 5] = 0;
        self.w.buf[at + 6..at + 8].copy_from_slice(&0u16.to_le_bytes());
        // `reserve` checked `align8(len) <= u32::MAX`. In shared memory this is the Release store.
        self.w.buf[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
        self.w.pos = at + need;
        self.w.count += 1;
    }
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
