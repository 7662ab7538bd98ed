//! The conformance suite over `rdma://`: the bodies of `conformance/` (see
//! `conformance/mod.rs`) on a real RDMA device, Soft-RoCE in the VM, with each connection's own
//! receive queue (`rdma::*`) and with a shared receive queue per poller (`rdma_srq::*`).
//!
//! `scripts/ci/rdma-vm.sh` runs it inside the VM (`RXE_VM_IP` set), one test at a time:
//! `scripts/ci/rdma-vm.sh --no-smoke --test rdma_conformance`. Outside the VM every case prints
//! `SKIP rdma/<case>: RXE_VM_IP unset ...` and passes.
#![cfg(feature = "rdma")]

#[macro_use]
#[path = "conformance/mod.rs"]
mod suite;

conformance!(rdma, crate::suite::schemes::RDMA);
// The same cases with a shared receive queue per poller and overcommitted windows (each
// connection granted 4 of its 16 buffers' worth): `rdma_srq::*`.
conformance!(rdma_srq, crate::suite::schemes::RDMA_SRQ);
