//! [`RecordReader`]: parses the records of a buffer (exact) or of a byte stream's front.

use std::fmt;

use super::error::RecordError;
use super::header::RecordHeader;
use super::types::Record;
use super::{MAX_PAYLOAD, RECORD_HEADER};

/// What [`RecordReader`] does at the end of its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tail {
    /// A frame or ring region: every byte belongs to a complete record.
    Exact,
    /// A byte stream: a partial (or uncommitted) record at the end waits for more bytes.
    Stream,
}

/// Parses records from a byte buffer, validating each header; an iterator of
/// `Result<Record, RecordError>` that stops after the first error.
///
/// `buf` must start at a record boundary (offset 0 is aligned by definition).
pub struct RecordReader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
    pub(super) max_payload: usize,
    pub(super) tail: Tail,
    pub(super) failed: bool,
    pub(super) count: usize,
}

impl fmt::Debug for RecordReader<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordReader")
            .field("len", &self.buf.len())
            .field("pos", &self.pos)
            .field("max_payload", &self.max_payload)
            .finish_non_exhaustive()
    }
}

impl<'a> RecordReader<'a> {
    /// A reader of a region that holds only complete records (a frame's body, a drained ring
    /// span): a partial record at the end is [`RecordError::Truncated`].
    ///
    /// # Errors
    ///
    /// [`RecordError::BadLimit`] when `max_payload > MAX_PAYLOAD`.
    pub fn exact(buf: &'a [u8], max_payload: usize) -> Result<Self, RecordError> {
        Self::new(buf, max_payload, Tail::Exact)
    }

    /// A reader of the front of a byte stream: it stops (`None`) at a partial record or an
    /// uncommitted (`len == 0`) header; [`position`](Self::position) tells how much was
    /// consumed.
    ///
    /// # Errors
    ///
    /// [`RecordError::BadLimit`] when `max_payload > MAX_PAYLOAD`.
    pub fn stream(buf: &'a [u8], max_payload: usize) -> Result<Self, RecordError> {
        Self::new(buf, max_payload, Tail::Stream)
    }

    fn new(buf: &'a [u8], max_payload: usize, tail: Tail) -> Result<Self, RecordError> {
        if max_payload > MAX_PAYLOAD {
            return Err(RecordError::BadLimit { max: max_payload });
        }
        Ok(RecordReader {
            buf,
            pos: 0,
            max_payload,
            tail,
            failed: false,
            count: 0,
        })
    }

    /// Bytes consumed by the complete records returned so far (a multiple of 8).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Records returned so far.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Whether every byte was consumed.
    pub fn is_done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// Parses the record at the current position.
    ///
    /// `Ok(None)`: end of buffer (exact), or a partial / uncommitted record (stream).
    ///
    /// # Errors
    ///
    /// Any [`RecordError`] of the validation rules; the reader then stays failed.
    pub fn next_record(&mut self) -> Result<Option<Record<'a>>, RecordError> {
        if self.failed {
            return Ok(None);
        }
        let r = self.parse();
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    fn parse(&mut self) -> Result<Option<Record<'a>>, RecordError> {
        let offset = self.pos;
        let have = self.buf.len().saturating_sub(offset);
        if have == 0 {
            return Ok(None);
        }
        let stream = self.tail == Tail::Stream;
        if have < RECORD_HEADER {
            if stream {
                return Ok(None);
            }
            return Err(RecordError::Truncated {
                offset,
                need: RECORD_HEADER,
                have,
            });
        }
        // `have >= 8`, so this slice is in bounds.
        let mut word = [0u8; RECORD_HEADER];
        word.copy_from_slice(&self.buf[offset..offset + RECORD_HEADER]);
        if word[..4] == [0; 4] && stream {
            return Ok(None);
        }
        let header = RecordHeader::parse(word, offset, self.max_payload)?;
        let need = header.size();
        if need > have {
            if stream {
                return Ok(None);
            }
            return Err(RecordError::Truncated { offset, need, have });
        }
        let start = offset + RECORD_HEADER;
        let rec = header.decode(offset, &self.buf[start..start + header.payload_len()])?;
        self.pos = offset + need;
        self.count += 1;
        Ok(Some(rec))
    }
}

impl<'a> Iterator for RecordReader<'a> {
    type Item = Result<Record<'a>, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}
