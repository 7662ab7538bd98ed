//! [`FrameReader`]: checks a frame header and hands out its records.

use super::error::RecordError;
use super::reader::{RecordReader, Tail};
use super::types::Record;
use super::{u16_at, u32_at, FRAME_HEADER, MAX_PAYLOAD, RECORD_ALIGN, RECORD_HEADER, VERSION};

/// A validated frame: its header checked, its records parsed on demand by [`records`](Self::records)
/// or all at once by [`for_each`](Self::for_each).
#[derive(Debug, Clone, Copy)]
pub struct FrameReader<'a> {
    body: &'a [u8],
    count: u16,
    max_payload: usize,
}

impl<'a> FrameReader<'a> {
    /// Checks the frame header at the start of `buf` (an RDMA receive buffer's filled bytes, or
    /// a TCP buffer holding at least one whole frame). Bytes after the frame are not looked at.
    ///
    /// # Errors
    ///
    /// [`RecordError::BadFrame`] for a short, misaligned or oversized frame, an unknown version
    /// or nonzero flags or a zero count; [`RecordError::BadLimit`].
    pub fn new_checked(buf: &'a [u8], max_payload: usize) -> Result<Self, RecordError> {
        if max_payload > MAX_PAYLOAD {
            return Err(RecordError::BadLimit { max: max_payload });
        }
        let have = buf.len();
        let bad = |reason, len| Err(RecordError::BadFrame { reason, len, have });
        let Some(len) = u32_at(buf, 0) else {
            return bad("shorter than the frame header", 0);
        };
        if have < FRAME_HEADER {
            return bad("shorter than the frame header", len);
        }
        let count = u16_at(buf, 4).unwrap_or(0);
        let version = buf[6];
        let flags = buf[7];
        if (len as usize) < FRAME_HEADER + RECORD_HEADER {
            return bad("length below one record", len);
        }
        if len as usize % RECORD_ALIGN != 0 {
            return bad("length not a multiple of 8", len);
        }
        if len as usize > have {
            return bad("length beyond the buffer", len);
        }
        if version != VERSION {
            return bad("unknown version", len);
        }
        if flags != 0 {
            return bad("reserved flags set", len);
        }
        if count == 0 {
            return bad("zero records", len);
        }
        Ok(FrameReader {
            body: &buf[FRAME_HEADER..len as usize],
            count,
            max_payload,
        })
    }

    /// The frame's length in bytes, header included (where the next frame of a stream starts).
    pub fn len(&self) -> usize {
        FRAME_HEADER + self.body.len()
    }

    /// Always false: a checked frame holds at least one record.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The `count` field.
    pub fn count(&self) -> u16 {
        self.count
    }

    /// The records, each validated. The iterator's own errors cover the body; the count is
    /// checked by [`for_each`](Self::for_each), or by the caller against
    /// [`RecordReader::count`].
    pub fn records(&self) -> RecordReader<'a> {
        RecordReader {
            buf: self.body,
            pos: 0,
            max_payload: self.max_payload,
            tail: Tail::Exact,
            failed: false,
            count: 0,
        }
    }

    /// Parses every record and hands each to `f`, then checks the count. Returns the number of
    /// records. On an error some records may already have been handed to `f`; the whole frame
    /// is then to be treated as a protocol violation.
    ///
    /// # Errors
    ///
    /// The first [`RecordError`] found, or [`RecordError::CountMismatch`].
    pub fn for_each(&self, mut f: impl FnMut(Record<'a>)) -> Result<usize, RecordError> {
        let mut r = self.records();
        let mut n = 0usize;
        while let Some(rec) = r.next_record()? {
            n += 1;
            if n > usize::from(self.count) {
                return Err(RecordError::CountMismatch {
                    count: self.count,
                    found: n,
                });
            }
            f(rec);
        }
        if n != usize::from(self.count) {
            return Err(RecordError::CountMismatch {
                count: self.count,
                found: n,
            });
        }
        Ok(n)
    }
}
