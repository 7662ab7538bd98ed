//! The counters file's layout: one definition that the engine's writer and the reader
//! ([`super::read`]) share.
//!
//! Every field is a little-endian `u64` at an 8-byte-aligned offset; text fields are
//! NUL-padded UTF-8. The file is a header ([`HEADER_BYTES`]), then as many poller slots of
//! [`POLLER_BYTES`] as header word 7 says, then as many connection slots of [`CONN_BYTES`] as
//! word 8 says ([`CONN_SLOTS`] in this version). A reader refuses a file whose [`MAGIC`] or
//! [`LAYOUT_VERSION`] differs.
//!
//! A poller slot is its core (`u64::MAX`: the run-to-completion poller) and [`POLLER_FIELDS`];
//! a connection slot is its id plus one (0: free), its [`ConnState`], [`CONN_FIELDS`], then the
//! fabric name (bytes 144..160), the disconnect reason (160..192) and the peer endpoint
//! (192..256). On a direct path `sent`, `received`, bytes, `would_block` and `alloc_failures`
//! are the application's counts as of its last copy (every 256 messages, and whenever a
//! receive finds the ring empty); on a polled one `sent` and `received` are the messages its
//! poller posted and delivered; `in_flight` is a polled path's (0 on a direct path); `heartbeats`
//! and `last_heard_ms` (`u64::MAX`: not tracked) are the shm control thread's; `large_sent`
//! counts large slots taken to send, `large_received` large messages released.
//!
//! | header word | field |
//! |---|---|
//! | 0 | [`MAGIC`] |
//! | 1 | [`LAYOUT_VERSION`] |
//! | 2 | process id |
//! | 3 | process start time (clock ticks since boot, `/proc/<pid>/stat` field 22) |
//! | 4 | created, ns since the Unix epoch |
//! | 5 | publication sequence: odd while the writer updates the file |
//! | 6 | last publication, ns since the Unix epoch |
//! | 7, 8 | poller slots, connection slots |
//! | 9 | pollers in use |
//! | 10.. | engine counters ([`ENGINE_FIELDS`]) |
//! | bytes 192..256 | engine name |

/// First word of every counters file: `SPWCNTR` and a NUL.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SPWCNTR\0");
/// The layout this build writes and reads. A change of any offset or slot size bumps it.
pub const LAYOUT_VERSION: u64 = 1;

/// Bytes of the header.
pub const HEADER_BYTES: usize = 256;
/// Bytes of one poller slot.
pub const POLLER_BYTES: usize = 128;
/// Bytes of one connection slot.
pub const CONN_BYTES: usize = 256;
/// Connection slots a file has: connections beyond them are counted in the header
/// (`conns_unlisted`) but not listed.
pub const CONN_SLOTS: usize = 256;

pub(crate) const H_MAGIC: usize = 0;
pub(crate) const H_VERSION: usize = 1;
pub(crate) const H_PID: usize = 2;
pub(crate) const H_PROC_START: usize = 3;
pub(crate) const H_CREATED_NS: usize = 4;
pub(crate) const H_SEQ: usize = 5;
pub(crate) const H_PUBLISHED_NS: usize = 6;
pub(crate) const H_POLLER_SLOTS: usize = 7;
pub(crate) const H_CONN_SLOTS: usize = 8;
pub(crate) const H_POLLERS_USED: usize = 9;
/// First word of the engine counters.
pub(crate) const H_ENGINE: usize = 10;
/// Byte offset and length of the engine name.
pub(crate) const H_NAME: (usize, usize) = (192, 64);

/// Engine counters, in header words from 10 on.
pub const ENGINE_FIELDS: [&str; 6] = [
    "connections",
    "connections_opened",
    "connections_closed",
    "control_wakeups",
    "events_dropped",
    "conns_unlisted",
];

