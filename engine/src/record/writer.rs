//! [`RecordWriter`] and its [`Claim`]: writes records (bare or in a frame) into a byte buffer.

use std::fmt;

use super::error::RecordError;
use super::types::RecordType;
use super::{
    align8, BUF_REF_PAYLOAD, FRAME_HEADER, MAX_PAYLOAD, RECORD_ALIGN, RECORD_HEADER, VERSION,
};

/// Writes records into a byte buffer, in place: [`claim`](Self::claim) a payload, fill it,
/// [`commit`](Claim::commit). In [frame mode](Self::frame) it reserves the frame header and
/// [`finish`](Self::finish) writes it.
pub struct RecordWriter<'a> {
    buf: &'a mut [u8],
    /// Next free byte; a multiple of 8, `<= buf.len()`.
    pos: usize,
    count: usize,
    max_payload: usize,
    frame: bool,
}

impl fmt::Debug for RecordWriter<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordWriter")
            .field("cap", &self.buf.len())
            .field("pos", &self.pos)
            .field("count", &self.count)
            .field("frame", &self.frame)
            .finish_non_exhaustive()
    }
}

impl<'a> RecordWriter<'a> {
    /// A writer of bare records (a ring span, a TCP send buffer) from the start of `buf`.
    ///
    /// # Errors
    ///
    /// [`RecordError::BadLimit`] when `max_payload > MAX_PAYLOAD`.
    pub fn new(buf: &'a mut [u8], max_payload: usize) -> Result<Self, RecordError> {
        if max_payload > MAX_PAYLOAD {
            return Err(RecordError::BadLimit { max: max_payload });
        }
        Ok(RecordWriter {
            buf,
            pos: 0,
            count: 0,
            max_payload,
            frame: false,
        })
    }

    /// A writer of one frame: the first 8 bytes are reserved for the frame header.
    ///
    /// # Errors
    ///
    /// [`RecordError::BadLimit`]; [`RecordError::NoSpace`] when `buf` cannot hold the header.
    pub fn frame(buf: &'a mut [u8], max_payload: usize) -> Result<Self, RecordError> {
        let mut w = Self::new(buf, max_payload)?;
        if w.buf.len() < FRAME_HEADER {
            return Err(RecordError::NoSpace {
                need: FRAME_HEADER,
                have: w.buf.len(),
            });
        }
        w.pos = FRAME_HEADER;
        w.frame = true;
        Ok(w)
    }

    /// Bytes written so far (frame header included in frame mode).
    pub fn len(&self) -> usize {
        self.pos
    }

    /// True when no record was written.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Records written.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Bytes still free.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Reserves a `payload`-byte DATA record; the returned [`Claim`] exposes the payload for
    /// writing in place. Dropping the claim without committing writes nothing.
    ///
    /// # Errors
    ///
    /// [`RecordError::TooLong`], [`RecordError::NoSpace`], or [`RecordError::CountMismatch`]
    /// when a frame already holds `u16::MAX` records.
    pub fn claim(&mut self, payload: usize) -> Result<Claim<'_, 'a>, RecordError> {
        self.reserve(RecordType::Data, payload)
    }

    fn reserve(&mut self, ty: RecordType, payload: usize) -> Result<Claim<'_, 'a>, RecordError> {
        if ty == RecordType::Data && payload > self.max_payload {
            return Err(RecordError::TooLong {
                offset: self.pos,
                len: payload,
                max: self.max_payload,
            });
        }
        if self.frame && self.count >= usize::from(u16::MAX) {
            return Err(RecordError::CountMismatch {
                count: u16::MAX,
                found: self.count + 1,
            });
        }
        let have = self.remaining();
        // DATA: `payload <= MAX_PAYLOAD`; the fixed types are 8 bytes; PAD is `<= have`. So the
        // record length fits in the `u32` length word whenever it fits in the buffer below.
        let need = RECORD_HEADER
            .checked_add(payload)
            .and_then(align8)
            .unwrap_or(usize::MAX);
        if need > have || need > u32::MAX as usize {
            return Err(RecordError::NoSpace { need, have });
        }
        Ok(Claim {
            w: self,
            ty,
            payload,
        })
    }

    fn put_fixed(&mut self, ty: RecordType, bytes: &[u8]) -> Result<(), RecordError> {
        let mut c = self.reserve(ty, bytes.len())?;
        c.payload_mut().copy_from_slice(bytes);
        c.commit();
        Ok(())
    }

