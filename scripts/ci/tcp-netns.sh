#!/usr/bin/env bash
# scripts/ci/tcp-netns.sh - the tcp:// fabric across two hosts without a VM: the verified
# every-size ping-pong (engine/tests/tcp.rs roles netns_server / netns_client) between two
# network namespaces joined by a veth pair (scripts/netns-two, 198.18.0.1 <-> 198.18.0.2).
# Needs root, like the VM suite; fails with a clear message where namespaces cannot be made.
#
# usage: scripts/ci/tcp-netns.sh [--debug]   (default: release build)
set -euo pipefail
cd "$(dirname "$0")/../.."
profile=(--release)
[ "${1:-}" = "--debug" ] && profile=()
# `--workspace`: the features resolve as in scripts/ci/test.sh (its build, not another).
bin=$(cargo test --workspace "${profile[@]}" --test tcp --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "tcp" and m.get("executable"):
        print(m["executable"])')
[ -x "$bin" ] || { echo "tcp-netns: could not build the tcp test binary" >&2; exit 1; }
port=$((20000 + $$ % 20000))
ep="tcp://198.18.0.1:$port"
role() { echo "SPINWIRE_TEST_ENDPOINT=$ep '$bin' --ignored --exact $1 --nocapture --test-threads=1"; }
bash scripts/netns-two "$(role netns_server)" "$(role netns_client)"
