#!/usr/bin/env bash
# The FP8 accuracy experiment (kernel columns, 4 seeds) with HEAD's kernels (base) and with
# an experimental build whose FP8 kernels add each block's PV to O in f32 registers (prom;
# spills, for accuracy only).
cd "$(dirname "$0")/.."
source scripts/device-env.sh
export CUDA_CACHE_MAXSIZE=4294967296
unpack_exp
for b in base prom; do
  timeout 150 .device/exp/$b/fa3 fp8-accuracy --seqlens 4096,16384 --seeds 0,1,2,3 --kernel-only > "$OUT/fp8_accuracy_$b.md" 2>&1; echo "$b rc=$?"
  cat "$OUT/fp8_accuracy_$b.md"
done
exit 0
