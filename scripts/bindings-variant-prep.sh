#!/usr/bin/env bash
# Builds what scripts/bindings-variant-checks.sh runs on the GPU machine (it has no Rust)
# into .device/bindings/ and packs it as .device/bindings.tgz, the one path to carry: the
# PyTorch extension's wheel (scripts/build-wheel.sh), the user-defined variants example's
# module (its `variants-ptx` binary; FA3_VARIANTS_PTX=FILE takes a prebuilt one instead of
# compiling it) and candle-flash-attn3's test binaries (scripts/candle-prep.sh; needs
# scripts/setup-candle.sh once).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-wheel.sh
rm -rf .device/bindings
mkdir -p .device/bindings/candle
cp dist/flash_attn3_torch-*.whl .device/bindings/
cargo run --release -q -p fa3-variants-example --bin variants-ptx -- .device/bindings/variants.ptx
scripts/candle-prep.sh
# The tests only: the example is not run here.
find .device/candle -maxdepth 1 -type f ! -name transformer_block -exec cp {} .device/bindings/candle/ \;
tar czf .device/bindings.tgz -C .device bindings
du -sh .device/bindings/* .device/bindings/candle/* .device/bindings.tgz
