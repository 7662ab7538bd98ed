#!/usr/bin/env bash
# Gate: every criterion bench compiles (`cargo bench --no-run`).
# Built with the release profile, not the bench profile (Cargo.toml: `lto = true`): the test
# step has already built every dependency and library in release, so only the bench targets
# compile here (about 15 s against 3 minutes for a fresh LTO build of the workspace). What is
# checked is that the benches build; `cargo bench` itself still uses the bench profile.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo bench --workspace --no-run --profile release
