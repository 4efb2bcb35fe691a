#!/usr/bin/env bash
# GPU machine: the duration and DRAM throughput of each launch of one backward (preprocess,
# main, postprocess: ncu's SpeedOfLight section at the card's own clocks) for every SHAPE
# (default the FA3 grid's 1k and 16k shapes at hdim 64 and 128). One report per shape in
# $OUT/ncu_SHAPE.txt; the durations are printed.
# usage (device): [B=.device/bin] [SHAPES="16x1024x16x128 ..."] scripts/bwd-launch-profile.sh
source "$(dirname "$0")/device-env.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for s in ${SHAPES:-16x1024x16x128 16x1024x16x64 1x16384x16x128}; do
  timeout 200 ncu --clock-control none --section SpeedOfLight -k 'regex:^bwd_' \
    "$B"/fa3 run --random "$s" --dtype "${DTYPE:-f16}" --backward > "$OUT/ncu_$s.txt" 2>&1 || status=1
  echo "== $s"
  grep -E "^  bwd_|Duration|DRAM Throughput" "$OUT/ncu_$s.txt" | head -24
done
exit $status
