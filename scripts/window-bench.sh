#!/usr/bin/env bash
# GPU machine: sliding-window speed, bf16, TFLOP/s on visible pairs. Plain causal and
# causal with a 4096-key window (hdim 64 and 128, 4k and 16k, forward and backward),
# FlexAttention's same variants (hdim 128, 16k), then an A/B of the plain kernels
# (.device/exp/base vs .device/exp/new, forward and backward) to show the window costs
# them nothing. usage: scripts/window-bench.sh (results in $OUT)
source "$(dirname "$0")/device-env.sh"
grid="--dtype bf16 --hdims 64,128 --seqlens 4096,16384 --causal on"
for pass in fwd bwd; do
  timeout 120 $B/fa3 bench $grid --pass $pass --csv "$TMP/plain_$pass.csv" > /dev/null || status=1
  timeout 120 $B/fa3 bench $grid --pass $pass --window 4096,0 --csv "$TMP/window_$pass.csv" > /dev/null || status=1
done
{ head -n 1 "$TMP/plain_fwd.csv"; cat "$TMP"/plain_*.csv "$TMP"/window_*.csv | grep -v '^impl' | sort; } | tee "$OUT/window.csv"
timeout 240 python3 scripts/flex_peers.py --hdim 128 --seqlen 16384 --csv "$OUT/flex.csv" 2>&1 | tail -n 12 || status=1
mkdir -p .device/exp/new && cp $B/fa3 .device/exp/new/fa3
for pass in fwd bwd; do
  hdims=$([ $pass = fwd ] && echo 64,128,256 || echo 64,128)
  VARIANTS="base new" ROUNDS=2 PEERS=0 LABEL=ab_plain_$pass OUT=$OUT \
    BENCH_ARGS="--hdims $hdims --seqlens 4096,16384 --pass $pass" scripts/ab.sh || status=1
done
exit $status
