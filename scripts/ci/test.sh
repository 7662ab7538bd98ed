#!/usr/bin/env bash
# Every workspace test (unit, integration, doc tests), debug then the release stress tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo test --workspace
cargo test --workspace --release
