//! Rendezvous on the wire, below the connection state: the peer's large send
//! region as announced at connect ([`LargeRegion`]) and the checks of every RNDV record
//! against it, the RNDV frame a sender writes in place, and the control frame of RNDV_DONE
//! acknowledgements (written and validated here). Pure code: no verbs, no connection state,
//! so it is unit-tested without hardware. The protocol is described in
//! [`rdma`](crate::fabric::rdma#large-messages-rendezvous).

use crate::error::FabricError;
use crate::record::{
    rndv_payload, FrameReader, Record, RecordHeader, RecordType, FRAME_HEADER, RECORD_HEADER,
    RNDV_DONE_PAYLOAD, RNDV_PAYLOAD, VERSION,
};

/// Bytes of an RNDV frame: a frame header and one RNDV record (no padding: 8 + 8 + 24).
pub(crate) const RNDV_FRAME: usize = FRAME_HEADER + RECORD_HEADER + RNDV_PAYLOAD;
/// Bytes one RNDV_DONE record takes in a control frame.
pub(crate) const ACK_RECORD: usize = RECORD_HEADER + RNDV_DONE_PAYLOAD;
/// Most large slots per connection and direction (bounds the handshake's `slots` field and
/// the control frame of acknowledgements).
pub(crate) const MAX_LARGE_SLOTS: u32 = 256;

const _: () = assert!(RNDV_FRAME == 40 && ACK_RECORD == 16);

/// A connection's large send region as announced in the handshake: `slots` slots of
/// `slot_size` bytes from virtual address `base`, readable with `rkey`. `slots == 0`: the side
/// has no large messages (then every RNDV from it is a protocol violation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LargeRegion {
    /// Virtual address of slot 0 (in the announcing process).
    pub(crate) base: u64,
    /// Bytes per slot (that side's `max_message_size`).
    pub(crate) slot_size: u32,
    /// Slot count (`large_buffers`), `<= MAX_LARGE_SLOTS`.
    pub(crate) slots: u32,
    /// The region's remote key.
    pub(crate) rkey: u32,
}

/// Why a peer's announced [`LargeRegion`] was refused.
pub(crate) type RegionError = &'static str;

impl LargeRegion {
    /// No large region.
    pub(crate) const NONE: LargeRegion = LargeRegion {
        base: 0,
        slot_size: 0,
        slots: 0,
        rkey: 0,
    };

    /// Whether the region has any slot.
    #[inline]
    pub(crate) fn is_enabled(&self) -> bool {
        self.slots > 0
    }

    /// Checks a region a peer announced: either none at all (every field zero), or at most
    /// [`MAX_LARGE_SLOTS`] slots of a nonzero size at a nonzero base, the whole region inside
    /// the 64-bit address space.
    ///
    /// # Errors
    ///
    /// The rule that was broken.
    pub(crate) fn check(&self) -> Result<(), RegionError> {
        if self.slots == 0 {
            return if *self == Self::NONE {
                Ok(())
            } else {
                Err("large region fields set without slots")
            };
        }
        if self.slots > MAX_LARGE_SLOTS {
            return Err("too many large slots");
        }
        if self.slot_size == 0 {
            return Err("zero large slot size");
        }
        if self.base == 0 {
            return Err("large region at address 0");
        }
        let bytes = u64::from(self.slots) * u64::from(self.slot_size);
        if self.base.checked_add(bytes).is_none() {
            return Err("large region wraps the address space");
        }
        Ok(())
    }

    /// Address of slot `slot` (`slot < slots`, unchecked: only for our own region).
    #[inline]
    pub(crate) fn slot_addr(&self, slot: u32) -> u64 {
        self.base + u64::from(slot) * u64::from(self.slot_size)
    }

    /// Checks an RNDV record from the peer whose send region this is, before any byte of it
    /// is read: the key is the announced one, the slot exists, `addr .. addr + len` lies inside
    /// that one slot, and `len` fits our receive slot (`rx_slot_size`, our `max_message_size`).
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] naming the violation.
    #[inline]
    pub(crate) fn check_rndv(&self, r: &Rndv, rx_slot_size: u32) -> Result<(), FabricError> {
        let bad = |what| Err(FabricError::Protocol(what));
        if !self.is_enabled() || rx_slot_size == 0 {
            return bad("rndv record on a connection without large messages");
        }
        if r.rkey != self.rkey {
            return bad("rndv record with an rkey the peer never announced");
        }
        if r.slot >= self.slots {
            return bad("rndv record names a large slot out of range");
        }
        if r.len > rx_slot_size {
            return bad("rndv message longer than the receive slot");
        }
        let start = self.slot_addr(r.slot);
        let end = start + u64::from(self.slot_size);
        // `check` proved `base + slots * slot_size` does not wrap.
        match r.addr.checked_add(u64::from(r.len)) {
            Some(last) if r.addr >= start && last <= end => Ok(()),
            _ => bad("rndv record outside its large slot"),
        }
    }
}

/// An RNDV record's fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Rndv {
    /// The sender's large slot.
    pub(crate) slot: u32,
    /// Message bytes.
    pub(crate) len: u32,
    /// Remote address of the first byte.
    pub(crate) addr: u64,
    /// Remote key.
    pub(crate) rkey: u32,
}

