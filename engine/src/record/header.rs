//! [`RecordHeader`]: the checks and encoding of the 8 header bytes, and the payload decode.

use super::error::RecordError;
use super::types::{Record, RecordType};
use super::{
    align8, u32_at, u64_at, BUF_REF_PAYLOAD, CLOSE_PAYLOAD, RECORD_HEADER, RNDV_DONE_PAYLOAD,
    RNDV_PAYLOAD, U64_PAYLOAD,
};

/// A validated record header: the first checks of the [validation rules](super#validation-what-a-reader-rejects),
/// those that need only the 8 header bytes. A shared-memory ring parses the header word it
/// loaded atomically with this, bounds the record by its own geometry, then [`decode`](Self::decode)s
/// the payload; [`RecordReader`](super::RecordReader) does the same on a plain buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// `>= RECORD_HEADER`; for DATA `len - 8 <= max_payload`.
    len: u32,
    ty: RecordType,
}

impl RecordHeader {
    /// Checks the header bytes of the record at `offset` (used in errors only).
    ///
    /// # Errors
    ///
    /// [`RecordError::BadLength`] (`len < 8`, including an uncommitted `0`: callers that poll
    /// check for `0` first), [`RecordError::UnknownType`], [`RecordError::Reserved`],
    /// [`RecordError::TooLong`] (a DATA payload above `max_payload`).
    pub fn parse(
        bytes: [u8; RECORD_HEADER],
        offset: usize,
        max_payload: usize,
    ) -> Result<Self, RecordError> {
        let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if (len as usize) < RECORD_HEADER {
            return Err(RecordError::BadLength { offset, len });
        }
        let payload_len = len as usize - RECORD_HEADER;
        let ty_byte = bytes[4];
        let flags = bytes[5];
        let aux = u16::from_le_bytes([bytes[6], bytes[7]]);
        let ty = RecordType::from_u8(ty_byte).ok_or(RecordError::UnknownType {
            offset,
            ty: ty_byte,
        })?;
        if flags != 0 || aux != 0 {
            return Err(RecordError::Reserved { offset, flags, aux });
        }
        // The maximum bounds message payloads; PAD is bounded by the buffer, the fixed-size
        // types by their size.
        if ty == RecordType::Data && payload_len > max_payload {
            return Err(RecordError::TooLong {
                offset,
                len: payload_len,
                max: max_payload,
            });
        }
        Ok(RecordHeader { len, ty })
    }

    /// [`parse`](Self::parse) of the header as one little-endian word (`u64::from_le_bytes` of
    /// the 8 bytes), as a ring loads it: a `DATA` header (type 1, no flags, no `aux`, a payload
    /// within `max_payload`) is recognised with two compares, anything else takes `parse`.
    ///
    /// # Errors
    ///
    /// As [`parse`](Self::parse).
    #[inline(always)]
    pub fn parse_word(word: u64, offset: usize, max_payload: usize) -> Result<Self, RecordError> {
        let len = word as u32;
        // `len < 8` wraps to a huge payload and fails the second compare.
        if word >> 32 == RecordType::Data as u64
            && (len as usize).wrapping_sub(RECORD_HEADER) <= max_payload
        {
            return Ok(RecordHeader {
                len,
                ty: RecordType::Data,
            });
        }
        Self::parse(word.to_le_bytes(), offset, max_payload)
    }

    /// The header bytes of a version-1 record of type `ty` with a `payload`-byte payload
    /// (`flags` and `aux` zero). `None` when the length does not fit the `u32` length word.
    pub fn encode(ty: RecordType, payload: usize) -> Option<[u8; RECORD_HEADER]> {
        let len = u32::try_from(RECORD_HEADER.checked_add(payload)?).ok()?;
        let l = len.to_le_bytes();
        Some([l[0], l[1], l[2], l[3], ty as u8, 0, 0, 0])
    }

    /// The `len` field: header plus payload, without padding.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Always false: a header is part of its record.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The record's type.
    pub fn record_type(&self) -> RecordType {
        self.ty
    }

