#!/usr/bin/env bash
# base = HEAD's kernels, new = the FP8 per-head kernels' row sums on the tensor cores:
# the FP8 GPU tests and A/B (bursts), the 16-bit forward A/B (its PTX moved with the
# shared mainloop) and a subset of the forward GPU tests.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
export CUDA_CACHE_MAXSIZE=4294967296
unpack_exp
t0=$(date +%s)
HDIMS=64,128,256 SEQ=1024,4096,16384 ROUNDS=2 PEER=0 timeout 300 scripts/fp8-ab.sh > "$OUT/fp8_ab.txt" 2>&1; echo "fp8 rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "test result|FAIL" "$OUT/gpu_fp8.txt" | head -5
cat "$OUT/ab_fp8.md"
VARIANTS="base new" ROUNDS=1 DTYPE=bf16 PEERS=0 LABEL=ab_fwd16 BENCH_ARGS="--hdims 64,128,256 --seqlens 16384 --causal both" timeout 90 scripts/ab.sh > /dev/null 2>&1; echo "fwd16 rc=$? t=$(( $(date +%s) - t0 ))"
cat "$OUT/ab_fwd16.md"
timeout 100 .device/exp/new/gpu b3_sq1500 > "$OUT/gpu_subset.log" 2>&1; echo "gpu subset rc=$? $(grep 'test result' "$OUT/gpu_subset.log") t=$(( $(date +%s) - t0 ))"
exit 0
