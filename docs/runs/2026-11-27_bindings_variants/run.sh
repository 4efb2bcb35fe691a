#!/usr/bin/env bash
export CUDA_CACHE_MAXSIZE=4294967296
source scripts/device-env.sh
unpack_exp
timeout 300 .device/exp/new/fa3 run --dtype f16 --random 1x300x2x64 --causal --window 40,0 --backward > /dev/null 2>&1; echo "warm rc $? $(date +%T)"
B=.device/exp/new OUT=$OUT timeout 250 scripts/sanitize.sh "1x1000x4x64 --heads-k 2 --causal --window 100,0 --backward" "1x300x2x64 --window 40,9 --backward --deterministic" "1x700x2x128 --causal --window 128,0 --backward" "1x500x2x128 --seqlen-k 700 --causal --backward"; echo "sanitize rc $? $(date +%T)"
bash scripts/bindings-variant-checks.sh; echo "bindings rc $? $(date +%T)"
