//! Shared-memory wire format: segment layout, descriptor rings and validation (work in progress).
