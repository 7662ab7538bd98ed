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

/// The memory behind a [`MemoryRegion`].
enum Backing {
    /// From the global allocator with this layout.
    Heap(std::alloc::Layout),
    /// A placed mapping (hugepages, NUMA node); unmapped when dropped.
    Placed(PlacedRegion),
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
        // SAFETY: `addr..addr+len` is a live allocation owned by the returned object and
        // freed only after ibv_dereg_mr in Drop.
        let mr =
            unsafe { ffi::ibv_reg_mr(pd.as_ptr(), addr.as_ptr().cast(), len, access.0 as i32) };
        match NonNull::new(mr) {
            Some(raw) => Ok(Self {
                raw,
                addr,
                len: layout.size(),
                backing: Backing::Heap(layout),
                pd: Arc::clone(pd),
            }),
            None => {
                let source = last_os_error();
                // SAFETY: allocated above with `layout`, never registered.
                unsafe { std::alloc::dealloc(addr.as_ptr(), layout) };
                Err(VerbsError::RegMr { len, source })
            }
        }
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
        // SAFETY: `addr..addr+len` is a live mapping of at least `len` bytes owned by the
        // returned object and unmapped only after ibv_dereg_mr in Drop (or here, on failure,
        // by dropping `region`).
        let mr =
            unsafe { ffi::ibv_reg_mr(pd.as_ptr(), addr.as_ptr().cast(), len, access.0 as i32) };
        match NonNull::new(mr) {
            Some(raw) => Ok(Self {
                raw,
                addr,
                len,
                backing: Backing::Placed(region),
                pd: Arc::clone(pd),
            }),
            None => Err(VerbsError::RegMr {
                len,
                source: last_os_error(),
            }),
        }
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
        // SAFETY: registered by ibv_reg_mr; the memory is freed (or, placed, unmapped when
        // `backing` drops after this) only after deregistration.
        unsafe {
            ffi::ibv_dereg_mr(self.raw.as_ptr());
            if let Backing::Heap(layout) = self.backing {
                std::alloc::dealloc(self.addr.as_ptr(), layout);
            }
        }
    }
}
