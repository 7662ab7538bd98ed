# scripts/lib/rdma-vm.sh - helpers shared by the Soft-RoCE VM counting scripts
# (scripts/rdma-vm-count.sh, scripts/rdma-vm-kcount.sh). Sourced, not run; each helper's
# messages start with WHO, the calling script's name.

# rdma_vm_tool WHO COMMAND PACKAGE: installs Debian's PACKAGE when COMMAND is missing.
rdma_vm_tool() {
  command -v "$2" >/dev/null && return 0
  echo "$1: installing $3"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y \
    --no-install-recommends "$3" >&2
}

# rdma_vm_bench WHO [BENCH]: sets `bench` to BENCH's absolute path (it must be executable) or,
# without BENCH, builds bench with `--features rdma` here and takes that. Exits 2 on a BENCH
# that is not an executable.
rdma_vm_bench() {
  bench=${2:-}
  if [ -z "$bench" ]; then
    echo "$1: building bench (cargo build --release -p bench --features rdma)"
    cargo build --release -p bench --features rdma
    bench=$PWD/target/release/bench
  fi
  [ -x "$bench" ] || { echo "$1: $bench is not an executable" >&2; exit 2; }
  bench=$(realpath "$bench")
}

# rdma_vm_workdir WHO: sets `work` to a new directory /tmp/WHO.XXXXXX, removed when the script
# exits unless KEEP is set (then its path is printed).
rdma_vm_workdir() {
  work=$(mktemp -d "/tmp/$1.XXXXXX")
  if [ -n "${KEEP:-}" ]; then
    echo "$1: keeping $work"
  else
    # shellcheck disable=SC2064 # expanded now: the directory of this call
    trap "rm -rf '$work'" EXIT
  fi
}
