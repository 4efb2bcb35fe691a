#!/usr/bin/env bash
# base (main HEAD) / soft (soft-capping's fixed row maximum): the backward GPU tests of the
# preprocess' lane-map build, the soft-capping A/B, the soft-capped forward GPU tests.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
export CUDA_CACHE_MAXSIZE=4294967296
unpack_exp
E=.device/exp
t0=$(date +%s)
timeout 170 $E/base/gpu_backward _sq1 > "$OUT/gpu_backward.log" 2>&1; echo "gpu_backward rc=$? $(grep 'test result' "$OUT/gpu_backward.log") t=$(( $(date +%s) - t0 ))"
# Soft-capping at 30, bf16 (the fixed maximum) at every head dim; fp16 (running max) at hdim 128.
VARIANTS="base soft" ROUNDS=2 DTYPE=bf16 PEERS=0 LABEL=softcap_bf16 BENCH_ARGS="--hdims 64,128,256 --seqlens 4096,16384 --causal both --softcap 30" timeout 200 scripts/ab.sh > /dev/null 2>&1; echo "ab bf16 rc=$? t=$(( $(date +%s) - t0 ))"
cat "$OUT/softcap_bf16.md"
VARIANTS="base soft" ROUNDS=1 DTYPE=bf16 PEERS=0 LABEL=plain_bf16 BENCH_ARGS="--hdims 128 --seqlens 4096,16384 --causal both" timeout 60 scripts/ab.sh > /dev/null 2>&1; echo "ab plain rc=$? t=$(( $(date +%s) - t0 ))"
cat "$OUT/plain_bf16.md"
timeout 150 $E/soft/gpu _softcap > "$OUT/gpu_softcap.log" 2>&1; echo "gpu softcap rc=$? $(grep 'test result' "$OUT/gpu_softcap.log") t=$(( $(date +%s) - t0 ))"
grep -E "FAIL|panicked" "$OUT/gpu_softcap.log" | head -20
exit 0
