//! Shared-memory wire format (version 2): segment layout, record rings, release rings and
//! validation.
//!
//! One connection = one shared segment (a sealed, mode-0600 memfd created by side A and passed
//! to side B over the control socket, see `cm::uds`). The segment holds a header with both
//! sides' state words, and for each direction a record ring ([`crate::record::ring`]), a
//! release ring and the sender's buffer pool. The layout is documented in [`layout`], the
//! protocol in [`ring`]. Everything but the large slots is reserved (`fallocate`) and both
//! mappings pre-fault it (`MAP_POPULATE`), so no first-touch page fault lands on the path of a
//! pool-sized message. The large slots (most of a default segment) are committed by their
//! sender on its first large message ([`TxRing::reserve_large`]), so an idle connection costs
//! only the prefix.
//!
//! # Files
//! Lower files never use higher ones:
//! - `error`, [`layout`]: error types; offsets, sizes and parameter validation.
//! - `mapping`: the `mmap` owner shared by every handle of a segment, and [`Side`].
//! - [`ring`]: the protocol, and the geometry both halves share (the ring region as
//!   `RingMemory`, release ring, pool, ownership bitmap).
//! - `tx` ([`TxRing`]) and `rx` ([`RxRing`], [`RxMsg`], [`Releaser`]): the data-path halves.
//! - `segment` ([`Segment`]): setup (create, attach, split) and liveness; the only file that
//!   makes syscalls.
//!
//! # Trust model
//! The peer is untrusted. Each side computes the layout from parameters it validated itself and
//! never reads an offset from the segment. Every word read from the peer's side (record headers,
//! ring positions, buffer references, release entries and positions) is validated before use; a
//! bad value yields [`WireError::Ring`] or [`WireError::Corrupt`] and the caller must fail the
//! connection. No value the peer writes can cause an out-of-bounds access, undefined behaviour
//! in this module's code, a panic or an unbounded loop. The memfd is sealed against shrinking,
//! so the peer cannot truncate it under our mapping (which would fault our accesses). Payload
//! *contents* are application data: a hostile peer can change them while they are read; they
//! are delivered, not interpreted.
//!
//! # Usage
//! ```
//! use spinwire::fabric::shm::wire::{Params, RxMsg, Segment};
//!
//! let params = Params { buffer_size: 4096, buffer_count: 64, ring_depth: 128, inline_max: 120 , large_size: 0, large_count: 0};
//! // Side A creates the segment and sends `fd` to side B (over the control socket).
//! let (seg_a, fd) = Segment::create(&params)?;
//! // Side B validated the same params during the handshake and attaches.
//! let seg_b = Segment::attach(std::os::fd::AsFd::as_fd(&fd), &params)?;
//! let (mut tx_a, _rx_a, _rel_a) = seg_a.split()?;
//! let (_tx_b, mut rx_b, mut rel_b) = seg_b.split()?;
//!
//! // Small message: a DATA record in the ring.
//! assert!(tx_a.try_send_inline(b"hello")?);
//! // Large message: written in place into a buffer, then sent by reference (BUF_REF).
//! tx_a.buffer_mut(7)?[..5].copy_from_slice(b"world");
//! assert!(tx_a.try_send_buf(7, 5)?);
//!
//! let mut got = Vec::new();
//! let n = rx_b.poll(16, |m| match m {
//!     RxMsg::Inline(bytes) => got.push(bytes.to_vec()),
//!     RxMsg::Buffer { index, len } => {
//!         rel_b.hold(index).unwrap();
//!         got.push(rel_b.buffer(index, len as usize).unwrap().to_vec());
//!         rel_b.release(index).unwrap(); // buffer back to the sender...
//!     }
//! })?;
//! assert_eq!(n, 2);
//! assert_eq!(got, [b"hello".to_vec(), b"world".to_vec()]);
//! rel_b.publish_releases(); // ...visible now
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
pub use layout::{ring_capacity, Dir, Layout, Params};
pub use mapping::Side;
pub use rx::{Releaser, RxMsg, RxRing};
pub use segment::{PeerState, Segment};
pub use tx::TxRing;
