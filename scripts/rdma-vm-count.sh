#!/usr/bin/env bash
# scripts/rdma-vm-count.sh - instructions per 8-B round trip of a bench build's rdma server
# against perftest's ib_send_lat server, counted by callgrind in ONE Soft-RoCE VM boot: the map
# of where the run-to-completion round trip's instructions go (under TCG, every guest
# instruction and call costs time; the VM's timings are emulation's, its counts are not).
#
# Each SERVER runs twice under valgrind with a different number of round trips (its client
# natively), and the difference of the two runs is divided by the round trips between them,
# so that setup, teardown and warm-up cancel. The server, not the client: slowed down by
# valgrind, it mostly finds each ping already there when it looks (a client under valgrind
# spins a number of turns that changes from boot to boot: perftest's client counted 1029 and
# 2088 a round trip in two). Mostly: the server still polls an empty queue now and then, a
# number that changes from run to run too, so the script prints bench's receive attempts
# (`Polled::try_recv` calls) per round trip of each run beside the count; read a build's count
# from runs with few empty attempts, and compare builds over several boots.
# Both servers answer each ping with a pong from their run-to-completion loop (bench's keeps
# no histogram and reads no clock per message):
#   bench lat --fabric rdma --mode rtc --idle spin --size 8 --server (its client: --iters SHORT,
#   then LONG)
#   ib_send_lat -F -s 8 -n SHORT, then LONG (a sorting of samples after the run, which grows
#   with n, is shown apart)
#
# usage: scripts/rdma-vm-count.sh [BENCH]   (env: SHORT=3000, LONG=8000; KEEP=1 keeps the
#        callgrind files, in /tmp/rdma-vm-count.*)
#   BENCH   a bench binary built with `--features rdma` (default: built here)
# Prints each server's instructions per round trip, grouped (engine and what inlines into it,
# rxe's provider and libibverbs, libc, the bench's own loop, its histograms, its clock), the
# 25 costliest functions of the bench server, and the bench server's instructions per call of
# its send, receive attempt, CQ poll and take (the send and the take do not move with a run's
# empty polls; an attempt and its poll average empty and full ones). Needs valgrind (installed when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
short=${SHORT:-3000}
long=${LONG:-8000}
[[ $short =~ ^[0-9]+$ && $long =~ ^[0-9]+$ && $long -gt $short ]] ||
  { echo "rdma-vm-count: SHORT and LONG must be numbers, LONG > SHORT" >&2; exit 2; }

# shellcheck source=scripts/lib/rdma-vm.sh
. scripts/lib/rdma-vm.sh
scripts/setup-rdma
rdma_vm_tool rdma-vm-count valgrind valgrind
rdma_vm_bench rdma-vm-count "${1:-}"
rdma_vm_workdir rdma-vm-count

read -r -d '' guest <<'GUEST' || true
set -uo pipefail
bench=$1 short=$2 long=$3 W=$4
D=$RXE_VM_DEV X=$RXE_VM_GID_INDEX IP=$RXE_VM_IP
port=7490
# client SERVER_PID NAME CMD...: the native client, retried (at most 30 times) while the
# server (under valgrind, slow to start) does not listen yet and is still running.
client() {
  local spid=$1 name=$2 _
  shift 2
  for _ in $(seq 30); do
    timeout -s KILL 300 taskset -c 1 "$@" >"$W/$name.log" 2>&1 && return 0
    kill -0 "$spid" 2>/dev/null || break
    sleep 1
  done
  echo "rdma-vm-count: FAIL: $name"
  tail -n 20 "$W/$name.log"
}
for n in "$short" "$long"; do
  port=$((port + 1))
  c=(lat --fabric rdma --mode rtc --idle spin --size 8 --liveness-timeout 0 --connect-timeout 60s)
  # Only the serving loop is counted: the server's accept wait before it spins (a run-to-
  # completion accept runs poller cycles) for as long as the native client takes to connect,
  # which differs between the two runs and, divided by the round trips, read as 700 of a
  # count's 1989 instructions a round trip in one boot.
  (cd "$W" && timeout -s KILL 600 taskset -c 0 valgrind --tool=callgrind \
    --collect-atstart=no --toggle-collect='*proto::serve_with*' \
    --callgrind-out-file="$W/bench-$n.cg" "$bench" "${c[@]}" --server "rdma://$IP:$port" --once \
    >"$W/bench-server-$n.log" 2>&1) &
  spid=$!
  sleep 5
  client "$spid" "bench-client-$n" "$bench" "${c[@]}" --iters "$n" --warmup 10000 --client "rdma://$IP:$port"
  wait
  timeout -s KILL 600 taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$W/perftest-$n.cg" \
    ib_send_lat -d "$D" -x "$X" -F -s 8 -n "$n" >"$W/perftest-server-$n.log" 2>&1 &
  spid=$!
  sleep 5
  client "$spid" "perftest-client-$n" ib_send_lat -d "$D" -x "$X" -F -s 8 -n "$n" "$IP"
  wait
done
GUEST

RXE_VM_RW=$work scripts/rxe-vm \
  "bash -c $(printf %q "$guest") guest $(printf %q "$bench") $short $long $work"
