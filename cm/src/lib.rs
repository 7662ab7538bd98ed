//! spinwire control plane (work in progress).

pub mod control;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod uds;
