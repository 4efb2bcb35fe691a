#!/usr/bin/env bash
# A/B of backward kernels: .device/exp/{base,new} (scripts/ab-prep-rev.sh for base,
# scripts/ab-prep.sh plus the `gpu_backward` test binary for new; carry .device/ab.tgz).
# Runs the new build's backward GPU tests, compute-sanitizer on one hdim-64 case per
# mode, then scripts/ab.sh over the backward (default and deterministic), fp16.
# usage (device): [HDIMS=64,128] [SEQLENS=1024,4096,16384] [TESTS=filter] scripts/bwd-ab.sh
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
FA3_REQUIRE_GPU=1 timeout 300 .device/exp/new/gpu_backward ${TESTS:-} > "$OUT"/gpu_backward.log 2>&1
echo "gpu_backward rc=$?: $(grep -E 'test result' "$OUT"/gpu_backward.log | tail -1)"
grep -E "FAILED|panicked" "$OUT"/gpu_backward.log | head -5
B=.device/exp/new scripts/sanitize.sh "2x333x3x64 --backward" "2x333x3x64 --causal --backward" "1x700x2x64 --backward --deterministic" > /dev/null || status=1
cat "$OUT"/sanitize.log
A="--pass bwd --hdims ${HDIMS:-64,128} --seqlens ${SEQLENS:-1024,4096,16384} --causal both"
VARIANTS="base new" ROUNDS=2 PEERS=0 LABEL=ab_bwd BENCH_ARGS="$A" scripts/ab.sh || status=1
VARIANTS="base new" ROUNDS=1 PEERS=0 LABEL=ab_bwd_det BENCH_ARGS="$A --deterministic" scripts/ab.sh || status=1
exit $status
