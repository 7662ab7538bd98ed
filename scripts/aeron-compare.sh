#!/usr/bin/env bash
# A benchmark, not a test: Aeron's C ping-pong over aeron:ipc (aeronmd + cpong + cping) and
# spinwire's `bench lat --floor` back to back on the same two cores, ROUNDS times, then each
# round's p50 and p99.9 RTT and the ratios spinwire/Aeron, spinwire/floor (one cache line
# both ways) and spinwire/two-line floor (one line per direction, the least a design with a
# ring per direction moves, as Aeron's and spinwire's). The last three columns are each side's
# mean of the round trips up to its p99 (`tm99`, from the same percentile listing for both:
# cping's and the bench's .hgrm) and their ratio: where the clock ticks coarsely (10 ns on
# some VMs' TSC) a p50 moves in whole ticks, and this figure still resolves a few ns.
# `a_fl_p50` is the cache-line floor probed just before and after Aeron's run (`bench floor`,
# the larger of the two), and `placement` says whether the row's two sides ran in one placement
# of the VM's vCPUs: a host that moves them between placements whose floors differ several-fold
# (a 2-core KVM guest: 80-90 against about 380 ns) makes a row whose probes differ by more than
# 2x (`MIXED`) compare the two sides across the move. `rg_mean` is the ring floor's mean round
# trip (`bench floor`'s ping-pong over a ring of 16-byte records per direction, the protocol
# under both transports, with no software around it: `floor, rings`), and `a-rg_tm` / `s-rg_tm`
# each side's tm99 less it: what each transport's software adds to the ring protocol, in ns.
#
# Aeron's binaries: AERON_BIN names a directory that holds aeronmd, cping and cpong (Aeron's C
# media driver and C samples); or AERON_SRC names an Aeron source tree or git directory (a clone
# of github.com/real-logic/aeron) and scripts/build-aeron.sh builds them from it first, outside
# this repository (AERON_BUILD, default /tmp/aeron-build; about a minute, once per commit).
# This script fetches nothing.
#
# Usage: AERON_BIN=DIR scripts/aeron-compare.sh [BENCH]
#        AERON_SRC=DIR scripts/aeron-compare.sh [BENCH]
#   BENCH    the bench binary (default target/release/bench)
#   CORES    "PING,PONG": cping and the bench client on the first, cpong and the bench server
#            on the second (default 0,1); aeronmd's shared conductor may use both
#   SIZE     message bytes (default 8); ITERS round trips (default 300000); WARMUP (100000)
#   ROUNDS   rounds, Aeron then spinwire each (default 3)
#   APIS     the `bench --api` values run each round, one row each (default "buffer poll-copy
#            claim": the quick-start calls, then send_copy/poll, the calls Aeron's samples make,
#            then claim/send with try_recv)
#   OUT      where the runs' output goes (default target/aeron-compare)
set -euo pipefail

if [[ -z "${AERON_BIN:-}" ]]; then
    : "${AERON_SRC:?set AERON_BIN to a directory with built aeronmd, cping and cpong, or AERON_SRC to an Aeron source tree or git directory to build them from}"
    AERON_BIN=$("$(dirname "$0")/build-aeron.sh" "$AERON_SRC") || exit 2
