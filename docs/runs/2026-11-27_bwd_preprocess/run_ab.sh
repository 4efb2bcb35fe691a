#!/usr/bin/env bash
# base (bc67170) / new (preprocess: 16-byte loads all in flight, contiguous zeroing,
# heads as the aux grid's x; postprocess on the same grid order).
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
B=.device/exp/new timeout 200 scripts/sanitize.sh "2x333x3x128 --backward" "2x200x4x256 --backward --sinks 0.5 --deterministic" "1x129x2x64 --backward --causal" > /dev/null &
FA3_REQUIRE_GPU=1 timeout 150 .device/exp/new/gpu_backward _sq1 > "$OUT"/gpu_backward.log 2>&1
echo "gpu_backward rc=$?: $(grep -E 'test result' "$OUT"/gpu_backward.log | tail -1)"
grep -E "FAILED|panicked" "$OUT"/gpu_backward.log | head -5
FA3_REQUIRE_GPU=1 timeout 100 .device/exp/new/gpu_fp8 > "$OUT"/gpu_fp8.log 2>&1
echo "gpu_fp8 rc=$?: $(grep -E 'test result' "$OUT"/gpu_fp8.log | tail -1)"
grep -E "FAILED|panicked" "$OUT"/gpu_fp8.log | head -5
wait; cat "$OUT"/sanitize.log
for v in new base; do
  for s in 16x1024x16x64 16x1024x16x128 16x1024x8x256; do
    timeout 100 ncu --clock-control none --section SpeedOfLight -k 'regex:^bwd_(pre|post)' .device/exp/$v/fa3 run --random $s --dtype f16 --backward > "$OUT/ncu_${v}_$s.txt" 2>&1
    echo "== $v $s"; grep -E "^  bwd_|Duration|DRAM Throughput" "$OUT/ncu_${v}_$s.txt" | head -8
  done
done
A="--pass bwd --hdims 64,128,256 --seqlens 1024,2048,4096 --causal both"
VARIANTS="base new" ROUNDS=2 PEERS=0 LABEL=ab_aux BENCH_ARGS="$A" timeout 200 scripts/ab.sh || status=1
exit $status
