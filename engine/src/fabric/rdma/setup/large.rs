//! Large messages at connection setup (rendezvous): the registered large regions
//! ([`LargeRegions`], registered in `prepare`, never on the data path), the large send region
//! announced in the handshake's private data behind the [`FlowParams`] ([`encode`],
//! [`decode`]) and its checks against ours ([`check_peer`]), and the data path's
//! [`LargeParts`] ([`parts`]).
//!
//! Private data layout (little-endian): bytes `0..20` the [`FlowParams`], then
//!
//! | bytes  | field       | meaning |
//! |--------|-------------|---------|
//! | 20..28 | `base`      | `u64`: virtual address of large send slot 0 |
//! | 28..32 | `slot_size` | `u32`: bytes per slot (`max_message_size`) |
//! | 32..36 | `slots`     | `u32`: slot count (`large_buffers`), `0`: no large messages |
//! | 36..40 | `rkey`      | `u32`: the send region's remote key |
//!
//! 40 bytes in all, within the 56 bytes of an RC connect request. Private data that ends
//! after the [`FlowParams`] announces no large region.

use std::ptr::NonNull;
use std::sync::Arc;

use cm::rdma::FlowParams;

use super::setup_err;
use crate::config::Config;
use crate::error::Error;
use crate::fabric::rdma::datapath::{
    ack_scratch_size, LargeParts, LargeRegion, ACK_BUFS, MAX_LARGE_SLOTS, READ_WINDOW, RNDV_FRAME,
    RNDV_SCRATCH,
};
use crate::fabric::rdma::error::RdmaSetupError;
use crate::fabric::rdma::verbs::{Access, DeviceLimits, MemoryRegion, ProtectionDomain};
use crate::PoolView;

/// Bytes of the large-region block after the [`FlowParams`].
pub(super) const LARGE_LEN: usize = 20;
/// Bytes of this side's whole private data.
pub(super) const PRIVATE_LEN: usize = FlowParams::LEN + LARGE_LEN;

const _: () = assert!(PRIVATE_LEN <= 56, "must fit an RC connect request");

/// One connection's registered large regions.
pub(super) struct LargeRegions {
    /// Send slots: `slots * slot_size` bytes, page aligned, registered with
    /// `IBV_ACCESS_REMOTE_READ` only (the peer pulls them; the HCA reads them locally for
    /// nothing else).
    pub(super) tx: MemoryRegion,
    /// Receive slots, registered with `IBV_ACCESS_LOCAL_WRITE` (an RDMA READ's sink is written
    /// by the local HCA) and, on iWARP only, `IBV_ACCESS_REMOTE_WRITE` (iWARP's READ response
    /// is placed through the sink's remote write right).
    pub(super) rx: MemoryRegion,
    /// RNDV frames (one [`RNDV_SCRATCH`] slot per send slot) and the [`ACK_BUFS`]
    /// acknowledgement frames: local access only (send sources).
    pub(super) scratch: MemoryRegion,
    pub(super) slot_size: u32,
    pub(super) slots: u32,
    /// Most RDMA READ chunks in flight ([`READ_WINDOW`] and the device's initiator depth).
    pub(super) max_reads: u32,
    /// Bytes of one acknowledgement frame buffer.
    ack_size: usize,
}

/// Registers a connection's large regions when large messages are on (`None` otherwise).
///
/// # Errors
///
/// [`RdmaSetupError::LargeSlots`], [`RdmaSetupError::LargeNeedsBuffer`],
/// [`RdmaSetupError::NoRdmaRead`], or the registration's verbs error.
pub(super) fn register(
    pd: &Arc<ProtectionDomain>,
    cfg: &Config,
    limits: &DeviceLimits,
    iwarp: bool,
    buffer_size: u32,
) -> Result<Option<LargeRegions>, Error> {
    let (slot_size, slots) = cfg.large_pool();
    if slots == 0 {
        return Ok(None);
    }
    if slots > MAX_LARGE_SLOTS {
        return Err(RdmaSetupError::LargeSlots {
            count: slots as usize,
            max: MAX_LARGE_SLOTS,
        }
        .into());
    }
    if (buffer_size as usize) < RNDV_FRAME {
        return Err(RdmaSetupError::LargeNeedsBuffer {
            buffer_size,
            min: RNDV_FRAME as u32,
        }
        .into());
    }
    if limits.max_qp_init_rd_atom == 0 || limits.max_qp_rd_atom == 0 {
        return Err(RdmaSetupError::NoRdmaRead {
            initiator: limits.max_qp_init_rd_atom,
            responder: limits.max_qp_rd_atom,
        }
        .into());
    }
    // `Config` caps max_message_size at 1 GiB.
    let slot_u32 = u32::try_from(slot_size).unwrap_or(u32::MAX);
    let bytes = slot_size * slots as usize;
    let rx_access = if iwarp {
        Access::LOCAL_WRITE.with(Access::REMOTE_WRITE)
    } else {
        Access::LOCAL_WRITE
    };
    let ack_size = ack_scratch_size(buffer_size);
    let scratch_bytes = RNDV_SCRATCH * slots as usize + ACK_BUFS * ack_size;
    Ok(Some(LargeRegions {
        tx: MemoryRegion::placed(pd, bytes, Access::REMOTE_READ, &cfg.placer)
            .map_err(|e| setup_err("register large send slots", e))?,
        rx: MemoryRegion::placed(pd, bytes, rx_access, &cfg.placer)
            .map_err(|e| setup_err("register large receive slots", e))?,
        scratch: MemoryRegion::new(pd, scratch_bytes, Access::NONE)
            .map_err(|e| setup_err("register rendezvous frames", e))?,
        slot_size: slot_u32,
        slots,
        max_reads: READ_WINDOW.min(limits.max_qp_init_rd_atom),
        ack_size,
    }))
}

