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
//! | 8..12  | `buffer_size` | bytes per pool buffer (the largest message without large slots) |
//! | 12..16 | `depth`       | messages the sender may have in flight (the credit grant) |
//! | 16..20 | `max_message_size` | the largest message with large slots (issue #12); 0 or `buffer_size` without |
//! | 20..24 | `large_buffers` | large slots per direction; 0: no large messages |
//! | 24..32 | reserved      | 0 |
//!
//! Both sides must use the same buffer size. Large messages are on when both sides announce
//! large slots; the connection's limit is then the smaller `max_message_size` of the two (the
//! receiver accepts `DATA` records up to it), else the buffer size.
//!
//! Compatibility: a hello from before large messages has zeros at 16..24, which reads as "no
//! large slots", so such a peer still connects (without large messages). An older listener
//! rejects a hello that announces large slots (reserved bytes set) with status 3.

use crate::config::{MAX_LARGE_BUFFERS, MAX_MESSAGE_SIZE};
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
    /// Bytes per pool buffer (the largest message without large slots).
    pub buffer_size: u32,
    /// The sender's credit depth.
    pub depth: u32,
    /// The largest message this side carries through its large slots (`buffer_size` or 0
    /// without large slots).
    pub max_message_size: u32,
    /// Large slots per direction this side has (0: no large messages).
    pub large_buffers: u32,
}

impl TcpParams {
    pub(crate) fn encode(&self, status: u8) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = self.version;
        b[5] = status;
        b[8..12].copy_from_slice(&self.buffer_size.to_le_bytes());
        b[12..16].copy_from_slice(&self.depth.to_le_bytes());
        b[16..20].copy_from_slice(&self.max_message_size.to_le_bytes());
        b[20..24].copy_from_slice(&self.large_buffers.to_le_bytes());
        b
    }

    /// Parses a hello; returns the parameters and the status byte, or what is wrong.
    pub(crate) fn decode(b: &[u8; HELLO_LEN]) -> Result<(TcpParams, u8), &'static str> {
        let bad = |reason| Err(reason);
        if b[0..4] != MAGIC {
            return bad("bad magic");
        }
        if b[6..8].iter().chain(&b[24..]).any(|&x| x != 0) {
            return bad("reserved bytes set");
        }
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let p = TcpParams {
            version: b[4],
            buffer_size: u32_at(8),
            depth: u32_at(12),
            max_message_size: u32_at(16),
            large_buffers: u32_at(20),
        };
        if p.version != record::VERSION {
            return bad("unsupported record format version");
        }
        if p.buffer_size == 0 || p.buffer_size as usize > record::MAX_PAYLOAD || p.depth == 0 {
            return bad("buffer size or depth out of range");
        }
        let large_ok = if p.large_buffers == 0 {
            p.max_message_size == 0 || p.max_message_size == p.buffer_size
        } else {
            p.large_buffers as usize <= MAX_LARGE_BUFFERS
                && p.max_message_size > p.buffer_size
                && p.max_message_size as usize <= MAX_MESSAGE_SIZE
        };
        if !large_ok {
            return bad("max message size or large buffers out of range");
        }
        Ok((p, b[5]))
    }
}

impl TcpParams {
    /// The largest message of a connection between `self` (ours) and `theirs`, and whether it
    /// travels through large slots: with large slots on both sides, the smaller
    /// `max_message_size`; else the buffer size (the two sides' buffer sizes are equal).
    pub(crate) fn message_limit(&self, theirs: &TcpParams) -> (usize, bool) {
        let limit = self.max_message_size.min(theirs.max_message_size) as usize;
        if self.large_buffers > 0 && theirs.large_buffers > 0 && limit > self.buffer_size as usize {
            (limit, true)
        } else {
            (self.buffer_size as usize, false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(max_message_size: u32, large_buffers: u32) -> TcpParams {
        TcpParams {
            version: record::VERSION,
            buffer_size: 4096,
            depth: 16,
            max_message_size,
            large_buffers,
        }
    }

    #[test]
    fn large_fields_round_trip_and_are_validated() {
        let p = params(1 << 20, 2);
        assert_eq!(TcpParams::decode(&p.encode(STATUS_OK)), Ok((p, STATUS_OK)));
        // Without large slots: 0 (a hello from before large messages) or the buffer size.
        for ok in [params(0, 0), params(4096, 0)] {
            assert!(TcpParams::decode(&ok.encode(STATUS_OK)).is_ok(), "{ok:?}");
        }
        for bad in [
            params(4096, 2),
            params(100, 2),
            params(1 << 20, 0),
            params((MAX_MESSAGE_SIZE + 1) as u32, 2),
            params(1 << 20, MAX_LARGE_BUFFERS as u32 + 1),
        ] {
            assert!(
                TcpParams::decode(&bad.encode(STATUS_OK)).is_err(),
                "{bad:?}"
            );
        }
        let mut b = p.encode(STATUS_OK);
        b[24] = 1;
        assert!(TcpParams::decode(&b).is_err(), "reserved byte");
    }

    #[test]
    fn the_limit_is_the_smaller_side_and_needs_slots_on_both() {
        let big = params(16 << 20, 2);
        let small = params(1 << 20, 1);
        assert_eq!(big.message_limit(&small), (1 << 20, true));
        assert_eq!(small.message_limit(&big), (1 << 20, true));
        assert_eq!(big.message_limit(&params(0, 0)), (4096, false));
        assert_eq!(params(4096, 0).message_limit(&big), (4096, false));
    }
}
