#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/../.."
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt
cargo fmt --all --check
