//! Large records: a `DATA` record longer than half a receive chunk is read into a large
//! receive slot (its header recognised and checked here, its payload read by `recv`s straight
//! into the slot) and lent from there.

use crate::error::FabricError;
use crate::record::{RecordType, RECORD_HEADER};

use super::super::sys;
use super::{sock_err, Delivery, LargeRx, TcpConn};

/// The payload length of the `DATA` record whose header starts `buf` when it goes into a large
/// slot (longer than `lend_max`); `None` for any other record, or before its header is
/// complete (the record reader checks those).
///
/// # Errors
///
/// [`FabricError::Protocol`] for a `DATA` record above the connection's limit `max_payload`, or
/// one with reserved header bytes set.
#[inline]
pub(super) fn large_data(
    buf: &[u8],
    lend_max: usize,
    max_payload: usize,
) -> Result<Option<usize>, FabricError> {
    if buf.len() < RECORD_HEADER || buf[4] != RecordType::Data as u8 {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let Some(payload) = len.checked_sub(RECORD_HEADER) else {
        return Ok(None);
    };
    if payload <= lend_max {
        return Ok(None);
    }
    if payload > max_payload {
        return Err(FabricError::Protocol(
            "tcp record longer than the connection's message limit",
        ));
    }
    if buf[5..8] != [0; 3] {
        return Err(FabricError::Protocol("tcp record with reserved fields set"));
    }
    Ok(Some(payload))
}

impl Delivery {
    /// Takes a free large receive slot.
    #[inline]
    pub(super) fn take_large(&mut self) -> Option<u32> {
        self.large_free_len = self.large_free_len.checked_sub(1)?;
        let s = self.large_free[self.large_free_len];
        self.large_out[s as usize] = true;
        Some(s)
    }

    /// The application dropped large message `slot`: the slot is free again.
    #[inline]
    pub(super) fn release_large(&mut self, slot: u32) -> Result<(), FabricError> {
        match self.large_out.get_mut(slot as usize) {
            Some(out) if *out => *out = false,
            _ => {
                return Err(FabricError::Protocol(
                    "released a large receive slot not lent",
                ))
            }
        }
        // At most `count` slots are free at once: there is room.
        if let Some(top) = self.large_free.get_mut(self.large_free_len) {
            *top = slot;
            self.large_free_len += 1;
        }
        Ok(())
    }
}

impl TcpConn {
    /// One non-blocking `recv` of the rest of the large record being read, straight into its
    /// slot (the kernel's copy is the only one).
    #[inline]
    pub(super) fn fill_large(&mut self, mut l: LargeRx) -> Result<bool, FabricError> {
        // SAFETY: `slot < large count` (taken from the free stack), `got < total <=` the slot
        // size (`new` caps `max_payload` so that `align8(max_payload)` fits): the unread rest of
        // a slot that only the fabric touches until the message is delivered.
        let free = unsafe {
            std::slice::from_raw_parts_mut(
                self.rx.large.buf_ptr_unchecked(l.slot).as_ptr().add(l.got),
                l.total - l.got,
            )
        };
        self.recvs += 1;
        match sys::recv(self.fd, free) {
            Ok(0) => {
                self.eof = true;
                Err(FabricError::Protocol("tcp stream ended inside a record"))
            }
            Ok(n) => {
                l.got += n;
                self.large_rx = Some(l);
                self.heard += n as u64;
                Ok(true)
            }
            Err(libc::EAGAIN | libc::EINTR) => Ok(false),
            Err(e) => {
                self.eof = true;
                Err(sock_err(e))
            }
        }
    }
}
