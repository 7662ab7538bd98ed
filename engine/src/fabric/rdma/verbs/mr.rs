//! Registered memory: [`MemoryRegion`] and its [`Access`] rights.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys as ffi;

use super::device::ProtectionDomain;
use super::error::{last_os_error, VerbsError};
use crate::placement::{PlacedRegion, Placer};

/// Memory access rights of a [`MemoryRegion`]. Use the least that works: receive buffers need
/// [`Access::LOCAL_WRITE`]; send-only buffers need nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access(u32);

impl Access {
    /// No rights beyond local read (send-only buffers).
    pub const NONE: Self = Self(0);
    /// The HCA may write into the region (receive buffers).
    pub const LOCAL_WRITE: Self = Self(ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    /// A peer may RDMA READ the region with its rkey (an advertised rendezvous send region).
    pub const REMOTE_READ: Self = Self(ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);
    /// A peer may RDMA WRITE the region. Verbs requires [`Access::LOCAL_WRITE`] with it. Only
    /// iWARP needs it for rendezvous: there an RDMA READ's *sink* is written through a remote
    /// write right.
    pub const REMOTE_WRITE: Self = Self(ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0);

    /// Both sets of rights.
    #[must_use]
    pub const fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

/// The memory behind a [`MemoryRegion`]; freed (or unmapped) when dropped, which a region does
/// only after deregistering it.
enum Backing {
    /// From the global allocator with this layout.
    Heap {
        addr: NonNull<u8>,
        layout: std::alloc::Layout,
    },
    /// A placed mapping (hugepages, NUMA node); unmapped when dropped.
    Placed(PlacedRegion),
}

impl Drop for Backing {
    fn drop(&mut self) {
        if let Backing::Heap { addr, layout } = *self {
            // SAFETY: allocated by `MemoryRegion::new` with this layout, freed only here; no
            // registration refers to it any more (a region drops its backing after
            // `ibv_dereg_mr`, and a failed registration never made one).
            unsafe { std::alloc::dealloc(addr.as_ptr(), layout) };
        }
    }
}

/// A registered, page-aligned, zero-initialised memory region that owns its memory.
pub struct MemoryRegion {
    raw: NonNull<ffi::ibv_mr>,
    addr: NonNull<u8>,
    len: usize,
    backing: Backing,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: the region's memory is owned by this object; access to the bytes goes through raw
// pointers whose use is governed by the data path's ownership protocol.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above; `&MemoryRegion` only hands out raw pointers and keys.
unsafe impl Sync for MemoryRegion {}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .finish()
    }
}

impl MemoryRegion {
    /// Allocates `len` bytes (page aligned, zeroed) and registers them with `access`.
    ///
    /// # Errors
    /// [`VerbsError::AllocMemory`], [`VerbsError::RegMr`].
    pub fn new(pd: &Arc<ProtectionDomain>, len: usize, access: Access) -> Result<Self, VerbsError> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .map_err(|_| VerbsError::AllocMemory { len })?;
        // SAFETY: layout has non-zero size.
        let addr = unsafe { std::alloc::alloc_zeroed(layout) };
        let addr = NonNull::new(addr).ok_or(VerbsError::AllocMemory { len })?;
        Self::register(
            pd,
            addr,
            layout.size(),
            Backing::Heap { addr, layout },
            access,
        )
    }

    /// Maps `len` bytes placed by the engine's `placer` (on hugepages when it asks for them,
    /// on the device's or the engine's NUMA node) and registers them with `access`. Registering
    /// faults every page in, on the node the mapping was bound to.
    ///
    /// # Errors
    /// [`VerbsError::Placement`] (e.g. `HugePages::Require` with the pool short),
    /// [`VerbsError::RegMr`].
    pub(crate) fn placed(
        pd: &Arc<ProtectionDomain>,
        len: usize,
        access: Access,
        placer: &Placer,
    ) -> Result<Self, VerbsError> {
        let len = len.max(1);
        let node = placer.node_for_device(&pd.context().name());
        let region = placer
            .anon_on(len, node)
            .map_err(|source| VerbsError::Placement { len, source })?;
        let addr = region.ptr();
        Self::register(pd, addr, len, Backing::Placed(region), access)
    }

    /// Registers `addr..addr+len`, memory that `backing` owns, with `access`; on failure the
    /// backing is dropped (freed or unmapped) with the error.
    fn register(
        pd: &Arc<ProtectionDomain>,
        addr: NonNull<u8>,
        len: usize,
        backing: Backing,
        access: Access,
    ) -> Result<Self, VerbsError> {
        // SAFETY: `addr..addr+len` is live memory owned by `backing`, which the returned
        // object keeps until after ibv_dereg_mr in Drop (on failure no registration exists
        // when it drops here).
        let mr =
            unsafe { ffi::ibv_reg_mr(pd.as_ptr(), addr.as_ptr().cast(), len, access.0 as i32) };
        // The error is read before `backing` drops.
        let raw = NonNull::new(mr).ok_or_else(|| VerbsError::RegMr {
            len,
            source: last_os_error(),
        })?;
        Ok(Self {
            raw,
            addr,
            len,
            backing,
            pd: Arc::clone(pd),
        })
    }

    /// Whether the region's memory is on 2 MiB hugepages.
    pub fn is_huge(&self) -> bool {
        matches!(&self.backing, Backing::Placed(r) if r.is_huge())
    }

    /// Start of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: at least one byte is allocated).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Local key for scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        // SAFETY: valid MR.
        unsafe { (*self.raw.as_ptr()).lkey }
    }

    /// Remote key (what a peer names the region with in RDMA READ/WRITE; meaningful only for
    /// a region registered with a remote right).
    pub fn rkey(&self) -> u32 {
        // SAFETY: valid MR.
        unsafe { (*self.raw.as_ptr()).rkey }
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr and deregistered once, here; the memory is freed
        // (or unmapped) when `backing` drops, after this body.
        unsafe {
            ffi::ibv_dereg_mr(self.raw.as_ptr());
        }
    }
}