impl LargeRegions {
    /// The send region as announced to the peer.
    pub(super) fn region(&self) -> LargeRegion {
        LargeRegion {
            base: self.tx.as_ptr() as u64,
            slot_size: self.slot_size,
            slots: self.slots,
            rkey: self.tx.rkey(),
        }
    }
}

/// This side's private data: the flow parameters, then the large send region (all zero
/// without large messages).
pub(super) fn encode(flow: &FlowParams, large: Option<&LargeRegions>) -> [u8; PRIVATE_LEN] {
    let r = large.map_or(LargeRegion::NONE, LargeRegions::region);
    let mut b = [0u8; PRIVATE_LEN];
    b[..FlowParams::LEN].copy_from_slice(&flow.encode());
    let at = FlowParams::LEN;
    b[at..at + 8].copy_from_slice(&r.base.to_le_bytes());
    b[at + 8..at + 12].copy_from_slice(&r.slot_size.to_le_bytes());
    b[at + 12..at + 16].copy_from_slice(&r.slots.to_le_bytes());
    b[at + 16..at + 20].copy_from_slice(&r.rkey.to_le_bytes());
    b
}

/// The large send region a peer announced in `private_data` (already accepted by
/// [`FlowParams::decode`]), validated with [`LargeRegion::check`]; none when the data ends
/// after the flow parameters.
///
/// # Errors
///
/// [`RdmaSetupError::BadLargeRegion`] for a short block or a region that breaks the rules.
pub(super) fn decode(private_data: &[u8]) -> Result<LargeRegion, RdmaSetupError> {
    let Some(rest) = private_data.get(FlowParams::LEN..) else {
        return Ok(LargeRegion::NONE);
    };
    if rest.iter().all(|&b| b == 0) {
        // No block, or librdmacm's zero padding of a 20-byte private data.
        return Ok(LargeRegion::NONE);
    }
    let b = rest
        .get(..LARGE_LEN)
        .ok_or(RdmaSetupError::BadLargeRegion {
            reason: "large region block cut short",
        })?;
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut base = [0u8; 8];
    base.copy_from_slice(&b[..8]);
    let r = LargeRegion {
        base: u64::from_le_bytes(base),
        slot_size: u32_at(8),
        slots: u32_at(12),
        rkey: u32_at(16),
    };
    r.check()
        .map_err(|reason| RdmaSetupError::BadLargeRegion { reason })?;
    Ok(r)
}

/// Checks the peer's large region against ours: neither side has large messages, or both
/// do with the same slot size (`max_message_size`).
///
/// # Errors
///
/// [`RdmaSetupError::LargeMismatch`].
pub(super) fn check_peer(ours: Option<&LargeRegions>, peer: &LargeRegion) -> Result<(), Error> {
    let ours_size = ours.map_or(0, |l| l.slot_size);
    let peer_size = if peer.is_enabled() { peer.slot_size } else { 0 };
    if ours_size != peer_size {
        return Err(RdmaSetupError::LargeMismatch {
            peer_slot_size: peer_size,
            peer_slots: peer.slots,
            ours: ours_size,
        }
        .into());
    }
    Ok(())
}

/// [`check_peer`] against the large slots this configuration would register (a listener,
/// before it accepts).
///
/// # Errors
///
/// [`RdmaSetupError::LargeMismatch`].
pub(super) fn check_config(cfg: &Config, peer: &LargeRegion) -> Result<(), Error> {
    let (size, slots) = cfg.large_pool();
    let ours = if slots == 0 {
        0
    } else {
        u32::try_from(size).unwrap_or(u32::MAX)
    };
    let peer_size = if peer.is_enabled() { peer.slot_size } else { 0 };
    if ours != peer_size {
        return Err(RdmaSetupError::LargeMismatch {
            peer_slot_size: peer_size,
            peer_slots: peer.slots,
            ours,
        }
        .into());
    }
    Ok(())
}

