#!/usr/bin/env bash
# GPU machine: the backward's tables against cuDNN in one call: for each dtype, `fa3 bench
# --pass bwd` over the paper grid at hdim 64 and 128 (steady state), then cuDNN's backward
# (PyTorch SDPA, scripts/peers.py), then both in bursts at 16k tokens. CSVs and markdown
# tables (scripts/compare.py), packed into $OUT/bwd_table.tgz (the device returns few files).
# usage (device): [B=.device/exp/new] [PARTS="steady bursts"] scripts/bwd-table.sh
source "$(dirname "$0")/device-env.sh"
[ -f .device/ab.tgz ] && unpack_exp
R=$TMP/res; mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee "$R/gpu.txt"
burst="--warmup-ms 0 --timing-ms 0 --cooldown-ms 3000 --seqlens 16384"
for d in f16 bf16; do
  for part in ${PARTS:-steady bursts}; do
    if [ "$part" = steady ]; then args="" min=1024; else args=$burst min=16384; fi
    timeout 240 $B/fa3 bench --pass bwd --dtype $d --hdims 64,128 $args --csv "$R/${part}_$d.csv" > /dev/null || status=1
    timeout 300 python3 scripts/peers.py --pass bwd --backends torch-cudnn --dtype $d --hdims 64,128 $args \
      --csv "$R/${part}_cudnn_$d.csv" > /dev/null 2>&1 || status=1
    python3 scripts/compare.py "$R/${part}_$d.csv" "$R/${part}_cudnn_$d.csv" --min-seqlen $min > "$R/${part}_table_$d.md"
    tail -n 1 "$R/${part}_table_$d.md"
  done
done
tar czf "$OUT/bwd_table.tgz" -C "$R" .
exit $status
