#!/usr/bin/env bash
# scripts/ci/conformance.sh - the conformance suite's per-scheme case counts and skips
# (engine/tests/conformance/: one body per behaviour, run over every scheme). It runs no
# case itself: scripts/ci/test.sh runs the suite (cargo test --workspace --release --test
# conformance), the Soft-RoCE VM step its rdma instance (scripts/ci/rdma-vm.sh).
#
# usage: scripts/ci/conformance.sh [--release] [--features rdma]
# Prints, per scheme:  conformance <scheme>: N cases, R run, S skipped
# then one line per skipped case:  SKIP <scheme>/<case>: <reason>
set -euo pipefail
cd "$(dirname "$0")/../.."
args=("$@")
targets=(--test conformance)
[[ " ${args[*]} " == *" rdma "* ]] && targets+=(--test rdma_conformance)
# `--workspace`, not `-p spinwire`: the features resolve as in scripts/ci/test.sh (no rebuild).
bins=$(cargo test --workspace "${args[@]}" "${targets[@]}" --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json, re, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and re.fullmatch("(rdma_)?conformance", m["target"]["name"]):
        print(m["executable"])')
[ -n "$bins" ] || { echo "conformance: could not build the suite" >&2; exit 1; }
for bin in $bins; do
  # The cases: every listed test but the child roles and the report.
  mapfile -t schemes < <("$bin" --list 2>/dev/null | sed -n 's/^\([a-z0-9_]*\)::.*: test$/\1/p' | sort -u)
  for s in "${schemes[@]}"; do
    # The report checks that each skip names a case, and counts what is skipped here.
    report=$(cd engine && "$bin" --ignored --exact "$s::skip_report" --nocapture --test-threads=1 |
      grep -oE '(conformance |SKIP ).*' || true)
    [ -n "$report" ] || { echo "conformance: $s::skip_report printed nothing" >&2; exit 1; }
    echo "$report"
    # libtest's count of the scheme's cases (its ignored tests are the roles and the report)
    # must be the report's.
    listed=$("$bin" --list 2>/dev/null | grep -c "^$s::.*: test$" || true)
    ignored=$("$bin" --list --ignored 2>/dev/null | grep -c "^$s::.*: test$" || true)
    n=$(sed -n "s/^conformance $s: \([0-9]*\) cases.*/\1/p" <<<"$report")
    [ "$n" = "$((listed - ignored))" ] ||
      { echo "conformance: $s: the report counts $n cases, libtest lists $((listed - ignored))" >&2; exit 1; }
  done
done
