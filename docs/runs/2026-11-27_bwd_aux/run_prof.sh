#!/usr/bin/env bash
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
for s in 16x1024x16x128 16x1024x16x64 1x16384x16x128; do
  timeout 200 ncu --clock-control none --section SpeedOfLight -k 'regex:^bwd_' "$B"/fa3 run --random $s --dtype f16 --backward > "$OUT/ncu_$s.txt" 2>&1
  echo "== $s"; grep -E "^  bwd_|Duration|DRAM Throughput|Memory Throughput" "$OUT/ncu_$s.txt" | head -24
done
