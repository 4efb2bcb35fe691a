#!/usr/bin/env bash
# GPU machine: the hdim-256 backward's GPU tests, then its timings and cuDNN's in the same
# call (steady state, fp16, the paper grid at hdim 256), then the rest of the backward suite.
# usage: scripts/bwd256-run.sh [tests] [variants] [sanitize] [bench] [suite]
source scripts/device-env.sh
for step in "$@"; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case $step in
    tests) FA3_REQUIRE_GPU=1 timeout 300 $B/gpu_backward d256 2>&1 | tee "$OUT/bwd256_tests.log" | grep -vE '^    |\.\.\. ok$' ; status=$((status | $?)) ;;
    variants) FA3_REQUIRE_GPU=1 timeout 200 $B/variants_device d256 2>&1 | tee "$OUT/variants256_tests.log" | grep -vE '^    |\.\.\. ok$' ; status=$((status | $?)) ;;
    sanitize) B=$B OUT=$OUT scripts/sanitize.sh "1x300x2x256 --backward" "1x300x2x256 --causal --backward --deterministic" "1x200x2x256 --softcap 5 --window 40,0 --backward" "1x700x2x256 --causal --backward" || status=1 ;;
    bench)
      timeout 200 $B/fa3 bench --pass bwd --hdims 256 --csv "$OUT/bwd256_ours.csv" > "$TMP/ours.log" || status=1
      cat "$TMP/ours.log"
      for a in "--deterministic" "--softcap 30"; do
        timeout 100 $B/fa3 bench --pass bwd --hdims 256 --seqlens 8192,16384 $a | grep -v "^#" | sed "s/^/$a /"
      done | tee "$OUT/bwd256_modes.txt"
      timeout 240 python3 scripts/peers.py --pass bwd --backends torch-cudnn --hdims 256 --csv "$OUT/bwd256_cudnn.csv" > "$TMP/peers.log" 2>&1 || status=1
      tail -n 15 "$TMP/peers.log" ;;
    suite) FA3_REQUIRE_GPU=1 timeout 400 $B/gpu_backward 2>&1 | tee "$OUT/bwd_suite.log" | grep -vE '^    |\.\.\. ok$' ; status=$((status | $?)) ;;
  esac
done
exit $status
