//! Placed memory: buffer pools, shm segments and RDMA regions on 2 MiB hugepages and on a
//! chosen NUMA node ([`EngineBuilder::hugepages`](crate::EngineBuilder::hugepages),
//! [`EngineBuilder::numa`](crate::EngineBuilder::numa)).
//!
//! One [`Placer`] per engine (in its configuration) decides, per region, whether to ask for
//! hugepages ([`Placer::wants_huge`]), maps anonymous regions ([`Placer::anon`]), binds a range
//! to the engine's node ([`Placer::bind`]), turns a failed hugepage attempt into a fallback or
//! the typed error ([`Placer::huge_failed`]) and counts what every region got
//! ([`PlacementStats`], in [`EngineStats`](crate::EngineStats)). The shm segment's memfd
//! (`MFD_HUGETLB`) is made by the shm wire layer with the flags this module exports. Setup only:
//! nothing here runs on the data path.
//!
//! This module sits below the fabrics and the configuration and imports neither.

mod sys;
pub(crate) mod topology;

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub(crate) use sys::MFD_HUGE_2MB;

/// The size of a huge page: regions on hugepages are rounded up to a multiple of it.
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// Rounds `bytes` up to a multiple of [`HUGE_PAGE_SIZE`] (saturating).
pub(crate) fn round_huge(bytes: usize) -> usize {
    bytes
        .checked_next_multiple_of(HUGE_PAGE_SIZE)
        .unwrap_or(usize::MAX & !(HUGE_PAGE_SIZE - 1))
}

/// Whether pools, shm segments and RDMA regions come from 2 MiB hugepages
/// ([`EngineBuilder::hugepages`](crate::EngineBuilder::hugepages)).
///
/// Hugepages come from the kernel's reserved pool (`/proc/sys/vm/nr_hugepages`); a region on
/// them is rounded up to a multiple of 2 MiB and its pages are reserved when it is mapped (so a
/// short pool is an error at setup, never a fault on the data path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HugePages {
    /// 4 KiB pages only.
    Off,
    /// The default: every region of at least one huge page (2 MiB) is placed on hugepages
    /// while the pool has them, else on 4 KiB pages (the first fallback of an engine is logged
    /// once, each is counted in [`PlacementStats::fallbacks`]). Smaller regions stay on 4 KiB
    /// pages: rounding them up would mostly waste the page.
    #[default]
    Try,
    /// Every region is placed on hugepages, rounded up to 2 MiB; when the pool is short, the
    /// engine ([`build`](crate::EngineBuilder::build), when none is free at all) or the
    /// connection fails with [`PlacementError::HugePagesUnavailable`].
    Require,
}

/// The NUMA node pool memory is placed on ([`EngineBuilder::numa`](crate::EngineBuilder::numa)).
///
/// Placement is a preference (`mbind(MPOL_PREFERRED)` before the first touch): pages come from
/// the node while it has free memory, from another when it has none, so a full node is never a
/// failed page fault on the data path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum NumaPolicy {
    /// The default: no policy; the kernel places pages (first touch).
    #[default]
    Off,
    /// The node of the first poller's core; in run-to-completion mode the node of the core the
    /// thread calling [`build`](crate::EngineBuilder::build) runs on.
    Local,
    /// Node `n` (`/sys/devices/system/node/node<n>` must exist).
    Node(u32),
    /// RDMA regions on their device's node (`/sys/class/infiniband/<dev>/device/numa_node`),
    /// everything else (and RDMA regions of a device with no node, e.g. Soft-RoCE) as
    /// [`NumaPolicy::Local`].
    Device,
}

