#!/usr/bin/env bash
# GPU machine: block-sparse masks (after scripts/variants-prep.sh). STEPS (default all):
# `tests` the variants example's GPU tests; `sanitize` compute-sanitizer (memcheck,
# racecheck, synccheck) on a block-mask case per head dim, forward and backward; `bench`
# the example's variants (with and without block masks) and FlexAttention with the same
# masks, bf16, 16k tokens, hdim 128 and 64. Results in $OUT.
# usage: scripts/sparse-run.sh [tests] [sanitize] [bench]
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-.device/bin}
OUT=${OUT:-/tmp/fa3-out}
mkdir -p "$OUT"
steps=${*:-tests sanitize bench}
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
for step in $steps; do
  case $step in
  tests)
    FA3_REQUIRE_GPU=1 timeout 420 "$B/variants_device" ${TESTS_FILTER:-} > "$OUT/variants_tests.log" 2>&1 || status=1
    grep -E "^test result|FAILED|failed|panicked" "$OUT/variants_tests.log" | head -40
    ;;
  sanitize)
    for tool in memcheck racecheck synccheck; do
      for c in local_global_bf16_d64_b2_sq257_sk4097_h4-2_bwd_blockmask local_global_f16_d128_b2_sq17_sk300_h4-2_causal_bwd_blockmask \
               local_global_bf16_d256_b2_sq1000_sk1000_h4-1_causal_bwd_blockmask block_mask_lists_match_the_cpu_rules; do
        echo "$tool $c"
      done
    done | B=$B xargs -P 6 -L 1 bash -c 'log=$(mktemp); timeout 300 compute-sanitizer --tool "$0" --error-exitcode 9 "$B/variants_device" --exact "$1" > "$log" 2>&1; rc=$?
      echo "$0 $1: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$log" | tr "\n" " ") (rc $rc)"' | sort | tee "$OUT/sanitize.log"
    grep -q "(rc [1-9]" "$OUT/sanitize.log" && status=1
    ;;
  bench)
    for d in 128 64; do
      "$B/variants-bench" $d 16384 1 16 > "$OUT/ours_d$d.csv" 2> "$OUT/ours_d$d.log" || status=1
      cat "$OUT/ours_d$d.csv" "$OUT/ours_d$d.log"
      timeout 240 python3 scripts/flex_peers.py --hdim $d --seqlen 16384 --heads 16 --variants causal,prefixlm,localglobal --csv "$OUT/flex_d$d.csv" > "$OUT/flex_d$d.log" 2>&1 || status=1
      cat "$OUT/flex_d$d.csv"
    done
    ;;
  esac
done
exit $status
