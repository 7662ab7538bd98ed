//! RDMA fabric (feature `rdma`): RC queue pairs over verbs, connected through rdma_cm.
//!
//! - [`verbs`]: the thin safe layer over libibverbs (the only FFI in the engine).
//!
//! Building needs libibverbs-dev, librdmacm-dev and libclang-dev; on Debian 12 that is
//! libclang 14 (rdma-sys 0.3's bindgen fails with libclang >= 16).

pub mod verbs;
