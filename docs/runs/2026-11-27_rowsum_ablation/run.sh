#!/usr/bin/env bash
# Ablation (timing only, wrong results): no row sum in the online softmax. base = HEAD's
# kernels, new = the ablation: the 16-bit forward (bf16) and the FP8 forward in one call.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
export CUDA_CACHE_MAXSIZE=4294967296
unpack_exp
VARIANTS="base new" ROUNDS=2 DTYPE=bf16 PEERS=0 LABEL=abl_fwd16 BENCH_ARGS="--hdims 64,128,256 --seqlens 4096,16384 --causal both" timeout 220 scripts/ab.sh > /dev/null 2>&1; echo "fwd16 rc=$?"
cat "$OUT/abl_fwd16.md"
HDIMS=64,128,256 SEQ=4096,16384 ROUNDS=2 PEER=0 timeout 260 scripts/fp8-ab.sh > /dev/null 2>&1; echo "fp8 rc=$?"
cat "$OUT/ab_fp8.md"
exit 0
