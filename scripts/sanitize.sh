#!/usr/bin/env bash
# GPU machine: compute-sanitizer (TOOLS, default memcheck racecheck synccheck) on `fa3 run
# --dtype f16 --random CASE` for every CASE argument, 8 runs at a time; one summary line
# per run into $OUT/sanitize.log. Exit 1 if any run reports an error.
# usage: scripts/sanitize.sh "1x200x2x64 --causal" "1x300x2x128 --window 64,0 --backward" ...
set -uo pipefail
B=${B:-.device/bin}
OUT=${OUT:-/tmp/fa3-out}
TMP=$(mktemp -d)
mkdir -p "$OUT"
for tool in ${TOOLS:-memcheck racecheck synccheck}; do
  for a in "$@"; do
    echo "$tool $a"
  done
done | B=$B TMP=$TMP xargs -P 8 -L 1 bash -c 'tool=$0; log=$(mktemp -p "$TMP"); timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 9 "$B/fa3" run --dtype f16 --random "$@" > "$log" 2>&1; rc=$?
  echo "$tool $*: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1) (rc $rc)"; [ $rc -eq 0 ] || echo "SANITIZER FAILED $tool $*"' \
  | sort | tee "$OUT/sanitize.log"
! grep -q "SANITIZER FAILED" "$OUT/sanitize.log"