/// The data path's view of the large regions and the peer's (validated) region, and the
/// application's large pool views (send, receive).
///
/// # Errors
///
/// [`RdmaSetupError::NullRegion`] (never, for a registered region).
pub(super) fn parts(
    ours: Option<&LargeRegions>,
    peer: LargeRegion,
) -> Result<(LargeParts, PoolView, PoolView), Error> {
    let Some(l) = ours else {
        return Ok((LargeParts::none(), PoolView::empty(), PoolView::empty()));
    };
    let nn = |p: *mut u8, what| NonNull::new(p).ok_or(RdmaSetupError::NullRegion { what });
    let slot = l.slot_size as usize;
    let tx_base = nn(l.tx.as_ptr(), "large send slots")?;
    let rx_base = nn(l.rx.as_ptr(), "large receive slots")?;
    let scratch = nn(l.scratch.as_ptr(), "rendezvous frames")?;
    // SAFETY: each region was registered with exactly these sizes in `register` (`slots *
    // slot_size`; `slots * RNDV_SCRATCH + ACK_BUFS * ack_size` for the scratch, the
    // acknowledgement buffers right after the RNDV frames) and is owned by the connection's
    // `Pools`, which the connection and every user of the views keep alive (`keep`).
    let (tx, rx, rndv_scratch, ack_scratch) = unsafe {
        (
            PoolView::new(tx_base, slot, l.slots),
            PoolView::new(rx_base, slot, l.slots),
            PoolView::new(scratch, RNDV_SCRATCH, l.slots),
            PoolView::new(
                scratch.add(RNDV_SCRATCH * l.slots as usize),
                l.ack_size,
                ACK_BUFS as u32,
            ),
        )
    };
    let large = LargeParts {
        tx,
        tx_region: l.region(),
        rx,
        rx_lkey: l.rx.lkey(),
        rndv_scratch,
        ack_scratch,
        scratch_lkey: l.scratch.lkey(),
        peer,
        max_reads: l.max_reads,
    };
    Ok((large, tx, rx))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow() -> FlowParams {
        FlowParams {
            credits: 8,
            buffer_size: 4096,
            inline_size: 64,
        }
    }

    fn with_region(r: LargeRegion) -> Vec<u8> {
        let mut b = flow().encode().to_vec();
        b.extend_from_slice(&r.base.to_le_bytes());
        b.extend_from_slice(&r.slot_size.to_le_bytes());
        b.extend_from_slice(&r.slots.to_le_bytes());
        b.extend_from_slice(&r.rkey.to_le_bytes());
        b
    }

    const R: LargeRegion = LargeRegion {
        base: 0x7f12_3456_0000,
        slot_size: 1 << 20,
        slots: 2,
        rkey: 0x55aa,
    };

    #[test]
    fn private_data_round_trips_and_fits_a_connect_request() {
        let wire = encode(&flow(), None);
        assert_eq!(wire.len(), 40);
        assert_eq!(FlowParams::decode(&wire), Ok(flow()));
        assert_eq!(decode(&wire).unwrap(), LargeRegion::NONE);
        let wire = with_region(R);
        assert_eq!(FlowParams::decode(&wire), Ok(flow()));
        assert_eq!(decode(&wire).unwrap(), R);
        // A peer that sends only the flow parameters (or librdmacm's zero padding).
        assert_eq!(decode(&flow().encode()).unwrap(), LargeRegion::NONE);
        let mut padded = flow().encode().to_vec();
        padded.resize(56, 0);
        assert_eq!(decode(&padded).unwrap(), LargeRegion::NONE);
    }

    #[test]
    fn hostile_regions_are_typed_errors() {
        let bad = |r: LargeRegion| {
            matches!(
                decode(&with_region(r)),
                Err(RdmaSetupError::BadLargeRegion { .. })
            )
        };
        assert!(bad(LargeRegion { slots: 0, ..R }));
        assert!(bad(LargeRegion {
            slots: MAX_LARGE_SLOTS + 1,
            ..R
        }));
        assert!(bad(LargeRegion { slot_size: 0, ..R }));
        assert!(bad(LargeRegion { base: 0, ..R }));
        assert!(bad(LargeRegion {
            base: u64::MAX - 100,
            ..R
        }));
        // Cut short.
        let w = with_region(R);
        assert!(matches!(
            decode(&w[..30]),
            Err(RdmaSetupError::BadLargeRegion { .. })
        ));
    }

    #[test]
    fn peer_regions_must_match_ours() {
        assert!(check_peer(None, &LargeRegion::NONE).is_ok());
        assert!(check_peer(None, &R).is_err());
    }
}
