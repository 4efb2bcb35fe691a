#!/usr/bin/env bash
export CUDA_CACHE_MAXSIZE=4294967296
source scripts/device-env.sh
unpack_exp
B=.device/exp/new
grid="--dtype bf16 --hdims 64,128 --seqlens 4096,16384 --causal on"
for pass in fwd bwd; do
  timeout 300 $B/fa3 bench $grid --pass $pass --csv "$OUT/ours_causal_$pass.csv" > /dev/null || echo "causal $pass failed"
  timeout 200 $B/fa3 bench $grid --pass $pass --window 4096,0 --csv "$OUT/ours_window_$pass.csv" > /dev/null || echo "window $pass failed"
  timeout 200 $B/fa3 bench $grid --pass $pass --doc-lens 2048 --csv "$OUT/ours_docs_$pass.csv" > /dev/null || echo "docs $pass failed"
done
echo "ours done $(date +%T)"
for hs in "128 16384 16 1" "64 16384 32 1" "128 4096 16 4" "64 4096 32 4"; do
  set -- $hs
  timeout 170 python3 scripts/flex_peers.py --hdim $1 --seqlen $2 --heads $3 --batch $4 --variants causal,causal_window4096,causal_docs2048 --csv "$OUT/flex_$1_$2.csv" > "$OUT/flex_$1_$2.log" 2>&1 || echo "flex $hs failed"
  echo "flex $hs $(date +%T)"; tail -n 7 "$OUT/flex_$1_$2.csv"
done
