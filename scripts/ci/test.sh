#!/usr/bin/env bash
# Every workspace test (unit, integration, doc tests), debug then the release stress tests;
# then the conformance suite (once, in release: engine/Cargo.toml keeps it out of plain
# `cargo test`) and its per-scheme case counts and skips (scripts/ci/conformance.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo test --workspace
cargo test --workspace --release
cargo test -p spinwire --release --test conformance
bash scripts/ci/conformance.sh --release