/// Writes the RNDV frame of `r` (a frame of one RNDV record, [`RNDV_FRAME`] bytes) into `dst`.
#[inline]
pub(crate) fn write_rndv_frame(dst: &mut [u8; RNDV_FRAME], r: &Rndv) {
    let rec = RecordHeader::encode(RecordType::Rndv, RNDV_PAYLOAD).unwrap_or([0; RECORD_HEADER]);
    let l = (RNDV_FRAME as u32).to_le_bytes();
    dst[..FRAME_HEADER].copy_from_slice(&[l[0], l[1], l[2], l[3], 1, 0, VERSION, 0]);
    dst[FRAME_HEADER..FRAME_HEADER + RECORD_HEADER].copy_from_slice(&rec);
    dst[FRAME_HEADER + RECORD_HEADER..]
        .copy_from_slice(&rndv_payload(r.slot, r.len, r.addr, r.rkey));
}

/// Bytes of a control frame of `n` acknowledgements.
#[inline]
pub(crate) const fn ack_frame_len(n: usize) -> usize {
    FRAME_HEADER + n * ACK_RECORD
}

/// Writes a control frame of one RNDV_DONE record per slot of `slots` into `dst` and returns
/// its length; `None` (nothing written) when `slots` is empty, holds more than a frame's
/// `u16` count, or `dst` is too short.
pub(crate) fn write_ack_frame(dst: &mut [u8], slots: &[u32]) -> Option<usize> {
    let n = slots.len();
    let len = ack_frame_len(n);
    if n == 0 || n > usize::from(u16::MAX) || dst.len() < len {
        return None;
    }
    let rec = RecordHeader::encode(RecordType::RndvDone, RNDV_DONE_PAYLOAD)?;
    let l = u32::try_from(len).ok()?.to_le_bytes();
    let c = (n as u16).to_le_bytes();
    dst[..FRAME_HEADER].copy_from_slice(&[l[0], l[1], l[2], l[3], c[0], c[1], VERSION, 0]);
    for (i, &slot) in slots.iter().enumerate() {
        let at = FRAME_HEADER + i * ACK_RECORD;
        dst[at..at + RECORD_HEADER].copy_from_slice(&rec);
        dst[at + RECORD_HEADER..at + RECORD_HEADER + 4].copy_from_slice(&slot.to_le_bytes());
        dst[at + RECORD_HEADER + 4..at + ACK_RECORD].fill(0);
    }
    Some(len)
}

