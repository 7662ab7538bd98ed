#!/usr/bin/env bash
# scripts/rdma-vm-suite.sh - the RDMA test suite. Runs INSIDE the VM, in one boot:
#   scripts/rxe-vm scripts/rdma-vm-suite.sh [--no-smoke] [MANIFEST [TEST_ARG...]]
# scripts/ci/rdma-vm.sh builds the test binaries on the host, writes MANIFEST
# and calls this; run that, not this, unless you wrote MANIFEST yourself.
#
# 1. scripts/rdma-smoke.sh (unless --no-smoke); if it fails, nothing else runs:
#    the RDMA stack itself is broken.
# 2. every test binary in MANIFEST, one after the other, each in its package's
#    directory (as cargo runs them) with `--test-threads=1 TEST_ARG...`.
#    MANIFEST lines: TARGET_NAME<TAB>PACKAGE_DIR<TAB>EXECUTABLE
# Exit status: 0 if everything passed, else 1.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
smoke=1
if [ "${1:-}" = --no-smoke ]; then
  smoke=0
  shift
fi
manifest=${1:-}
[ $# -gt 0 ] && shift
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

T0=$(now)
if [ $smoke = 1 ]; then
  if ! bash "$HERE/rdma-smoke.sh"; then
    echo "rdma-vm-suite: FAIL: the smoke test failed; test binaries not run"
    exit 1
  fi
  echo "rdma-vm-suite: smoke test took $(since "$T0") s"
fi
[ -n "$manifest" ] || exit 0
[ -r "$manifest" ] || { echo "rdma-vm-suite: cannot read manifest $manifest"; exit 1; }

passed=()
failed=()
while IFS=$'\t' read -r name dir exe; do
  [ -n "$name" ] || continue
  echo "rdma-vm-suite: ==> $name ($exe)"
  t0=$(now)
  (cd "$dir" && CARGO_MANIFEST_DIR=$dir "$exe" --test-threads=1 "$@") </dev/null
  rc=$?
  if [ $rc -eq 0 ]; then
    passed+=("$name")
    echo "rdma-vm-suite: <== $name ok ($(since "$t0") s)"
  else
    failed+=("$name")
    echo "rdma-vm-suite: <== $name FAILED (exit $rc, $(since "$t0") s)"
  fi
done <"$manifest"

echo "rdma-vm-suite: ${#passed[@]} test binaries passed, ${#failed[@]} failed${failed[*]:+: ${failed[*]}} ($(since "$T0") s in the VM)"
[ ${#failed[@]} -eq 0 ]
