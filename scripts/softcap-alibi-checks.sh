#!/usr/bin/env bash
# GPU machine: soft-capping with ALiBi. The forward GPU cases with soft-capping (alone and
# with ALiBi), every backward case, sanitizers on the combined kernels, and its speed
# against plain and soft-capping alone (bf16, hdim 128 16k, both masks, forward and
# backward). usage: scripts/softcap-alibi-checks.sh (results in $OUT)
source "$(dirname "$0")/device-env.sh"
FA3_REQUIRE_GPU=1 timeout 200 $B/gpu softcap > "$OUT/gpu_tests.log" 2>&1 || status=1
FA3_REQUIRE_GPU=1 timeout 150 $B/gpu_backward >> "$OUT/gpu_tests.log" 2>&1 || status=1
grep -E "^test result|FAILED" "$OUT/gpu_tests.log"
TOOLS="memcheck racecheck" B=$B OUT=$OUT scripts/sanitize.sh "1x300x4x128 --heads-k 2 --causal --softcap 2 --alibi --backward" \
  "1x500x2x64 --softcap 2 --alibi --window 64,0 --backward --deterministic" "1x300x2x256 --softcap 2 --alibi" || status=1

grid="--dtype bf16 --hdims 128 --seqlens 16384 --causal both"
for pass in fwd bwd; do
  for v in "" "--softcap 30" "--softcap 30 --alibi"; do
    timeout 60 $B/fa3 bench $grid --pass $pass $v --csv "$TMP/$pass$(echo $v | tr -d ' -').csv" > /dev/null || status=1
  done
done
{ echo "impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops"; cat "$TMP"/*.csv | grep -v '^impl' | sort; } | tee "$OUT/speed.csv"
exit $status