/// Validates a received control frame (`bytes`: exactly what the SEND delivered): a checked
/// frame header covering all of `bytes`, whose records are all RNDV_DONE; then hands each
/// acknowledged slot to `ack` in order. Nothing is handed over unless the whole frame is valid.
///
/// # Errors
///
/// [`FabricError::Protocol`] naming the violation, or `ack`'s error.
pub(crate) fn read_ack_frame(
    bytes: &[u8],
    mut ack: impl FnMut(u32) -> Result<(), FabricError>,
) -> Result<usize, FabricError> {
    let frame = FrameReader::new_checked(bytes, 0)
        .map_err(|_| FabricError::Protocol("rdma control frame with a bad frame header"))?;
    if frame.len() != bytes.len() {
        return Err(FabricError::Protocol(
            "rdma control frame length disagrees with the bytes received",
        ));
    }
    let mut only_acks = true;
    frame
        .for_each(|r| only_acks &= matches!(r, Record::RndvDone { .. }))
        .map_err(|_| FabricError::Protocol("rdma control frame record malformed"))?;
    if !only_acks {
        return Err(FabricError::Protocol(
            "rdma control frame holds a record other than RNDV_DONE",
        ));
    }
    let mut n = 0;
    let mut r = frame.records();
    while let Some(rec) = r
        .next_record()
        .map_err(|_| FabricError::Protocol("rdma control frame changed after validation"))?
    {
        if let Record::RndvDone { slot } = rec {
            ack(slot)?;
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REGION: LargeRegion = LargeRegion {
        base: 0x7f00_0000_0000,
        slot_size: 1 << 20,
        slots: 2,
        rkey: 0xabcd,
    };

    fn rndv(slot: u32, len: u32) -> Rndv {
        Rndv {
            slot,
            len,
            addr: REGION.slot_addr(slot),
            rkey: REGION.rkey,
        }
    }

    fn proto(r: Result<(), FabricError>) -> bool {
        matches!(r, Err(FabricError::Protocol(_)))
    }

    #[test]
    fn handshake_region_checks() {
        assert!(LargeRegion::NONE.check().is_ok());
        assert!(REGION.check().is_ok());
        let bad = |f: &dyn Fn(&mut LargeRegion)| {
            let mut r = REGION;
            f(&mut r);
            r.check().is_err()
        };
        assert!(bad(&|r| r.slots = MAX_LARGE_SLOTS + 1));
        assert!(bad(&|r| r.slot_size = 0));
        assert!(bad(&|r| r.base = 0));
        assert!(bad(&|r| r.base = u64::MAX - (1 << 20)));
        // Fields without slots: not a clean "none".
        assert!(bad(&|r| r.slots = 0));
        let mut r = LargeRegion::NONE;
        r.rkey = 1;
        assert!(r.check().is_err());
    }

    #[test]
    fn rndv_records_are_checked_against_the_region() {
        let rx = 1 << 20;
        assert!(REGION.check_rndv(&rndv(0, 0), rx).is_ok());
        assert!(REGION.check_rndv(&rndv(1, rx), rx).is_ok());
        // Bogus key, slot, length, address.
        assert!(proto(REGION.check_rndv(
            &Rndv {
                rkey: 1,
                ..rndv(0, 10)
            },
            rx
        )));
        assert!(proto(REGION.check_rndv(&rndv(2, 10), rx)));
        assert!(proto(REGION.check_rndv(
            &Rndv {
                slot: u32::MAX,
                ..rndv(0, 10)
            },
            rx
        )));
        assert!(proto(REGION.check_rndv(&rndv(0, rx + 1), rx)));
        // Fits the slot but not our (smaller) receive slot.
        assert!(proto(REGION.check_rndv(&rndv(0, 4096), 4095)));
        // Straddles two slots, starts before the region, wraps.
        let mut r = rndv(0, 16);
        r.addr = REGION.slot_addr(1) - 8;
        assert!(proto(REGION.check_rndv(&r, rx)));
        r.addr = REGION.base - 1;
        assert!(proto(REGION.check_rndv(&r, rx)));
        r.addr = u64::MAX - 4;
        assert!(proto(REGION.check_rndv(&r, rx)));
        // Inside the slot at an offset is allowed (the sender uses the slot start).
        r.slot = 1;
        r.addr = REGION.slot_addr(1) + 8;
        assert!(REGION.check_rndv(&r, rx).is_ok());
        // ... but not in another slot than the one named.
        r.slot = 0;
        assert!(proto(REGION.check_rndv(&r, rx)));
        // A side without large messages rejects every RNDV.
        assert!(proto(LargeRegion::NONE.check_rndv(&rndv(0, 1), rx)));
        assert!(proto(REGION.check_rndv(&rndv(0, 1), 0)));
    }

    #[test]
    fn rndv_frame_parses_as_a_frame_of_one() {
        let mut f = [0u8; RNDV_FRAME];
        write_rndv_frame(&mut f, &rndv(1, 77));
        let fr = FrameReader::new_checked(&f, 0).unwrap();
        assert_eq!((fr.len(), fr.count()), (RNDV_FRAME, 1));
        let mut got = None;
        fr.for_each(|r| got = Some(r)).unwrap();
        assert_eq!(
            got,
            Some(Record::Rndv {
                slot: 1,
                len: 77,
                addr: REGION.slot_addr(1),
                rkey: REGION.rkey
            })
        );
    }

    #[test]
    fn ack_frames_round_trip_and_hostile_ones_are_refused() {
        let mut b = [0xAAu8; 128];
        assert_eq!(write_ack_frame(&mut b, &[]), None);
        assert_eq!(write_ack_frame(&mut b[..20], &[1, 2]), None);
        let n = write_ack_frame(&mut b, &[3, 0, 7]).unwrap();
        assert_eq!(n, 8 + 3 * 16);
        let mut got = Vec::new();
        let k = read_ack_frame(&b[..n], |s| {
            got.push(s);
            Ok(())
        })
        .unwrap();
        assert_eq!((k, got), (3, vec![3, 0, 7]));
        // The callback's error comes back.
        assert!(read_ack_frame(&b[..n], |_| Err(FabricError::Protocol("x"))).is_err());
        let fails = |bytes: &[u8]| {
            let mut called = false;
            let r = read_ack_frame(bytes, |_| {
                called = true;
                Ok(())
            });
            matches!(r, Err(FabricError::Protocol(_))) && !called
        };
        let good = b[..n].to_vec();
        let mut x = good.clone();
        x[4] = 2; // count
        assert!(fails(&x));
        assert!(fails(&good[..n - 8])); // cut
        let mut x = good.clone();
        x.extend_from_slice(&[0; 8]); // more bytes than the frame
        assert!(fails(&x));
        let mut x = good.clone();
        x[8 + 16 + 4] = RecordType::Data as u8; // a DATA record among the acks
        assert!(fails(&x));
        let mut x = good.clone();
        x[8 + 4] = RecordType::Rndv as u8; // wrong size for RNDV
        assert!(fails(&x));
        // An RNDV frame is not a control frame.
        let mut f = [0u8; RNDV_FRAME];
        write_rndv_frame(&mut f, &rndv(0, 1));
        assert!(fails(&f));
        assert!(fails(&[]));
        // Random corruption never panics and never acks a slot of a broken frame.
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            let mut x = good.clone();
            for _ in 0..2 {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let i = (s as usize) % x.len();
                x[i] = (s >> 32) as u8;
            }
            let mut acks = 0;
            if let Ok(k) = read_ack_frame(&x, |_| {
                acks += 1;
                Ok(())
            }) {
                assert_eq!(k, acks);
            }
        }
    }
}
