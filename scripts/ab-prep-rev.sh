#!/usr/bin/env bash
# Builds one A/B variant from a git revision (kernels *and* host code of that revision,
# unlike ab-prep.sh, which swaps only the PTX): the fa3 CLI of REV, and its GPU test
# binary, into .device/exp/NAME/ (fa3, gpu). On the device: `.device/exp/NAME/gpu` runs
# that revision's GPU tests; scripts/ab.sh times the fa3 CLIs.
# usage: scripts/ab-prep-rev.sh NAME REV     e.g. scripts/ab-prep-rev.sh base main
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1 rev=$2
tgt="$PWD/target/ab-rev"
wt=$(mktemp -d)
trap 'git worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"' EXIT
git worktree add -q --detach "$wt" "$rev"
# One target dir for every revision: only what differs is rebuilt.
mkdir -p .device/exp/"$name"
(cd "$wt" && CARGO_TARGET_DIR="$tgt" cargo build --release -q -p flash-attn3 --bin fa3)
cp "$tgt/release/fa3" .device/exp/"$name"/fa3
(cd "$wt" && CARGO_TARGET_DIR="$tgt" cargo test --release -p fa3-tests --test gpu --no-run --message-format=json 2>/dev/null) \
  | scripts/test-binaries.py .device/exp/"$name" gpu
strip .device/exp/"$name"/fa3 .device/exp/"$name"/gpu
echo "built .device/exp/$name/fa3 from $(git rev-parse --short "$rev")"
