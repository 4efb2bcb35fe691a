#!/usr/bin/env bash
# Builds everything the GPU machine runs (it has no Rust) into .device/ (git-ignored):
# the fa3 CLI and the test binaries, release mode, stripped.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p flash-attn3 --bin fa3
mkdir -p .device/bin
cp target/release/fa3 .device/bin/
cargo test --release -p fa3-tests --no-run --message-format=json 2>/dev/null | scripts/test-binaries.py .device/bin
strip .device/bin/* 2>/dev/null || true
du -sh .device/bin/*
