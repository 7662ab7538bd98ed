#!/usr/bin/env bash
# scripts/rdma-smoke.sh - Soft-RoCE smoke test. Runs INSIDE the VM:
#   scripts/rxe-vm scripts/rdma-smoke.sh
# Checks, against the kernel RDMA stack (rdma_rxe) on $RXE_VM_DEV:
#   1. ibv_devinfo lists the device with its port PORT_ACTIVE;
#   2. perftest ib_send_lat (RC SEND/RECV, RoCEv2 GID index $RXE_VM_GID_INDEX):
#      a server and a client on the VM's own IP both succeed;
#   3. the same through rdma_cm (ib_send_lat -R): address resolution, route
#      resolution and connection setup by the CM.
# It asserts function only: the latencies it prints are emulation numbers.
# Exit status: the number of failed checks.
set -uo pipefail

DEV=${RXE_VM_DEV:?run me inside scripts/rxe-vm}
GIDX=${RXE_VM_GID_INDEX:?}
IP=${RXE_VM_IP:?}
TMO=${RDMA_SMOKE_TIMEOUT:-60} # seconds per process
ITERS=${RDMA_SMOKE_ITERS:-1000}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
fails=0

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
report() { # name ok|FAIL seconds detail
  printf 'rdma-smoke: %-24s %-4s %5s s  %s\n' "$1" "$2" "$3" "$4"
}

# pair NAME SERVER_CMD CLIENT_CMD: start the server, then the client; both must
# exit 0. A failed client is retried (up to 10 times, 0.5 s apart) while the
# server is still running: under load the server may not listen yet, and
# connecting too early fails in several ways (TCP refused; rdma_cm REJECTED,
# which perftest reports as "Unexpected CM event ... 8").
pair() {
  local name=$1 srv=$2 cli=$3 t0 spid src crc=1 _
  t0=$(now)
  timeout -s KILL "$TMO" bash -c "$srv" >"$OUT/s" 2>&1 &
  spid=$!
  sleep 0.3
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    timeout -s KILL "$TMO" bash -c "$cli" >"$OUT/c" 2>&1
    crc=$?
    [ $crc -eq 0 ] && break
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.5
  done
  wait "$spid"
  src=$?
  if [ $crc -eq 0 ] && [ $src -eq 0 ]; then
    # perftest prints "#bytes #iterations t_min t_max t_typical t_avg ..."
    report "$name" ok "$(since "$t0")" \
      "$(awk '/^ *#bytes/ { getline; print "typical " $5 " us (emulated: not a performance figure)" }' "$OUT/c")"
  else
    report "$name" FAIL "$(since "$t0")" "client rc=$crc server rc=$src"
    echo "---- client output"; tail -n 20 "$OUT/c"
    echo "---- server output"; tail -n 20 "$OUT/s"
    fails=$((fails + 1))
  fi
}

T0=$(now)
echo "rdma-smoke: device $DEV, ip $IP, RoCEv2 gid index $GIDX"

t0=$(now)
if timeout "$TMO" ibv_devinfo -d "$DEV" >"$OUT/devinfo" 2>&1 && grep -q PORT_ACTIVE "$OUT/devinfo"; then
  report ibv_devinfo ok "$(since "$t0")" "$DEV port PORT_ACTIVE"
else
  report ibv_devinfo FAIL "$(since "$t0")" "$DEV missing or its port not ACTIVE"
  cat "$OUT/devinfo"
  fails=$((fails + 1))
fi

# -F: don't fail on the cpufreq check (meaningless in a VM).
pair "ib_send_lat (RC, GID)" \
  "ib_send_lat -d $DEV -x $GIDX -F -n $ITERS" \
  "ib_send_lat -d $DEV -x $GIDX -F -n $ITERS $IP"
pair "ib_send_lat -R (rdma_cm)" \
  "ib_send_lat -d $DEV -R -F -n $ITERS" \
  "ib_send_lat -d $DEV -R -F -n $ITERS $IP"

if [ $fails -eq 0 ]; then
  echo "rdma-smoke: PASS (3 checks, $(since "$T0") s)"
else
  echo "rdma-smoke: FAIL ($fails of 3 checks failed, $(since "$T0") s)"
fi
exit $fails
