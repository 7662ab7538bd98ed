//! Shared-memory wire format: segment layout, descriptor rings, release rings and validation.
//!
//! One connection = one shared segment (a sealed, mode-0600 memfd created by side A and passed
//! to side B over the control socket, see `cm::uds`). The segment holds a header with both
//! sides' state words, and for each direction a descriptor ring, a release ring and the sender's
//! buffer pool. The layout is documented in [`layout`], the ring protocol in [`ring`].
//!
//! # Files
//! Lower files never use higher ones:
//! - `error`, [`layout`]: error types; offsets, sizes and parameter validation.
//! - `mapping`: the `mmap` owner shared by every handle of a segment, and [`Side`].
//! - [`ring`]: the protocol, its wire constants and the geometry both halves share.
//! - `tx` ([`TxRing`]) and `rx` ([`RxRing`], [`RxRecord`]): the data-path halves.
//! - `segment` ([`Segment`]): setup (create, attach, split) and liveness; the only file that
//!   makes syscalls.
//!
//! # Trust model
//! The peer is untrusted. Each side computes the layout from parameters it validated itself and
//! never reads an offset from the segment. Every word read from the peer's side (sequence
//! numbers, lengths, buffer indices, ring heads and tails) is validated before use; a bad value
//! yields [`WireError::Corrupt`] and the caller must fail the connection. No value the peer
//! writes can cause an out-of-bounds access, undefined behaviour in this module's code, a panic
//! or an unbounded loop. The memfd is sealed against shrinking, so the peer cannot truncate it
//! under our mapping (which would fault our accesses). Payload *contents* are application data:
//! a hostile peer can change them while they are read; they are delivered, not interpreted.
//!
//! # Usage
//! ```
//! use spinwire::fabric::shm::wire::{Params, RxPayload, Segment};
//!
//! let params = Params { buffer_size: 4096, buffer_count: 64, ring_depth: 128, inline_max: 200 };
//! // Side A creates the segment and sends `fd` to side B (over the control socket).
//! let (seg_a, fd) = Segment::create(&params)?;
//! // Side B validated the same params during the handshake and attaches.
//! let seg_b = Segment::attach(std::os::fd::AsFd::as_fd(&fd), &params)?;
//! let (mut tx_a, _rx_a) = seg_a.split()?;
//! let (_tx_b, mut rx_b) = seg_b.split()?;
//!
//! // Small message: inline in the descriptor ring.
//! assert!(tx_a.try_send_inline(b"hello", 0)?);
//! // Large message: written in place into a buffer, then sent by index.
//! tx_a.buffer_mut(7)?[..5].copy_from_slice(b"world");
//! assert!(tx_a.try_send_buf(7, 5, 0)?);
//!
//! let d = rx_b.poll()?.expect("published");
//! let mut out = [0u8; 200];
//! let n = rx_b.copy_inline(&d, &mut out)?;
//! assert_eq!(&out[..n], b"hello");
//! let d = rx_b.poll()?.expect("published");
//! assert_eq!(d.payload(), RxPayload::Buffer { index: 7 });
//! assert_eq!(rx_b.buffer(7, d.len())?, b"world");
//! rx_b.commit(); // slots back to the sender
//! rx_b.release(7)?; // buffer back to the sender...
//! rx_b.publish_releases(); // ...visible now
//!
//! let mut freed = [0u32; 8];
//! assert_eq!(tx_a.reclaim(&mut freed)?, 1);
//! assert_eq!(freed[0], 7);
//! # Ok::<(), spinwire::fabric::shm::wire::WireError>(())
//! ```

// Dependency order (rustfmt sorts the lines): error, layout < mapping < ring < tx, rx < segment.
mod error;
pub mod layout;
mod mapping;
pub mod ring;
mod rx;
mod segment;
mod tx;

pub use error::{Field, WireError};
pub use layout::{slots_for_inline, Dir, Layout, Params};
pub use mapping::Side;
pub use rx::{RxPayload, RxRecord, RxRing};
pub use segment::{PeerState, Segment};
pub use tx::TxRing;