/// Poller counters, one word each from the slot's word 1 on (word 0 is the core, `u64::MAX`
/// for the run-to-completion poller).
///
/// `sleeps` and `sleep_timeouts` (an `IdleStrategy::Block` poller's sleeps, and those that
/// ended at their bound) took words 12 and 13, zero in a file written before them.
pub const POLLER_FIELDS: [&str; 13] = [
    "cycles",
    "busy_cycles",
    "empty_cycles",
    "commands",
    "rx_msgs",
    "tx_msgs",
    "tx_batches",
    "tx_stalls",
    "rx_ring_full",
    "conn_errors",
    "connections",
    "sleeps",
    "sleep_timeouts",
];

/// Word 0 of a connection slot: the connection's id plus one (0: a free slot).
pub(crate) const C_ID: usize = 0;
/// Word 1: [`ConnState`] as a number.
pub(crate) const C_STATE: usize = 1;
/// First word of the counters.
pub(crate) const C_COUNTERS: usize = 2;
/// Byte offset and length of the fabric name.
pub(crate) const C_FABRIC: (usize, usize) = (144, 16);
/// ... of the disconnect reason.
pub(crate) const C_REASON: (usize, usize) = (160, 32);
/// ... of the peer endpoint.
pub(crate) const C_ENDPOINT: (usize, usize) = (192, 64);

/// Connection counters, one word each from the slot's word 2 on.
pub const CONN_FIELDS: [&str; 15] = [
    "sent",
    "received",
    "tx_msgs",
    "tx_bytes",
    "rx_msgs",
    "rx_bytes",
    "would_block",
    "credit_stalls",
    "alloc_failures",
    "large_sent",
    "large_received",
    "in_flight",
    "heartbeats",
    "last_heard_ms",
    "errors",
];

/// Total bytes of a file with `pollers` poller slots and `conns` connection slots.
pub const fn file_bytes(pollers: usize, conns: usize) -> usize {
    HEADER_BYTES + pollers * POLLER_BYTES + conns * CONN_BYTES
}

/// Byte offset of poller slot `i`.
pub(crate) const fn poller_at(i: usize) -> usize {
    HEADER_BYTES + i * POLLER_BYTES
}

/// Byte offset of connection slot `i` in a file with `pollers` poller slots.
pub(crate) const fn conn_at(pollers: usize, i: usize) -> usize {
    HEADER_BYTES + pollers * POLLER_BYTES + i * CONN_BYTES
}

/// A connection's state as the counters file shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnState {
    /// Up.
    Open,
    /// The peer went away.
    Disconnected,
    /// The data path failed it (the reason says why).
    Failed,
    /// This side closed it.
    Closed,
    /// A value this build does not know.
    Unknown(u64),
}

impl ConnState {
    /// The number stored in the file.
    pub const fn code(self) -> u64 {
        match self {
            ConnState::Open => 1,
            ConnState::Disconnected => 2,
            ConnState::Failed => 3,
            ConnState::Closed => 4,
            ConnState::Unknown(v) => v,
        }
    }

    /// The state a stored number means.
    pub const fn from_code(v: u64) -> ConnState {
        match v {
            1 => ConnState::Open,
            2 => ConnState::Disconnected,
            3 => ConnState::Failed,
            4 => ConnState::Closed,
            v => ConnState::Unknown(v),
        }
    }

    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnState::Open => "open",
            ConnState::Disconnected => "disconnected",
            ConnState::Failed => "failed",
            ConnState::Closed => "closed",
            ConnState::Unknown(_) => "unknown",
        }
    }
}

const _: () = {
    assert!((H_ENGINE + ENGINE_FIELDS.len()) * 8 <= H_NAME.0);
    assert!(H_NAME.0 + H_NAME.1 <= HEADER_BYTES);
    assert!((1 + POLLER_FIELDS.len()) * 8 <= POLLER_BYTES);
    assert!((C_COUNTERS + CONN_FIELDS.len()) * 8 <= C_FABRIC.0);
    assert!(C_FABRIC.0 + C_FABRIC.1 <= C_REASON.0);
    assert!(C_REASON.0 + C_REASON.1 <= C_ENDPOINT.0);
    assert!(C_ENDPOINT.0 + C_ENDPOINT.1 <= CONN_BYTES);
};
