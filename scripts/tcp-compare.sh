#!/usr/bin/env bash
# scripts/tcp-compare.sh - issue #22's peers, measured beside `--fabric tcp` in one run: ZeroMQ
# (PUSH/PULL and REQ/REP, the system libzmq) and sockperf (`--tcp --nonblocked`) next to
# spinwire's `bench lat` / `bench rate --fabric tcp` and the raw busy-polled TCP floor
# (`bench floor --fabric tcp`), on loopback (127.0.0.1 only) or across two network namespaces
# (`WHERE=netns`: scripts/netns-two, 198.18.0.1 <-> 198.18.0.2 over a veth pair, root needed),
# on the same two cores, for 8-B and 64-B messages. A benchmark, not a CI test: it asserts
# nothing about the numbers.
#
# usage: scripts/tcp-compare.sh            (WHERE=netns scripts/tcp-compare.sh)
#
# Each round runs four groups, their order rotated by one each round (so no peer always runs
# first or last on a machine that warms up or gets busier):
#   floor     bench floor --fabric tcp --size S    raw ping-pong RTT of S bytes
#   spinwire  bench lat  --fabric tcp --size S     RTT p50, p99.9
#             bench rate --fabric tcp --size S     msgs/s at the receiver
#   sockperf  sockperf server / ping-pong --tcp --nonblocked -m max(S,14) --full-rtt
#                                                  RTT p50, p99.9 (sockperf's smallest message
#                                                  is 14 B; without --full-rtt it prints RTT/2)
#   zeromq    bench/peers/zmq_peer.c (REQ/REP)     RTT p50, p99.9 (CLOCK_MONOTONIC per trip)
#             bench/peers/zmq_peer.c (PUSH/PULL)   msgs/s at the receiver
# The client side (spinwire's client thread, sockperf ping-pong, REQ, PUSH) runs on the first of
# CORES and the server side (server thread, sockperf server, REP, PULL) on the second; on
# loopback spinwire and the floor run both in one process (--app-cores), the peers as two
# processes under taskset. Across the namespaces every step is two processes, the server's in
# namespace A (198.18.0.1) and the client's in B, each pair on a fresh pair of namespaces
# (scripts/netns-two), the client started once the server listens; spinwire and the floor as
# `--server ... --once` / `--client` processes. ZeroMQ keeps its stock settings, so each side's
# I/O thread shares that side's core with its app thread.
# It prints a table per round with its placement probes (the cache-line RTT before each group:
# see "the placement probe" below), then the medians over the rounds that ran in one placement
# with no bench step marked disturbed, and the ratios issue #22 targets, each marked met or missed:
#   spinwire RTT p50 / floor RTT p50       <= 1.1   (8 B and 64 B)
#   spinwire RTT p50 / sockperf RTT p50    <= 1.0   (8 B against sockperf's 14 B; 64 B)
#   spinwire rate / ZeroMQ PUSH/PULL rate  >= 2 at 8 B (and spinwire >= 10 M msgs/s), >= 1.5 at 64 B
#
# Installs what is missing (as root: apt-get install -y libzmq3-dev sockperf) and builds the
# ZeroMQ peer with gcc into target/peers/ (outside cargo). Exit status 0 when every step ran and
# was parsed, 1 when a step failed (it is named), 2 when the peers (or the bench) cannot be
# installed or built.
#
# Knobs (environment):
#   WHERE=loopback      loopback (127.0.0.1), or netns (across two namespaces, as root)
#   ROUNDS=3            rounds (the medians are over these)
#   CORES=0,1           client core, server core
#   ITERS=300000        round trips per latency step (floor, bench lat, REQ/REP)
#   WARMUP=10000        unmeasured round trips before each of those
#   DURATION=2s         length of each `bench rate` step
#   SOCKPERF_TIME=3     seconds per sockperf step (sockperf takes a time, not a count; it drops
#                       its own 400 ms warm-up and the edges from the figures)
#   ZMQ_MSGS=10000000   messages per PUSH/PULL step
#   STEP_TIMEOUT=300    seconds any one step may take before it counts as failed
#   PORT=               first TCP port (default derived from the pid); round r uses
#                       PORT+10r .. PORT+10r+9
#   BENCH=              a prebuilt bench binary (default: nice -n 15 cargo build --release -p bench)
#   OUT=                keep every step's output under this directory (default: a temporary one)
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${ROUNDS:-3}
cores=${CORES:-0,1}
client_core=${cores%%,*}
server_core=${cores##*,}
iters=${ITERS:-300000}
warmup=${WARMUP:-10000}
duration=${DURATION:-2s}
sockperf_time=${SOCKPERF_TIME:-3}
zmq_msgs=${ZMQ_MSGS:-10000000}
step_timeout=${STEP_TIMEOUT:-300}
port=${PORT:-$((22000 + $$ % 20000))}
sizes=(8 64)
where=${WHERE:-loopback}

say() { echo "tcp-compare: $*" >&2; }
fail() {
  say "$*"
  exit 1
}
unbuildable() {
  say "$*"
  exit 2
}

case $where in
  loopback) host=127.0.0.1 ;;
  netns)
    host=198.18.0.1 # scripts/netns-two's namespace A
    export ZMQ_PEER_HOST=$host
    [ "$(id -u)" = 0 ] || unbuildable "WHERE=netns needs root (network namespaces)"
    ;;
  *) unbuildable "WHERE=$where: loopback or netns" ;;
