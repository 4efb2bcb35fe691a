#!/usr/bin/env bash
# Builds the user-defined variants example for the GPU machine into .device/bin/:
# `variants_device` (its GPU tests; a test name and --exact run one, e.g. under
# compute-sanitizer) and `variants-bench [HDIM SEQLEN BATCH HEADS]` (the variants against
# the plain kernels, CSV). FlexAttention with the same variants:
# `python3 scripts/flex_peers.py --variants causal,causal_relbias,prefixlm,localglobal --csv FILE`.
# Block masks' tests, sanitizer runs and bench against FlexAttention: scripts/sparse-run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .device/bin
cargo test --release -p fa3-variants-example --no-run --message-format=json 2>/dev/null | scripts/test-binaries.py .device/bin device
mv .device/bin/device .device/bin/variants_device
cargo build --release -p fa3-variants-example --bin variants-bench
cp target/release/variants-bench .device/bin/
strip .device/bin/variants_device .device/bin/variants-bench
du -sh .device/bin/variants_device .device/bin/variants-bench
