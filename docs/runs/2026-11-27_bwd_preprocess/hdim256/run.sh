#!/usr/bin/env bash
# The hdim-256 backward and cuDNN's in the same call (steady state, fp16), the build with the
# wide preprocess.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
B=.device/exp/base
timeout 150 $B/fa3 bench --pass bwd --hdims 256 --csv "$OUT/bwd256_ours.csv" > /dev/null || status=1
timeout 200 python3 scripts/peers.py --pass bwd --backends torch-cudnn --hdims 256 --csv "$OUT/bwd256_cudnn.csv" > /dev/null 2>&1 || status=1
python3 scripts/compare.py "$OUT/bwd256_ours.csv" "$OUT/bwd256_cudnn.csv" --min-seqlen 1024 | tee "$OUT/bwd256_table.md"
exit $status
