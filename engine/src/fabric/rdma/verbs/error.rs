//! Errors of the verbs layer: [`VerbsError`] (setup) and [`PostError`] (posting).

use std::io;

/// Errors from setting up verbs objects (control path only).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// `ibv_get_device_list` failed or returned no device.
    #[error("no RDMA device found (is a driver such as rdma_rxe loaded?)")]
    NoDevice,
    /// No device with the requested name.
    #[error("RDMA device {name:?} not found")]
    DeviceNotFound {
        /// The name that was asked for.
        name: String,
    },
    /// `ibv_open_device` failed.
    #[error("ibv_open_device({name}) failed")]
    OpenDevice {
        /// Device name.
        name: String,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// `ibv_alloc_pd` failed.
    #[error("ibv_alloc_pd failed")]
    AllocPd(#[source] io::Error),
    /// `ibv_create_cq` failed.
    #[error("ibv_create_cq with {entries} entries failed")]
    CreateCq {
        /// Requested entries.
        entries: u32,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// `ibv_create_srq` failed.
    #[error("ibv_create_srq with {max_wr} work requests failed")]
    CreateSrq {
        /// Requested receive work requests.
        max_wr: u32,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// Allocating the memory behind a memory region failed.
    #[error("allocating {len} bytes for a memory region failed")]
    AllocMemory {
        /// Requested length in bytes.
        len: usize,
    },
    /// Placing the memory behind a memory region (hugepages, NUMA node) failed.
    #[error("placing {len} bytes for a memory region")]
    Placement {
        /// Requested length in bytes.
        len: usize,
        /// The placement error.
        #[source]
        source: crate::placement::PlacementError,
    },
    /// `ibv_reg_mr` failed (often `ulimit -l` too small).
    #[error("ibv_reg_mr of {len} bytes failed (check `ulimit -l`)")]
    RegMr {
        /// Length in bytes.
        len: usize,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// `ibv_create_qp` failed.
    #[error("ibv_create_qp failed")]
    CreateQp(#[source] io::Error),
    /// `ibv_modify_qp` failed.
    #[error("ibv_modify_qp ({what}) failed")]
    ModifyQp {
        /// Which transition or attribute.
        what: &'static str,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// `ibv_query_qp` failed.
    #[error("ibv_query_qp failed")]
    QueryQp(#[source] io::Error),
    /// `ibv_query_device` failed.
    #[error("ibv_query_device failed")]
    QueryDevice(#[source] io::Error),
    /// `ibv_query_gid` failed.
    #[error("ibv_query_gid(port {port}, index {index}) failed")]
    QueryGid {
        /// Port number.
        port: u8,
        /// GID index.
        index: u8,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// `ibv_query_port` failed.
    #[error("ibv_query_port({port}) failed")]
    QueryPort {
        /// Port number.
        port: u8,
        /// errno.
        #[source]
        source: io::Error,
    },
}

/// A failed post: the provider's return code and the index of the first work request that was
/// not posted (all earlier ones in the chain were posted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("post failed with errno {errno} at work request {bad_index}")]
pub struct PostError {
    /// The provider's errno (e.g. `ENOMEM` for a full queue).
    pub errno: i32,
    /// Index in the chain of the first work request not posted.
    pub bad_index: usize,
}

pub(super) fn last_os_error() -> io::Error {
    io::Error::last_os_error()
}

pub(super) fn post_result<T>(
    rc: i32,
    first: *mut T,
    bad: *mut T,
    next: impl Fn(*mut T) -> *mut T,
) -> Result<(), PostError> {
    if rc == 0 {
        return Ok(());
    }
    let mut idx = 0;
    let mut w = first;
    while !w.is_null() && w != bad {
        w = next(w);
        idx += 1;
    }
    Err(PostError {
        errno: rc,
        bad_index: idx,
    })
}
