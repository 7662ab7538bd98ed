#!/usr/bin/env bash
# The soak, 60-second version (scripts/soak): churn, SIGKILLed and SIGSTOPped peers, an idle
# peer, tcp peers stopped mid-record, mutated hellos, every message sequence-checked, RSS and
# fds flat. Run-to-completion with backoff idling in every
# process, so it does not hog the cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
SOAK_SECONDS=60 scripts/soak
