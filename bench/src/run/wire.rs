//! The benchmark protocol's messages: tags, layouts, encoding and checked decoding.
//!
//! Every message's first byte is its tag. Payload messages (`DATA`) are exactly the requested
//! size; control messages are at most [`CONTROL_MAX`] bytes, so `--buffer-size` must be at least
//! that. Multi-byte fields are little-endian at 8-byte-aligned offsets.
//!
//! | message | bytes | layout |
//! |---------|-------|--------|
//! | `DATA` | size | tag, then byte `i` is `i % 251` ([`payload_byte`]); for `load` seq `u64` at 8 and intended send time (ns, `CLOCK_MONOTONIC`) at 16 instead |
//! | `HELLO` | 48 | tag, test, latency kind (1 one-way), flags (bit 0: verify), app batch `u32` at 4, size at 8, warm-up at 16, stall after at 24, stall ns at 32, interval ns at 40 |
//! | `READY` | 2.. | tag, ok (1) or refused (0) + reason text |
//! | `END` | 1 | tag |
//! | `RESULT` | 64 | tag, msgs at 8, bytes at 16, elapsed ns at 24, server thread CPU at 32 ([`ThreadCpu::encode`]) |
//! | `INTERVAL` | 32 | tag, interval count `u32` at 4, start ns at 8, length ns at 16, histogram bytes at 24 |
//! | `CHUNK` | 2..=64 | tag, then the next bytes of the V2-serialized histogram |
//! | `BYE` | 1 | tag |

use crate::cli::{LatencyKind, TestKind};
use crate::error::BenchError;
use crate::stats::RateSummary;
use crate::sys::ThreadCpu;

/// Tag of payload messages.
pub const TAG_DATA: u8 = 0x00;
pub(super) const TAG_HELLO: u8 = 0xB1;
pub(super) const TAG_READY: u8 = 0xB2;
pub(super) const TAG_END: u8 = 0xB3;
pub(super) const TAG_RESULT: u8 = 0xB4;
pub(super) const TAG_BYE: u8 = 0xB5;
pub(super) const TAG_INTERVAL: u8 = 0xB6;
pub(super) const TAG_CHUNK: u8 = 0xB7;
pub(super) const TAG_SETTINGS: u8 = 0xB8;
/// Largest control message, bytes.
pub const CONTROL_MAX: usize = 64;
/// Smallest `load` payload: tag, sequence number and intended send time.
pub const LOAD_MIN_SIZE: usize = 24;

/// Byte `i` of a `DATA` payload (`i > 0`; byte 0 is the tag), as the sender writes it.
#[inline]
pub fn payload_byte(i: usize) -> u8 {
    (i % 251) as u8
}

/// Reads the little-endian `u64` at `at` (the caller checked the length).
pub(super) fn u64_at(m: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&m[at..at + 8]);
    u64::from_le_bytes(b)
}

/// The protocol error for an unexpected message.
pub(super) fn unexpected(what: &str, m: &[u8]) -> BenchError {
    BenchError::Protocol(format!(
        "expected {what}, got {} bytes with tag {:#04x}",
        m.len(),
        m.first().copied().unwrap_or(0)
    ))
}

/// What the client asks the server to do for one point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// lat, rate or load.
    pub test: TestKind,
    /// For load: who records (one-way: the server; round-trip: the client, the server echoes).
    pub latency: LatencyKind,
    /// Payload bytes.
    pub size: u64,
    /// Unmeasured messages first.
    pub warmup: u64,
    /// Test aid: messages to receive before the one stall.
    pub stall_after: u64,
    /// Test aid: the one stall, nanoseconds (0: none).
    pub stall_ns: u64,
    /// Interval-log period of a one-way receiver, nanoseconds.
    pub interval_ns: u64,
    /// Rate: the application batch (`--app-batch`; bytes 4..8): the receiver takes up to this
    /// many messages per `poll(handler, n)` call. 0: one `try_recv` per message (and what a
    /// client that predates the field sends).
    pub app_batch: u32,
    /// `--verify` (flags bit 0, byte 3): the receiver checks every payload byte. A client that
    /// predates the field sends 0.
    pub verify: bool,
}

