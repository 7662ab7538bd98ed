# scripts/lib/measure.sh - measuring helpers shared by the comparison scripts
# (scripts/aeron-compare.sh, scripts/tcp-compare.sh, scripts/ci/ffi.sh). Sourced, not run.

# hdr_tm99 FILE: the mean of the round trips up to the 99th percentile ("tm99"), in ns, from an
# HdrHistogram percentile listing in µs (`hdr_percentiles_print` classic: value, percentile,
# total count; Aeron's cping and the bench's .hgrm alike): each row's count since the row before,
# at the row's value. Where a clock ticks coarsely (10 ns on some VMs' TSC) a p50 moves in whole
# ticks, and this resolves a few ns. Prints "nan" for a listing with no rows.
hdr_tm99() {
  awk '$1 ~ /^[0-9.]+$/ && $2 ~ /^[0-9.]+$/ && $3 ~ /^[0-9]+$/ {
    if ($2 > 0.99) exit
    sum += ($3 - n) * $1; n = $3
  } END { if (n > 0) printf "%.1f\n", sum / n * 1000; else print "nan" }' "$1"
}

# placement_probe BENCH CORES: the cache-line floor's RTT p50 on CORES ("A,B") in ns, from a
# short `bench floor` (nothing printed when it fails). A VM's host may move its vCPUs between
# placements whose floors differ several-fold (a 2-core KVM guest: 80-90 against about 380 ns);
# two measurements compare only when the probes around them agree.
placement_probe() {
  "$1" floor --size 8 --iters 20000 --app-cores "$2" 2>/dev/null |
    sed -n 's/.*cache-line RTT p50 \([0-9.]*\) us.*/\1/p' | head -1 |
    awk '{ printf "%.0f\n", $1 * 1000 }' || true
}
