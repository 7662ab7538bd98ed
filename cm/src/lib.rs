//! spinwire control plane (work in progress).