/// The engine settings both sides of a run should share: a `--client` sends its own once
/// (`SETTINGS`), the server names the ones that differ in its READYs, and the client warns.
///
/// A message of its own rather than more bytes of HELLO: its 56 bytes make one 64-byte record
/// in shm's record ring, so the data records after it keep the cache-line phase they had.
/// A 64-byte HELLO (a 72-byte record) shifted the client's ring by 16 bytes against the
/// server's and moved a loopback `lat` 8 B ping-pong's p50 from 394 to 370 ns and its p99 from
/// 686 to 777 ns (medians of 8 interleaved runs on a 2-core VM), with the engine unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `--depth`.
    pub depth: u32,
    /// `--batch`.
    pub batch: u32,
    /// `--inline-threshold`, bytes.
    pub inline_threshold: u32,
    /// `--buffers`.
    pub buffers: u32,
}

impl Settings {
    /// The 56-byte SETTINGS message.
    pub fn encode(&self) -> [u8; 56] {
        let mut b = [0u8; 56];
        b[0] = TAG_SETTINGS;
        for (at, v) in [
            (8, self.depth),
            (12, self.batch),
            (16, self.inline_threshold),
            (20, self.buffers),
        ] {
            b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Checks and decodes a SETTINGS message.
    ///
    /// # Errors
    /// [`BenchError::Protocol`] for anything but a well-formed SETTINGS.
    pub fn decode(m: &[u8]) -> Result<Self, BenchError> {
        if m.len() != 56 || m[0] != TAG_SETTINGS {
            return Err(unexpected("a SETTINGS message", m));
        }
        let at = |i: usize| u32::from_le_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
        Ok(Settings {
            depth: at(8),
            batch: at(12),
            inline_threshold: at(16),
            buffers: at(20),
        })
    }

    /// The server's settings that differ from `client`'s, as `--flag server-value` pairs
    /// (empty when they all match).
    pub fn differences(&self, client: &Settings) -> String {
        let mut out = Vec::new();
        for (flag, mine, theirs) in [
            ("depth", self.depth, client.depth),
            ("batch", self.batch, client.batch),
            (
                "inline-threshold",
                self.inline_threshold,
                client.inline_threshold,
            ),
            ("buffers", self.buffers, client.buffers),
        ] {
            if mine != theirs {
                out.push(format!("--{flag} {mine} (client {theirs})"));
            }
        }
        out.join(", ")
    }
}

impl Hello {
    /// The 48-byte message.
    pub fn encode(&self) -> [u8; 48] {
        let mut b = [0u8; 48];
        b[0] = TAG_HELLO;
        b[1] = match self.test {
            TestKind::Lat => 1,
            TestKind::Rate => 2,
            TestKind::Load => 3,
        };
        b[2] = u8::from(self.latency == LatencyKind::OneWay);
        b[3] = u8::from(self.verify);
        b[4..8].copy_from_slice(&self.app_batch.to_le_bytes());
        for (at, v) in [
            (8, self.size),
            (16, self.warmup),
            (24, self.stall_after),
            (32, self.stall_ns),
            (40, self.interval_ns),
        ] {
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Checks and decodes a HELLO.
    ///
    /// # Errors
    /// [`BenchError::Protocol`] for anything but a well-formed HELLO.
    pub fn decode(m: &[u8]) -> Result<Self, BenchError> {
        if m.len() != 48 || m[0] != TAG_HELLO {
            return Err(unexpected("a HELLO message", m));
        }
        let test = match m[1] {
            1 => TestKind::Lat,
            2 => TestKind::Rate,
            3 => TestKind::Load,
            t => {
                return Err(BenchError::Protocol(format!(
                    "unknown test id {t} in HELLO"
                )))
            }
        };
        Ok(Self {
            test,
            latency: if m[2] == 1 {
                LatencyKind::OneWay
            } else {
                LatencyKind::RoundTrip
            },
            size: u64_at(m, 8),
            warmup: u64_at(m, 16),
            stall_after: u64_at(m, 24),
            stall_ns: u64_at(m, 32),
            interval_ns: u64_at(m, 40),
            app_batch: u32::from_le_bytes([m[4], m[5], m[6], m[7]]),
            verify: m[3] & 1 == 1,
        })
    }
}

/// What the server reports after a point: what it counted, and its thread's CPU use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServerResult {
    /// Messages, bytes and the receiver's window.
    pub rate: RateSummary,
    /// The serving thread's CPU use over the point.
    pub cpu: ThreadCpu,
}

impl ServerResult {
    /// The 64-byte RESULT message.
    pub fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0] = TAG_RESULT;
        b[8..16].copy_from_slice(&self.rate.msgs.to_le_bytes());
        b[16..24].copy_from_slice(&self.rate.bytes.to_le_bytes());
        b[24..32].copy_from_slice(&self.rate.elapsed_ns.to_le_bytes());
        b[32..64].copy_from_slice(&self.cpu.encode());
        b
    }

    /// Checks and decodes a RESULT.
    ///
    /// # Errors
    /// [`BenchError::Protocol`] for anything but a well-formed RESULT.
    pub fn decode(m: &[u8]) -> Result<Self, BenchError> {
        if m.len() != 64 || m[0] != TAG_RESULT {
            return Err(unexpected("RESULT", m));
        }
        let mut cpu = [0u8; 32];
        cpu.copy_from_slice(&m[32..64]);
        Ok(Self {
            rate: RateSummary {
                msgs: u64_at(m, 8),
                bytes: u64_at(m, 16),
                elapsed_ns: u64_at(m, 24),
            },
            cpu: ThreadCpu::decode(&cpu),
        })
    }
}

/// Header of one shipped interval histogram (one-way load: server to client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntervalHeader {
    /// Intervals in this shipment.
    pub count: u32,
    /// Start, `CLOCK_MONOTONIC` ns.
    pub start_ns: u64,
    /// Length, ns.
    pub length_ns: u64,
    /// Bytes of the serialized histogram that follow in CHUNKs.
    pub bytes: u64,
}

