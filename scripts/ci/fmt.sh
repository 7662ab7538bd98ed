#!/usr/bin/env bash
# Gate: formatting.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt >/dev/null 2>&1 || true
cargo fmt --version >/dev/null 2>&1 || { echo "fmt: rustfmt is not installed (rustup component add rustfmt)" >&2; exit 1; }
cargo fmt --all --check
