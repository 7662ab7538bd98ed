#!/usr/bin/env bash
# scripts/rdma-vm-ab.sh - several bench builds against perftest, interleaved in ONE Soft-RoCE VM
# boot: the before/after of a change to the rdma data path, by ratio (the VM's absolute figures
# are emulation's; only what runs in the same boot compares).
#
# usage: scripts/rdma-vm-ab.sh [ROUNDS [ITERS]] BENCH...
#   ROUNDS  rounds (default 5); each round runs perftest's ib_send_lat -F -s 8 -n ITERS, then
#           each BENCH's `lat --fabric rdma --mode rtc --idle spin --size 8 --iters ITERS`
#           (server on vCPU 0, client on vCPU 1), in the order given
#   ITERS   round trips per run (default 5000)
#   BENCH   bench binaries built with `--features rdma` (copy each build aside first:
#           cargo build --release -p bench --features rdma && cp target/release/bench /tmp/b1)
# Prints, per round, perftest's t_typical and each build's RTT/2 p50 (one-way, us), then the
# medians and each build's median ratio to perftest.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=5 iters=5000
[[ ${1:-} =~ ^[0-9]+$ ]] && { rounds=$1; shift; }
[[ ${1:-} =~ ^[0-9]+$ ]] && { iters=$1; shift; }
[ $# -ge 1 ] || { echo "usage: scripts/rdma-vm-ab.sh [ROUNDS [ITERS]] BENCH..." >&2; exit 2; }
for b in "$@"; do
  [ -x "$b" ] || { echo "rdma-vm-ab: $b is not an executable" >&2; exit 2; }
done
scripts/setup-rdma

read -r -d '' guest <<'GUEST' || true
set -uo pipefail
rounds=$1 iters=$2; shift 2
D=$RXE_VM_DEV X=$RXE_VM_GID_INDEX IP=$RXE_VM_IP
port=7480
for r in $(seq "$rounds"); do
  timeout -s KILL 120 taskset -c 0 ib_send_lat -d "$D" -x "$X" -F -s 8 -n "$iters" >/tmp/ibs 2>&1 &
  sleep 1
  timeout -s KILL 120 taskset -c 1 ib_send_lat -d "$D" -x "$X" -F -s 8 -n "$iters" "$IP" >/tmp/ibc 2>&1
  wait
  t=$(awk '/#bytes/ { h = 1; next } h && $1 ~ /^[0-9]+$/ { print $5; exit }' /tmp/ibc)
  echo "rdma-vm-ab: round $r perftest ${t:-?}"
  for b in "$@"; do
    port=$((port + 1))
    c=(--fabric rdma --mode rtc --idle spin --size 8 --iters "$iters" --warmup 500)
    timeout -s KILL 120 taskset -c 0 "$b" lat "${c[@]}" --server "rdma://$IP:$port" --once \
      --app-cores 0 >/tmp/bs 2>&1 &
    sleep 1
    for _ in 1 2 3 4 5; do
      timeout -s KILL 120 taskset -c 1 "$b" lat "${c[@]}" --client "rdma://$IP:$port" \
        --app-cores 1 >/tmp/bc 2>&1 && break
      sleep 1
    done
    wait
    # The RTT/2 row: min, p50, ...
    p=$(awk '$1 == "RTT/2" { print $3; exit }' /tmp/bc)
    echo "rdma-vm-ab: round $r $b ${p:-?}"
  done
done
GUEST

out=$(mktemp)
trap 'rm -f "$out"' EXIT
scripts/rxe-vm "bash -c $(printf %q "$guest") guest $rounds $iters $(printf '%q ' "$@")" | tee "$out"
python3 - "$out" "$@" <<'PY'
import statistics, sys
lines = [l.split() for l in open(sys.argv[1]) if l.startswith("rdma-vm-ab: round ")]
perf = [float(l[4]) for l in lines if l[3] == "perftest" and l[4] != "?"]
if not perf:
    sys.exit("rdma-vm-ab: no perftest figure parsed")
mp = statistics.median(perf)
print(f"perftest ib_send_lat t_typical: median {mp:.2f} us over {len(perf)} rounds")
for b in sys.argv[2:]:
    rows = [(int(l[2]), float(l[4])) for l in lines if l[3] == b and l[4] != "?"]
    if not rows:
        print(f"{b}: no figure parsed")
        continue
    by_round = {r: v for r, v in rows}
    ratios = [v / float(l[4]) for l in lines if l[3] == "perftest" and l[4] != "?"
              for r, v in by_round.items() if int(l[2]) == r]
    v = [x for _, x in rows]
    print(f"{b}: RTT/2 p50 median {statistics.median(v):.2f} us [{', '.join(f'{x:.2f}' for x in v)}],"
          f" x perftest median {statistics.median(ratios):.2f}")
PY