    /// Payload bytes (`len - 8`).
    pub fn payload_len(&self) -> usize {
        self.len as usize - RECORD_HEADER
    }

    /// Bytes the record takes, padding included (`align8(len)`; `len` is a `u32`, so this
    /// cannot overflow a 64-bit `usize`).
    pub fn size(&self) -> usize {
        align8(self.len as usize).unwrap_or(usize::MAX)
    }

    /// The record, given its payload. The size checks use the header's length; for DATA the
    /// record borrows `payload` (pass exactly [`payload_len`](Self::payload_len) bytes), for the
    /// fixed-size types only the first 8 bytes of `payload` are read (a shared-memory ring
    /// passes a bounded copy), and PAD ignores it.
    ///
    /// # Errors
    ///
    /// [`RecordError::BadPayload`] for a fixed-size type of the wrong size,
    /// [`RecordError::Unsupported`] for FRAG.
    pub fn decode<'a>(&self, offset: usize, payload: &'a [u8]) -> Result<Record<'a>, RecordError> {
        let ty = self.ty;
        let payload_len = self.payload_len();
        let fixed = |expected: usize| {
            if payload_len == expected {
                Ok(())
            } else {
                Err(RecordError::BadPayload {
                    offset,
                    ty,
                    len: payload_len,
                    expected,
                })
            }
        };
        Ok(match ty {
            RecordType::Data => Record::Data(payload),
            RecordType::BufRef => {
                fixed(BUF_REF_PAYLOAD)?;
                Record::BufRef {
                    buf: u32_at(payload, 0).unwrap_or(0),
                    len: u32_at(payload, 4).unwrap_or(0),
                }
            }
            RecordType::Pad => Record::Pad,
            RecordType::Credit => {
                fixed(U64_PAYLOAD)?;
                Record::Credit(u64_at(payload, 0).unwrap_or(0))
            }
            RecordType::Heartbeat => {
                fixed(U64_PAYLOAD)?;
                Record::Heartbeat(u64_at(payload, 0).unwrap_or(0))
            }
            RecordType::Rndv => {
                fixed(RNDV_PAYLOAD)?;
                Record::Rndv {
                    slot: u32_at(payload, 0).unwrap_or(0),
                    len: u32_at(payload, 4).unwrap_or(0),
                    addr: u64_at(payload, 8).unwrap_or(0),
                    rkey: u32_at(payload, 16).unwrap_or(0),
                }
            }
            RecordType::RndvDone => {
                fixed(RNDV_DONE_PAYLOAD)?;
                Record::RndvDone {
                    slot: u32_at(payload, 0).unwrap_or(0),
                }
            }
            RecordType::Close => {
                fixed(CLOSE_PAYLOAD)?;
                Record::Close {
                    reason: u32_at(payload, 0).unwrap_or(0),
                }
            }
            RecordType::Frag => {
                return Err(RecordError::Unsupported { offset, ty });
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `parse_word`'s fast path agrees with `parse` on every word: the DATA boundaries, every
    /// type byte with and without flags or `aux`, and a pseudo-random sweep.
    #[test]
    fn parse_word_agrees_with_parse() {
        let max = 120;
        let mut words = Vec::new();
        for len in [
            0u64,
            1,
            7,
            8,
            9,
            16,
            127,
            128,
            129,
            4096,
            u64::from(u32::MAX),
        ] {
            for ty in 0u64..=10 {
                for high in [0u64, 1 << 8, 1 << 16, 1 << 23] {
                    words.push(len | (ty | high) << 32);
                }
            }
        }
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            words.push(x);
            // Mostly DATA-like words too.
            words.push((x & 0xff) | 1 << 32);
        }
        for w in words {
            assert_eq!(
                RecordHeader::parse_word(w, 64, max),
                RecordHeader::parse(w.to_le_bytes(), 64, max),
                "word {w:#x}"
            );
        }
    }
}
