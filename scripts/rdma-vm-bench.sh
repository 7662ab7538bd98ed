#!/usr/bin/env bash
# scripts/rdma-vm-bench.sh - run the `bench` CLI over --fabric rdma, next to
# perftest, in ONE Soft-RoCE VM boot: a functional check of bench's RDMA path.
#
# usage: scripts/rdma-vm-bench.sh [SUBCOMMAND [BENCH_ARG...]]
#   SUBCOMMAND   bench subcommand to run (default: lat)
#   BENCH_ARG    replace the default run-length args (--iters 20000 --warmup 1000)
# Example: scripts/rdma-vm-bench.sh rate --iters 100000
#
# Steps: scripts/setup-rdma; cargo build -p bench --features rdma --release;
# then in the VM: perftest ib_send_lat and ib_write_bw on rxe0 (the reference
# for what the emulated stack does), then a bench server
# (--server rdma://$RXE_VM_IP:7471 --once) and a bench client against it.
# Exit status: 0 if perftest, the bench server and the bench client all passed.
#
# The numbers are EMULATION numbers (TCG, Soft-RoCE in the guest kernel): use
# them to compare bench with perftest on the same stack, never as a
# performance claim. Knobs: RXE_VM_* (scripts/rxe-vm); RXE_VM_SMP defaults to 3
# here (two busy-polling processes plus rxe's softirq work).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

sub=${1:-lat}
[ $# -gt 0 ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--iters 20000 --warmup 1000)

scripts/setup-rdma
echo "rdma-vm-bench: building bench (cargo build -p bench --features rdma --release)"
bench=$(cargo build -p bench --features rdma --release --message-format=json |
  jq -r 'select(.reason == "compiler-artifact" and .executable != null
                and (.target.kind | index("bin"))) | .executable' | tail -n 1)
[ -x "$bench" ] || { echo "rdma-vm-bench: no bench executable was built" >&2; exit 1; }

# The guest-side script: positional args are BENCH SUBCOMMAND BENCH_ARG...
read -r -d '' guest <<'GUEST' || true
set -uo pipefail
bench=$1 sub=$2
shift 2
D=$RXE_VM_DEV X=$RXE_VM_GID_INDEX IP=$RXE_VM_IP EP=rdma://$RXE_VM_IP:7471
fails=0
pair() { # NAME SERVER_CMD... -- CLIENT_CMD...  (client retried until the server listens)
  local name=$1 s=() c=() spid src crc=1 _
  shift
  while [ "$1" != -- ]; do s+=("$1"); shift; done
  shift
  c=("$@")
  echo "rdma-vm-bench: ==> $name"
  timeout -s KILL 180 "${s[@]}" >/tmp/server.out 2>&1 &
  spid=$!
  sleep 0.5
  for _ in $(seq 20); do
    timeout -s KILL 180 "${c[@]}" >/tmp/client.out 2>&1
    crc=$?
    [ $crc -eq 0 ] && break
    kill -0 "$spid" 2>/dev/null || break # retry only while the server still waits
    sleep 0.5
  done
  wait "$spid"
  src=$?
  cat /tmp/client.out
  if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
    echo "rdma-vm-bench: $name FAILED (client exit $crc, server exit $src); server output:"
    tail -n 30 /tmp/server.out
    fails=$((fails + 1))
  fi
}
pair "perftest ib_send_lat" ib_send_lat -d "$D" -x "$X" -F -- ib_send_lat -d "$D" -x "$X" -F "$IP"
pair "perftest ib_write_bw" ib_write_bw -d "$D" -x "$X" -F -n 1000 -- ib_write_bw -d "$D" -x "$X" -F -n 1000 "$IP"
# One vCPU each for the two busy-polling sides; with 3 or more vCPUs, vCPU 0
# is left to rxe's softirq work (bench pins both sides to core 0 otherwise).
if [ "$(nproc)" -ge 3 ]; then srv_core=1 cli_core=2; else srv_core=0 cli_core=1; fi
pair "bench $sub --fabric rdma" \
  "$bench" "$sub" --fabric rdma --server "$EP" --once --app-cores "$srv_core" "$@" -- \
  "$bench" "$sub" --fabric rdma --client "$EP" --app-cores "$cli_core" "$@"
echo "rdma-vm-bench: $fails failed (emulated numbers: not performance figures)"
exit $fails
GUEST

cmd="bash -c $(printf '%q' "$guest") rdma-vm-bench $(printf '%q ' "$bench" "$sub" "${args[@]}")"
RXE_VM_SMP=${RXE_VM_SMP:-3} RXE_VM_TIMES=1 "$ROOT/scripts/rxe-vm" "$cmd"
