#!/usr/bin/env bash
# scripts/ci/rdma-vm.sh - the Soft-RoCE VM suite: spinwire's RDMA tests against
# a real kernel RDMA stack (rdma_rxe) inside a qemu VM. Called by scripts/test;
# never skipped: a machine that cannot run the VM fails this step.
#
# usage: scripts/ci/rdma-vm.sh [--no-smoke] [--test NAME]... [-- TEST_ARG...]
#   --test NAME   run only the RDMA test target NAME (e.g. rdma_loopback); repeatable
#   --no-smoke    skip the perftest smoke test
#   TEST_ARG...   passed to every test binary after --test-threads=1
#                 (a test-name filter, --nocapture, ...)
# Example, one test of one binary, with its output:
#   scripts/ci/rdma-vm.sh --no-smoke --test rdma_loopback -- send_recv --nocapture
#
# Steps:
#  1. scripts/setup-rdma: host packages (qemu, rdma-core, perftest, libclang, ...).
#  2. If the `spinwire` package has an `rdma` feature, build the RDMA
#     integration tests (the test targets named rdma*: engine/tests/rdma*.rs,
#     cm/tests/rdma*.rs) on the host:
#       cargo test -p spinwire -p cm --features rdma --release --no-run --test rdma_...
#     Without the feature (or without rdma* targets), only the smoke test runs.
#  3. ONE VM boot (scripts/rxe-vm) runs scripts/rdma-vm-suite.sh: the smoke
#     test (scripts/rdma-smoke.sh), then every test binary with --test-threads=1.
#  4. Prints the build, boot, in-VM and total times.
# Binaries must not use -C target-cpu=native: the emulated CPU has no AVX-512.
# Knobs: every RXE_VM_* knob of scripts/rxe-vm (e.g. RXE_VM_TIMEOUT, default here 1200 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

smoke_flag=()
only=()
test_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-smoke) smoke_flag=(--no-smoke) ;;
    --test)
      [ $# -ge 2 ] || { echo "rdma-vm: --test needs a target name" >&2; exit 2; }
      only+=("$2")
      shift
      ;;
    --) shift; test_args=("$@"); break ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "rdma-vm: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

t_start=$SECONDS
secs() { echo "$((SECONDS - $1)) s"; }

# ------------------------------------------------------------ 1. host packages
t0=$SECONDS
scripts/setup-rdma
echo "rdma-vm: host packages ready ($(secs "$t0"))"

# The emulated CPU lacks AVX-512/AMX: host-tuned binaries would die of SIGILL in the VM.
if [[ " ${RUSTFLAGS:-} ${CARGO_BUILD_RUSTFLAGS:-} ${CARGO_ENCODED_RUSTFLAGS:-} " == *target-cpu=native* ]] ||
  grep -qs 'target-cpu=native' .cargo/config.toml .cargo/config; then
  echo "rdma-vm: FAIL: target-cpu=native in RUSTFLAGS or .cargo/config: the test binaries would SIGILL in the VM" >&2
  exit 1
fi

# ------------------------------------------------------- 2. build the RDMA tests
work=$(mktemp -d "${TMPDIR:-/tmp}/rdma-vm.XXXXXX")
trap 'rm -rf "$work"' EXIT
manifest="$work/tests.tsv"
: >"$manifest"
t0=$SECONDS
cargo metadata --no-deps --format-version 1 >"$work/meta.json"
has_rdma=$(jq -r '[.packages[] | select(.name == "spinwire") | .features | has("rdma")] | any' "$work/meta.json")
if [ "$has_rdma" = true ]; then
  # The rdma* integration-test targets of spinwire and cm (engine/tests/rdma*.rs,
  # cm/tests/rdma*.rs). Only these are built: other tests are scripts/ci/test.sh's.
  mapfile -t targets < <(jq -r '.packages[] | select(.name == "spinwire" or .name == "cm") | .targets[]
      | select((.kind | index("test")) and (.name | startswith("rdma"))) | .name' "$work/meta.json" | sort -u)
  if [ ${#only[@]} -gt 0 ]; then
    for n in "${only[@]}"; do
      printf '%s\n' "${targets[@]}" | grep -qx -- "$n" ||
        { echo "rdma-vm: no RDMA test target named $n; have: ${targets[*]}" >&2; exit 1; }
    done
    targets=("${only[@]}")
  fi
  if [ ${#targets[@]} -eq 0 ]; then
    echo "rdma-vm: the rdma feature exists but there are no rdma* test targets: running only the smoke test"
  else
    build=(cargo test -p spinwire -p cm --features rdma --release --no-run)
    for t in "${targets[@]}"; do build+=(--test "$t"); done
    echo "rdma-vm: building the RDMA tests: ${build[*]}"
    if ! "${build[@]}" --message-format=json >"$work/build.json"; then
      jq -r 'select(.reason == "compiler-message") | .message.rendered' "$work/build.json" >&2
      echo "rdma-vm: FAIL: building the RDMA tests failed" >&2
      exit 1
    fi
    # One line per test executable: target name, package dir, path.
    jq -r 'select(.reason == "compiler-artifact" and .profile.test and .executable != null
                  and (.target.kind | index("test")) and (.target.name | startswith("rdma")))
           | [.target.name, (.manifest_path | sub("/Cargo.toml$"; "")), .executable] | @tsv' \
      "$work/build.json" | sort -u >"$manifest"
    echo "rdma-vm: $(wc -l <"$manifest") RDMA test binaries: $(cut -f1 "$manifest" | tr '\n' ' ')(built in $(secs "$t0"))"
    [ "$(wc -l <"$manifest")" -eq ${#targets[@]} ] ||
      { echo "rdma-vm: FAIL: expected ${#targets[@]} test executables (${targets[*]})" >&2; exit 1; }
  fi
else
  echo "rdma-vm: the spinwire package has no 'rdma' feature yet: running only the Soft-RoCE smoke test"
  [ ${#only[@]} -eq 0 ] || { echo "rdma-vm: --test given, but there are no RDMA tests to run" >&2; exit 1; }
fi

# ------------------------------------------------------- 3. one VM boot for all
t0=$SECONDS
cmd=$(printf '%q ' bash "$ROOT/scripts/rdma-vm-suite.sh" "${smoke_flag[@]}" "$manifest" "${test_args[@]}")
set +e
RXE_VM_TIMES=1 RXE_VM_TIMEOUT=${RXE_VM_TIMEOUT:-1200} scripts/rxe-vm "$cmd"
rc=$?
set -e
echo "rdma-vm: VM step $(secs "$t0"), whole rdma-vm step $(secs "$t_start")"
case $rc in
  0) echo "rdma-vm: PASS" ;;
  124) echo "rdma-vm: FAIL: the VM timed out" >&2 ;;
  125) echo "rdma-vm: FAIL: the VM could not be built, booted or set up (see above)" >&2 ;;
  *) echo "rdma-vm: FAIL: the suite failed in the VM (exit $rc)" >&2 ;;
esac
exit $rc
