#!/usr/bin/env bash
# scripts/rdma-vm-scale.sh - many RDMA connections on one poller, in the Soft-RoCE VM:
# registered receive memory per connection with and without a shared receive queue
# (EngineBuilder::rdma_srq + rdma_srq_credits), at 1, 100 and CONNS connections, and how
# long the connects took.
#
# usage: scripts/rdma-vm-scale.sh [CONNS]     (default 1000)
#
# Runs engine/tests/rdma_srq.rs's registered_receive_memory_per_connection_with_and_without_srq
# with SPINWIRE_SRQ_SCALE_CONNS=CONNS through scripts/ci/rdma-vm.sh (one boot). It prints
# a table (conns, mode, registered receive and send bytes per connection end, connect
# seconds, SRQ receive bytes / private-pool receive bytes) and fails when the SRQ figure is
# above 10 % of the private pools'. Without an SRQ, 1000 connections of 64 buffers do not
# fit one poller's completion queue (rxe: 32767 entries): the table says so.
# CI runs the same test at 1 and 100 connections (scripts/ci/rdma-vm.sh); this is the scale
# step, a few minutes under TCG. Knobs: every RXE_VM_* knob of scripts/rxe-vm.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h | --help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
conns=${1:-1000}
[[ $conns =~ ^[0-9]+$ ]] || { echo "rdma-vm-scale: CONNS must be a number" >&2; exit 2; }
export SPINWIRE_SRQ_SCALE_CONNS=$conns
RXE_VM_ENV="${RXE_VM_ENV:+$RXE_VM_ENV }SPINWIRE_SRQ_SCALE_CONNS" \
  exec scripts/ci/rdma-vm.sh --no-smoke --test rdma_srq -- \
  registered_receive_memory_per_connection_with_and_without_srq --exact --nocapture
