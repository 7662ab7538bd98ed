//! The connect/accept/reject private data: [`FlowParams`] (the flow-control handshake) and
//! [`CmRejectReason`] (why the passive side rejected). Pure encoding: no FFI.

/// Errors decoding a peer's [`FlowParams`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PrivateDataError {
    /// Shorter than [`FlowParams::LEN`].
    #[error("private data too short: {len} bytes, need {need}")]
    TooShort {
        /// Received length.
        len: usize,
        /// Needed length.
        need: usize,
    },
    /// Wrong magic: not a spinwire peer.
    #[error("bad magic {0:#010x}: peer is not spinwire")]
    BadMagic(u32),
    /// Unsupported protocol version.
    #[error("unsupported protocol version {0}")]
    Version(u16),
    /// A field is out of range.
    #[error("{field} = {value} out of range {min}..={max}")]
    OutOfRange {
        /// Field name.
        field: &'static str,
        /// Received value.
        value: u32,
        /// Minimum.
        min: u32,
        /// Maximum.
        max: u32,
    },
}

/// Flow-control parameters exchanged in the connect/accept private data: "you may send me up to
/// `credits` messages of up to `buffer_size` bytes; I send inline up to `inline_size`".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowParams {
    /// Initial credits = receive buffers the sender of these params has posted for the peer.
    pub credits: u32,
    /// Receive buffer size in bytes (largest message the peer may send).
    pub buffer_size: u32,
    /// The sender's QP inline size (informational).
    pub inline_size: u32,
}

impl FlowParams {
    /// Encoded length in bytes (fits the 56-byte RC connect private data).
    pub const LEN: usize = 20;
    const MAGIC: u32 = u32::from_le_bytes(*b"SPWR");
    const VERSION: u16 = 1;
    /// Largest credit count (credits travel in 16-bit immediate-data fields).
    pub const MAX_CREDITS: u32 = 1 << 15;
    /// Largest buffer size accepted (1 GiB).
    pub const MAX_BUFFER: u32 = 1 << 30;

    /// Encodes into the wire form (little endian).
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&Self::MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&Self::VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&self.credits.to_le_bytes());
        b[12..16].copy_from_slice(&self.buffer_size.to_le_bytes());
        b[16..20].copy_from_slice(&self.inline_size.to_le_bytes());
        b
    }

    /// Decodes and validates a peer's private data (trailing padding is ignored).
    ///
    /// # Errors
    /// [`PrivateDataError`] for short, foreign, unsupported or out-of-range data.
    pub fn decode(b: &[u8]) -> Result<Self, PrivateDataError> {
        if b.len() < Self::LEN {
            return Err(PrivateDataError::TooShort {
                len: b.len(),
                need: Self::LEN,
            });
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let magic = u32_at(0);
        if magic != Self::MAGIC {
            return Err(PrivateDataError::BadMagic(magic));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != Self::VERSION {
            return Err(PrivateDataError::Version(version));
        }
        let p = Self {
            credits: u32_at(8),
            buffer_size: u32_at(12),
            inline_size: u32_at(16),
        };
        let check = |field, value, min, max| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(PrivateDataError::OutOfRange {
                    field,
                    value,
                    min,
                    max,
                })
            }
        };
        check("credits", p.credits, 1, Self::MAX_CREDITS)?;
        check("buffer_size", p.buffer_size, 1, Self::MAX_BUFFER)?;
        check("inline_size", p.inline_size, 0, Self::MAX_BUFFER)?;
        Ok(p)
    }
}

/// Why the passive side rejected a connection (sent as reject private data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CmRejectReason {
    /// The request's private data was invalid.
    BadParams,
    /// The server is out of resources (pool, QP, connection limit).
    NoResources,
    /// The server is shutting down.
    ShuttingDown,
}

impl CmRejectReason {
    /// Encodes as 8 bytes: magic + reason code.
    pub fn encode(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0..4].copy_from_slice(&FlowParams::MAGIC.to_le_bytes());
        b[4] = match self {
            Self::BadParams => 1,
            Self::NoResources => 2,
            Self::ShuttingDown => 3,
        };
        b
    }

    /// Decodes a peer's reject private data.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < 8 || b[0..4] != FlowParams::MAGIC.to_le_bytes() {
            return None;
        }
        match b[4] {
            1 => Some(Self::BadParams),
            2 => Some(Self::NoResources),
            3 => Some(Self::ShuttingDown),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_params_roundtrip_and_validation() {
        let p = FlowParams {
            credits: 128,
            buffer_size: 4096,
            inline_size: 220,
        };
        let mut wire = p.encode().to_vec();
        wire.resize(56, 0); // IB pads private data
        assert_eq!(FlowParams::decode(&wire), Ok(p));
        assert!(matches!(
            FlowParams::decode(&wire[..10]),
            Err(PrivateDataError::TooShort { .. })
        ));
        let mut bad = wire.clone();
        bad[0] ^= 1;
        assert!(matches!(
            FlowParams::decode(&bad),
            Err(PrivateDataError::BadMagic(_))
        ));
        let zero = FlowParams { credits: 0, ..p }.encode();
        assert!(matches!(
            FlowParams::decode(&zero),
            Err(PrivateDataError::OutOfRange {
                field: "credits",
                ..
            })
        ));
        let mut v = p.encode();
        v[4] = 9;
        assert_eq!(FlowParams::decode(&v), Err(PrivateDataError::Version(9)));
    }

    #[test]
    fn reject_reason_roundtrip() {
        for r in [
            CmRejectReason::BadParams,
            CmRejectReason::NoResources,
            CmRejectReason::ShuttingDown,
        ] {
            assert_eq!(CmRejectReason::decode(&r.encode()), Some(r));
        }
        assert_eq!(CmRejectReason::decode(&[0; 8]), None);
    }
}
