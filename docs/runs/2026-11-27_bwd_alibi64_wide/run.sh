#!/usr/bin/env bash
export CUDA_CACHE_MAXSIZE=4294967296
source scripts/device-env.sh
unpack_exp
for v in base new; do timeout 400 .device/exp/$v/fa3 bench --dtype bf16 --hdims 64 --seqlens 1024 --causal on --pass bwd --alibi > /dev/null 2>&1 || echo "warm $v failed"; done
echo "warm done $(date +%T)"
VARIANTS="base new" ROUNDS=2 PEERS=0 DTYPE=bf16 LABEL=alibi64 BENCH_ARGS="--hdims 64 --seqlens 4096,16384 --causal both --pass bwd --alibi" scripts/ab.sh
VARIANTS="base new" ROUNDS=2 PEERS=0 DTYPE=bf16 LABEL=plain64 BENCH_ARGS="--hdims 64,128 --seqlens 16384 --causal both --pass bwd" scripts/ab.sh
echo "ab done $(date +%T)"
for f in alibi d64; do FA3_REQUIRE_GPU=1 timeout 150 .device/exp/new/gpu_backward $f > $OUT/tests_$f.log 2>&1; echo "tests $f rc $?"; grep -E "^test result|FAILED|failed" $OUT/tests_$f.log | head -5; done
B=.device/exp/new OUT=$OUT timeout 120 scripts/sanitize.sh "1x1000x4x64 --heads-k 2 --causal --alibi --backward" "1x300x2x64 --window 40,9 --alibi --backward"; echo "sanitize rc $?"
