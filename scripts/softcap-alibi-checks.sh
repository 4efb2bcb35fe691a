#!/usr/bin/env bash
# GPU machine: soft-capping with ALiBi. The forward GPU cases with soft-capping (alone and
# with ALiBi), every backward case, sanitizers on the combined kernels, and its speed
# against plain and soft-capping alone (bf16, hdim 128 16k, both masks, forward and
# backward). usage: scripts/softcap-alibi-checks.sh (results in $OUT)
set -uo pipefail
B=.device/bin
OUT=${OUT:-/tmp/fa3-out}
TMP=$(mktemp -d)
mkdir -p "$OUT"
status=0
FA3_REQUIRE_GPU=1 timeout 200 $B/gpu softcap > "$OUT/gpu_tests.log" 2>&1 || status=1
FA3_REQUIRE_GPU=1 timeout 150 $B/gpu_backward >> "$OUT/gpu_tests.log" 2>&1 || status=1
grep -E "^test result|FAILED" "$OUT/gpu_tests.log"
for tool in memcheck racecheck; do
  for a in "1x300x4x128 --heads-k 2 --causal --softcap 2 --alibi --backward" "1x500x2x64 --softcap 2 --alibi --window 64,0 --backward --deterministic" \
    "1x300x2x256 --softcap 2 --alibi"; do
    echo "$tool $a"
  done
done | B=$B TMP=$TMP xargs -P 6 -L 1 bash -c 'tool=$0; log=$(mktemp -p "$TMP"); timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 9 "$B/fa3" run --dtype f16 --random "$@" > "$log" 2>&1; rc=$?
  echo "$tool $*: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1) (rc $rc)"; [ $rc -eq 0 ] || echo "SANITIZER FAILED $tool $*"' \
  | sort | tee "$OUT/sanitize.log"
! grep -q "SANITIZER FAILED" "$OUT/sanitize.log" || status=1
grid="--dtype bf16 --hdims 128 --seqlens 16384 --causal both"
for pass in fwd bwd; do
  for v in "" "--softcap 30" "--softcap 30 --alibi"; do
    timeout 60 $B/fa3 bench $grid --pass $pass $v --csv "$TMP/$pass$(echo $v | tr -d ' -').csv" > /dev/null || status=1
  done
done
{ echo "impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops"; cat "$TMP"/*.csv | grep -v '^impl' | sort; } | tee "$OUT/speed.csv"
exit $status
