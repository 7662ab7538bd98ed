//! spinwire engine (work in progress).
