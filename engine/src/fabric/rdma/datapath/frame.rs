//! Frames on the RDMA wire: several small messages coalesced into one SEND as DATA records
//! behind a frame header ([`crate::record`], "Frames"), and their splitting on receive.
//!
//! * Send: [`FrameBuilder`] writes a frame in place in a send-pool buffer: the first message's
//!   own buffer becomes the frame (its payload is moved behind the two headers), the following
//!   messages are copied in behind it. No allocation; raw-pointer copies with `memmove`
//!   semantics, so even a (buggy) batch naming one buffer twice stays sound.
//! * Receive: [`check_frame`] validates a whole received frame once (header, `count`, every
//!   record a DATA record of at most [`INLINE_MAX`] bytes, the frame exactly the bytes
//!   received) before anything is delivered; [`FrameCursor`] then hands out its records across
//!   calls, as the application's receive ring makes room.

use super::rndv::{LargeRegion, Rndv};
use crate::desc::INLINE_MAX;
use crate::error::FabricError;
use crate::record::{
    self, FrameReader, Record, RecordError, RecordHeader, RecordReader, RecordType, FRAME_HEADER,
    RECORD_HEADER, VERSION,
};

/// Bytes a message of `len` bytes takes in a frame: its record, padding included.
#[inline]
pub(super) const fn record_bytes(len: u32) -> usize {
    // `len <= INLINE_MAX` for every framed message: no overflow.
    (RECORD_HEADER + len as usize + 7) & !7
}

/// Smallest frame limit that can hold two records: below it coalescing is off (a frame of one
/// would only add 16 bytes to every small message).
pub(super) const MIN_FRAME: usize = FRAME_HEADER + 2 * RECORD_HEADER;

/// The frame limit of a connection: `frame_size` bounded by the peer's receive buffer and our
/// own send buffer; 0 (coalescing off) when that cannot hold two records.
pub(crate) fn frame_limit(frame_size: usize, peer_buffer: u32, tx_buffer: usize) -> u32 {
    let limit = frame_size.min(peer_buffer as usize).min(tx_buffer) & !7;
    if limit < MIN_FRAME {
        0
    } else {
        u32::try_from(limit).unwrap_or(!7)
    }
}

/// A frame being written in place in one send buffer.
pub(super) struct FrameBuilder {
    base: *mut u8,
    /// Next free byte (a multiple of 8); starts behind the frame header.
    pos: usize,
    count: u16,
}

impl FrameBuilder {
    /// Starts a frame in the buffer at `base`, whose first `first_len` bytes are the first
    /// message: the payload moves behind the frame and record headers.
    ///
    /// # Safety
    ///
    /// `base` is valid for reads and writes of `FRAME_HEADER + record_bytes(first_len)` bytes,
    /// nothing else accesses them meanwhile, and `first_len <= INLINE_MAX`.
    #[inline]
    pub(super) unsafe fn start(base: *mut u8, first_len: u32) -> Self {
        let mut f = FrameBuilder {
            base,
            pos: FRAME_HEADER,
            count: 0,
        };
        // SAFETY: source `base..+first_len` and destination `base+16..+first_len` both lie in
        // the region the caller guarantees; `copy` allows the overlap.
        unsafe {
            core::ptr::copy(
                base,
                base.add(FRAME_HEADER + RECORD_HEADER),
                first_len as usize,
            );
            f.commit(first_len);
        }
        f
    }