    /// Writes a DATA record holding `data`.
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim).
    pub fn push_data(&mut self, data: &[u8]) -> Result<(), RecordError> {
        self.put_fixed(RecordType::Data, data)
    }

    /// Writes a BUF_REF record.
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim).
    pub fn push_buf_ref(&mut self, buf: u32, len: u32) -> Result<(), RecordError> {
        let mut b = [0u8; BUF_REF_PAYLOAD];
        b[..4].copy_from_slice(&buf.to_le_bytes());
        b[4..].copy_from_slice(&len.to_le_bytes());
        self.put_fixed(RecordType::BufRef, &b)
    }

    /// Writes a CREDIT record (cumulative credits).
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim).
    pub fn push_credit(&mut self, credits: u64) -> Result<(), RecordError> {
        self.put_fixed(RecordType::Credit, &credits.to_le_bytes())
    }

    /// Writes an RNDV record (a large message in the sender's slot `slot`, `len` bytes at
    /// remote address `addr`, key `rkey`).
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim).
    pub fn push_rndv(
        &mut self,
        slot: u32,
        len: u32,
        addr: u64,
        rkey: u32,
    ) -> Result<(), RecordError> {
        self.put_fixed(
            RecordType::Rndv,
            &super::rndv_payload(slot, len, addr, rkey),
        )
    }

    /// Writes an RNDV_DONE record (the sender's large slot `slot` was pulled).
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim).
    pub fn push_rndv_done(&mut self, slot: u32) -> Result<(), RecordError> {
        let mut b = [0u8; super::RNDV_DONE_PAYLOAD];
        b[..4].copy_from_slice(&slot.to_le_bytes());
        self.put_fixed(RecordType::RndvDone, &b)
    }

    /// Writes a HEARTBEAT record.
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim).
    pub fn push_heartbeat(&mut self, seq: u64) -> Result<(), RecordError> {
        self.put_fixed(RecordType::Heartbeat, &seq.to_le_bytes())
    }

    /// Fills the rest of the buffer with one PAD record (a ring's wrap). Does nothing when the
    /// buffer is full.
    ///
    /// # Errors
    ///
    /// [`RecordError::NoSpace`] when the rest exceeds what one length word can describe.
    pub fn pad_to_end(&mut self) -> Result<(), RecordError> {
        let rest = self.remaining();
        if rest == 0 {
            return Ok(());
        }
        // `rest` is a multiple of 8 only if the buffer length is; round down to stay inside.
        let rest = rest & !(RECORD_ALIGN - 1);
        if rest < RECORD_HEADER {
            return Ok(());
        }
        let c = self.reserve(RecordType::Pad, rest - RECORD_HEADER)?;
        c.commit();
        Ok(())
    }

    /// Frame mode: writes the frame header and returns the frame's bytes. Bare mode: returns the
    /// records written.
    ///
    /// # Errors
    ///
    /// [`RecordError::CountMismatch`] for a frame without records (a frame holds at least one).
    pub fn finish(self) -> Result<&'a [u8], RecordError> {
        let RecordWriter {
            buf,
            pos,
            count,
            frame,
            ..
        } = self;
        if frame {
            if count == 0 {
                return Err(RecordError::CountMismatch { count: 0, found: 0 });
            }
            // `pos <= buf.len()`; a frame longer than 4 GiB cannot be described: refuse it.
            let len = u32::try_from(pos).map_err(|_| RecordError::BadFrame {
                reason: "frame longer than u32::MAX",
                len: u32::MAX,
                have: pos,
            })?;
            buf[0..4].copy_from_slice(&len.to_le_bytes());
            // `count <= u16::MAX` by `reserve`.
            buf[4..6].copy_from_slice(&(count as u16).to_le_bytes());
            buf[6] = VERSION;
            buf[7] = 0;
        }
        Ok(&buf[..pos])
    }
}

/// A reserved record: write the payload in place, then [`commit`](Self::commit) (the header,
/// length word last). Dropping it aborts: nothing is written.
pub struct Claim<'w, 'a> {
    w: &'w mut RecordWriter<'a>,
    ty: RecordType,
    payload: usize,
}

impl fmt::Debug for Claim<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("type", &self.ty)
            .field("payload", &self.payload)
            .finish()
    }
}

impl Claim<'_, '_> {
    /// The payload bytes, in place (their previous contents are unspecified).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.w.pos + RECORD_HEADER;
        // In bounds: `reserve` checked `pos + align8(8 + payload) <= buf.len()`.
        &mut self.w.buf[start..start + self.payload]
    }

    /// Publishes the record: writes type, flags, aux, then the length word, and advances the
    /// writer. Padding bytes are zeroed so no stale data leaves the process.
    pub fn commit(self) {
        let at = self.w.pos;
        let len = RECORD_HEADER + self.payload;
        let need = (len + RECORD_ALIGN - 1) & !(RECORD_ALIGN - 1);
        self.w.buf[at + len..at + need].fill(0);
        self.w.buf[at + 4] = self.ty as u8;
        self.w.buf[at + 5] = 0;
        self.w.buf[at + 6..at + 8].copy_from_slice(&0u16.to_le_bytes());
        // `reserve` checked `align8(len) <= u32::MAX`. In shared memory this is the Release store.
        self.w.buf[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
        self.w.pos = at + need;
        self.w.count += 1;
    }
}
