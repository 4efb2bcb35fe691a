#!/usr/bin/env bash
# base (HEAD: head after head) / new (the main kernel's CTAs heads first outside the
# deterministic mode): backward GPU tests, sanitizer, A/B over the grid.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
B=.device/exp/new TOOLS="memcheck racecheck" timeout 150 scripts/sanitize.sh "2x333x3x128 --backward --causal" "1x700x2x256 --backward --causal" > /dev/null &
FA3_REQUIRE_GPU=1 timeout 120 .device/exp/new/gpu_backward _sq1 > "$OUT"/gpu_backward.log 2>&1
echo "gpu_backward rc=$?: $(grep -E 'test result' "$OUT"/gpu_backward.log | tail -1)"
grep -E "FAILED|panicked" "$OUT"/gpu_backward.log | head -5
wait; cat "$OUT"/sanitize.log
A="--pass bwd --hdims 64,128,256 --seqlens 1024,4096,16384 --causal both"
VARIANTS="base new" ROUNDS=2 PEERS=0 LABEL=ab_heads_first BENCH_ARGS="$A" timeout 300 scripts/ab.sh || status=1
exit $status
