//! The record types (the `type` byte) and the parsed [`Record`].

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
    /// Reserved: a fragment of a large message.
    Frag = 6,
    /// A rendezvous descriptor: a large message the receiver pulls with RDMA READ
    /// (`slot: u32, len: u32, addr: u64, rkey: u32, pad: u32`).
    Rndv = 7,
    /// A rendezvous acknowledgement: the receiver pulled the large message of the
    /// sender's slot `slot` (`slot: u32, pad: u32`); the sender may reuse the slot.
    RndvDone = 8,
    /// The sender failed the connection because of the receiver and closes it
    /// (`reason: u32, pad: u32`): the last record of its stream.
    Close = 9,
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
            8 => RecordType::RndvDone,
            9 => RecordType::Close,
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
    /// A rendezvous descriptor: `len` bytes of the sender's large slot `slot` at remote
    /// address `addr`, readable with `rkey` (the consumer checks all four against the region
    /// the peer announced).
    Rndv {
        /// The sender's large-slot index (echoed in the acknowledgement).
        slot: u32,
        /// Message length.
        len: u32,
        /// Remote virtual address of the message's first byte.
        addr: u64,
        /// Remote key of the sender's large send region.
        rkey: u32,
    },
    /// A rendezvous acknowledgement: the sender's large slot `slot` was pulled.
    RndvDone {
        /// The sender's large-slot index.
        slot: u32,
    },
    /// The sender failed the connection because of the receiver, for `reason` (a code: 2, the
    /// receiver was unresponsive; 3, it broke the protocol; others are unknown), and closes it.
    Close {
        /// The reason code.
        reason: u32,
    },
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
            Record::Rndv { .. } => RecordType::Rndv,
            Record::RndvDone { .. } => RecordType::RndvDone,
            Record::Close { .. } => RecordType::Close,
        }
    }
}
