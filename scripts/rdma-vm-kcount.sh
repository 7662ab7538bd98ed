#!/usr/bin/env bash
# scripts/rdma-vm-kcount.sh - what the guest KERNEL does per 8-B round trip of bench's rdma
# ping-pong against perftest's ib_send_lat, counted in ONE Soft-RoCE VM boot: rxe's own steps
# (kprobes on its functions), the CQEs posted, system calls, context switches, wake-ups,
# interrupts and page faults, each divided by the round trips of the same window.
#
# The other half of scripts/rdma-vm-count.sh's map (user-space instructions, by callgrind):
# under rxe every SEND is a `write(2)` doorbell into the kernel, which runs the requester, the
# peer QP's responder, the ACK and the completer in software, so a difference in what the
# kernel is asked to do (more packets, more completions, signalled sends, wake-ups of other
# threads, a descheduled spinner) shows here, and the user-space difference does not.
#
# Each round starts a pair (server on vCPU 0, client on vCPU 1, many round trips), waits
# DELAY seconds for it to reach its steady state, counts system-wide for WINDOW seconds
# (`perf stat -a`), then stops the pair; bench first, then ib_send_lat. The round trips of a
# window are its `rxe_post_send` calls over 2 (each side posts one SEND a round trip: bench's
# unsignalled sends and piggy-backed credits included; a build that posts more would show as
# a lower round-trip rate in the same window, and in the `write` count). Both pairs spin:
#   bench lat --fabric rdma --mode rtc --idle spin --size 8 --liveness-timeout 0
#   ib_send_lat -F -s 8
# The kprobes themselves cost time under TCG, so the windows' round-trip times are for
# comparing the two tools of one round, not absolute figures.
#
# usage: scripts/rdma-vm-kcount.sh [BENCH]  (env: ROUNDS=2, DELAY=6, WINDOW=4, ITERS=400000)
#   BENCH   a bench binary built with `--features rdma` (default: built here)
# Prints, per round, each tool's round trips in the window (and the mean round trip they
# imply) and every counter per round trip, side by side. Needs perf (linux-perf, installed
# when missing) and the guest kernel's kprobes and tracepoints (Debian's have them).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-2} delay=${DELAY:-6} window=${WINDOW:-4} iters=${ITERS:-400000}
for v in "$rounds" "$delay" "$window" "$iters"; do
  [[ $v =~ ^[0-9]+$ && $v -gt 0 ]] ||
    { echo "rdma-vm-kcount: ROUNDS, DELAY, WINDOW and ITERS must be positive numbers" >&2; exit 2; }
done

# shellcheck source=scripts/lib/rdma-vm.sh
. scripts/lib/rdma-vm.sh
scripts/setup-rdma
rdma_vm_tool rdma-vm-kcount perf linux-perf
rdma_vm_bench rdma-vm-kcount "${1:-}"
rdma_vm_workdir rdma-vm-kcount

read -r -d '' guest <<'GUEST' || true
set -uo pipefail
bench=$1 W=$2 rounds=$3 delay=$4 window=$5 iters=$6
D=$RXE_VM_DEV X=$RXE_VM_GID_INDEX IP=$RXE_VM_IP
T=/sys/kernel/tracing
mountpoint -q $T || mount -t tracefs nodev $T
echo -1 >/proc/sys/kernel/perf_event_paranoid
export PAGER=cat
ev=()
for f in rxe_post_send rxe_requester rxe_responder rxe_completer rxe_rcv rxe_cq_post; do
  echo "p:k_$f $f" >>$T/kprobe_events 2>/dev/null && ev+=("kprobes:k_$f")
done
for e in syscalls:sys_enter_write syscalls:sys_enter_sched_yield syscalls:sys_enter_futex \
  syscalls:sys_enter_poll sched:sched_switch sched:sched_wakeup irq:softirq_entry \
  irq:irq_handler_entry irq_vectors:local_timer_entry irq_vectors:reschedule_entry \
  irq_vectors:call_function_single_entry exceptions:page_fault_user; do
  perf list "$e" 2>/dev/null | grep -q "${e#*:}" && ev+=("$e")
