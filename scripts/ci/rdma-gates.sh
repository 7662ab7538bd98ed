#!/usr/bin/env bash
# Gates for the `rdma` feature: the FFI code behind it (engine/src/fabric/rdma/, cm/src/rdma/)
# gets the same clippy (-D warnings, undocumented unsafe denied) and rustdoc checks as the
# default build, and the engine's unit tests run with the feature on (the rdma module's own:
# its queues, frames and parking, which need no device; the VM runs the integration tests,
# scripts/ci/rdma-vm.sh). Needs libibverbs-dev, librdmacm-dev and libclang 14: scripts/setup-rdma installs
# them (root on Debian).
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/setup-rdma
cargo clippy -p spinwire -p cm -p bench --features rdma --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc -p spinwire -p cm -p bench --features rdma --no-deps
cargo test -p spinwire --release --features rdma --lib
