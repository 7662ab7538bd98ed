//! The credit word every message carries: in the 32-bit immediate data (RoCE, InfiniBand), or
//! in a 4-byte header gathered from and scattered into registered header slots (iWARP, which
//! has no immediate data). See the protocol in [`datapath`](super::datapath).
//!
//! The credit count is a delta of receive-buffer credits (buffers re-posted since the last
//! return), at most [`IMM_CREDITS_MAX`] a word: the receiver takes it from its
//! [`CreditReturn`](crate::flow::CreditReturn) with `take_up_to(IMM_CREDITS_MAX)`, the sender
//! credits it to its [`SendWindow`](crate::flow::SendWindow), which refuses more than it sent.

use crate::desc::PoolView;

/// Immediate-data flag of an explicit credit message.
pub(crate) const IMM_CREDIT_ONLY: u32 = 1 << 31;
/// Immediate-data flag of a *frame*: the payload is a frame of DATA and RNDV records
/// ([`crate::record`]: frame header, then records), not one message. Together with
/// [`IMM_CREDIT_ONLY`]: a *control frame* of RNDV_DONE records (rendezvous acknowledgements),
/// which is not an application message.
pub(crate) const IMM_FRAME: u32 = 1 << 30;
/// Largest credit count one immediate can carry (bits 0..=29).
pub(crate) const IMM_CREDITS_MAX: u32 = IMM_FRAME - 1;

/// Bytes of the message header that replaces immediate data on iWARP: the same 32-bit word
/// (credits | [`IMM_CREDIT_ONLY`] | [`IMM_FRAME`]), little-endian.
pub(crate) const HDR_LEN: u32 = 4;

/// iWARP only: where a connection's message headers live. One slot of [`HDR_LEN`] bytes per
/// receive buffer (`0..rx_slots`, the receive scatters the header there and the payload into
/// the buffer), then one per send-queue slot (a send's header stays put until the send
/// completes: slot `rx_slots + seq % sq_depth` is reused only `sq_depth` sends later, and the
/// send queue never holds more than `sq_depth`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HdrParts {
    /// The header slots (`rx_slots + sq_depth` of them), registered with local write.
    pub(crate) view: PoolView,
    /// lkey of the header region.
    pub(crate) lkey: u32,
    /// Receive header slots (= receive buffers).
    pub(crate) rx_slots: u32,
    /// Whether a header-only send fits the QP's inline size.
    pub(crate) inline: bool,
}

/// Reads and validates the header of a completed iWARP receive into buffer `buf`: returns the
/// header word and the payload length. `None` if the message is shorter than a header, the
/// buffer is out of range, or a credit message that is not a control frame carries a payload.
/// (The frame flag is checked with the immediate on every transport, in the completion
/// handler.)
#[inline]
pub(super) fn read_hdr(h: &HdrParts, buf: u32, byte_len: u32) -> Option<(u32, u32)> {
    if buf >= h.rx_slots {
        return None;
    }
    let len = byte_len.checked_sub(HDR_LEN)?;
    let mut word = [0u8; 4];
    // SAFETY: slot `buf` (< rx_slots) is HDR_LEN bytes inside the header region; the receive
    // completed, so the HCA is done writing it and it is not re-posted until the buffer is.
    unsafe { std::ptr::copy_nonoverlapping(h.view.buf_ptr(buf).as_ptr(), word.as_mut_ptr(), 4) };
    let word = u32::from_le_bytes(word);
    if word & IMM_CREDIT_ONLY != 0 && word & IMM_FRAME == 0 && len != 0 {
        return None;
    }
    Some((word, len))
}
