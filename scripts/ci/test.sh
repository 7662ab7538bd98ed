#!/usr/bin/env bash
# Every workspace test (unit, integration, doc tests), debug then the release stress tests;
# then the conformance suite (once, in release: engine/Cargo.toml keeps it out of plain
# `cargo test`) and its per-scheme case counts and skips (scripts/ci/conformance.sh).
# The suite here, and the later steps that reuse this build (conformance.sh, soak, tcp-netns,
# ffi), select the whole workspace (`--workspace`, with target filters), so that features
# resolve as in the runs above and nothing is rebuilt for another feature set (`-p spinwire`
# rebuilt criterion, clap, regex and the testkit for the suite: 50 s of CI's build time). The
# loom and rdma steps build with their own cfg and features anyway.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo test --workspace
cargo test --workspace --release
cargo test --workspace --release --test conformance
bash scripts/ci/conformance.sh --release