/// Placing memory failed, or the placement asked for cannot be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlacementError {
    /// [`HugePages::Require`] and the hugepage pool is short.
    #[error(
        "no 2 MiB hugepages for {bytes} bytes ({free} of {total} reserved pages free); reserve \
         them with `echo N > /proc/sys/vm/nr_hugepages` (as root) or `hugepages=N` on the kernel \
         command line, or use HugePages::Try"
    )]
    HugePagesUnavailable {
        /// The region's size, rounded up to 2 MiB.
        bytes: usize,
        /// Free 2 MiB pages when it failed.
        free: u64,
        /// Reserved 2 MiB pages (`nr_hugepages`).
        total: u64,
        /// What the kernel said (`mmap`, `memfd_create`, `fallocate`, ...).
        #[source]
        source: io::Error,
    },
    /// [`NumaPolicy::Node`] names a node this machine does not have.
    #[error("NUMA node {node} does not exist (online nodes: {online})")]
    NoSuchNode {
        /// The node asked for.
        node: u32,
        /// `/sys/devices/system/node/online`.
        online: String,
    },
    /// [`NumaPolicy::Local`]: the node of a CPU could not be read from sysfs.
    #[error("reading the NUMA node of CPU {cpu} from /sys/devices/system/cpu")]
    CpuNode {
        /// The CPU.
        cpu: usize,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// `mbind` of a region to its node failed.
    #[error("binding {bytes} bytes to NUMA node {node} (mbind)")]
    Bind {
        /// The node.
        node: u32,
        /// The region's size.
        bytes: usize,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// Mapping a region on 4 KiB pages failed.
    #[error("mapping {bytes} bytes of pool memory")]
    Map {
        /// The size asked for.
        bytes: usize,
        /// The errno.
        #[source]
        source: io::Error,
    },
}

/// What an engine's regions got ([`EngineStats::placement`](crate::EngineStats::placement)):
/// counts and bytes of every region placed since the engine started (pools, shm segments the
/// engine created or attached, RDMA regions), by page size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlacementStats {
    /// The hugepage policy.
    pub hugepages: HugePages,
    /// The node regions are placed on (`None`: no NUMA policy).
    pub node: Option<u32>,
    /// Regions on 2 MiB pages.
    pub huge_regions: u64,
    /// Their bytes (rounded up to 2 MiB).
    pub huge_bytes: u64,
    /// Regions on 4 KiB pages.
    pub small_regions: u64,
    /// Their bytes.
    pub small_bytes: u64,
    /// Regions that asked for hugepages and fell back to 4 KiB pages
    /// ([`HugePages::Try`] with the pool short); included in `small_*`.
    pub fallbacks: u64,
}

/// One engine's placement: the policies, resolved at build, and the counts.
#[derive(Debug)]
pub(crate) struct Placer {
    huge: HugePages,
    numa: NumaPolicy,
    node: Option<u32>,
    huge_regions: AtomicU64,
    huge_bytes: AtomicU64,
    small_regions: AtomicU64,
    small_bytes: AtomicU64,
    fallbacks: AtomicU64,
    warned: AtomicBool,
}

impl Placer {
    /// Resolves the policies: the node of [`NumaPolicy::Local`] from `pollers` (or the calling
    /// thread's CPU), a [`NumaPolicy::Node`] checked against sysfs, and for
    /// [`HugePages::Require`] at least one free huge page.
    ///
    /// # Errors
    ///
    /// [`PlacementError::NoSuchNode`], [`PlacementError::CpuNode`],
    /// [`PlacementError::HugePagesUnavailable`].
    pub(crate) fn resolve(
        huge: HugePages,
        numa: NumaPolicy,
        pollers: &[usize],
    ) -> Result<Placer, PlacementError> {
        let node = match numa {
            NumaPolicy::Off => None,
            NumaPolicy::Node(node) => {
                if node >= sys::MAX_NODES || !topology::node_exists(node) {
                    return Err(PlacementError::NoSuchNode {
                        node,
                        online: topology::online_nodes(),
                    });
                }
                Some(node)
            }
            NumaPolicy::Local | NumaPolicy::Device => {
                let cpu = pollers
                    .first()
                    .copied()
                    .or_else(sys::current_cpu)
                    .unwrap_or(0);
                let node = topology::node_of_cpu(cpu)
                    .map_err(|source| PlacementError::CpuNode { cpu, source })?;
                Some(node.unwrap_or(0))
            }
        };
        if huge == HugePages::Require {
            let (free, total) = topology::hugepages_2m();
            if free == 0 {
                return Err(PlacementError::HugePagesUnavailable {
                    bytes: HUGE_PAGE_SIZE,
                    free,
                    total,
                    source: io::Error::from_raw_os_error(libc::ENOMEM),
                });
            }
        }
        Ok(Placer {
            huge,
            numa,
            node,
            huge_regions: AtomicU64::new(0),
            huge_bytes: AtomicU64::new(0),
            small_regions: AtomicU64::new(0),
            small_bytes: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            warned: AtomicBool::new(false),
        })
    }

    /// No hugepages, no node (for tests and for memory outside any engine).
    #[allow(dead_code)] // not every build has a user
    pub(crate) fn off() -> Placer {
        Placer::resolve(HugePages::Off, NumaPolicy::Off, &[]).unwrap_or_else(|_| unreachable!())
    }

    /// Whether a region of `bytes` should ask for hugepages.
    pub(crate) fn wants_huge(&self, bytes: usize) -> bool {
        match self.huge {
            HugePages::Off => false,
            HugePages::Try => bytes >= HUGE_PAGE_SIZE,
            HugePages::Require => bytes > 0,
        }
    }

    /// The node regions are placed on.
    pub(crate) fn node(&self) -> Option<u32> {
        self.node
    }

