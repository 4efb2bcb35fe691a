#!/usr/bin/env bash
# On the GPU machine: every packed-document GPU case, forward (`gpu`) and backward
# (`gpu_backward`), among them documents with ALiBi (soft-capped or not) and soft-capped
# documents' hdim-128 backward, then compute-sanitizer memcheck, racecheck and synccheck
# on forward and backward cases of documents with ALiBi at hdim 128 (TESTS=0: only these).
source "$(dirname "$0")/device-env.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${TESTS:-1}" = 1 ]; then
  FA3_REQUIRE_GPU=1 "$B/gpu" docs > "$OUT/gpu_docs.txt" 2>&1 || status=1
  FA3_REQUIRE_GPU=1 "$B/gpu_backward" docs > "$OUT/gpu_backward_docs.txt" 2>&1 || status=1
  grep -E "test result|FAIL|panicked" "$OUT"/gpu_*docs.txt
fi
for tool in memcheck racecheck synccheck; do
  echo "$tool gpu fa3_bf16_d128_b2_sq700_sk1000_h4-2_full_alibi_docs"
  echo "$tool gpu_backward bwd_bf16_d128_b2_sq700_sk1000_h4-2_full_alibi_docs"
done | B=$B OUT=$OUT xargs -P 6 -L 1 bash -c 'log=$OUT/sanitize_$0_$1.log; FA3_REQUIRE_GPU=1 timeout 400 compute-sanitizer --tool "$0" --error-exitcode 9 "$B/$1" "$2" > "$log" 2>&1; rc=$?
  echo "$0 $1 $2: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1) $(grep -cE "^test .*PASS$" "$log") cases passed (rc $rc)"; [ $rc -eq 0 ] || echo "SANITIZER FAILED $0 $1 $2"' \
  | sort | tee "$OUT/sanitize.log"
grep -q "SANITIZER FAILED" "$OUT/sanitize.log" && status=1
exit $status
