#!/usr/bin/env bash
export CUDA_CACHE_MAXSIZE=4294967296
source scripts/device-env.sh
unpack_exp
B=.device/exp/new
R=$TMP/res; mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee "$R/gpu.txt"
timeout 300 $B/fa3 bench --pass bwd --dtype bf16 --hdims 64,128 --csv "$R/steady_bf16.csv" > /dev/null || echo "ours failed"
timeout 300 python3 scripts/peers.py --pass bwd --backends torch-cudnn --dtype bf16 --hdims 64,128 --csv "$R/steady_cudnn_bf16.csv" > /dev/null 2>&1 || echo "cudnn failed"
python3 scripts/compare.py "$R/steady_bf16.csv" "$R/steady_cudnn_bf16.csv" --min-seqlen 1024 > "$R/steady_table_bf16.md"
cat "$R/steady_table_bf16.md"
tar czf "$OUT/bwd_table.tgz" -C "$R" .
