#!/usr/bin/env bash
# On the GPU machine: a per-instruction profile of one backward main kernel (ncu's source
# counters: warp-stall samples per SASS instruction, and executed instructions), at the
# card's own clocks (`--clock-control none`). SHAPE (default 1x16384x16x128: the FA3 grid's
# 16k hdim 128), KERNEL (default regex bwd_hdim128_f16$). Writes the report, its SASS
# source page as CSV, and the summary sections as text.
source "$(dirname "$0")/device-env.sh"
shape=${SHAPE:-1x16384x16x128}
kernel=${KERNEL:-'regex:^bwd_hdim128_f16$'}
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 400 ncu --clock-control none --section SourceCounters --section WarpStateStats --section InstructionStats \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --import-source no -k "$kernel" --launch-count 1 \
  --export "$OUT/bwd_profile" "$B/fa3" run --random "$shape" --dtype f16 --backward > "$OUT/ncu_run.txt" 2>&1 || status=1
tail -5 "$OUT/ncu_run.txt"
ncu --import "$OUT/bwd_profile.ncu-rep" > "$OUT/ncu_sections.txt" 2>&1 || status=1
ncu --import "$OUT/bwd_profile.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_sass.csv" 2>&1 || status=1
gzip -f "$OUT/ncu_sass.csv"
grep -E "Warp Cycles|Issued|Eligible|Stall|stall" "$OUT/ncu_sections.txt" | head -40
exit $status