fi
BENCH=${1:-target/release/bench}
CORES=${CORES:-0,1}
SIZE=${SIZE:-8}
ITERS=${ITERS:-300000}
WARMUP=${WARMUP:-100000}
ROUNDS=${ROUNDS:-3}
APIS=${APIS:-buffer poll-copy claim}
OUT=${OUT:-target/aeron-compare}
PING_CORE=${CORES%%,*}
PONG_CORE=${CORES##*,}
for b in aeronmd cping cpong; do
    [[ -x "$AERON_BIN/$b" ]] || { echo "no executable $AERON_BIN/$b" >&2; exit 2; }
done
[[ -x "$BENCH" ]] || { echo "no bench binary $BENCH (cargo build --release -p bench)" >&2; exit 2; }
mkdir -p "$OUT"
# hdr_tm99 (each side's mean up to its p99) and placement_probe (the cache-line floor).
. "$(dirname "$0")/lib/measure.sh"

DRIVER_PID=""
PONG_PID=""
AERON_DIR_PATH=""
cleanup() {
    [[ -n "$PONG_PID" ]] && kill "$PONG_PID" 2>/dev/null || true
    [[ -n "$DRIVER_PID" ]] && kill "$DRIVER_PID" 2>/dev/null || true
    wait 2>/dev/null || true
    [[ -n "$AERON_DIR_PATH" ]] && rm -rf "$AERON_DIR_PATH"
    PONG_PID=""
    DRIVER_PID=""
}
trap cleanup EXIT

# `hdr_percentiles_print` (classic, µs): the first value at or above a percentile, in ns.
hdr_pct() {
    awk -v q="$2" '$1 ~ /^[0-9.]+$/ && $2 >= q { printf "%.0f\n", $1 * 1000; exit }' "$1"
}

aeron_round() {
    local r=$1
    AERON_DIR_PATH=$(mktemp -d /dev/shm/aeron-compare.XXXXXX)
    AERON_DIR=$AERON_DIR_PATH AERON_THREADING_MODE=SHARED AERON_SHARED_IDLE_STRATEGY=backoff \
        AERON_PRE_TOUCH_MAPPED_MEMORY=true AERON_IPC_TERM_BUFFER_LENGTH=${AERON_TERM:-65536} \
        taskset -c "$CORES" "$AERON_BIN/aeronmd" >"$OUT/aeronmd-$r.log" 2>&1 &
    DRIVER_PID=$!
    for _ in $(seq 100); do [[ -e "$AERON_DIR_PATH/cnc.dat" ]] && break; sleep 0.1; done
    taskset -c "$PONG_CORE" "$AERON_BIN/cpong" -p "$AERON_DIR_PATH" -c aeron:ipc -C aeron:ipc \
        >"$OUT/cpong-$r.log" 2>&1 &
    PONG_PID=$!
    sleep 1
    timeout 300 taskset -c "$PING_CORE" "$AERON_BIN/cping" -p "$AERON_DIR_PATH" -c aeron:ipc \
        -C aeron:ipc -m "$ITERS" -w "$WARMUP" -L "$SIZE" >"$OUT/cping-$r.log" 2>&1
    cleanup
}

spin_round() {
    local r=$1 api=$2
    "$BENCH" lat --size "$SIZE" --iters "$ITERS" --warmup "$WARMUP" --floor --api "$api" \
        --app-cores "$CORES" --out "$OUT/spinwire-$r-$api" >"$OUT/spinwire-$r-$api.log" 2>&1
}

printf '%-6s %-10s %10s %10s %10s %10s %12s %12s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n' round \
    api floor_p50 fl2_p50 aeron_p50 spin_p50 aeron_p99.9 spin_p99.9 load_avg s/a_p50 s/fl_p50 \
    s/fl2_p50 s/a_p999 s999/s50 aeron_tm99 spin_tm99 s/a_tm99 a_fl_p50 placement rg_mean \
    a-rg_tm s-rg_tm
for r in $(seq "$ROUNDS"); do
    afl1=$(placement_probe "$BENCH" "$CORES")
    aeron_round "$r"
    afl2=$(placement_probe "$BENCH" "$CORES")
    afl=$(( ${afl1:-0} > ${afl2:-0} ? ${afl1:-0} : ${afl2:-0} ))
    aflmin=$(( ${afl1:-0} < ${afl2:-0} ? ${afl1:-0} : ${afl2:-0} ))
    for api in $APIS; do
        spin_round "$r" "$api"
    done
    a50=$(hdr_pct "$OUT/cping-$r.log" 0.5)
    a999=$(hdr_pct "$OUT/cping-$r.log" 0.999)
    atm=$(hdr_tm99 "$OUT/cping-$r.log")
    load=$(cut -d' ' -f1 /proc/loadavg)
    for api in $APIS; do
        read -r f50 f2 s50 s999 rg < <(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
p = d["points"][0]["rtt_ns"]
f = d["floor"]
rg = (f.get("rtt_rings_ns") or {}).get("mean", 0)
print(f["rtt_ns"]["p50"], f["rtt_two_lines_ns"]["p50"], p["p50"], p["p99_9"], rg)' \
            "$OUT/spinwire-$r-$api/summary.json")
        stm=$(hdr_tm99 "$OUT/spinwire-$r-$api/lat-shm-rtc-${SIZE}B.hgrm")
        python3 -c '
import sys
r, api, f50, f2, a50, s50, a999, s999, load, atm, stm, afl, aflmin, rg = sys.argv[1:]
f50, f2, a50, s50, a999, s999, atm, stm, afl, aflmin, rg = map(
    float, (f50, f2, a50, s50, a999, s999, atm, stm, afl, aflmin, rg))
probes = [v for v in (f50, afl, aflmin) if v > 0]
mixed = len(probes) > 1 and max(probes) > 2 * min(probes)
# A bench without the ring floor (older summary.json): its three columns "-".
rings = ("%9.1f %9.1f %9.1f" % (rg, atm - rg, stm - rg)) if rg > 0 else "%9s %9s %9s" % (("-",) * 3)
print("%-6s %-10s %10.0f %10.0f %10.0f %10.0f %12.0f %12.0f %9s %9.2f %9.2f %9.2f %9.2f %9.2f"
      " %9.1f %9.1f %9.3f %9.0f %9s %s" % (
    r, api, f50, f2, a50, s50, a999, s999, load, s50 / a50, s50 / f50, s50 / f2, s999 / a999,
    s999 / s50, atm, stm, stm / atm, afl, "MIXED" if mixed else "one", rings))
' "$r" "$api" "$f50" "$f2" "$a50" "$s50" "$a999" "$s999" "$load" "$atm" "$stm" "$afl" "$aflmin" "$rg"
    done
done
