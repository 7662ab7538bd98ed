#!/usr/bin/env bash
# Gates for the `rdma` feature: the FFI code behind it (engine/src/fabric/rdma/, cm/src/rdma/)
# gets the same clippy (-D warnings, undocumented unsafe denied) and rustdoc checks as the
# default build. Needs libibverbs-dev, librdmacm-dev and libclang 14: scripts/setup-rdma installs
# them (root on Debian).
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/setup-rdma
cargo clippy -p spinwire -p cm -p bench --features rdma --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc -p spinwire -p cm -p bench --features rdma --no-deps