    /// The node of an RDMA region on device `ibdev`: the device's under
    /// [`NumaPolicy::Device`] when sysfs names one, else the engine's.
    #[allow(dead_code)] // used by the rdma fabric only
    pub(crate) fn node_for_device(&self, ibdev: &str) -> Option<u32> {
        match self.numa {
            NumaPolicy::Device => topology::device_node(ibdev).or(self.node),
            _ => self.node,
        }
    }

    /// A hugepage attempt for `bytes` failed with `source`: under [`HugePages::Require`] the
    /// typed error; under [`HugePages::Try`] a fallback (counted; the engine's first is logged,
    /// once).
    ///
    /// # Errors
    ///
    /// [`PlacementError::HugePagesUnavailable`] under [`HugePages::Require`].
    pub(crate) fn huge_failed(
        &self,
        bytes: usize,
        source: io::Error,
    ) -> Result<(), PlacementError> {
        let (free, total) = topology::hugepages_2m();
        if self.huge == HugePages::Require {
            return Err(PlacementError::HugePagesUnavailable {
                bytes: round_huge(bytes),
                free,
                total,
                source,
            });
        }
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::info!(
                bytes,
                free,
                total,
                error = %source,
                "hugepages: none to be had, falling back to 4 KiB pages (logged once per engine; \
                 reserve them with /proc/sys/vm/nr_hugepages)"
            );
        }
        Ok(())
    }

    /// Counts a region placed: `bytes` on hugepages or not.
    pub(crate) fn record(&self, huge: bool, bytes: usize) {
        let (n, b) = if huge {
            (&self.huge_regions, &self.huge_bytes)
        } else {
            (&self.small_regions, &self.small_bytes)
        };
        n.fetch_add(1, Ordering::Relaxed);
        b.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Sets the NUMA policy of a fresh range to `node` (nothing for `None`); before first touch.
    ///
    /// # Errors
    ///
    /// [`PlacementError::Bind`].
    ///
    /// # Safety
    ///
    /// `ptr .. ptr + bytes` is (part of) a mapping this process owns, `ptr` page aligned.
    pub(crate) unsafe fn bind(
        &self,
        ptr: NonNull<u8>,
        bytes: usize,
        node: Option<u32>,
    ) -> Result<(), PlacementError> {
        let Some(node) = node else {
            return Ok(());
        };
        // SAFETY: the caller's contract.
        unsafe { sys::mbind_preferred(ptr, bytes, node) }.map_err(|source| PlacementError::Bind {
            node,
            bytes,
            source,
        })
    }

    /// A zeroed anonymous region of `bytes` on the engine's node, on hugepages when
    /// [`wants_huge`](Self::wants_huge) (and they can be had).
    ///
    /// # Errors
    ///
    /// [`PlacementError::HugePagesUnavailable`] (under [`HugePages::Require`]),
    /// [`PlacementError::Map`], [`PlacementError::Bind`].
    pub(crate) fn anon(&self, bytes: usize) -> Result<PlacedRegion, PlacementError> {
        self.anon_on(bytes, self.node)
    }

    /// [`anon`](Self::anon) on `node` instead of the engine's node.
    ///
    /// # Errors
    ///
    /// As [`anon`](Self::anon).
    pub(crate) fn anon_on(
        &self,
        bytes: usize,
        node: Option<u32>,
    ) -> Result<PlacedRegion, PlacementError> {
        if bytes == 0 {
            return Ok(PlacedRegion {
                ptr: NonNull::dangling(),
                bytes: 0,
                huge: false,
            });
        }
        if bytes > isize::MAX as usize / 2 {
            return Err(PlacementError::Map {
                bytes,
                source: io::Error::from_raw_os_error(libc::ENOMEM),
            });
        }
        let mut region = None;
        if self.wants_huge(bytes) {
            let len = round_huge(bytes);
            match sys::map_anon(len, true) {
                Ok(ptr) => {
                    region = Some(PlacedRegion {
                        ptr,
                        bytes: len,
                        huge: true,
                    })
                }
                Err(e) => self.huge_failed(bytes, e)?,
            }
        }
        let region = match region {
            Some(r) => r,
            None => {
                let ptr = sys::map_anon(bytes, false)
                    .map_err(|source| PlacementError::Map { bytes, source })?;
                PlacedRegion {
                    ptr,
                    bytes,
                    huge: false,
                }
            }
        };
        // SAFETY: the region was just mapped by us, page aligned, and nothing touched it yet.
        unsafe { self.bind(region.ptr, region.bytes, node) }?;
        self.record(region.huge, region.bytes);
        Ok(region)
    }

    /// The counts so far.
    pub(crate) fn stats(&self) -> PlacementStats {
        PlacementStats {
            hugepages: self.huge,
            node: self.node,
            huge_regions: self.huge_regions.load(Ordering::Relaxed),
            huge_bytes: self.huge_bytes.load(Ordering::Relaxed),
            small_regions: self.small_regions.load(Ordering::Relaxed),
            small_bytes: self.small_bytes.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
        }
    }
}

