#!/usr/bin/env bash
# scripts/tcp-netns-bench.sh - issue #22's tcp:// targets, measured in one run: every bench
# figure next to the raw busy-polled TCP floor of the same run, across the two network
# namespaces (scripts/netns-two, 198.18.0.1 <-> 198.18.0.2 over a veth pair) and on loopback.
# A benchmark, not a CI test: it asserts nothing about the numbers.
#
# usage: scripts/tcp-netns-bench.sh
#
# Each round measures, across the namespaces (server in namespace A, client in B; each a
# `--server ... --once` / `--client` pair of processes):
#   floor 8    bench floor --fabric tcp --size 8     raw 8-B ping-pong RTT (the floor of lat 8)
#   floor 64   bench floor --fabric tcp --size 64    raw 64-B ping-pong RTT (the floor of lat 64)
#   floor 64k  bench floor --fabric tcp --size 64k   raw 64 KiB send/recv loop (the floor of bw 64k;
#                                                    its ping-pong, of 64 KiB, is not used)
#   lat 8      bench lat  --fabric tcp --size 8      RTT
#   lat 64     bench lat  --fabric tcp --size 64     RTT
#   bw 64k     bench rate --fabric tcp --size 64k    bytes/s at the receiver
# and on loopback (both sides in one process) the same plus
#   rate 8     bench rate --fabric tcp --size 8      8-B msgs/s at the receiver
# (`bench floor --size S` moves S bytes both in its ping-pong and per streamed chunk, so each
# ratio takes its floor from the step of its own size, measured in the same round.)
# The server side is pinned to one core and the client side to another (--app-cores), the same
# for every step. It prints, per round and as the median over the rounds, each figure with its
# ratio to its floor and the issue's targets:
#   RTT p50 x floor <= 1.1  (lat 8 and lat 64 against the raw ping-pong RTT p50 of that size)
#   rate 8 B        >= 20 M msgs/s (loopback)
#   bw 64 KiB       >= 0.9 x the raw 64 KiB send/recv loop
# Needs root for the namespaces (as scripts/netns-two says); exit status 0 when every step ran
# and was parsed, else 1 (the failing step is named), 2 when the test bed cannot be built.
#
# Knobs (environment):
#   TCP_BENCH_ROUNDS=3          rounds (the medians are over these)
#   TCP_BENCH_CORES=0,1         client core, server core
#   TCP_BENCH_LAT_ITERS=100000  round trips for the floor and each lat step
#   TCP_BENCH_RATE_TIME=2s      duration of each rate / bandwidth step
#   TCP_BENCH_PORT=             first TCP port (default derived from the pid)
#   BENCH=                      a prebuilt bench binary (default: cargo build --release -p bench)
#   TCP_BENCH_OUT=              keep every step's summary.json under this directory
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${TCP_BENCH_ROUNDS:-3}
cores=${TCP_BENCH_CORES:-0,1}
client_core=${cores%%,*}
server_core=${cores##*,}
lat_iters=${TCP_BENCH_LAT_ITERS:-100000}
rate_time=${TCP_BENCH_RATE_TIME:-2s}
port=${TCP_BENCH_PORT:-$((21000 + $$ % 20000))}

if [ -z "${BENCH:-}" ]; then
  cargo build --release -p bench >&2
  BENCH=$PWD/target/release/bench
fi
[ -x "$BENCH" ] || { echo "tcp-netns-bench: no bench binary at $BENCH" >&2; exit 1; }
BENCH=$(readlink -f "$BENCH")

if [ -n "${TCP_BENCH_OUT:-}" ]; then
  out=$TCP_BENCH_OUT
  mkdir -p "$out"
else
  out=$(mktemp -d /tmp/tcp-netns-bench.XXXXXX)
  trap 'rm -rf "$out"' EXIT
fi

fail() {
  echo "tcp-netns-bench: $*" >&2
  exit 1
}

# remote NAME SERVER_ARGS CLIENT_ARGS: one server/client pair across the namespaces; the
# client's summary.json lands in $out/NAME. The client starts once the server is listening (its
# console line, in a file both namespaces see).
remote() {
  local name=$1 sargs=$2 cargs=$3
  local dir=$out/$name log=$out/$name.server.log
  rm -rf "$dir"
  : >"$log"
  local server="exec '$BENCH' $sargs --app-cores $server_core >'$log' 2>&1"
  local client="for _ in \$(seq 1 300); do grep -q listening '$log' && break; sleep 0.05; done
grep -q listening '$log' || { echo 'the server did not start:' >&2; cat '$log' >&2; exit 1; }
exec '$BENCH' $cargs --app-cores $client_core --out '$dir' >'$out/$name.client.log' 2>&1"
  local rc=0
  bash scripts/netns-two "$server" "$client" 2>"$out/$name.netns.log" || rc=$?
  if [ "$rc" = 2 ] && ! [ -s "$log" ]; then
    cat "$out/$name.netns.log" >&2
    exit 2
  fi
  [ "$rc" = 0 ] || {
    cat "$out/$name.netns.log" "$log" "$out/$name.client.log" >&2
    fail "step $name (across the namespaces) failed (exit $rc)"
  }
}

# local NAME ARGS: both sides in one process on loopback.
loopback() {
  local name=$1 args=$2
  local dir=$out/$name
  rm -rf "$dir"
  # shellcheck disable=SC2086
  "$BENCH" $args --app-cores "$client_core,$server_core" --out "$dir" \
    >"$out/$name.log" 2>&1 || {
    cat "$out/$name.log" >&2
    fail "step $name (loopback) failed"
  }
}

lat="--fabric tcp --iters $lat_iters --warmup 10000"
rate="--fabric tcp --duration $rate_time --no-floor"
bw="$rate --size 64k --buffer-size 64k"
for r in $(seq 1 "$rounds"); do
  echo "tcp-netns-bench: round $r of $rounds" >&2
  p=$((port + 10 * r)) # this round's ports: p .. p+2 the floors, p+4 .. p+6 the bench servers
  for f in 8 64 64k; do
    remote "r$r-ns-floor$f" "floor --fabric tcp --size $f --server 198.18.0.1:$p --once" \
      "floor --fabric tcp --size $f --iters $lat_iters --client 198.18.0.1:$p"
    p=$((p + 1))
  done
  remote "r$r-ns-lat8" "lat $lat --size 8 --server tcp://198.18.0.1:$((p + 1)) --once" \
    "lat $lat --size 8 --client tcp://198.18.0.1:$((p + 1))"
  remote "r$r-ns-lat64" "lat $lat --size 64 --server tcp://198.18.0.1:$((p + 2)) --once" \
    "lat $lat --size 64 --client tcp://198.18.0.1:$((p + 2))"
  remote "r$r-ns-bw64k" "rate $bw --server tcp://198.18.0.1:$((p + 3)) --once" \
    "rate $bw --client tcp://198.18.0.1:$((p + 3))"
  for f in 8 64 64k; do
    loopback "r$r-lo-floor$f" "floor --fabric tcp --size $f --iters $lat_iters"
  done
  loopback "r$r-lo-lat8" "lat $lat --size 8"
  loopback "r$r-lo-lat64" "lat $lat --size 64"
  loopback "r$r-lo-bw64k" "rate $bw"
  loopback "r$r-lo-rate8" "rate $rate --size 8"
done

python3 - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])

