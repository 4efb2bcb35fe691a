#!/usr/bin/env bash
# base = HEAD's kernels, new = the window and document backward kernels reading the first
# k-step's LSE before the waits: their GPU tests, then the window backward A/B (bf16, causal
# + 4096 window, 2 rounds) and plain causal for the ratio.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
export CUDA_CACHE_MAXSIZE=4294967296
unpack_exp
t0=$(date +%s)
timeout 100 .device/exp/new/gpu_backward window > "$OUT/gpu_backward_window.log" 2>&1; echo "window rc=$? $(grep 'test result' "$OUT/gpu_backward_window.log") t=$(( $(date +%s) - t0 ))"
timeout 80 .device/exp/new/gpu_backward docs > "$OUT/gpu_backward_docs.log" 2>&1; echo "docs rc=$? $(grep 'test result' "$OUT/gpu_backward_docs.log") t=$(( $(date +%s) - t0 ))"
VARIANTS="base new" ROUNDS=2 DTYPE=bf16 PEERS=0 LABEL=ab_window_bwd BENCH_ARGS="--pass bwd --hdims 64,128 --seqlens 4096,16384 --causal on --window 4096,0" timeout 150 scripts/ab.sh > /dev/null 2>&1; echo "ab rc=$? t=$(( $(date +%s) - t0 ))"
cat "$OUT/ab_window_bwd.md"
exit 0