    /// Bytes the frame takes so far (frame header included).
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.pos
    }

    /// Copies `len` bytes at `src` in as the next record.
    ///
    /// # Safety
    ///
    /// `base` (as given to [`start`](Self::start)) is valid for writes of
    /// `self.len() + record_bytes(len)` bytes; `src` is valid for reads of `len` bytes (it may
    /// overlap the frame); `len <= INLINE_MAX`.
    #[inline]
    pub(super) unsafe fn push(&mut self, src: *const u8, len: u32) {
        // SAFETY: per the contract; `copy` has memmove semantics.
        unsafe {
            core::ptr::copy(src, self.base.add(self.pos + RECORD_HEADER), len as usize);
            self.commit(len);
        }
    }

    /// Writes the header and padding of the record whose payload is in place at `pos + 8`.
    ///
    /// # Safety
    ///
    /// `base` is valid for writes of `pos + record_bytes(len)` bytes.
    #[inline]
    unsafe fn commit(&mut self, len: u32) {
        let hdr = RecordHeader::encode(RecordType::Data, len as usize).unwrap_or([0; 8]);
        let end = self.pos + RECORD_HEADER + len as usize;
        let next = self.pos + record_bytes(len);
        // SAFETY: `pos..next` is inside the region (the caller's contract); the padding bytes
        // are zeroed so no stale pool contents leave the process.
        unsafe {
            core::ptr::copy_nonoverlapping(hdr.as_ptr(), self.base.add(self.pos), RECORD_HEADER);
            core::ptr::write_bytes(self.base.add(end), 0, next - end);
        }
        self.pos = next;
        self.count += 1;
    }

    /// Writes the frame header and returns the frame's length in bytes.
    ///
    /// # Safety
    ///
    /// As [`start`](Self::start): `base` is valid for writes of the frame header.
    #[inline]
    pub(super) unsafe fn finish(self) -> u32 {
        // Frames are bounded by a `u32` limit (`frame_limit`).
        let len = self.pos as u32;
        let l = len.to_le_bytes();
        let c = self.count.to_le_bytes();
        let hdr = [l[0], l[1], l[2], l[3], c[0], c[1], VERSION, 0];
        // SAFETY: the first 8 bytes of the region (the caller's contract).
        unsafe { core::ptr::copy_nonoverlapping(hdr.as_ptr(), self.base, FRAME_HEADER) };
        len
    }
}

/// The typed error of a frame that breaks the format.
fn frame_err(e: RecordError) -> FabricError {
    FabricError::Protocol(match e {
        RecordError::BadFrame { .. } => "rdma frame with a bad frame header",
        RecordError::CountMismatch { .. } => "rdma frame whose count disagrees with its records",
        RecordError::TooLong { .. } => "rdma frame record longer than the inline limit",
        RecordError::Truncated { .. } => "rdma frame record runs past the frame",
        RecordError::BadLength { .. } => "rdma frame record length below the header",
        RecordError::UnknownType { .. } | RecordError::Unsupported { .. } => {
            "rdma frame record of an unknown or unsupported type"
        }
        RecordError::Reserved { .. } => "rdma frame record with reserved fields set",
        _ => "rdma frame record malformed",
    })
}

/// Validates a received frame, `bytes` being exactly the bytes the SEND delivered: a checked
/// frame header whose length is all of `bytes`, `count` records, each a DATA record of at most
/// [`INLINE_MAX`] bytes or an RNDV record that passes [`LargeRegion::check_rndv`] against
/// `rndv` (the peer's region and our receive slot size; `None`: no large messages, every RNDV
/// is refused). Returns the record count.
///
/// # Errors
///
/// [`FabricError::Protocol`] naming the violation.
pub(super) fn check_frame(
    bytes: &[u8],
    rndv: Option<(&LargeRegion, u32)>,
) -> Result<u16, FabricError> {
    let frame = FrameReader::new_checked(bytes, INLINE_MAX).map_err(frame_err)?;
    if frame.len() != bytes.len() {
        return Err(FabricError::Protocol(
            "rdma frame length disagrees with the bytes received",
        ));
    }
    let mut verdict = Ok(());
    frame
        .for_each(|r| {
            if verdict.is_err() {
                return;
            }
            verdict = match (r, rndv) {
                (Record::Data(_), _) => Ok(()),
                (
                    Record::Rndv {
                        slot,
                        len,
                        addr,
                        rkey,
                    },
                    Some((region, rx_slot)),
                ) => region.check_rndv(
                    &Rndv {
                        slot,
                        len,
                        addr,
                        rkey,
                    },
                    rx_slot,
                ),
                (Record::Rndv { .. }, None) => Err(FabricError::Protocol(
                    "rndv record on a connection without large messages",
                )),
                _ => Err(FabricError::Protocol(
                    "rdma frame holds a record other than DATA or RNDV",
                )),
            };
        })
        .map_err(frame_err)?;
    verdict?;
    Ok(frame.count())
}