def point(name):
    try:
        with open(f"{out}/{name}/summary.json") as f:
            return json.load(f)["points"][0]
    except (OSError, KeyError, IndexError, ValueError) as e:
        sys.exit(f"tcp-netns-bench: no figures from step {name}: {e}")

rows = []  # (where, figure, value per round, ratio per round, unit, target)
R = range(1, rounds + 1)
for where, tag in (("netns", "ns"), ("loopback", "lo")):
    for size in (8, 64):
        floor_rtt = [point(f"r{r}-{tag}-floor{size}")["rtt_ns"]["p50"] / 1e3 for r in R]
        rows.append((where, f"raw floor {size} B RTT p50", floor_rtt, None, "us", ""))
        v = [point(f"r{r}-{tag}-lat{size}")["rtt_ns"]["p50"] / 1e3 for r in R]
        rows.append((where, f"lat {size} B RTT p50", v,
                     [a / b for a, b in zip(v, floor_rtt)], "us", "<= 1.1x floor"))
    floor_bw = [point(f"r{r}-{tag}-floor64k")["mb_per_sec"] for r in R]
    rows.append((where, "raw floor 64 KiB", floor_bw, None, "MB/s", ""))
    v = [point(f"r{r}-{tag}-bw64k")["mb_per_sec"] for r in R]
    rows.append((where, "rate 64 KiB", v, [a / b for a, b in zip(v, floor_bw)], "MB/s",
                 ">= 0.9x floor"))
v = [point(f"r{r}-lo-rate8")["msgs_per_sec"] / 1e6 for r in R]
rows.append(("loopback", "rate 8 B", v, None, "M msgs/s", ">= 20 M msgs/s"))

def fmt(x):
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"

print(f"\ntcp:// targets (issue #22), {rounds} round(s); medians, per-round values in brackets")
print(f"{'where':<9} {'figure':<22} {'median':>9} {'unit':<9} {'x floor':>8}  {'target':<15} rounds")
for where, fig, v, ratio, unit, target in rows:
    rx = f"{statistics.median(ratio):.3f}x" if ratio else ""
    per = ", ".join(fmt(x) for x in v)
    if ratio:
        per += "; x " + ", ".join(f"{x:.3f}" for x in ratio)
    print(f"{where:<9} {fig:<22} {fmt(statistics.median(v)):>9} {unit:<9} {rx:>8}  {target:<15} [{per}]")
EOF