done
[[ " ${ev[*]} " == *" kprobes:k_rxe_post_send "* ]] ||
  { echo "rdma-vm-kcount: FAIL: no kprobe on rxe_post_send"; exit 1; }
E=$(IFS=,; echo "${ev[*]}")
# pair NAME SERVER... -- CLIENT...: starts the pair, counts one window, stops it.
pair() {
  local name=$1 s=() c=()
  shift
  while [ "$1" != -- ]; do s+=("$1"); shift; done
  shift
  c=("$@")
  taskset -c 0 "${s[@]}" >"$W/$name.server" 2>&1 &
  local sp=$!
  sleep 3
  taskset -c 1 "${c[@]}" >"$W/$name.client" 2>&1 &
  local cp=$!
  sleep "$delay"
  if kill -0 "$cp" 2>/dev/null; then
    perf stat -a -x, -e "$E" -o "$W/$name.stat" -- sleep "$window" >/dev/null 2>&1
    kill -0 "$cp" 2>/dev/null || echo "ended" >"$W/$name.short"
  else
    echo "rdma-vm-kcount: FAIL: $name's client ended before its window"
    tail -n 5 "$W/$name.client"
  fi
  kill -KILL "$cp" "$sp" 2>/dev/null
  wait 2>/dev/null # (the shell's "Killed" notices)
}
bl=(lat --fabric rdma --mode rtc --idle spin --size 8 --liveness-timeout 0 --connect-timeout 60s)
for r in $(seq "$rounds"); do
  port=$((7570 + r))
  pair "bench-$r" "$bench" "${bl[@]}" --server "rdma://$IP:$port" --once -- \
    "$bench" "${bl[@]}" --iters "$iters" --warmup 1000 --client "rdma://$IP:$port"
  pair "perftest-$r" ib_send_lat -d "$D" -x "$X" -F -s 8 -n "$iters" -- \
    ib_send_lat -d "$D" -x "$X" -F -s 8 -n "$iters" "$IP"
done
GUEST

RXE_VM_RW=$work scripts/rxe-vm \
  "bash -c $(printf %q "$guest") guest $(printf %q "$bench") $work $rounds $delay $window $iters"
python3 - "$work" "$rounds" "$window" <<'PY'
import os, sys
work, rounds, window = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def load(name):
    path = f"{work}/{name}.stat"
    if not os.path.exists(path):
        sys.exit(f"rdma-vm-kcount: no counts for {name} (see the VM's output above)")
    d = {}
    for line in open(path):
        f = line.strip().split(",")
        if len(f) >= 3 and f[0].isdigit():
            d[f[2]] = int(f[0])
    return d

for r in range(1, rounds + 1):
    b, p = load(f"bench-{r}"), load(f"perftest-{r}")
    rb, rp = b["kprobes:k_rxe_post_send"] / 2, p["kprobes:k_rxe_post_send"] / 2
    if rb == 0 or rp == 0:
        sys.exit(f"rdma-vm-kcount: round {r}: no round trip in a window")
    print(f"round {r}: round trips in the {window:g}-s window: bench {rb:.0f} "
          f"(mean {window * 1e6 / rb:.1f} us), ib_send_lat {rp:.0f} (mean {window * 1e6 / rp:.1f} us)")
    print(f"  {'per round trip':42s} {'bench':>9s} {'ib_send_lat':>12s}")
    for k in b:
        name = k.replace("kprobes:k_", "rxe: ").replace("syscalls:sys_enter_", "syscall: ")
        print(f"  {name:42s} {b[k] / rb:9.3f} {p.get(k, 0) / rp:12.3f}")
    for t in ("bench", "perftest"):
        if os.path.exists(f"{work}/{t}-{r}.short"):
            print(f"  note: {t}'s pair ended inside its window (raise ITERS)")
PY