/// A zeroed anonymous mapping of [`Placer::anon`], unmapped on drop. Pages are taken on first
/// touch (hugepages are reserved at mapping time).
#[derive(Debug)]
pub(crate) struct PlacedRegion {
    ptr: NonNull<u8>,
    bytes: usize,
    huge: bool,
}

// SAFETY: plain memory; who may touch which byte is governed by the owner's protocol (the
// engine's buffer ownership), not by this handle.
unsafe impl Send for PlacedRegion {}
// SAFETY: as above; `&PlacedRegion` exposes nothing but the pointer.
unsafe impl Sync for PlacedRegion {}

impl PlacedRegion {
    /// The start (dangling for an empty region).
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The mapped length (rounded up to 2 MiB on hugepages).
    #[allow(dead_code)] // used by the rdma fabric only
    pub(crate) fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the region is on 2 MiB pages.
    #[allow(dead_code)] // used by the rdma fabric only
    pub(crate) fn is_huge(&self) -> bool {
        self.huge
    }
}

impl Drop for PlacedRegion {
    fn drop(&mut self) {
        if self.bytes > 0 {
            // SAFETY: mapped by `Placer::anon_on` with this length, unmapped once; the owner
            // drops the region only after every use of its memory.
            unsafe { sys::unmap(self.ptr, self.bytes) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_and_the_try_threshold() {
        assert_eq!(round_huge(1), HUGE_PAGE_SIZE);
        assert_eq!(round_huge(HUGE_PAGE_SIZE), HUGE_PAGE_SIZE);
        assert_eq!(round_huge(HUGE_PAGE_SIZE + 1), 2 * HUGE_PAGE_SIZE);
        let p = Placer::off();
        assert!(!p.wants_huge(64 << 20));
        let p = Placer::resolve(HugePages::Try, NumaPolicy::Off, &[]).unwrap();
        assert!(!p.wants_huge(HUGE_PAGE_SIZE - 1));
        assert!(p.wants_huge(HUGE_PAGE_SIZE));
    }

    /// Counts the events logged while it is the thread's default subscriber.
    struct CountEvents(std::sync::Arc<AtomicU64>);

    impl tracing::Subscriber for CountEvents {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[test]
    fn try_falls_back_with_one_log_line_per_engine_and_require_fails_typed() {
        let events = std::sync::Arc::new(AtomicU64::new(0));
        let sub = CountEvents(events.clone());
        tracing::subscriber::with_default(sub, || {
            for _ in 0..2 {
                let p = Placer::resolve(HugePages::Try, NumaPolicy::Off, &[]).unwrap();
                let before = events.load(Ordering::Relaxed);
                for _ in 0..3 {
                    let e = io::Error::from_raw_os_error(libc::ENOMEM);
                    p.huge_failed(4 << 20, e).unwrap();
                }
                assert_eq!(
                    events.load(Ordering::Relaxed) - before,
                    1,
                    "one line per engine"
                );
                assert_eq!(p.stats().fallbacks, 3);
            }
        });
        let mut p = Placer::off();
        p.huge = HugePages::Require;
        let e = p
            .huge_failed(3 << 20, io::Error::from_raw_os_error(libc::ENOMEM))
            .unwrap_err();
        let PlacementError::HugePagesUnavailable { bytes, source, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*bytes, 4 << 20, "rounded up to 2 MiB");
        assert_eq!(source.raw_os_error(), Some(libc::ENOMEM));
        assert!(e.to_string().contains("hugepages=N"), "{e}");
        assert_eq!(p.stats().fallbacks, 0);
    }

    #[test]
    fn an_anonymous_region_is_zeroed_writable_counted_and_bound_to_node_0() {
        let p = Placer::resolve(HugePages::Try, NumaPolicy::Node(0), &[]).unwrap();
        let r = p.anon(3 << 20).unwrap();
        // SAFETY: the region is ours, `len()` bytes long.
        let s = unsafe { std::slice::from_raw_parts_mut(r.ptr().as_ptr(), r.len()) };
        assert!(s.iter().step_by(4096).all(|&b| b == 0));
        s[r.len() - 1] = 7;
        let st = p.stats();
        assert_eq!(st.node, Some(0));
        assert_eq!(st.huge_regions + st.small_regions, 1);
        if r.is_huge() {
            assert_eq!((st.huge_bytes, r.len()), (4 << 20, 4 << 20));
        } else {
            assert_eq!((st.small_bytes, st.fallbacks), (3 << 20, 1));
        }
    }
}
