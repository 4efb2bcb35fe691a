#!/usr/bin/env bash
# FP8 items not yet measured (the final quantizer's accuracy, V as stored with its
# power-of-two factors) and the 16-bit forward before (old = a2c478f) / after (new) the
# shared mainloop's change for V's block factors.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
timeout 150 .device/exp/new/fa3 fp8-accuracy --seqlens 4096,8192,16384 > "$OUT/fp8_accuracy.md" 2>&1 || status=1
cat "$OUT/fp8_accuracy.md"
timeout 150 .device/exp/new/fa3 bench --dtype e4m3 --fp8-v all --hdims 64,128,256 --seqlens 1024,4096,16384 \
  --warmup-ms 0 --cooldown-ms 1000 --warmup 5 --iters 20 --csv "$OUT/fp8_vlayouts.csv" > "$OUT/fp8_vlayouts.txt" 2>&1 || status=1
tail -60 "$OUT/fp8_vlayouts.txt"
VARIANTS="old new" ROUNDS=2 PEERS=0 LABEL=ab_fwd16 BENCH_ARGS="--hdims 64,128,256 --seqlens 1024,4096,16384 --causal both" timeout 230 scripts/ab.sh || status=1
exit $status