/// Where the delivery of a validated frame stands (per connection, across `poll_rx` calls).
#[derive(Debug, Clone, Copy)]
pub(super) struct FrameCursor {
    /// The receive buffer holding the frame.
    pub(super) buf: u32,
    /// Offset of the next record in the buffer.
    pub(super) pos: u32,
    /// The frame's length.
    pub(super) end: u32,
    /// Records not delivered yet.
    pub(super) left: u16,
    /// DATA records delivered so far: the engine's messages the frame's buffer credit stands
    /// for once it is re-posted (the sender credits a frame's records only with its buffer).
    pub(super) data: u16,
}

impl FrameCursor {
    /// The cursor of a frame in `bytes` (the received bytes of buffer `buf`), validated by
    /// [`check_frame`] (with `rndv` as there).
    ///
    /// # Errors
    ///
    /// As [`check_frame`].
    pub(super) fn new(
        buf: u32,
        bytes: &[u8],
        rndv: Option<(&LargeRegion, u32)>,
    ) -> Result<Self, FabricError> {
        let left = check_frame(bytes, rndv)?;
        Ok(FrameCursor {
            buf,
            pos: FRAME_HEADER as u32,
            // `check_frame` proved `bytes.len()` is the frame's `u32` length.
            end: bytes.len() as u32,
            left,
            data: 0,
        })
    }

