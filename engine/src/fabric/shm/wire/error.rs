//! Errors of the wire layer.

use std::io;

use crate::record::ring::RingError;

/// Which value read from the peer's side of the segment failed validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Field {
    /// A `BUF_REF` record's length exceeds `buffer_size`.
    BufRefLen,
    /// A `BUF_REF` record's buffer index is `>= buffer_count`.
    BufRefIndex,
    /// A `BUF_REF` record names a buffer the receiver still holds (sent twice without a
    /// release).
    BufRefHeld,
    /// The release-ring tail moved backwards or more than the ring capacity ahead of the head.
    ReleaseTail,
    /// The release-ring head moved backwards or past the tail.
    ReleaseHead,
    /// A release entry is `>= buffer_count`.
    ReleaseIndex,
    /// A release entry names a buffer the sender already owns (duplicate or forged release).
    ReleaseDuplicate,
    /// The release ring is full although the receiver only releases buffers it holds; the
    /// sender must have re-sent buffers it never reclaimed.
    ReleaseOverflow,
}

impl Field {
    /// A short name of the field, for messages and counters.
    pub const fn name(self) -> &'static str {
        match self {
            Field::BufRefLen => "buffer reference len",
            Field::BufRefIndex => "buffer reference index",
            Field::BufRefHeld => "buffer reference to a buffer already held",
            Field::ReleaseTail => "release-ring tail",
            Field::ReleaseHead => "release-ring head",
            Field::ReleaseIndex => "release index",
            Field::ReleaseDuplicate => "duplicate release",
            Field::ReleaseOverflow => "release-ring overflow",
        }
    }
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors of the shared-memory wire layer.
///
/// [`WireError::Corrupt`] means the peer wrote an invalid value into the segment: the caller must
/// fail the connection (it can no longer be trusted). The other variants are local: setup
/// failures or misuse of the API by the caller.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// A layout parameter is out of range (see [`crate::fabric::shm::wire::Params::validate`]).
    #[error("invalid shm wire parameter {what} = {value}")]
    InvalidParams {
        /// The parameter.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// Placing the segment's memory (its NUMA node) failed.
    #[error("placing the shm segment")]
    Placement(#[source] crate::placement::PlacementError),
    /// A system call creating the segment failed.
    #[error("creating the shm segment failed at {step}")]
    Create {
        /// The failing step (`memfd_create`, `fchmod`, `ftruncate`, `fallocate`, `seal`,
        /// `mmap`).
        step: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Committing the memory of this direction's large slots failed (on the first large
    /// message: the segment leaves them unreserved until then). Nothing was sent; the slots
    /// stay unusable until a later try succeeds.
    #[error("reserving {bytes} bytes of shared memory for the large slots failed")]
    ReserveLarge {
        /// The bytes of this direction's large slots.
        bytes: usize,
        /// The OS error (`ENOMEM`, or `EFAULT` where tmpfs or a memory limit is full).
        #[source]
        source: io::Error,
    },
    /// A system call attaching the segment failed.
    #[error("attaching the shm segment failed at {step}")]
    Attach {
        /// The failing step (`fstat`, `get_seals`, `fstatfs`, `mmap`).
        step: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The received segment file is not a regular file, or grants access beyond its owner.
    #[error("shm segment file has mode {mode:o}; expected a regular file with mode 0600")]
    SegmentMode {
        /// `st_mode` of the file.
        mode: u32,
    },
    /// The received segment's size differs from the size computed from the validated params.
    #[error("shm segment is {actual} bytes; the negotiated params need {expected}")]
    SegmentSize {
        /// Computed length.
        expected: u64,
        /// `st_size` of the received file.
        actual: u64,
    },
    /// The received memfd is not sealed against shrinking, so the peer could truncate it and
    /// fault our accesses.
    #[error("shm segment is not sealed against shrinking (seals {seals:#x})")]
    NotSealed {
        /// `F_GET_SEALS` result.
        seals: u32,
    },
    /// A header field of the received segment differs from the locally computed value.
    #[error("shm segment header {what} is {found:#x}; expected {expected:#x}")]
    HeaderMismatch {
        /// The header field.
        what: &'static str,
        /// The locally computed value.
        expected: u64,
        /// The value found in the segment.
        found: u64,
    },
    /// The attaching side's slot in the header is already marked attached.
    #[error("shm segment already has an attached peer")]
    AlreadyAttached,
    /// [`crate::fabric::shm::wire::Segment::split`] was called a second time.
    #[error("shm segment rings were already split off")]
    AlreadySplit,
    /// A payload is longer than `inline_max` (inline) or `buffer_size` (buffer reference).
    #[error("inline payload of {len} bytes exceeds the inline limit of {max} bytes")]
    PayloadTooLarge {
        /// Payload length.
        len: usize,
        /// The limit (`inline_max`, or `buffer_size` for buffer sends).
        max: usize,
    },
    /// A local buffer index is `>= buffer_count`.
    #[error("buffer index {index} out of range (buffer_count {count})")]
    BadBufferIndex {
        /// The index.
        index: u32,
        /// `buffer_count`.
        count: u32,
    },
    /// The sender tried to use a buffer that is in flight to the peer.
    #[error("buffer {index} is in flight to the peer")]
    BufferInFlight {
        /// The index.
        index: u32,
    },
    /// The receiver tried to read or release a buffer it does not hold.
    #[error("buffer {index} is not held by the receiver")]
    BufferNotHeld {
        /// The index.
        index: u32,
    },
    /// The record ring rejected what the peer wrote (a record header, a record running past
    /// its limit, the consumer position), or could not be set up over the segment: fail the
    /// connection.
    #[error("shm record ring")]
    Ring {
        /// The ring's error.
        #[source]
        source: RingError,
    },
    /// The peer wrote an invalid value: fail the connection.
    #[error("corrupt shm segment: {what} = {value:#x} (at ring position {position})")]
    Corrupt {
        /// What failed validation.
        what: Field,
        /// The offending value read from the segment.
        value: u64,
        /// Ring position (record or release ring) where it was read, for diagnostics.
        position: u64,
    },
}

impl WireError {
    /// `true` for [`WireError::Corrupt`] and [`WireError::Ring`]: the peer misbehaved and the
    /// connection must be failed.
    #[inline]
    pub fn is_corrupt(&self) -> bool {
        matches!(self, WireError::Corrupt { .. } | WireError::Ring { .. })
    }

    #[cold]
    pub(crate) fn corrupt(what: Field, value: u64, position: u64) -> Self {
        WireError::Corrupt {
            what,
            value,
            position,
        }
    }
}
