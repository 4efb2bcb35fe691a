#!/usr/bin/env bash
# Builds candle-flash-attn3's test binary and example for the GPU machine (it has no
# Rust) into .device/candle/, release mode, stripped. Needs scripts/setup-candle.sh once.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/candle-env.sh
manifest=candle-flash-attn3/Cargo.toml
mkdir -p .device/candle
cargo build --release --manifest-path $manifest --example transformer_block
cp candle-flash-attn3/target/release/examples/transformer_block .device/candle/
cargo test --release --manifest-path $manifest --no-run --message-format=json 2>/dev/null | scripts/test-binaries.py .device/candle
strip .device/candle/* 2>/dev/null || true
du -sh .device/candle/*
