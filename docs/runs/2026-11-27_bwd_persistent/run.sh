#!/usr/bin/env bash
# Persistent backward (claims after the unit's loads): base/new A/B (fp16, hdim 128 + 256),
# then the new build's hdim 128/256 GPU tests for as long as the call allows.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
export CUDA_CACHE_MAXSIZE=4294967296
unpack_exp
A="--pass bwd --hdims 128,256 --seqlens 1024,2048,4096,16384 --causal both"
VARIANTS="base new" ROUNDS=2 PEERS=0 LABEL=ab_bwd BENCH_ARGS="$A" timeout 300 scripts/ab.sh || status=1
FA3_REQUIRE_GPU=1 timeout 150 .device/exp/new/gpu_backward _d128_ > "$OUT"/gpu_backward.log 2>&1
echo "gpu_backward rc=$?: $(grep -c PASS "$OUT"/gpu_backward.log) PASS, $(grep -c FAIL "$OUT"/gpu_backward.log) FAIL"
exit $status
