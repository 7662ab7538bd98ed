#!/usr/bin/env bash
# scripts/rdma-smoke-two.sh - two-host Soft-RoCE smoke test. Runs INSIDE the
# two VMs of scripts/rxe-vm-two, as both the server and the client command:
#   scripts/rxe-vm-two scripts/rdma-smoke-two.sh scripts/rdma-smoke-two.sh
# The server runs perftest servers; the client connects to $RXE_VM_PEER_IP,
# retrying while the other VM is still booting. Checks: ib_send_lat over a raw
# RoCEv2 GID, ib_send_lat through rdma_cm (-R), rping (rdma_cm + RDMA READ/WRITE).
# Exit status: 0 if every check passed.
set -uo pipefail

DEV=${RXE_VM_DEV:?run me inside scripts/rxe-vm-two}
GIDX=${RXE_VM_GID_INDEX:?}
PEER=${RXE_VM_PEER_IP:?run me inside scripts/rxe-vm-two}
ROLE=${RXE_VM_ROLE:?}
TMO=${RDMA_SMOKE_TIMEOUT:-120}

# shellcheck disable=SC2317 # called through check
# retry CMD...: rerun CMD (a client) until it connects, for up to ~60 s.
retry() {
  local out rc _
  for _ in $(seq 60); do
    out=$(timeout -s KILL "$TMO" "$@" 2>&1)
    rc=$?
    [ "$rc" -eq 0 ] && { echo "$out"; return 0; }
    # Connecting before the server listens: TCP refused, or rdma_cm REJECTED
    # (perftest: "Unexpected CM event ... 8"); the peer may also still be booting.
    echo "$out" | grep -qiE 'refused|couldn.t connect|unable to (open|connect|init)|failed to connect|unreachable|unexpected cm event|rejected' || break
    sleep 1
  done
  echo "$out" | tail -n 20
  return "$rc"
}

check() { # NAME CMD...: run CMD quietly; show its output only if it fails
  local name=$1 out lat
  shift
  if out=$("$@" 2>&1); then
    # perftest prints "#bytes #iterations t_min t_max t_typical ..."
    lat=$(echo "$out" | awk '/^ *#bytes/ { getline; print " (typical " $5 " us, emulated)" }')
    echo "rdma-smoke-two: $ROLE: $name ok$lat"
  else
    echo "rdma-smoke-two: $ROLE: $name FAILED"
    echo "$out" | tail -n 20
    fails=$((fails + 1))
  fi
}

fails=0
echo "rdma-smoke-two: $ROLE $RXE_VM_IP ($DEV, gid index $GIDX), peer $PEER"
if [ "$ROLE" = server ]; then
  check "ib_send_lat (GID)" timeout -s KILL "$TMO" ib_send_lat -d "$DEV" -x "$GIDX" -F
  check "ib_send_lat -R (rdma_cm)" timeout -s KILL "$TMO" ib_send_lat -d "$DEV" -R -F
  check "rping" timeout -s KILL "$TMO" rping -s -a "$RXE_VM_IP" -C 20
else
  check "ib_send_lat (GID)" retry ib_send_lat -d "$DEV" -x "$GIDX" -F "$PEER"
  check "ib_send_lat -R (rdma_cm)" retry ib_send_lat -d "$DEV" -R -F "$PEER"
  check "rping" retry rping -c -a "$PEER" -C 20
fi
exit $fails
