#!/usr/bin/env bash
# Runs on the GPU machine, from the repo root, after scripts/device-prep.sh staged .device/.
# usage: scripts/device.sh STEP...   (steps: info tests check bench peers table sass sanitize)
# Logs and CSVs go to $OUT (default /tmp/fa3-out).
set -uo pipefail
B=.device/bin
OUT=${OUT:-/tmp/fa3-out}
DTYPE=${DTYPE:-f16}
mkdir -p "$OUT"
status=0
for step in "$@"; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case $step in
    info) nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv; $B/fa3 info ;;
    tests) FA3_REQUIRE_GPU=1 $B/gpu 2>&1 | tee "$OUT/gpu_tests.log" | grep -vE '^    ' ; status=$((status | $?)) ;;
    check) $B/fa3 run --random 2x4096x16x128 --causal --dtype bf16 --check || status=1 ;;
    bench) $B/fa3 bench --dtype "$DTYPE" --csv "$OUT/ours_$DTYPE.csv" ${BENCH_ARGS:-} > "$OUT/bench_$DTYPE.log" || status=1; tail -n 3 "$OUT/bench_$DTYPE.log" ;;
    peers) python3 scripts/peers.py --dtype "$DTYPE" --csv "$OUT/peers_$DTYPE.csv" ${PEER_ARGS:-} > "$OUT/peers_$DTYPE.log" 2>&1 || status=1; tail -n 2 "$OUT/peers_$DTYPE.log" ;;
    table) python3 scripts/compare.py "$OUT/ours_$DTYPE.csv" "$OUT/peers_$DTYPE.csv" | tee "$OUT/table_$DTYPE.md" ;;
    sass)
      $B/fa3 ptx > "$OUT/kernels.ptx"
      ptxas -arch=sm_90a -v "$OUT/kernels.ptx" -o /tmp/k.cubin 2>&1 | tee "$OUT/ptxas.log" | grep -E "Function properties|Used|stack|warning"
      cuobjdump -sass /tmp/k.cubin > /tmp/k.sass
      for f in $(grep -oE "Function : [a-z0-9_]+" /tmp/k.sass | awk '{print $3}'); do
        awk -v f="$f" '/Function : /{p=($3==f)} p' /tmp/k.sass > /tmp/one.sass
        printf "%-28s HGMMA %4d  HMMA %4d  LDL %3d  STL %3d\n" "$f" "$(grep -c HGMMA /tmp/one.sass)" "$(grep -c HMMA /tmp/one.sass)" "$(grep -c 'LDL' /tmp/one.sass)" "$(grep -c 'STL' /tmp/one.sass)"
      done | tee "$OUT/sass_summary.txt"
      gzip -c /tmp/k.sass > "$OUT/kernels.sass.gz" ;;
    *) echo "unknown step $step"; status=1 ;;
  esac
done
exit $status
