//! [`DeviceContext`]: the device context rdma_cm resolved for an id, handed to the verbs layer.

use std::fmt;
use std::ptr::NonNull;

use rdma_sys as ffi;

/// The `ibv_context` rdma_cm resolved for a connection ([`CmId::device_context`]), kept open by
/// a reference on librdmacm's device list for as long as this value lives.
///
/// The verbs layer creates the connection's PD, CQs and SRQ on it, so they are on the very
/// device rdma_cm picked. Two values compare equal when they name the same context.
///
/// [`CmId::device_context`]: super::CmId::device_context
pub struct DeviceContext {
    raw: NonNull<ffi::ibv_context>,
    /// librdmacm's device list (`rdma_get_devices`); holds a reference on every context in it
    /// until `rdma_free_devices`.
    list: NonNull<*mut ffi::ibv_context>,
}

// SAFETY: libibverbs contexts and librdmacm's device list may be used and freed from any
// thread (both libraries lock internally).
unsafe impl Send for DeviceContext {}
// SAFETY: `&DeviceContext` only compares or hands out the pointer (through an unsafe fn).
unsafe impl Sync for DeviceContext {}

impl DeviceContext {
    /// Takes a reference on `raw` through librdmacm's device list. `None` if `raw` is null or
    /// not one of librdmacm's contexts.
    pub(super) fn of(raw: *mut ffi::ibv_context) -> Option<Self> {
        let raw = NonNull::new(raw)?;
        let mut n = 0;
        // SAFETY: valid out pointer. The list holds a reference on every librdmacm context
        // until rdma_free_devices.
        let list = NonNull::new(unsafe { ffi::rdma_get_devices(&mut n) })?;
        // SAFETY: the list has `n` entries.
        let known =
            (0..n.max(0) as usize).any(|i| unsafe { *list.as_ptr().add(i) } == raw.as_ptr());
        if !known {
            // SAFETY: list came from rdma_get_devices.
            unsafe { ffi::rdma_free_devices(list.as_ptr()) };
            return None;
        }
        Some(Self { raw, list })
    }

    /// The raw `ibv_context` (never null), for the verbs layer (PD/CQ/SRQ creation, device
    /// queries).
    ///
    /// # Safety
    /// The pointer is valid only while this `DeviceContext` lives. The caller must keep it
    /// alive for as long as it uses the pointer, or any object created on it (hold it inside
    /// the context wrapper that those objects keep alive), and must never close the context
    /// (`ibv_close_device`): it belongs to librdmacm.
    pub unsafe fn as_ptr(&self) -> NonNull<ffi::ibv_context> {
        self.raw
    }
}

impl PartialEq for DeviceContext {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl Eq for DeviceContext {}

impl fmt::Debug for DeviceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceContext").finish_non_exhaustive()
    }
}

impl Drop for DeviceContext {
    fn drop(&mut self) {
        // SAFETY: the list came from rdma_get_devices and is freed once; objects created on the
        // context are gone (the caller's contract on `as_ptr`).
        unsafe { ffi::rdma_free_devices(self.list.as_ptr()) };
    }
}
