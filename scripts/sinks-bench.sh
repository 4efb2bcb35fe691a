#!/usr/bin/env bash
# GPU machine: the backward GPU tests, an A/B of the plain kernels (.device/exp/base against
# the current .device/bin/fa3, forward and backward: unused sinks and windows must cost
# nothing), and the current kernels with and without attention sinks, bf16, forward and
# backward, hdim 64 and 128 at 4k and 16k. usage: scripts/sinks-bench.sh (results in $OUT)
source "$(dirname "$0")/device-env.sh"
FA3_REQUIRE_GPU=1 timeout 150 $B/gpu_backward > "$OUT/gpu_backward.log" 2>&1 || status=1
grep -E "^test result|FAILED" "$OUT/gpu_backward.log"
mkdir -p .device/exp/new && cp $B/fa3 .device/exp/new/fa3
for pass in fwd bwd; do
  hdims=$([ $pass = fwd ] && echo 64,128,256 || echo 64,128)
  VARIANTS="base new" ROUNDS=2 PEERS=0 LABEL=ab_plain_$pass OUT=$OUT \
    BENCH_ARGS="--hdims $hdims --seqlens 4096,16384 --pass $pass" scripts/ab.sh > /dev/null || status=1
done
grid="--dtype bf16 --hdims 64,128 --seqlens 4096,16384 --causal both"
for pass in fwd bwd; do
  timeout 120 $B/fa3 bench $grid --pass $pass --csv "$TMP/plain_$pass.csv" > /dev/null || status=1
  timeout 120 $B/fa3 bench $grid --pass $pass --sinks 1 --csv "$TMP/sinks_$pass.csv" > /dev/null || status=1
done
{ head -n 1 "$TMP/plain_fwd.csv"; cat "$TMP"/plain_*.csv "$TMP"/sinks_*.csv | grep -v '^impl' | sort; } | tee "$OUT/sinks.csv"
cat "$OUT"/ab_plain_*.md
exit $status
