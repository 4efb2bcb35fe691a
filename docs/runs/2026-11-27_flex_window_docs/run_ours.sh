#!/usr/bin/env bash
export CUDA_CACHE_MAXSIZE=4294967296
source scripts/device-env.sh
[ -d .device/exp/new ] || unpack_exp
B=.device/exp/new
grid="--dtype bf16 --hdims 64,128 --seqlens 4096,16384 --causal on"
for pass in fwd bwd; do
  for v in causal "window --window 4096,0" "docs --doc-lens 2048"; do
    set -- $v; name=$1; shift
    timeout 200 $B/fa3 bench $grid --pass $pass "$@" --csv "$TMP/$name.$pass.csv" > /dev/null || echo "$name $pass failed"
    sed "s/^rust-fa3/$name-rust-fa3/" "$TMP/$name.$pass.csv" | grep -v "^impl" >> "$OUT/ours.csv"
  done
done
cat "$OUT/ours.csv"
