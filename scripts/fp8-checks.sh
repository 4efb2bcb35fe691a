#!/usr/bin/env bash
# On the GPU machine: the FP8 GPU tests, `run --dtype e4m3 --check` (with and without
# incoherent processing), and hdim 64's FP8 and bf16 forward timed in the same call.
source "$(dirname "$0")/device-env.sh"
FA3_REQUIRE_GPU=1 "$B/gpu_fp8" > "$OUT/gpu_fp8.txt" 2>&1 || status=1
grep -E "test result|FAIL" "$OUT/gpu_fp8.txt"
for flags in "" "--incoherent"; do
  "$B/fa3" run --random 2x4096x16x128 --causal --dtype e4m3 $flags --check 2>&1 | tee -a "$OUT/run_e4m3.txt" || status=1
done
"$B/fa3" bench --dtype e4m3 --hdims 64 --csv "$OUT/fp8_hdim64.csv" > "$OUT/fp8_hdim64.txt" 2>&1 || status=1
"$B/fa3" bench --dtype bf16 --hdims 64 --csv "$OUT/bf16_hdim64.csv" > "$OUT/bf16_hdim64.txt" 2>&1 || status=1
cat "$OUT/fp8_hdim64.txt" "$OUT/bf16_hdim64.txt"
exit $status
