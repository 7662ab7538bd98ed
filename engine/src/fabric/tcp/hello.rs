//! The TCP handshake message, before any record flows.
//!
//! The handshake is one fixed 32-byte message each way, before any record: the connector sends
//! its hello, the listener checks it and answers with its own (status 0) or a refusal (nonzero
//! status) and closes. All integers little-endian:
//!
//! | bytes  | field         | meaning |
//! |--------|---------------|---------|
//! | 0..4   | `magic`       | `b"SPWT"` |
//! | 4      | `version`     | the tcp wire version ([`WIRE_VERSION`]): the record format plus the credit encoding |
//! | 5      | `status`      | reply only: 0 accepted, 1 parameters differ, 2 busy, 3 invalid hello |
//! | 6..8   | reserved      | 0 |
//! | 8..12  | `buffer_size` | bytes per pool buffer (the largest message without large slots) |
//! | 12..16 | `depth`       | messages this side may have in flight (its message window) |
//! | 16..20 | `max_message_size` | the largest message with large slots; 0 or `buffer_size` without |
//! | 20..24 | `large_buffers` | large slots per direction; 0: no large messages |
//! | 24..28 | `rx_window`   | bytes of records the peer may have in flight to this side (its byte window), `1 ..= MAX_RX_WINDOW` |
//! | 28..32 | reserved      | 0 |
//!
//! Both sides must use the same buffer size. Large messages are on when both sides announce
//! large slots; the connection's limit is then the smaller `max_message_size` of the two (the
//! receiver accepts `DATA` records up to it), else the buffer size.
//!
//! Compatibility: a hello from before large messages has zeros at 16..24, which reads as "no
//! large slots", so such a peer still connects (without large messages). An older listener
//! rejects a hello that announces large slots (reserved bytes set) with status 3. Version 2
//! added the byte window (`rx_window`) and the two-count `CREDIT` record (see `datapath`); a
//! version-1 peer's hello is refused ([`HelloError::Version`]), as a version-1 side refuses
//! ours: the two would read each other's credits wrong.

use crate::config::{MAX_BUFFERS, MAX_BUFFER_SIZE, MAX_LARGE_BUFFERS, MAX_MESSAGE_SIZE};
use crate::record;

/// The tcp wire version a hello carries: 2 since the byte window (`rx_window`) and the
/// `CREDIT` record's two counts (messages and bytes, each mod 2^32); 1 was the record format
/// alone, with credits in messages.
pub const WIRE_VERSION: u8 = 2;

/// The largest byte window a hello may announce: 1 GiB, so that a window's worth of bytes is
/// below 2^31 and a `CREDIT` record's byte count, kept mod 2^32, is never ambiguous.
pub const MAX_RX_WINDOW: u32 = 1 << 30;

