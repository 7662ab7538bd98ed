#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/../.."
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy
cargo clippy --workspace --all-targets -- -D warnings
