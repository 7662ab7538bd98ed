//! spinwire engine (work in progress: see the engine issue).

pub mod fabric;
