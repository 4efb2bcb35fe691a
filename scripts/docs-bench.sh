#!/usr/bin/env bash
# GPU machine: document masks. The GPU tests of documents and sliding windows (forward
# and backward), then speed, bf16, TFLOP/s on visible pairs: plain causal and causal with
# documents of 2048 tokens (hdim 64 and 128, 4k and 16k, forward and backward),
# FlexAttention's document mask (hdim 128, 16k), and an A/B of the sliding-window kernels
# (.device/exp/base vs .device/exp/new), whose key ranges now go through the code the
# documents share. usage: scripts/docs-bench.sh tests|speed|peers (results in $OUT)
source "$(dirname "$0")/device-env.sh"
part=${1:-tests}
if [ "$part" = tests ]; then
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu_tests.log"
for t in docs window; do
  FA3_REQUIRE_GPU=1 timeout 150 $B/gpu $t >> "$OUT/gpu_tests.log" 2>&1 || status=1
  FA3_REQUIRE_GPU=1 timeout 120 $B/gpu_backward $t >> "$OUT/gpu_tests.log" 2>&1 || status=1
done
grep -E "^test result|FAILED|failed" "$OUT/gpu_tests.log"
elif [ "$part" = speed ]; then
grid="--dtype bf16 --hdims 64,128 --seqlens 4096,16384 --causal on"
for pass in fwd bwd; do
  timeout 100 $B/fa3 bench $grid --pass $pass --csv "$TMP/plain_$pass.csv" > /dev/null || status=1
  timeout 100 $B/fa3 bench $grid --pass $pass --doc-lens 2048 --csv "$TMP/docs_$pass.csv" > /dev/null || status=1
done
{ head -n 1 "$TMP/plain_fwd.csv"; cat "$TMP"/plain_*.csv "$TMP"/docs_*.csv | grep -v '^impl' | sort; } | tee "$OUT/docs.csv"
else
timeout 150 python3 scripts/flex_peers.py --hdim 128 --seqlen 16384 --variants causal,causal_docs2048 --csv "$OUT/flex.csv" 2>&1 | tail -n 6 || status=1
mkdir -p .device/exp/new && cp $B/fa3 .device/exp/new/fa3
VARIANTS="base new" ROUNDS=2 PEERS=0 LABEL=ab_window OUT=$OUT DTYPE=bf16 \
  BENCH_ARGS="--hdims 64,128 --seqlens 16384 --causal on --window 4096,0 --pass fwd" scripts/ab.sh || status=1
fi
exit $status
