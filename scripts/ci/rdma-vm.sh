#!/usr/bin/env bash
# The Soft-RoCE VM suite (filled in by the rxe-vm harness work).
set -euo pipefail
echo "rdma-vm: not yet wired" >&2
exit 1
