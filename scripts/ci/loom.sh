#!/usr/bin/env bash
# loom model checks of the lock-free rings (own target dir: --cfg loom changes every crate):
# the `rings` SPSC ring, the engine's record ring (`spinwire::record::ring`) and the doorbell
# protocol of IdleStrategy::Block (`spinwire::doorbell`) and the pollers' wake-up (`spinwire::wake`).
# Every interleaving with up to LOOM_MAX_PREEMPTIONS (default 4) preemptions; the models'
# spin-waits yield to loom, which makes unbounded exploration blow up, so keep a bound.
# About 10 s (rings) plus a few seconds (record ring) on 2 idle cores with the default, after
# the first build.
set -euo pipefail
cd "$(dirname "$0")/../.."
export RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-4}"
cargo test -p rings --release --target-dir target/loom --test loom
cargo test -p spinwire --release --target-dir target/loom --test record_ring_loom
cargo test -p spinwire --release --target-dir target/loom --test doorbell_loom
cargo test -p spinwire --release --target-dir target/loom --test poller_wake_loom
