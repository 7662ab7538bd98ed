#!/usr/bin/env bash
# loom model checks of the lock-free rings (own target dir: --cfg loom changes every crate).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
  cargo test -p rings --release --target-dir target/loom --test loom