esac

# --- the peers: install, build -------------------------------------------------------------
missing=()
for pkg in libzmq3-dev sockperf; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
    missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  [ "$(id -u)" = 0 ] || unbuildable "missing ${missing[*]}; run as root to apt-get install them"
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # A stale package list is the usual reason an install fails: refresh it once and retry.
  timeout 600 apt-get install -y "${missing[@]}" >&2 ||
    { timeout 600 apt-get update >&2 && timeout 600 apt-get install -y "${missing[@]}" >&2; } ||
    unbuildable "apt-get install -y ${missing[*]} failed"
fi
command -v sockperf >/dev/null || unbuildable "no sockperf on PATH after installing it"
mkdir -p target/peers
zmq_peer=$PWD/target/peers/zmq_peer
gcc -O2 -Wall -Wextra -Werror -o "$zmq_peer" bench/peers/zmq_peer.c -lzmq ||
  unbuildable "gcc could not build bench/peers/zmq_peer.c against libzmq"

if [ -z "${BENCH:-}" ]; then
  nice -n 15 cargo build --release -p bench >&2 || unbuildable "cargo build --release -p bench failed"
  BENCH=$PWD/target/release/bench
fi
[ -x "$BENCH" ] || unbuildable "no bench binary at $BENCH"
BENCH=$(readlink -f "$BENCH")

# --- the run's state and its cleanup -------------------------------------------------------
if [ -n "${OUT:-}" ]; then
  out=$OUT
  mkdir -p "$out"
  keep_out=1
else
  out=$(mktemp -d /tmp/tcp-compare.XXXXXX)
  keep_out=0
