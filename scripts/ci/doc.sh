#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/../.."
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
