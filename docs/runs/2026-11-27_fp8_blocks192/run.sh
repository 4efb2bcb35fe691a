#!/usr/bin/env bash
# base (HEAD: block factors on 128-key tiles at hdim 128) / new (192-key scale blocks and
# tiles): FP8 GPU tests, the accuracy experiment with the new kernel, A/B in bursts.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
HDIMS=128 ROUNDS=2 PEER=0 timeout 270 scripts/fp8-ab.sh || status=1
timeout 150 .device/exp/new/fa3 fp8-accuracy --seqlens 4096,8192,16384 > "$OUT/fp8_accuracy.md" 2>&1 || status=1
cat "$OUT/fp8_accuracy.md"
exit $status