    /// Hands the next records of the frame (`bytes`: the same bytes the cursor was made from)
    /// to `deliver`, at most `room`; returns how many were taken. `deliver` gets a DATA or an
    /// (already checked) RNDV record and returns whether it took it: `false` stops at that
    /// record, which is offered again by the next call (a rendezvous waiting for a slot, or a
    /// record that must wait for earlier large messages). The frame is done when
    /// [`left`](Self::left) is 0.
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] if the bytes no longer parse (they were validated: only a
    /// caller passing other bytes), or `deliver`'s error.
    pub(super) fn next_records(
        &mut self,
        bytes: &[u8],
        room: usize,
        mut deliver: impl FnMut(Record<'_>) -> Result<bool, FabricError>,
    ) -> Result<usize, FabricError> {
        let body = bytes
            .get(self.pos as usize..self.end as usize)
            .ok_or(FabricError::Protocol("rdma frame cursor out of range"))?;
        let mut r = RecordReader::exact(body, INLINE_MAX).map_err(frame_err)?;
        let mut n = 0;
        let mut taken_to = 0;
        while n < room && self.left > 0 {
            match r.next_record().map_err(frame_err)? {
                Some(rec @ (Record::Data(_) | Record::Rndv { .. })) => {
                    if !deliver(rec)? {
                        break;
                    }
                }
                _ => return Err(FabricError::Protocol("rdma frame changed after validation")),
            }
            taken_to = r.position();
            n += 1;
            self.left -= 1;
        }
        // Positions are multiples of 8 within a `u32` frame.
        self.pos += taken_to as u32;
        Ok(n)
    }

    /// Records not delivered yet.
    #[inline]
    pub(super) fn left(&self) -> u16 {
        self.left
    }
}

// The format's constants this file relies on.
const _: () = assert!(record::RECORD_ALIGN == 8 && RECORD_HEADER == 8 && FRAME_HEADER == 8);

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a frame of `msgs` in a buffer of `cap` bytes, the first message in place as the
    /// data path does.
    fn build(msgs: &[&[u8]], cap: usize) -> Vec<u8> {
        let mut buf = vec![0xAAu8; cap];
        let others: Vec<Vec<u8>> = msgs[1..].iter().map(|m| m.to_vec()).collect();
        buf[..msgs[0].len()].copy_from_slice(msgs[0]);
        // SAFETY: the test sizes `cap` for the frame; sources are separate vectors.
        let len = unsafe {
            let mut f = FrameBuilder::start(buf.as_mut_ptr(), msgs[0].len() as u32);
            for m in &others {
                assert!(f.len() + record_bytes(m.len() as u32) <= cap);
                f.push(m.as_ptr(), m.len() as u32);
            }
            f.finish()
        };
        buf.truncate(len as usize);
        buf
    }

    fn split(bytes: &[u8], room: usize) -> Result<Vec<Vec<u8>>, FabricError> {
        let mut c = FrameCursor::new(7, bytes, None)?;
        let mut out = Vec::new();
        while c.left() > 0 {
            let n = c.next_records(bytes, room, |r| match r {
                Record::Data(p) => {
                    out.push(p.to_vec());
                    Ok(true)
                }
                _ => Err(FabricError::Protocol("not data")),
            })?;
            assert!(n > 0 && n <= room);
        }
        assert_eq!(c.pos, c.end);
        Ok(out)
    }

    #[test]
    fn frame_of_one_full_frame_and_exact_boundary_round_trip() {
        // A frame of one record.
        let f = build(&[b"hello"], 64);
        assert_eq!(f.len(), 8 + 16);
        assert_eq!(split(&f, 1).unwrap(), vec![b"hello".to_vec()]);
        // A frame ending exactly at the buffer boundary: 8 + 7 * 16 + 8 = 128.
        let m: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 8]).collect();
        let refs: Vec<&[u8]> = m.iter().map(|v| v.as_slice()).collect();
        let f = build(&refs[..7], 128);
        assert_eq!(f.len(), 120);
        let mut eight = refs[..7].to_vec();
        eight.push(&[]);
        let f = build(&eight, 128);
        assert_eq!(
            f.len(),
            128,
            "the last (empty) record fills the buffer exactly"
        );
        let got = split(&f, 3).unwrap();
        assert_eq!(got.len(), 8);
        assert!(got[7].is_empty());
        // Every size up to the inline limit, with padding.
        let m: Vec<Vec<u8>> = (0..=INLINE_MAX).map(|l| vec![l as u8; l]).collect();
        let refs: Vec<&[u8]> = m.iter().map(|v| v.as_slice()).collect();
        let f = build(&refs, 16 << 10);
        assert_eq!(split(&f, 5).unwrap(), m);
    }

    #[test]
    fn hostile_frames_are_typed_protocol_errors() {
        let good = build(&[b"abc", b"defgh"], 64);
        assert!(check_frame(&good, None).is_ok());
        let bad = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            f(&mut b);
            check_frame(&b, None)
        };
        let is_proto = |r: Result<u16, FabricError>| matches!(r, Err(FabricError::Protocol(_)));
        assert!(is_proto(bad(&|b| b[4] = 3))); // count too high
        assert!(is_proto(bad(&|b| b[4] = 1))); // count too low
        assert!(is_proto(bad(&|b| b[4] = 0))); // zero count
        assert!(is_proto(bad(&|b| b[0] = 200))); // longer than received
        assert!(is_proto(bad(&|b| b[0] = 24))); // shorter than received
        assert!(is_proto(bad(&|b| b[0] = 33))); // not a multiple of 8
        assert!(is_proto(bad(&|b| b[6] = 2))); // version
        assert!(is_proto(bad(&|b| b[8] = 200))); // record runs past the frame
        assert!(is_proto(bad(&|b| b[8] = 3))); // record below its header
        assert!(is_proto(bad(&|b| b[12] = 9))); // unknown type
        assert!(is_proto(bad(&|b| b[12] = 4))); // CREDIT: not DATA (and wrong size)
        assert!(is_proto(bad(&|b| b[13] = 1))); // reserved flags
        assert!(is_proto(bad(&|b| b.truncate(20)))); // cut
        assert!(is_proto(check_frame(&[], None)));
        assert!(is_proto(check_frame(&[1, 2, 3], None)));
        // A DATA record above the inline limit.
        let mut big = vec![0u8; 8 + 8 + 128];
        big[..8].copy_from_slice(&[144, 0, 0, 0, 1, 0, VERSION, 0]);
        big[8..16].copy_from_slice(&RecordHeader::encode(RecordType::Data, 128).unwrap());
        assert!(is_proto(check_frame(&big, None)));
        // Random bytes never panic.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            let mut b = good.clone();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x as usize) % b.len();
                b[i] = (x >> 32) as u8;
            }
            if let Ok(n) = check_frame(&b, None) {
                let mut c = FrameCursor::new(0, &b, None).unwrap();
                let got = c.next_records(&b, usize::MAX, |_| Ok(true)).unwrap();
                assert_eq!(got, usize::from(n));
            }
        }
    }

    #[test]
    fn rndv_records_in_frames_are_checked_and_can_wait() {
        use crate::record::RecordWriter;
        let region = LargeRegion {
            base: 0x10_0000,
            slot_size: 4096,
            slots: 2,
            rkey: 9,
        };
        let rx = 4096;
        let build = |rkey: u32, len: u32, addr: u64| {
            let mut b = vec![0u8; 256];
            let mut w = RecordWriter::frame(&mut b, INLINE_MAX).unwrap();
            w.push_data(b"before").unwrap();
            w.push_rndv(1, len, addr, rkey).unwrap();
            w.push_data(b"after").unwrap();
            let n = w.finish().unwrap().len();
            b.truncate(n);
            b
        };
        let good = build(9, 4096, region.slot_addr(1));
        let some = Some((&region, rx));
        assert_eq!(check_frame(&good, some).unwrap(), 3);
        let proto = |r: Result<u16, FabricError>| matches!(r, Err(FabricError::Protocol(_)));
        // Without large messages, and with a bogus key, length or address: refused whole.
        assert!(proto(check_frame(&good, None)));
        assert!(proto(check_frame(&build(8, 16, region.slot_addr(1)), some)));
        assert!(proto(check_frame(
            &build(9, 4097, region.slot_addr(1)),
            some
        )));
        assert!(proto(check_frame(&build(9, 16, region.slot_addr(0)), some)));
        assert!(proto(check_frame(&build(9, 16, 0), some)));
        assert!(proto(check_frame(&good, Some((&region, 100)))));
        // The cursor stops at a record the consumer does not take, and offers it again.
        let mut c = FrameCursor::new(3, &good, some).unwrap();
        let mut seen = Vec::new();
        let mut take_rndv = false;
        let step = |c: &mut FrameCursor, take: bool, seen: &mut Vec<String>| {
            c.next_records(&good, 10, |r| {
                if matches!(r, Record::Rndv { .. }) && !take {
                    return Ok(false);
                }
                seen.push(format!("{r:?}"));
                Ok(true)
            })
            .unwrap()
        };
        assert_eq!(step(&mut c, take_rndv, &mut seen), 1);
        assert_eq!(c.left(), 2);
        assert_eq!(step(&mut c, take_rndv, &mut seen), 0);
        take_rndv = true;
        assert_eq!(step(&mut c, take_rndv, &mut seen), 2);
        assert_eq!(c.left(), 0);
        assert_eq!(seen.len(), 3);
        assert!(seen[1].starts_with("Rndv") && seen[2].starts_with("Data"));
    }

    #[test]
    fn frame_limit_bounds_and_disables() {
        assert_eq!(frame_limit(4096, 4096, 4096), 4096);
        assert_eq!(frame_limit(usize::MAX, 300, 4096), 296);
        assert_eq!(frame_limit(1000, 4096, 4096), 1000);
        assert_eq!(frame_limit(0, 4096, 4096), 0);
        assert_eq!(frame_limit(1, 4096, 4096), 0);
        assert_eq!(frame_limit(23, 4096, 4096), 0);
        assert_eq!(frame_limit(24, 4096, 4096), 24);
    }
}
