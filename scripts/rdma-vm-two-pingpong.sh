#!/usr/bin/env bash
# scripts/rdma-vm-two-pingpong.sh - spinwire's RDMA fabric across two hosts:
# the rdma_engine test binary's two-host roles in two Soft-RoCE VMs
# (scripts/rxe-vm-two).
#
# usage: scripts/rdma-vm-two-pingpong.sh
#
# Steps:
#  1. scripts/setup-rdma; build the rdma_engine test binary on the host:
#       cargo test -p spinwire --features rdma --release --no-run --test rdma_engine
#  2. scripts/rxe-vm-two boots the two VMs; in them, from engine/:
#       server VM (10.11.0.1): SPINWIRE_RDMA_SERVE_PORT=PORT rdma_engine --ignored --exact remote_echo_server
#       client VM (10.11.0.2): SPINWIRE_RDMA_REMOTE=10.11.0.1:PORT rdma_engine --ignored --exact remote_ping_pong
#     The roles are #[ignore]d tests (a plain run lists them as ignored) and fail
#     without their variable. The client connects through rdma_cm (retrying until
#     the server listens) and runs verified ping-pongs at every size from 1 B to
#     300 B; the server echoes them and checks the count. Then, in the same boot,
#     remote_link_down_server / remote_link_down_client: the server takes its
#     link down (ip link set eth0 down) and the client must see its connection
#     fail (liveness timeout or transport error) within the liveness timeout
#     + 20 %. Each role must also
#     print its result line: a run that did not reach the role (a wrong name
#     runs no test and exits 0) counts as a failure, not a pass.
# Exit status: 0 if both roles passed; else the first failure's status (1 for a
# test failure or a missing result line, 124/125 as in scripts/rxe-vm).
#
# Cost: two TCG VMs on the host's cores, about 20-40 s in all. Round-trip times
# printed by the client are emulation figures, never performance claims.
# Knobs: RDMA_TWO_PORT=7500 (the server's rdma_cm port; the link-down pair uses the next one); every RXE_VM_* knob of
# scripts/rxe-vm-two and scripts/rxe-vm (RXE_VM_TIMEOUT defaults to 300 here).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

case "${1:-}" in
  '') ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "rdma-vm-two-pingpong: no arguments expected (see --help)" >&2; exit 2 ;;
esac
port=${RDMA_TWO_PORT:-7500}
[[ $port =~ ^[0-9]+$ ]] || { echo "rdma-vm-two-pingpong: RDMA_TWO_PORT must be a number" >&2; exit 2; }

if [[ " ${RUSTFLAGS:-} ${CARGO_BUILD_RUSTFLAGS:-} ${CARGO_ENCODED_RUSTFLAGS:-} " == *target-cpu=native* ]]; then
  echo "rdma-vm-two-pingpong: FAIL: target-cpu=native in RUSTFLAGS: the test would SIGILL in the VM" >&2
  exit 1
fi

t0=$SECONDS
scripts/setup-rdma
echo "rdma-vm-two-pingpong: building the rdma_engine test binary"
log=$(mktemp "${TMPDIR:-/tmp}/rdma-vm-two.XXXXXX")
trap 'rm -f "$log"' EXIT
if ! cargo test -p spinwire --features rdma --release --no-run --test rdma_engine \
  --message-format=json >"$log"; then
  jq -r 'select(.reason == "compiler-message") | .message.rendered' "$log" >&2
  echo "rdma-vm-two-pingpong: FAIL: building the rdma_engine test failed" >&2
  exit 1
fi
bin=$(jq -r 'select(.reason == "compiler-artifact" and .profile.test and .executable != null
                    and .target.name == "rdma_engine") | .executable' "$log" | tail -n 1)
[ -x "$bin" ] || { echo "rdma-vm-two-pingpong: FAIL: no rdma_engine test executable was built" >&2; exit 1; }
echo "rdma-vm-two-pingpong: $bin (built in $((SECONDS - t0)) s)"

# role TEST MARKER: run one ignored test with its output shown; pass only if it
# passed AND printed MARKER (proof that it ran its role, not zero tests).
# shellcheck disable=SC2016 # expanded in the guest
role='out=$(mktemp); "$0" --ignored --exact "$1" --nocapture --test-threads=1 2>&1 | tee "$out"; rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || exit "$rc"
grep -q -- "$2" "$out" || { echo "rdma-vm-two-pingpong: FAIL: $1 passed without running its role (no \"$2\")"; exit 1; }'
q() { printf '%q ' "$@"; }
down_port=$((port + 1))
# Second pair of roles in the same boot: the server takes its link down (last, since the
# server VM has no network afterwards) and the client must see the connection fail within
# the liveness timeout + 20 %.
srv="cd $(q "$ROOT/engine") && SPINWIRE_RDMA_SERVE_PORT=$port bash -c $(q "$role") $(q "$bin" remote_echo_server 'echoed ') \
  && SPINWIRE_RDMA_LINKDOWN_PORT=$down_port bash -c $(q "$role") $(q "$bin" remote_link_down_server 'link down')"
cli="cd $(q "$ROOT/engine") && SPINWIRE_RDMA_REMOTE=\$RXE_VM_PEER_IP:$port bash -c $(q "$role") $(q "$bin" remote_ping_pong 'verified round trips across hosts') \
  && SPINWIRE_RDMA_LINKDOWN_REMOTE=\$RXE_VM_PEER_IP:$down_port bash -c $(q "$role") $(q "$bin" remote_link_down_client 'link-down detected')"

t1=$SECONDS
set +e
RXE_VM_TIMEOUT=${RXE_VM_TIMEOUT:-300} scripts/rxe-vm-two "$srv" "$cli"
rc=$?
set -e
echo "rdma-vm-two-pingpong: VMs $((SECONDS - t1)) s, total $((SECONDS - t0)) s"
if [ $rc -eq 0 ]; then
  echo "rdma-vm-two-pingpong: PASS"
else
  echo "rdma-vm-two-pingpong: FAIL (exit $rc)" >&2
fi
exit $rc
