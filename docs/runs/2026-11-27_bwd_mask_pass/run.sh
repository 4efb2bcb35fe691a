#!/usr/bin/env bash
export CUDA_CACHE_MAXSIZE=4294967296
source scripts/device-env.sh
unpack_exp
for v in base new; do timeout 400 .device/exp/$v/fa3 bench --dtype bf16 --hdims 64,128 --seqlens 1024 --causal on --pass bwd --window 512,0 > /dev/null 2>&1 || echo "warm $v failed"; done
echo "warm done $(date +%T)"
VARIANTS="base new" ROUNDS=2 PEERS=0 DTYPE=bf16 LABEL=win BENCH_ARGS="--hdims 64,128 --seqlens 4096,16384 --causal on --pass bwd --window 4096,0" scripts/ab.sh
echo "win done $(date +%T)"
VARIANTS="base new" ROUNDS=2 PEERS=0 DTYPE=bf16 LABEL=plain BENCH_ARGS="--hdims 64,128,256 --seqlens 4096,16384 --causal both --pass bwd" scripts/ab.sh
echo "plain done $(date +%T)"
FA3_REQUIRE_GPU=1 timeout 150 .device/exp/new/gpu_backward window > $OUT/tests_window.log 2>&1; echo "tests rc $?"
grep -E "^test result|FAILED|failed" $OUT/tests_window.log | head
