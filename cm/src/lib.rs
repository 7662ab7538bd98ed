//! spinwire control plane (work in progress).

pub mod control;
pub mod uds;
