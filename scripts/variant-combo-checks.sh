#!/usr/bin/env bash
# On the GPU machine: the packed-document forward cases (`gpu docs`) and the backward
# cases matching BWD_FILTER (default `docs`; empty: all of them), then compute-sanitizer
# memcheck, racecheck and synccheck on the forward and backward cases named in FWD_CASE
# and BWD_CASE (default: documents with ALiBi, soft-capped, at hdim 256 forward and
# hdim 128 backward, the combinations with the tightest registers). TESTS=0: only the
# sanitizer.
source "$(dirname "$0")/device-env.sh"
FWD_CASE=${FWD_CASE:-fa3_bf16_d256_b2_sq333_sk333_h2-1_causal_softcap_alibi_per_batch_window50-0_docs100}
BWD_CASE=${BWD_CASE:-bwd_bf16_d128_b2_sq600_sk1000_h4-2_causal_deterministic_softcap_alibi_per_batch_docs17-400_perbatch}
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${TESTS:-1}" = 1 ]; then
  FA3_REQUIRE_GPU=1 "$B/gpu" docs > "$OUT/gpu_docs.txt" 2>&1 || status=1
  FA3_REQUIRE_GPU=1 "$B/gpu_backward" ${BWD_FILTER-docs} > "$OUT/gpu_backward.txt" 2>&1 || status=1
  grep -E "test result|FAIL|panicked" "$OUT"/gpu_docs.txt "$OUT"/gpu_backward.txt
fi
for tool in memcheck racecheck synccheck; do
  echo "$tool gpu $FWD_CASE"
  echo "$tool gpu_backward $BWD_CASE"
done | B=$B OUT=$OUT xargs -P 6 -L 1 bash -c 'log=$OUT/sanitize_$0_$1.log; FA3_REQUIRE_GPU=1 timeout 400 compute-sanitizer --tool "$0" --error-exitcode 9 "$B/$1" "$2" > "$log" 2>&1; rc=$?
  echo "$0 $1 $2: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1) $(grep -cE "^test .*PASS$" "$log") cases passed (rc $rc)"; [ $rc -eq 0 ] || echo "SANITIZER FAILED $0 $1 $2"' \
  | sort | tee "$OUT/sanitize.log"
grep -q "SANITIZER FAILED" "$OUT/sanitize.log" && status=1
exit $status
