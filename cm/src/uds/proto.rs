//! The handshake's wire format: one 64-byte datagram per message (magic, version, kind, pid,
//! refusal code, connection parameters, reserved zeros; little endian), and the typed values it
//! carries. Pure encoding: no system calls.

use std::os::fd::OwnedFd;

use super::{UdsError, PROTOCOL_VERSION};

pub(super) const MAGIC: [u8; 4] = *b"SPWC";
pub(super) const MSG_LEN: usize = 64;

/// Why a listener rejected a hello or a connector aborted the handshake. Sent on the wire as a
/// `u16` code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HandshakeRefusal {
    /// Different protocol versions.
    VersionMismatch,
    /// Params are valid but differ from what this side requires.
    ParamsMismatch,
    /// Params are out of range.
    ParamsInvalid,
    /// The listener accepts no more connections (e.g. at its connection limit).
    Busy,
    /// Setting up the segment failed on this side (create/attach error).
    SegmentFailed,
    /// Some other local failure.
    Internal,
    /// A code this version does not know.
    Unknown(u16),
}

impl HandshakeRefusal {
    /// The wire code.
    pub const fn code(self) -> u16 {
        match self {
            HandshakeRefusal::VersionMismatch => 1,
            HandshakeRefusal::ParamsMismatch => 2,
            HandshakeRefusal::ParamsInvalid => 3,
            HandshakeRefusal::Busy => 4,
            HandshakeRefusal::SegmentFailed => 5,
            HandshakeRefusal::Internal => 6,
            HandshakeRefusal::Unknown(c) => c,
        }
    }

    /// Decodes a wire code.
    pub const fn from_code(code: u16) -> Self {
        match code {
            1 => HandshakeRefusal::VersionMismatch,
            2 => HandshakeRefusal::ParamsMismatch,
            3 => HandshakeRefusal::ParamsInvalid,
            4 => HandshakeRefusal::Busy,
            5 => HandshakeRefusal::SegmentFailed,
            6 => HandshakeRefusal::Internal,
            c => HandshakeRefusal::Unknown(c),
        }
    }
}

impl std::fmt::Display for HandshakeRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeRefusal::VersionMismatch => f.write_str("protocol version mismatch"),
            HandshakeRefusal::ParamsMismatch => f.write_str("connection parameters mismatch"),
            HandshakeRefusal::ParamsInvalid => f.write_str("connection parameters out of range"),
            HandshakeRefusal::Busy => f.write_str("listener busy"),
            HandshakeRefusal::SegmentFailed => f.write_str("shared segment setup failed"),
            HandshakeRefusal::Internal => f.write_str("internal error"),
            HandshakeRefusal::Unknown(c) => write!(f, "unknown reason code {c}"),
        }
    }
}

/// Connection parameters exchanged in the handshake. The wire layer (`spinwire`'s
/// `fabric::shm::wire::Params`) validates the layout-relevant fields; `flags` is reserved for
/// feature negotiation (0 today).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ConnParams {
    /// Bytes per buffer.
    pub buffer_size: u32,
    /// Buffers per direction.
    pub buffer_count: u32,
    /// Descriptor-ring slots per direction.
    pub ring_depth: u32,
    /// Largest inline payload.
    pub inline_max: u32,
    /// Feature flags (reserved, 0).
    pub flags: u32,
    /// Bytes per large slot (large messages; 0 without).
    pub large_size: u32,
    /// Large slots per direction (0 without).
    pub large_count: u32,
}

/// A received hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The connector's pid (as it claims; the kernel-verified one is in [`UdsStream::peer_cred`](super::UdsStream::peer_cred)).
    pub pid: u32,
    /// The proposed params (not validated here).
    pub params: ConnParams,
}

/// A received accept: the final params and the segment fd.
#[derive(Debug)]
pub struct Offer {
    /// The params the listener chose (not validated here: validate before attaching).
    pub params: ConnParams,
    /// The shared segment (close-on-exec).
    pub segment: OwnedFd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub(super) enum Kind {
    Hello = 1,
    Accept = 2,
    Reject = 3,
    Ready = 4,
    Abort = 5,
    Bye = 6,
}

impl Kind {
    fn from_u16(v: u16) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Accept,
            3 => Kind::Reject,
            4 => Kind::Ready,
            5 => Kind::Abort,
            6 => Kind::Bye,
            _ => return None,
        })
    }
}

/// A decoded message.
#[derive(Clone, Copy, Debug)]
pub(super) struct Msg {
    pub(super) kind: Kind,
    pub(super) pid: u32,
    pub(super) reason: u16,
    pub(super) params: ConnParams,
}

