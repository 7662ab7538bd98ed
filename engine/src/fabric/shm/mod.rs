//! The shared-memory fabric.

pub mod wire;