/// Why a hello is refused: the field that is wrong, with its value and the bound it broke
/// (the engine's own configuration bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HelloError {
    /// Not a spinwire TCP hello.
    #[error("bad magic {0:02x?}")]
    Magic([u8; 4]),
    /// A reserved byte is not zero.
    #[error("reserved byte {at} is {value:#04x}, not 0")]
    Reserved {
        /// Its offset.
        at: usize,
        /// Its value.
        value: u8,
    },
    /// Another tcp wire version.
    #[error("tcp wire version {got}, this build speaks {want}")]
    Version {
        /// The peer's.
        got: u8,
        /// Ours ([`WIRE_VERSION`]).
        want: u8,
    },
    /// An unknown status byte.
    #[error("status {0} is not a known status (0..=3)")]
    Status(u8),
    /// A number out of its range.
    #[error("{field} {value} out of range {min}..={max}")]
    OutOfRange {
        /// The field, as the builder names it (`buffer_size`, `depth`, `max_message_size`,
        /// `large_buffers`).
        field: &'static str,
        /// The value announced.
        value: u32,
        /// The smallest value accepted.
        min: u64,
        /// The largest value accepted.
        max: u64,
    },
}

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
    /// The tcp wire version ([`WIRE_VERSION`]).
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
    /// Bytes of records (headers, payloads and padding) the peer may have in flight to this
    /// side: this side's byte window, `1 ..= MAX_RX_WINDOW`.
    pub rx_window: u32,
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
        b[24..28].copy_from_slice(&self.rx_window.to_le_bytes());
        b
    }

    /// Parses a hello; returns the parameters and the status byte, or what is wrong. Every
    /// number it returns is within the engine's configuration bounds.
    pub(crate) fn decode(b: &[u8; HELLO_LEN]) -> Result<(TcpParams, u8), HelloError> {
        if b[0..4] != MAGIC {
            return Err(HelloError::Magic([b[0], b[1], b[2], b[3]]));
        }
        if let Some(at) = (6..8).chain(28..HELLO_LEN).find(|&i| b[i] != 0) {
            return Err(HelloError::Reserved { at, value: b[at] });
        }
        if b[5] > STATUS_INVALID {
            return Err(HelloError::Status(b[5]));
        }
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let p = TcpParams {
            version: b[4],
            buffer_size: u32_at(8),
            depth: u32_at(12),
            max_message_size: u32_at(16),
            large_buffers: u32_at(20),
            rx_window: u32_at(24),
        };
        if p.version != WIRE_VERSION {
            return Err(HelloError::Version {
                got: p.version,
                want: WIRE_VERSION,
            });
        }
        let range = |field, value: u32, min: u64, max: usize| {
            if (min..=max as u64).contains(&u64::from(value)) {
                Ok(())
            } else {
                Err(HelloError::OutOfRange {
                    field,
                    value,
                    min,
                    max: max as u64,
                })
            }
        };
        range(
            "buffer_size",
            p.buffer_size,
            1,
            MAX_BUFFER_SIZE.min(record::MAX_PAYLOAD),
        )?;
        // The credit depth is at most the buffers per connection.
        range("depth", p.depth, 1, MAX_BUFFERS)?;
        range("large_buffers", p.large_buffers, 0, MAX_LARGE_BUFFERS)?;
        range("rx_window", p.rx_window, 1, MAX_RX_WINDOW as usize)?;
        if p.large_buffers == 0 {
            // 0 (a hello from before large messages) or the buffer size.
            if p.max_message_size != 0 {
                range(
                    "max_message_size",
                    p.max_message_size,
                    u64::from(p.buffer_size),
                    p.buffer_size as usize,
                )?;
            }
        } else {
            range(
                "max_message_size",
                p.max_message_size,
                u64::from(p.buffer_size) + 1,
                MAX_MESSAGE_SIZE,
            )?;
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
            version: WIRE_VERSION,
            buffer_size: 4096,
            depth: 16,
            max_message_size,
            large_buffers,
            rx_window: 64 << 10,
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
        b[28] = 1;
        assert!(TcpParams::decode(&b).is_err(), "reserved byte");
    }

    /// Every value a hello that decodes may carry is within the engine's bounds.
    fn in_range(p: &TcpParams, status: u8) -> bool {
        p.version == WIRE_VERSION
            && status <= STATUS_INVALID
            && (1..=MAX_BUFFER_SIZE.min(record::MAX_PAYLOAD)).contains(&(p.buffer_size as usize))
            && (1..=MAX_BUFFERS).contains(&(p.depth as usize))
            && p.large_buffers as usize <= MAX_LARGE_BUFFERS
            && (1..=MAX_RX_WINDOW).contains(&p.rx_window)
            && p.max_message_size as usize <= MAX_MESSAGE_SIZE
            && (p.large_buffers == 0 || p.max_message_size > p.buffer_size)
    }

    #[test]
    fn every_byte_mutation_is_refused_or_in_range() {
        let valid = [params(1 << 20, 2), params(0, 0), params(4096, 0)];
        let mut refused = 0;
        let mut accepted = 0;
        for p in valid {
            for status in [STATUS_OK, STATUS_INVALID] {
                let good = p.encode(status);
                assert!(TcpParams::decode(&good).is_ok(), "{p:?}");
                for at in 0..HELLO_LEN {
                    for value in [
                        0x00,
                        0x01,
                        0x7f,
                        0x80,
                        0xfe,
                        0xff,
                        good[at] ^ 1,
                        good[at] ^ 0x40,
                    ] {
                        let mut b = good;
                        b[at] = value;
                        match TcpParams::decode(&b) {
                            Ok((q, s)) => {
                                accepted += 1;
                                assert!(in_range(&q, s), "byte {at} = {value:#x}: {q:?}");
                            }
                            Err(e) => {
                                refused += 1;
                                // A typed reason that says what it is.
                                assert!(!e.to_string().is_empty());
                            }
                        }
                    }
                }
            }
        }
        assert!(refused > 0 && accepted > 0);
    }

    #[test]
    fn absurd_values_are_refused_with_the_field() {
        let mut p = params(1 << 20, 2);
        p.depth = u32::MAX;
        assert!(matches!(
            TcpParams::decode(&p.encode(STATUS_OK)),
            Err(HelloError::OutOfRange {
                field: "depth",
                value: u32::MAX,
                ..
            })
        ));
        let mut p = params(1 << 20, 2);
        p.depth = MAX_BUFFERS as u32 + 1;
        assert!(TcpParams::decode(&p.encode(STATUS_OK)).is_err());
        let p = params(1 << 20, MAX_LARGE_BUFFERS as u32 + 1);
        assert!(matches!(
            TcpParams::decode(&p.encode(STATUS_OK)),
            Err(HelloError::OutOfRange {
                field: "large_buffers",
                ..
            })
        ));
        let mut b = params(0, 0).encode(STATUS_OK);
        b[5] = 9;
        assert_eq!(TcpParams::decode(&b), Err(HelloError::Status(9)));
    }

    /// Version 2 carries the byte window: a version-1 hello (the record format version alone,
    /// zeros where the window goes) is refused typed, and so are a zero window and one above
    /// [`MAX_RX_WINDOW`].
    #[test]
    fn the_wire_version_and_the_byte_window_are_checked() {
        let p = params(1 << 20, 2);
        let mut v1 = p.encode(STATUS_OK);
        v1[4] = 1;
        v1[24..28].fill(0);
        assert_eq!(
            TcpParams::decode(&v1),
            Err(HelloError::Version { got: 1, want: 2 })
        );
        for (w, ok) in [
            (0, false),
            (1, true),
            (MAX_RX_WINDOW, true),
            (MAX_RX_WINDOW + 1, false),
        ] {
            let q = TcpParams { rx_window: w, ..p };
            let got = TcpParams::decode(&q.encode(STATUS_OK));
            assert_eq!(got.is_ok(), ok, "{w}: {got:?}");
            if !ok {
                assert!(matches!(
                    got,
                    Err(HelloError::OutOfRange {
                        field: "rx_window",
                        ..
                    })
                ));
            }
        }
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
