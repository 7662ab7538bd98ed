//! Bounded lock-free SPSC rings (work in progress).
