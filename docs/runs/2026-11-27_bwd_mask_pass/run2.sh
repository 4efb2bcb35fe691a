#!/usr/bin/env bash
export CUDA_CACHE_MAXSIZE=4294967296
source scripts/device-env.sh
unpack_exp
for v in base new; do timeout 400 .device/exp/$v/fa3 bench --dtype bf16 --hdims 64,128 --seqlens 1024 --causal on --pass bwd --window 512,0 > /dev/null 2>&1 || echo "warm $v failed"; done
echo "warm done $(date +%T)"
VARIANTS="base new" ROUNDS=2 PEERS=0 DTYPE=bf16 LABEL=win2 BENCH_ARGS="--hdims 64,128 --seqlens 4096,16384 --causal on --pass bwd --window 4096,0" scripts/ab.sh
VARIANTS="base new" ROUNDS=2 PEERS=0 DTYPE=bf16 LABEL=plain2 BENCH_ARGS="--hdims 64,128,256 --seqlens 4096,16384 --causal both --pass bwd" scripts/ab.sh
echo "ab done $(date +%T)"
FA3_REQUIRE_GPU=1 timeout 330 .device/exp/new/gpu_backward > $OUT/tests_bwd.log 2>&1; echo "tests rc $?"
grep -c "\.\.\. ok" $OUT/tests_bwd.log; grep -E "^test result|FAILED|failed" $OUT/tests_bwd.log | head
