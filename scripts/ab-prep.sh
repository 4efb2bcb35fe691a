#!/usr/bin/env bash
# Builds one A/B variant: the fa3 CLI linked against a given PTX module, into
# .device/exp/NAME/fa3 (carried to the GPU machine with .device).
# usage: scripts/ab-prep.sh NAME KERNELS.ptx
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1 ptx=$(realpath "$2")
FA3_PTX="$ptx" CARGO_TARGET_DIR=target/ab cargo build --release -q -p flash-attn3 --bin fa3
mkdir -p .device/exp/"$name"
cp target/ab/release/fa3 .device/exp/"$name"/fa3
strip .device/exp/"$name"/fa3