impl IntervalHeader {
    /// The 32-byte INTERVAL message.
    pub fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[0] = TAG_INTERVAL;
        b[4..8].copy_from_slice(&self.count.to_le_bytes());
        b[8..16].copy_from_slice(&self.start_ns.to_le_bytes());
        b[16..24].copy_from_slice(&self.length_ns.to_le_bytes());
        b[24..32].copy_from_slice(&self.bytes.to_le_bytes());
        b
    }

    /// Checks and decodes an INTERVAL.
    ///
    /// # Errors
    /// [`BenchError::Protocol`] for anything but a well-formed INTERVAL.
    pub fn decode(m: &[u8]) -> Result<Self, BenchError> {
        if m.len() != 32 || m[0] != TAG_INTERVAL {
            return Err(unexpected("INTERVAL", m));
        }
        let mut c = [0u8; 4];
        c.copy_from_slice(&m[4..8]);
        Ok(Self {
            count: u32::from_le_bytes(c),
            start_ns: u64_at(m, 8),
            length_ns: u64_at(m, 16),
            bytes: u64_at(m, 24),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_reject_garbage() {
        let h = Hello {
            test: TestKind::Load,
            latency: LatencyKind::OneWay,
            size: 4096,
            warmup: 7,
            stall_after: 9,
            stall_ns: 50_000_000,
            interval_ns: 1_000_000_000,
            app_batch: 32,
            verify: true,
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let st = Settings {
            depth: 64,
            batch: 8,
            inline_threshold: 32,
            buffers: 128,
        };
        assert_eq!(Settings::decode(&st.encode()).unwrap(), st);
        assert!(Settings::decode(&h.encode()).is_err());
        let mine = Settings { depth: 128, ..st };
        assert_eq!(mine.differences(&st), "--depth 128 (client 64)");
        assert_eq!(st.differences(&st), "");
        assert!(Hello::decode(&[TAG_HELLO; 3]).is_err());
        let mut bad = h.encode();
        bad[1] = 9;
        assert!(Hello::decode(&bad).is_err());
        let r = ServerResult {
            rate: RateSummary {
                msgs: 1,
                bytes: 2,
                elapsed_ns: 3,
            },
            cpu: ThreadCpu {
                user_s: 0.5,
                system_s: 0.25,
                voluntary_csw: 4,
                involuntary_csw: 5,
            },
        };
        assert_eq!(ServerResult::decode(&r.encode()).unwrap(), r);
        assert!(ServerResult::decode(&r.encode()[..32]).is_err());
        let i = IntervalHeader {
            count: 3,
            start_ns: 10,
            length_ns: 20,
            bytes: 30,
        };
        assert_eq!(IntervalHeader::decode(&i.encode()).unwrap(), i);
    }
}
