#!/usr/bin/env bash
# GPU machine: the backward's tables against cuDNN in one call: for each dtype, `fa3 bench
# --pass bwd` over the paper grid at hdim 64 and 128 (steady state), then cuDNN's backward
# (PyTorch SDPA, scripts/peers.py), then both in bursts at 16k tokens. CSVs and markdown
# tables (scripts/compare.py) into $OUT. usage (device): [B=.device/exp/new] scripts/bwd-table.sh
source "$(dirname "$0")/device-env.sh"
[ -f .device/ab.tgz ] && unpack_exp
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
burst="--warmup-ms 0 --timing-ms 0 --cooldown-ms 3000 --seqlens 16384"
for d in f16 bf16; do
  timeout 240 $B/fa3 bench --pass bwd --dtype $d --hdims 64,128 --csv "$OUT/steady_$d.csv" > /dev/null || status=1
  timeout 300 python3 scripts/peers.py --pass bwd --backends torch-cudnn --dtype $d --hdims 64,128 --csv "$OUT/steady_cudnn_$d.csv" > /dev/null 2>&1 || status=1
  python3 scripts/compare.py "$OUT/steady_$d.csv" "$OUT/steady_cudnn_$d.csv" > "$OUT/steady_table_$d.md"
  timeout 120 $B/fa3 bench --pass bwd --dtype $d --hdims 64,128 $burst --csv "$OUT/bursts_$d.csv" > /dev/null || status=1
  timeout 200 python3 scripts/peers.py --pass bwd --backends torch-cudnn --dtype $d --hdims 64,128 $burst --csv "$OUT/bursts_cudnn_$d.csv" > /dev/null 2>&1 || status=1
  python3 scripts/compare.py "$OUT/bursts_$d.csv" "$OUT/bursts_cudnn_$d.csv" --min-seqlen 16384 > "$OUT/bursts_table_$d.md"
  tail -n 1 "$OUT/steady_table_$d.md" "$OUT/bursts_table_$d.md"
done
exit $status
