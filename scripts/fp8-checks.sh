#!/usr/bin/env bash
# On the GPU machine: the FP8 GPU tests, then the FP8 forward and the bf16 forward
# timed in the same call (FA3 grid, both timing modes' burst settings as perf.md).
source "$(dirname "$0")/device-env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
FA3_REQUIRE_GPU=1 "$B/gpu_fp8" 2>&1 | tee "$OUT/gpu_fp8.txt" | grep -E "PASS|FAIL|test result|panicked|Error|error" | tail -60 || status=1
SEQ=${SEQ:-1024,2048,4096,8192,16384}
"$B/fa3" bench --dtype e4m3 --hdims 128,256 --seqlens "$SEQ" --csv "$OUT/fp8.csv" 2>&1 | tee "$OUT/fp8_bench.txt"
"$B/fa3" bench --dtype bf16 --hdims 128,256 --seqlens "$SEQ" --csv "$OUT/bf16.csv" 2>&1 | tee "$OUT/bf16_bench.txt"
exit $status
