//! The conformance suite over `mem://`, `shm://` and `tcp://` (loopback): every body of
//! `conformance/` runs once per scheme, as `<scheme>::<case>` (see `conformance/mod.rs`).
//! `rdma://` runs the same bodies in `rdma_conformance.rs`, inside the Soft-RoCE VM.
//!
//! Run one scheme: `cargo test -p spinwire --test conformance -- tcp::`. The per-scheme case
//! counts and skips: `scripts/ci/conformance.sh`.

#[macro_use]
#[path = "conformance/mod.rs"]
mod suite;

conformance!(shm, crate::suite::schemes::SHM);
conformance!(tcp, crate::suite::schemes::TCP);
conformance!(mem, crate::suite::schemes::MEM);