fi
server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
cleanup() {
  stop_server
  if [ "$keep_out" = 0 ]; then rm -rf "$out"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_listening PORT NAME LOG: until something listens on 127.0.0.1:PORT, at most 10 s.
wait_listening() {
  local p=$1 name=$2 log=$3
  for _ in $(seq 1 200); do
    ss -Hltn "sport = :$p" 2>/dev/null | grep -q . && return 0
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.05
  done
  cat "$log" >&2
  fail "step $name: its server did not listen on 127.0.0.1:$p"
}

# bench_step NAME ARGS: one bench run on both cores; its summary.json lands in $out/NAME.
bench_step() {
  local name=$1 args=$2
  rm -rf "${out:?}/$name"
  # shellcheck disable=SC2086 # ARGS is a list of words
  timeout "$step_timeout" "$BENCH" $args --app-cores "$client_core,$server_core" \
    --out "$out/$name" >"$out/$name.log" 2>&1 || {
    cat "$out/$name.log" >&2
    fail "step $name (bench ${args%% *}) failed"
  }
}

# pair_step NAME PORT SERVER_CMD -- CLIENT_CMD: the server in the background on the server
# core (its pid in $server_pid: sockperf's runs until stopped, the ZeroMQ peers exit by
# themselves), the client on the client core; their output goes to $out/NAME.server.log and
# $out/NAME.client.log.
pair_step() {
  local name=$1 p=$2
  shift 2
  local server=()
  while [ "$1" != -- ]; do
    server+=("$1")
    shift
  done
  shift
  if [ "$where" = netns ]; then
    # sockperf's server runs until stopped; the ZeroMQ peers exit by themselves (netns-two
    # checks their exit status).
    local stop=0
    [ "${server[0]}" = sockperf ] && stop=1
    ns_step "$name" "$p" "$stop" "taskset -c $server_core $(printf '%q ' "${server[@]}")" \
      "taskset -c $client_core $(printf '%q ' "$@")"
    server_pid=""
    return
  fi
  timeout "$step_timeout" taskset -c "$server_core" "${server[@]}" \
    >"$out/$name.server.log" 2>&1 &
  server_pid=$!
  if [ "${server[0]}" = sockperf ]; then
    # sockperf's client gives up on a refused connection; ZeroMQ's reconnects by itself.
    wait_listening "$p" "$name" "$out/$name.server.log"
  fi
  timeout "$step_timeout" taskset -c "$client_core" "$@" >"$out/$name.client.log" 2>&1 || {
    cat "$out/$name.server.log" "$out/$name.client.log" >&2
    stop_server
    fail "step $name (client: ${1##*/} ${2:-}) failed"
  }
}

# server_done NAME: wait for a server that exits by itself; a failure fails step NAME.
server_done() {
  local rc=0
  [ -n "$server_pid" ] || return 0 # across the namespaces: ns_step checked it
  wait "$server_pid" || rc=$?
  server_pid=""
  [ "$rc" = 0 ] || {
    cat "$out/$1.server.log" >&2
    fail "step $1 (server) failed (exit $rc)"
  }
}

# ns_step NAME PORT STOP SERVER_CMD CLIENT_CMD (WHERE=netns): one pair across the namespaces,
# on a fresh pair of them (scripts/netns-two): SERVER_CMD in namespace A, CLIENT_CMD in B once
# something listens on the server's PORT (at most 10 s); their output goes to
# $out/NAME.server.log and $out/NAME.client.log. STOP=1: the server runs until stopped (it is
# stopped when the client is done).
ns_step() {
  local name=$1 p=$2 stop=$3 server=$4 client=$5 rc=0
  local listening="for _ in \$(seq 1 200); do
  ip netns exec \"\$NETNS_A\" ss -Hltn 'sport = :$p' | grep -q . && break; sleep 0.05; done"
  NETNS_TWO_STOP_SERVER=$stop NETNS_TWO_TIMEOUT=$step_timeout bash scripts/netns-two \
    "exec $server >'$out/$name.server.log' 2>&1" \
    "$listening; exec $client >'$out/$name.client.log' 2>&1" 2>"$out/$name.netns.log" || rc=$?
  [ "$rc" = 0 ] || {
    cat "$out/$name.netns.log" "$out/$name.server.log" "$out/$name.client.log" >&2 2>/dev/null
    fail "step $name (across the namespaces) failed (exit $rc)"
  }
}

# bench_pair NAME PORT ARGS: one bench figure; on loopback both sides in one process
# (bench_step), across the namespaces a `--server --once` and a `--client` process (ADDR is
# tcp://HOST:PORT for lat and rate, HOST:PORT for floor); the client's summary.json lands in
# $out/NAME.
bench_pair() {
  local name=$1 p=$2 args=$3
  if [ "$where" = loopback ]; then
    bench_step "$name" "$args"
    return
  fi
  local addr="tcp://$host:$p"
  [ "${args%% *}" = floor ] && addr="$host:$p"
  rm -rf "${out:?}/$name"
  ns_step "$name" "$p" 0 \
    "'$BENCH' $args --server $addr --once --app-cores $server_core" \
    "'$BENCH' $args --client $addr --app-cores $client_core --out '$out/$name'"
}

floor_group() {
  local r=$1 i
  for i in "${!sizes[@]}"; do
    local s=${sizes[$i]}
    bench_pair "r$r-floor-$s" $((port + 10 * r + 6 + i)) \
      "floor --fabric tcp --size $s --iters $iters --warmup $warmup"
  done
}

spinwire_group() {
  local r=$1 i
  for i in "${!sizes[@]}"; do
    local s=${sizes[$i]}
    bench_pair "r$r-spin-lat-$s" $((port + 10 * r + 8 + i)) \
      "lat --fabric tcp --size $s --iters $iters --warmup $warmup"
    # Its own namespaces across them (the lat step's port is free again); on loopback none.
    bench_pair "r$r-spin-rate-$s" $((port + 10 * r + 8 + i)) \
      "rate --fabric tcp --size $s --duration $duration --no-floor"
  done
}

# Each round and size has its own ports (round r: PORT + 10 r ..), so that no listener meets a
# previous step's connections in TIME_WAIT.
sockperf_group() {
  local r=$1 i p
  for i in "${!sizes[@]}"; do
    local s=${sizes[$i]}
    p=$((port + 10 * r + i))
    pair_step "r$r-sockperf-$s" "$p" \
      sockperf server --tcp --nonblocked -i "$host" -p "$p" -- \
      sockperf ping-pong --tcp --nonblocked -i "$host" -p "$p" -m $((s > 14 ? s : 14)) \
      -t "$sockperf_time" --full-rtt
    stop_server
  done
}

zeromq_group() {
  local r=$1 i p
  for i in "${!sizes[@]}"; do
    local s=${sizes[$i]}
    p=$((port + 10 * r + 2 + i))
    pair_step "r$r-zmq-reqrep-$s" "$p" "$zmq_peer" rep "$p" "$iters" "$s" "$warmup" -- \
      "$zmq_peer" req "$p" "$iters" "$s" "$warmup"
    server_done "r$r-zmq-reqrep-$s"
    # The receiver (PULL, the server side) reports the rate.
    p=$((port + 10 * r + 4 + i))
    pair_step "r$r-zmq-pushpull-$s" "$p" "$zmq_peer" pull "$p" "$zmq_msgs" "$s" -- \
      "$zmq_peer" push "$p" "$zmq_msgs" "$s"
    server_done "r$r-zmq-pushpull-$s"
  done
}

# --- the placement probe -------------------------------------------------------------------
# A virtual machine's host may move its vCPUs between placements whose cache-line transfer times
# differ several-fold (a 2-core KVM guest here: RTT 80-90 ns, or about 380 ns, switching within
# minutes), and loopback TCP's round trip moves with them (6.7 against about 10 us): a round
# whose groups ran in different placements compares them across it. Before each group (and once
# after the last) `bench floor` measures the cache-line RTT on CORES; the report prints the
# probes, marks a round whose probes differ by more than 2x "mixed", and takes the medians over
# the rounds that are not and whose bench steps none was marked disturbed (other processes on
# the run's cores); failing that over the rounds in one placement, failing that over all of
# them, and says which.
. scripts/lib/measure.sh # placement_probe (the working directory is the repository's)
probe() { placement_probe "$BENCH" "$cores" >"$out/r$1-probe-$2.txt" || true; }

# --- the report ---------------------------------------------------------------------------
# report.py OUT ROUNDS [ROUND]: ROUND's table, or without it the medians over ROUNDS rounds;
# exits non-zero, naming the step, when a step's output does not parse.
cat >"$out/report.py" <<'EOF'
import json, re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
one = int(sys.argv[3]) if len(sys.argv) > 3 else None
sizes = (8, 64)

def bad(step, why):
    sys.exit(f"tcp-compare: step {step}: could not parse its output: {why}")

def point(step):
    try:
        with open(f"{out}/{step}/summary.json") as f:
            p = json.load(f)["points"][0]
    except (OSError, KeyError, IndexError, ValueError) as e:
        bad(step, e)
    return p

def text(step, side):
    try:
        with open(f"{out}/{step}.{side}.log") as f:
            return f.read()
    except OSError as e:
        bad(step, e)

def sockperf(step):
    t = text(step, "client")
    if "Round trip is" not in t:
        bad(step, "no \"Summary: Round trip is\" line (was --full-rtt dropped?)")
    pct = dict(re.findall(r"percentile\s+([0-9.]+)\s*=\s*([0-9.]+)", t))
    try:
        return float(pct["50.000"]) * 1e3, float(pct["99.900"]) * 1e3  # us -> ns, RTT
    except KeyError as e:
        bad(step, f"no percentile {e}")

def field(step, side, key):
    m = re.search(rf"\b{key}=([0-9.]+)", text(step, side))
    if not m:
        bad(step, f"no {key}=")
    return float(m.group(1))

disturbed = []

def probes(r):
    """The round's placement probes (cache-line RTT p50, ns), in the order they ran."""
    got = []
    for g in ("floor", "spinwire", "sockperf", "zeromq", "end"):
        try:
            with open(f"{out}/r{r}-probe-{g}.txt") as f:
                got.append((g, float(f.read().strip())))
        except (OSError, ValueError):
            pass
    return got

def mixed(r):
    v = [ns for _, ns in probes(r)]
    return bool(v) and max(v) > 2 * min(v)

def placement(r):
    p = probes(r)
    if not p:
        return "placement probes: none"
    return ("placement probes (cache-line RTT p50 before each group, ns): "
            + ", ".join(f"{g} {ns:.0f}" for g, ns in p)
            + (" -> MIXED (the groups ran in different placements)" if mixed(r) else " -> one placement"))

def marked(p):
    """Whether bench's quiet-machine guard marked point p disturbed."""
    return bool((p.get("quiet") or {}).get("disturbed"))

def spin(step):
    p = point(step)
    if marked(p):
        disturbed.append(step)
    return p

def quiet(r):
    """Whether none of round r's bench steps was marked disturbed."""
    return not any(marked(point(f"r{r}-{k}-{s}"))
                   for s in sizes for k in ("floor", "spin-lat", "spin-rate"))

def figures(r):
    f = {}
    for s in sizes:
        fl = spin(f"r{r}-floor-{s}")["rtt_ns"]["p50"]
        lat = spin(f"r{r}-spin-lat-{s}")["rtt_ns"]
        rate = spin(f"r{r}-spin-rate-{s}")["msgs_per_sec"]
        sp50, sp999 = sockperf(f"r{r}-sockperf-{s}")
        zrep = f"r{r}-zmq-reqrep-{s}"
        zpush = f"r{r}-zmq-pushpull-{s}"
        f[s] = {
            "floor_p50": fl, "spin_p50": lat["p50"], "spin_p999": lat["p99_9"],
            "sock_p50": sp50, "sock_p999": sp999,
            "zmq_p50": field(zrep, "client", "p50"), "zmq_p999": field(zrep, "client", "p99_9"),
            "spin_rate": rate, "zmq_rate": field(zpush, "server", "msgs_per_sec"),
        }
        g = f[s]
        g["x_floor"] = g["spin_p50"] / g["floor_p50"]
        g["x_sock"] = g["spin_p50"] / g["sock_p50"]
        g["x_zmq_rate"] = g["spin_rate"] / g["zmq_rate"]
    return f

rows = [  # key, label, scale, unit
    ("floor_p50", "floor (raw tcp) RTT p50", 1e-3, "us"),
    ("spin_p50", "spinwire RTT p50", 1e-3, "us"),
    ("spin_p999", "spinwire RTT p99.9", 1e-3, "us"),
    ("sock_p50", "sockperf RTT p50", 1e-3, "us"),
    ("sock_p999", "sockperf RTT p99.9", 1e-3, "us"),
    ("zmq_p50", "ZeroMQ REQ/REP RTT p50", 1e-3, "us"),
    ("zmq_p999", "ZeroMQ REQ/REP RTT p99.9", 1e-3, "us"),
    ("spin_rate", "spinwire rate", 1e-6, "M msg/s"),
    ("zmq_rate", "ZeroMQ PUSH/PULL rate", 1e-6, "M msg/s"),
    ("x_floor", "spinwire p50 / floor p50", 1, "x"),
    ("x_sock", "spinwire p50 / sockperf p50", 1, "x"),
    ("x_zmq_rate", "spinwire rate / ZeroMQ rate", 1, "x"),
]

def fmt(x):
    return f"{x:.3f}" if x < 10 else f"{x:.2f}" if x < 1000 else f"{x:.0f}"

def table(vals, per_round=None):
    print(f"{'figure':<30} {'unit':<8} {'8 B':>10} {'64 B':>10}" + ("  rounds (8 B | 64 B)" if per_round else ""))
    for key, label, scale, unit in rows:
        line = f"{label:<30} {unit:<8} " + " ".join(f"{fmt(vals[s][key] * scale):>10}" for s in sizes)
        if per_round:
            line += "  " + " | ".join(", ".join(fmt(f[s][key] * scale) for f in per_round) for s in sizes)
        print(line)
    print("(sockperf ran 14-B messages for the 8-B column, its smallest, and reports the RTT itself with\n"
          " --full-rtt; ZeroMQ's stock I/O thread shares each side's one core with its app thread)")

if one is not None:
    table(figures(one))
    print(placement(one))
else:
    clean = [r for r in range(1, rounds + 1) if not mixed(r)]
    calm = [r for r in clean if quiet(r)]
    used = calm or clean or list(range(1, rounds + 1))
    per = [figures(r) for r in used]
    med = {s: {k: statistics.median(f[s][k] for f in per) for k in per[0][s]} for s in sizes}
    listed = ", ".join(map(str, used))
    which = ("every round ran in one placement, none disturbed" if len(calm) == rounds else
             f"rounds {listed}: those in one placement with no bench step disturbed" if calm else
             f"rounds {listed}: those in one placement, every one with a DISTURBED bench step"
             if clean else "every round MIXED placements: all of them, compare with care")
    print(f"\nmedians over {len(used)} of {rounds} round(s) ({which}; ratios: the median of the rounds' ratios)")
    table(med, per)
    targets = [
        ("spinwire RTT p50 / floor, 8 B", med[8]["x_floor"], "<=", 1.1),
        ("spinwire RTT p50 / floor, 64 B", med[64]["x_floor"], "<=", 1.1),
        ("spinwire RTT p50 / sockperf, 8 B (14 B)", med[8]["x_sock"], "<=", 1.0),
        ("spinwire RTT p50 / sockperf, 64 B", med[64]["x_sock"], "<=", 1.0),
        ("spinwire rate / ZeroMQ, 8 B", med[8]["x_zmq_rate"], ">=", 2.0),
        ("spinwire rate, 8 B (M msgs/s)", med[8]["spin_rate"] * 1e-6, ">=", 10.0),
        ("spinwire rate / ZeroMQ, 64 B", med[64]["x_zmq_rate"], ">=", 1.5),
    ]
    print(f"\nissue #22 targets (medians)")
    for label, v, op, t in targets:
        ok = v <= t if op == "<=" else v >= t
        print(f"{label:<42} {fmt(v):>8}  target {op} {t:<5} {'met' if ok else 'MISSED'}")
if disturbed:
    print(f"note: bench marked {len(set(disturbed))} spinwire step(s) disturbed (other processes took "
          "CPU on the run's cores; bench floor, sockperf and ZeroMQ steps are not checked): "
          + ", ".join(sorted(set(disturbed))))
EOF

# --- the rounds ---------------------------------------------------------------------------
groups=(floor spinwire sockperf zeromq)
for r in $(seq 1 "$rounds"); do
  order=()
  for i in 0 1 2 3; do order+=("${groups[$(((r - 1 + i) % 4))]}"); done
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  say "round $r of $rounds ($where): ${order[*]} (load average $load_before)"
  for g in "${order[@]}"; do
    probe "$r" "$g"
    "${g}_group" "$r"
  done
  probe "$r" end
  echo
  echo "round $r of $rounds ($where; order: ${order[*]}; load average $load_before before," \
    "$(cut -d' ' -f1-3 /proc/loadavg) after)"
  python3 "$out/report.py" "$out" "$rounds" "$r" || exit 1
done
python3 "$out/report.py" "$out" "$rounds" || exit 1
if [ "$keep_out" = 1 ]; then say "every step's output is in $out"; fi
