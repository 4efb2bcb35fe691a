#!/usr/bin/env bash
# compute-sanitizer on the FP8 block-factor kernels of 192-key tiles (hdim 128, HEAD's
# kernels): ragged key counts, causal or not, with incoherent processing.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
for tool in memcheck racecheck synccheck; do
  for a in "1x700x2x128" "1x700x2x128 --causal" "2x1000x4x128 --incoherent"; do
    echo "$tool $a"
  done
done | TMP=$TMP xargs -P 9 -L 1 bash -c 'tool=$0; log=$(mktemp -p "$TMP"); timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 9 .device/exp/new/fa3 run --dtype e4m3 --random "$@" --check > "$log" 2>&1; rc=$?
  echo "$tool $*: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1) (rc $rc) $(grep -m1 -o "max |O - O_f64| = [^,]*" "$log")"' | sort | tee "$OUT/sanitize_fp8.log"
exit 0
