//! [`RecordError`]: what the codec rejects.

use super::types::RecordType;
use super::MAX_PAYLOAD;

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
    /// A type reserved for a later version (FRAG).
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
