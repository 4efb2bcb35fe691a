#!/usr/bin/env bash
# On the GPU machine: candle-flash-attn3's tests and its transformer-block example, from
# the binaries scripts/candle-prep.sh put in .device/candle/. Logs to $OUT (or /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/candle-device-env.sh || exit 1
out=${OUT:-/tmp}
for t in .device/candle/*; do
  case $(basename "$t") in
    transformer_block) ;;
    *) FA3_REQUIRE_GPU=1 "$t" --test-threads 1 2>&1 | tee -a "$out/candle_tests.txt" ;;
  esac
done
.device/candle/transformer_block 2>&1 | tee "$out/candle_example.txt"