for f in bench perftest; do
  for n in "$short" "$long"; do
    [ -s "$work/$f-$n.cg" ] || { echo "rdma-vm-count: no callgrind output for $f, $n round trips" >&2; exit 1; }
    callgrind_annotate --auto=no "$work/$f-$n.cg" >"$work/$f-$n.txt"
  done
done
# bench's receive attempts per run: the calls of `Polled::try_recv` or, where that is inlined
# (as since its dedicated-poller fast case), of `Polled::try_recv_general`, which every
# run-to-completion receive calls (the warm-up's included).
for n in "$short" "$long"; do
  callgrind_annotate --tree=calling --inclusive=yes --auto=no "$work/bench-$n.cg" \
    >"$work/bench-$n.tree"
  calls=$(sed -n 's/.*>   .*Polled::try_recv\(_general\)\? (\([0-9,]*\)x).*/\2/p' \
    "$work/bench-$n.tree" | tr -d , | awk '{ s += $1 } END { print s + 0 }')
  echo "$calls" >"$work/bench-$n.attempts"
done
python3 - "$work" "$short" "$long" "$PWD" <<'PY'
import collections, re, sys
work, short, long_, repo = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rt = long_ - short

def load(path):
    d, started = collections.Counter(), False
    for line in open(path):
        if "file:function" in line:
            started = True
            continue
        m = re.match(r"^\s*([0-9,]+) \([ 0-9.]+%\)\s+(.*)$", line)
        if started and m:
            d[m.group(2).strip()] += int(m.group(1).replace(",", ""))
    return d

def per_rt(name):
    a, b = load(f"{work}/{name}-{short}.txt"), load(f"{work}/{name}-{long_}.txt")
    return {k: (b[k] - a[k]) / rt for k in set(a) | set(b)}

def group(k):
    if "librxe" in k or "libibverbs" in k:
        return "rxe provider, libibverbs"
    if "msort.c" in k or "qsort" in k:
        return "sorting the samples (after the run)"
    if "hdrhistogram" in k or "intervals.rs" in k:
        return "histograms, interval series"
    if re.search(r"time\.rs|Instant|Timespec|clock_gettime|vdso", k):
        return "clock"
    if "libc.so" in k or "ld-linux" in k:
        return "libc (copy, locks, doorbell write)"
    if k.startswith("bench/src/") or "/bench/src/" in k or "ib_send_lat" in k:
        return "the program's own loop"
    return "engine and what inlines into it"

attempts = {n: int(open(f"{work}/bench-{n}.attempts").read()) for n in (short, long_)}
for name in ("bench", "perftest"):
    d = per_rt(name)
    g = collections.Counter()
    for k, v in d.items():
        g[group(k)] += v
    print(f"{name}: {sum(d.values()):.0f} instructions per round trip ({rt} round trips)")
    if name == "bench":
        # The client's warm-up (10000 round trips) comes before its measured ones.
        per = [f"{attempts[n] / (n + 10000):.2f}" for n in (short, long_)]
        print(f"  receive attempts per round trip: {' and '.join(per)} (1.00: no empty poll)")
    for k, v in g.most_common():
        if abs(v) >= 0.5:
            print(f"  {v:8.1f}  {k}")
print("bench server, the 25 costliest functions (instructions per round trip, own cost):")
d = per_rt("bench")
for k, v in sorted(d.items(), key=lambda x: -x[1])[:25]:
    k = re.sub(r"/rustc/[0-9a-f]+/library/|/[^ ]*\.cargo/registry/src/[^/]+/", "", k).replace(repo + "/", "")
    print(f"  {v:8.1f}  {k[:150]}")
# Per call, from the long run alone (inclusive: what the call and everything under it ran). A
# send's and a take's counts do not depend on how many empty polls a run made, so they compare
# across boots and builds where the totals above spread; an attempt's and a CQ poll's average
# the empty ones with the rest.
calls, incl = collections.Counter(), collections.Counter()
steps = {
    "Polled::send (a send)": "Polled::send (",
    "PollerConn::send_one (its post, under it)": "PollerConn<C>>::send_one (",
    "Polled::try_recv_general (a receive attempt)": "Polled::try_recv_general (",
    "Poller::direct_shared_poll (the CQ poll of an attempt)": "Poller<F>>::direct_shared_poll (",
    "PollerConn::recv_one (a delivered message's take)": "PollerConn<C>>::recv_one (",
}
for line in open(f"{work}/bench-{long_}.tree"):
    m = re.match(r"^\s*([0-9,]+) \([ 0-9.]+%\)\s+>\s+(.*) \(([0-9,]+)x\)", line)
    if not m:
        continue
    for label, pat in steps.items():
        if pat in m.group(2) + " (":
            incl[label] += int(m.group(1).replace(",", ""))
            calls[label] += int(m.group(3).replace(",", ""))
print(f"bench server, per call ({long_} round trips + the warm-up; inclusive instructions):")
for label in steps:
    if calls[label]:
        print(f"  {incl[label] / calls[label]:8.1f}  {label}, {calls[label]} calls")
PY
