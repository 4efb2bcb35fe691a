#!/usr/bin/env bash
# base / dqh3 (early LSE+D, arrive-only dQ) / late (+ fence after dK), backward A/B.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
FA3_REQUIRE_GPU=1 timeout 200 .device/exp/late/gpu_backward _d128_ _d64_ > "$OUT"/gpu_backward.log 2>&1
echo "gpu_backward rc=$?: $(grep -E 'test result' "$OUT"/gpu_backward.log | tail -1)"
grep -E "FAILED|panicked" "$OUT"/gpu_backward.log | head -5
A="--pass bwd --hdims 64,128 --seqlens 1024,4096,16384 --causal both"
VARIANTS="base dqh3 late" ROUNDS=2 PEERS=0 LABEL=ab_bwd BENCH_ARGS="$A" timeout 300 scripts/ab.sh || status=1
exit $status
