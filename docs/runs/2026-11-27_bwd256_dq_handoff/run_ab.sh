#!/usr/bin/env bash
# base (HEAD) / split (arrive-only dQ handoff on hdim 256's split path), backward A/B.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
B=.device/exp/split timeout 200 scripts/sanitize.sh "1x333x3x256 --backward" > /dev/null &
FA3_REQUIRE_GPU=1 timeout 200 .device/exp/split/gpu_backward _d256_ > "$OUT"/gpu_backward.log 2>&1
echo "gpu_backward rc=$?: $(grep -E 'test result' "$OUT"/gpu_backward.log | tail -1)"
grep -E "FAILED|panicked" "$OUT"/gpu_backward.log | head -5
wait; cat "$OUT"/sanitize.log
A="--pass bwd --hdims 256 --seqlens 1024,4096,16384 --causal both"
VARIANTS="base split" ROUNDS=2 PEERS=0 LABEL=ab_bwd256 BENCH_ARGS="$A" timeout 300 scripts/ab.sh || status=1
exit $status
