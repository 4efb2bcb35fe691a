#!/usr/bin/env bash
# GPU machine: the GPU tests (forward and backward) and the sanitizers on the variants'
# calls: sliding windows and attention sinks, forward and backward (deterministic too),
# with soft-capping and ALiBi. usage: scripts/variant-checks.sh  (after
# scripts/device-prep.sh; results in $OUT)
source "$(dirname "$0")/device-env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu_tests.log"
FA3_REQUIRE_GPU=1 timeout 330 $B/gpu ${TESTS_FILTER:-} >> "$OUT/gpu_tests.log" 2>&1 || status=1
FA3_REQUIRE_GPU=1 timeout 150 $B/gpu_backward ${TESTS_FILTER:-} >> "$OUT/gpu_tests.log" 2>&1 || status=1
grep -E "^test result|FAILED|failed" "$OUT/gpu_tests.log"
B=$B OUT=$OUT scripts/sanitize.sh "1x300x2x64 --window 40,9" "1x1000x4x64 --heads-k 2 --causal --window 100,0 --backward --deterministic" \
  "1x700x2x128 --causal --window 128,0 --softcap 2 --backward" "1x500x4x128 --heads-k 1 --window 64,inf --alibi --backward --deterministic" \
  "1x300x2x256 --seqlen-k 700 --window 5,3" "1x300x4x128 --heads-k 2 --causal --sinks -1,0.5,2,3.5 --backward" \
  "2x500x4x64 --seqlen-k 200 --causal --sinks 1 --backward --deterministic" "1x300x2x256 --sinks 2,-1" || status=1

exit $status
