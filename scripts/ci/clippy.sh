#!/usr/bin/env bash
# Gate: clippy with every warning an error, all targets (tests, benches, examples).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy >/dev/null 2>&1 || true
cargo clippy --version >/dev/null 2>&1 || { echo "clippy: not installed (rustup component add clippy)" >&2; exit 1; }
cargo clippy --workspace --all-targets -- -D warnings
# The conformance suite is `test = false` (engine/Cargo.toml), which `--all-targets` skips.
cargo clippy -p spinwire --test conformance -- -D warnings
