//! The TCP handshake message, before any record flows.
//!
//! The handshake is one fixed 32-byte message each way, before any record: the connector sends
//! its hello, the listener checks it and answers with its own (status 0) or a refusal (nonzero
//! status) and closes. All integers little-endian:
//!
//! | bytes  | field         | meaning |
//! |--------|---------------|---------|
//! | 0..4   | `magic`       | `b"SPWT"` |
//! | 4      | `version`     | the record format version ([`record::VERSION`]) |
//! | 5      | `status`      | reply only: 0 accepted, 1 parameters differ, 2 busy, 3 invalid hello |
//! | 6..8   | reserved      | 0 |
//! | 8..12  | `buffer_size` | bytes per pool buffer = the largest message |
//! | 12..16 | `depth`       | messages the sender may have in flight (the credit grant) |
//! | 16..32 | reserved      | 0 |
//!
//! Both sides must use the same buffer size (the receiver accepts `DATA` records up to it).

use crate::record;

pub(crate) const MAGIC: [u8; 4] = *b"SPWT";
/// Size of a hello (either direction).
pub(crate) const HELLO_LEN: usize = 32;

pub(crate) const STATUS_OK: u8 = 0;
pub(crate) const STATUS_MISMATCH: u8 = 1;
pub(crate) const STATUS_BUSY: u8 = 2;
pub(crate) const STATUS_INVALID: u8 = 3;

/// The parameters one side announces in its hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpParams {
    /// Record format version.
    pub version: u8,
    /// Bytes per pool buffer (the largest message).
    pub buffer_size: u32,
    /// The sender's credit depth.
    pub depth: u32,
}

impl TcpParams {
    pub(crate) fn encode(&self, status: u8) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = self.version;
        b[5] = status;
        b[8..12].copy_from_slice(&self.buffer_size.to_le_bytes());
        b[12..16].copy_from_slice(&self.depth.to_le_bytes());
        b
    }

    /// Parses a hello; returns the parameters and the status byte, or what is wrong.
    pub(crate) fn decode(b: &[u8; HELLO_LEN]) -> Result<(TcpParams, u8), &'static str> {
        let bad = |reason| Err(reason);
        if b[0..4] != MAGIC {
            return bad("bad magic");
        }
        if b[6..8].iter().chain(&b[16..]).any(|&x| x != 0) {
            return bad("reserved bytes set");
        }
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let p = TcpParams {
            version: b[4],
            buffer_size: u32_at(8),
            depth: u32_at(12),
        };
        if p.version != record::VERSION {
            return bad("unsupported record format version");
        }
        if p.buffer_size == 0 || p.buffer_size as usize > record::MAX_PAYLOAD || p.depth == 0 {
            return bad("buffer size or depth out of range");
        }
        Ok((p, b[5]))
    }
}
