#!/usr/bin/env bash
# On the GPU machine: the FP8 GPU tests, the FP8 forward (block and per-head factors) and
# the bf16 forward timed in the same call over the FA3 grid, then an A/B of the 16-bit
# kernels against .device/exp/base (unused FP8 paths must cost the 16-bit kernels nothing).
source "$(dirname "$0")/device-env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
FA3_REQUIRE_GPU=1 "$B/gpu_fp8" > "$OUT/gpu_fp8.txt" 2>&1 || status=1
grep -E "test result" "$OUT/gpu_fp8.txt"
SEQ=${SEQ:-1024,2048,4096,8192,16384}
"$B/fa3" bench --dtype e4m3 --hdims 128,256 --seqlens "$SEQ" --csv "$OUT/fp8.csv" > "$OUT/fp8_bench.txt" 2>&1 || status=1
"$B/fa3" bench --dtype bf16 --hdims 128,256 --seqlens "$SEQ" --csv "$OUT/bf16.csv" > "$OUT/bf16_bench.txt" 2>&1 || status=1
cat "$OUT/fp8_bench.txt" "$OUT/bf16_bench.txt"
if [ -d .device/exp/base ]; then
  OUT=$OUT VARIANTS="base new" PEERS=0 LABEL=ab_16bit BENCH_ARGS="--hdims 64,128,256 --seqlens 4096,16384" bash scripts/ab.sh || status=1
fi
exit $status