pub(super) fn encode(kind: Kind, reason: u16, params: &ConnParams) -> [u8; MSG_LEN] {
    let mut m = [0u8; MSG_LEN];
    m[0..4].copy_from_slice(&MAGIC);
    m[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    m[6..8].copy_from_slice(&(kind as u16).to_le_bytes());
    m[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    m[12..14].copy_from_slice(&reason.to_le_bytes());
    let fields = [
        params.buffer_size,
        params.buffer_count,
        params.ring_depth,
        params.inline_max,
        params.flags,
        params.large_size,
        params.large_count,
    ];
    for (i, f) in fields.iter().enumerate() {
        m[16 + 4 * i..20 + 4 * i].copy_from_slice(&f.to_le_bytes());
    }
    m
}

fn u32_at(m: &[u8; MSG_LEN], off: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&m[off..off + 4]);
    u32::from_le_bytes(b)
}

fn u16_at(m: &[u8; MSG_LEN], off: usize) -> u16 {
    u16::from_le_bytes([m[off], m[off + 1]])
}

/// Decodes and validates the fixed fields (magic, version, kind, reserved bytes).
pub(super) fn decode(m: &[u8; MSG_LEN]) -> Result<Msg, UdsError> {
    if m[0..4] != MAGIC {
        return Err(UdsError::BadMessage {
            reason: "bad magic",
        });
    }
    let version = u16_at(m, 4);
    if version != PROTOCOL_VERSION {
        return Err(UdsError::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: version,
        });
    }
    let kind = Kind::from_u16(u16_at(m, 6)).ok_or(UdsError::BadMessage {
        reason: "unknown message kind",
    })?;
    if m[14..16] != [0, 0] || m[44..].iter().any(|&b| b != 0) {
        return Err(UdsError::BadMessage {
            reason: "reserved bytes not zero",
        });
    }
    Ok(Msg {
        kind,
        pid: u32_at(m, 8),
        reason: u16_at(m, 12),
        params: ConnParams {
            buffer_size: u32_at(m, 16),
            buffer_count: u32_at(m, 20),
            ring_depth: u32_at(m, 24),
            inline_max: u32_at(m, 28),
            flags: u32_at(m, 32),
            large_size: u32_at(m, 36),
            large_count: u32_at(m, 40),
        },
    })
}

/// Encodes a message with an arbitrary version and kind code.
pub fn encode_raw(version: u16, kind: u16, reason: u16, params: &ConnParams) -> [u8; 64] {
    let mut m = encode(Kind::Hello, reason, params);
    m[4..6].copy_from_slice(&version.to_le_bytes());
    m[6..8].copy_from_slice(&kind.to_le_bytes());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_round_trip() {
        let p = ConnParams {
            buffer_size: 4096,
            buffer_count: 7,
            ring_depth: 64,
            inline_max: 100,
            flags: 0,
            large_size: 0,
            large_count: 0,
        };
        let m = decode(&encode(Kind::Accept, 0, &p)).unwrap();
        assert_eq!(m.kind, Kind::Accept);
        assert_eq!(m.params, p);
        assert_eq!(m.pid, std::process::id());
    }

    #[test]
    fn decode_rejects_garbage() {
        let p = ConnParams::default();
        let mut m = encode(Kind::Hello, 0, &p);
        m[0] = b'X';
        assert!(matches!(decode(&m), Err(UdsError::BadMessage { .. })));
        let m = encode_raw(PROTOCOL_VERSION + 1, 1, 0, &p);
        assert!(matches!(decode(&m), Err(UdsError::VersionMismatch { .. })));
        let m = encode_raw(PROTOCOL_VERSION, 99, 0, &p);
        assert!(matches!(decode(&m), Err(UdsError::BadMessage { .. })));
        let mut m = encode(Kind::Hello, 0, &p);
        m[63] = 1;
        assert!(matches!(decode(&m), Err(UdsError::BadMessage { .. })));
    }

    #[test]
    fn reject_codes_round_trip() {
        for r in [
            HandshakeRefusal::VersionMismatch,
            HandshakeRefusal::ParamsMismatch,
            HandshakeRefusal::ParamsInvalid,
            HandshakeRefusal::Busy,
            HandshakeRefusal::SegmentFailed,
            HandshakeRefusal::Internal,
            HandshakeRefusal::Unknown(77),
        ] {
            assert_eq!(HandshakeRefusal::from_code(r.code()), r);
        }
    }
}
