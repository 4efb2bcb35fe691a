#!/usr/bin/env bash
# On the GPU machine: the FP8 GPU tests (among them V as stored, transposed by the
# kernel), compute-sanitizer on the in-kernel transpose (every head dim, both key tiles),
# and `bench --dtype e4m3 --fp8-v all` in bursts as the FP8 anchors (1 s idle, 5 warm-ups,
# median of 20): V transposed beforehand, transposed by the kernel, and transposed by a
# separate pass before each call.
# env: SEQLENS (default 1024,4096,16384), HDIMS (default 64,128,256), SANITIZE (default 1).
source "$(dirname "$0")/device-env.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
FA3_REQUIRE_GPU=1 "$B/gpu_fp8" > "$OUT/gpu_fp8.txt" 2>&1 || status=1
grep -E "test result|FAIL" "$OUT/gpu_fp8.txt"
if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck synccheck; do
    for t in hdim64_sk300_causal hdim128_sk300 hdim128_sk2100 hdim256_sk300_causal; do
      echo "$tool v_in_bshd_gives_the_transposed_v_result_$t"
    done
  done | B=$B TMP=$TMP xargs -P 6 -L 1 bash -c 'log=$(mktemp -p "$TMP"); FA3_REQUIRE_GPU=1 timeout 300 compute-sanitizer --tool "$0" --error-exitcode 9 "$B/gpu_fp8" "$1" --exact > "$log" 2>&1; rc=$?
    echo "$0 $1: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1) $(grep -cE "^test .* ok$" "$log") passed (rc $rc)"; [ $rc -eq 0 ] || echo "SANITIZER FAILED $0 $1"' \
    | sort | tee "$OUT/sanitize.log"
  grep -q "SANITIZER FAILED" "$OUT/sanitize.log" && status=1
fi
"$B/fa3" bench --dtype e4m3 --fp8-v all --hdims "${HDIMS:-64,128,256}" --seqlens "${SEQLENS:-1024,4096,16384}" \
  --warmup-ms 0 --cooldown-ms 1000 --warmup 5 --iters 20 --csv "$OUT/fp8_vlayouts.csv" > "$OUT/fp8_vlayouts.txt" 2>&1 || status=1
cat "$OUT/fp8_vlayouts.txt"
exit $status
