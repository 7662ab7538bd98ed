#!/usr/bin/env bash
# scripts/rdma-vm-ab.sh - several bench builds against perftest, interleaved in ONE Soft-RoCE VM
# boot: the before/after of a change to the rdma data path, by ratio (the VM's absolute figures
# are emulation's; only what runs in the same boot compares).
#
# usage: scripts/rdma-vm-ab.sh [--rate] [ROUNDS [ITERS]] BENCH...
#   --rate  the 8-B message rate instead of the latency (below)
#   ROUNDS  rounds (default 5); each round runs perftest, then each BENCH (server on vCPU 0,
#           client on vCPU 1), in the order given:
#           latency: ib_send_lat -F -s 8 -n ITERS, then each BENCH's
#             `lat --fabric rdma --mode rtc --idle spin --size 8 --iters ITERS --warmup 500`
#           --rate: ib_send_bw -F -s 8 -n ITERS, then each BENCH's
#             `rate --fabric rdma --mode rtc --idle spin --size 8 --iters ITERS --warmup 5000`
#   ITERS   round trips per latency run (default 5000), messages per rate run (default 50000)
#   BENCH   bench binaries built with `--features rdma` (copy each build aside first:
#           cargo build --release -p bench --features rdma && cp target/release/bench /tmp/b1)
# Prints, per round, perftest's figure and each build's (latency: ib_send_lat's t_typical and
# RTT/2 p50, one-way, us; rate: ib_send_bw's MsgRate and bench's msgs/s at the receiver, M, with
# the client's would_block and tx_batches counters), then the medians and each build's median
# ratio to perftest. A rate run that the emulation stalls (8-ms round trips: 0.02-0.03 M for any
# build) drags a mean, not the median: compare medians over several rounds.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=lat
[ "${1:-}" = --rate ] && { mode=rate; shift; }
rounds=5 iters=
[[ ${1:-} =~ ^[0-9]+$ ]] && { rounds=$1; shift; }
[[ ${1:-} =~ ^[0-9]+$ ]] && { iters=$1; shift; }
[ -n "$iters" ] || { [ $mode = rate ] && iters=50000 || iters=5000; }
[ $# -ge 1 ] || { echo "usage: scripts/rdma-vm-ab.sh [--rate] [ROUNDS [ITERS]] BENCH..." >&2; exit 2; }
for b in "$@"; do
  [ -x "$b" ] || { echo "rdma-vm-ab: $b is not an executable" >&2; exit 2; }
done
scripts/setup-rdma

read -r -d '' guest <<'GUEST' || true
set -uo pipefail
mode=$1 rounds=$2 iters=$3; shift 3
D=$RXE_VM_DEV X=$RXE_VM_GID_INDEX IP=$RXE_VM_IP
W=$(mktemp -d)
port=7480
echo "rdma-vm-ab: mode $mode, uptime: $(uptime)"
if [ "$mode" = rate ]; then
  perf=ib_send_bw col=5 sub=(rate --warmup 5000)
else
  perf=ib_send_lat col=5 sub=(lat --warmup 500)
fi
for r in $(seq "$rounds"); do
  timeout -s KILL 120 taskset -c 0 "$perf" -d "$D" -x "$X" -F -s 8 -n "$iters" >"$W/ps" 2>&1 &
  sleep 1
  timeout -s KILL 120 taskset -c 1 "$perf" -d "$D" -x "$X" -F -s 8 -n "$iters" "$IP" >"$W/pc" 2>&1
  wait
  # The first data row (after the "#bytes" header): ib_send_lat's t_typical, ib_send_bw's MsgRate.
  t=$(awk -v c="$col" '/#bytes/ { h = 1; next } h && $1 ~ /^[0-9]+$/ { print $c; exit }' "$W/pc")
  echo "rdma-vm-ab: round $r perftest ${t:-?}"
  for b in "$@"; do
    port=$((port + 1))
    c=("${sub[@]}" --fabric rdma --mode rtc --idle spin --size 8 --iters "$iters")
    timeout -s KILL 120 taskset -c 0 "$b" "${c[@]}" --server "rdma://$IP:$port" --once \
      --app-cores 0 >"$W/bs" 2>&1 &
    sleep 1
    rm -rf "$W/out"
    for _ in 1 2 3 4 5; do
      timeout -s KILL 120 taskset -c 1 "$b" "${c[@]}" --client "rdma://$IP:$port" \
        --app-cores 1 --out "$W/out" >"$W/bc" 2>&1 && break
      sleep 1
    done
    wait
    if [ "$mode" = rate ]; then
      p=$(jq -r '.points[0] | "\(.msgs_per_sec / 1e6) would_block \(.counters.would_block)
        tx_batches \(.counters.tx_batches)"' "$W/out/summary.json" 2>/dev/null | tr -s ' \n' ' ')
    else
      # The RTT/2 row: min, p50, ...
      p=$(awk '$1 == "RTT/2" { print $3; exit }' "$W/bc")
    fi
    echo "rdma-vm-ab: round $r $b ${p:-?}"
  done
done
echo "rdma-vm-ab: uptime: $(uptime)"
GUEST

out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "rdma-vm-ab: host uptime: $(uptime)"
scripts/rxe-vm "bash -c $(printf %q "$guest") guest $mode $rounds $iters $(printf '%q ' "$@")" | tee "$out"
echo "rdma-vm-ab: host uptime: $(uptime)"
python3 - "$out" "$mode" "$@" <<'PY'
import statistics, sys
mode = sys.argv[2]
lines = [l.split() for l in open(sys.argv[1]) if l.startswith("rdma-vm-ab: round ")]
def fig(l):
    try:
        return float(l[4])
    except (IndexError, ValueError):
        return None
perf = {int(l[2]): fig(l) for l in lines if l[3] == "perftest" and fig(l)}
if not perf:
    sys.exit("rdma-vm-ab: no perftest figure parsed")
mp = statistics.median(perf.values())
if mode == "rate":
    print(f"perftest ib_send_bw MsgRate: median {mp:.3f} M msgs/s over {len(perf)} rounds")
else:
    print(f"perftest ib_send_lat t_typical: median {mp:.2f} us over {len(perf)} rounds")
for b in sys.argv[3:]:
    rows = [(int(l[2]), fig(l)) for l in lines if l[3] == b and fig(l) is not None]
    if not rows:
        print(f"{b}: no figure parsed")
        continue
    ratios = [v / perf[r] for r, v in rows if r in perf]
    v = [x for _, x in rows]
    what = "msgs/s at the receiver, M" if mode == "rate" else "RTT/2 p50"
    unit = "" if mode == "rate" else " us"
    print(f"{b}: {what} median {statistics.median(v):.3f}{unit} [{', '.join(f'{x:.3f}' for x in v)}],"
          f" x perftest median {statistics.median(ratios):.2f}")
PY
