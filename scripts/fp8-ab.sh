#!/usr/bin/env bash
# On the GPU machine: an FP8 A/B in bursts (the FP8 anchors' timing: 1 s idle, 5 warm-ups,
# median of 20) of .device/exp/base against .device/exp/new (scripts/ab-prep*.sh), ROUNDS
# rotated rounds over HDIMS; the new build's FP8 GPU tests first; then, with PEER=1, cuDNN's
# FP8 forward (cudnn-frontend's `sdpa_fp8`, wheel in .device/wheels) and the new build over
# the whole grid in the same call. Results in $OUT.
# usage: [HDIMS=128] [SEQ=1024,4096,16384] [ROUNDS=2] [PEER=1] scripts/fp8-ab.sh
source "$(dirname "$0")/device-env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
FA3_REQUIRE_GPU=1 timeout 240 .device/exp/new/gpu_fp8 > "$OUT/gpu_fp8.txt" 2>&1 || status=1
grep -E "test result|FAILED|panicked" "$OUT/gpu_fp8.txt" | head
SEQ=${SEQ:-1024,4096,16384}
BURSTS="--dtype e4m3 --cooldown-ms 1000 --warmup 5 --warmup-ms 0 --iters 20 --timing-ms 0"
vs=(base new)
for r in $(seq "${ROUNDS:-2}"); do
  for i in 0 1; do
    v=${vs[$(((i + r - 1) % 2))]}
    timeout 200 .device/exp/$v/fa3 bench $BURSTS --hdims "${HDIMS:-128}" --seqlens "$SEQ" --csv "$TMP/$v.r$r.csv" > /dev/null 2>&1 || { echo "$v round $r failed"; status=1; }
    # The rounds so far, kept in $OUT: a call that runs past its limit still returns them.
    scripts/label-rows.sh "$TMP"/*.r*.csv > "$OUT/ab_fp8_rounds.csv"
  done
done
python3 scripts/ab.py "$TMP"/*.r*.csv | tee "$OUT/ab_fp8.md"
scripts/label-rows.sh "$TMP"/*.r*.csv > "$OUT/ab_fp8_rounds.csv"
if [ "${PEER:-1}" = 1 ]; then
  for w in .device/wheels/nvidia_cudnn_frontend-*.whl; do
    pip install -q --no-deps --target "$TMP/cfe" "$w" > /dev/null 2>&1 && break
  done
  PYTHONPATH="$TMP/cfe" timeout 60 python3 scripts/cudnn_fp8_peer.py --check 2>&1 | tail -2
  PYTHONPATH="$TMP/cfe" timeout 200 python3 scripts/cudnn_fp8_peer.py --seqlens "$SEQ" --csv "$OUT/cudnn_fp8.csv" > "$OUT/cudnn_fp8.txt" 2>&1 || status=1
  timeout 200 .device/exp/new/fa3 bench $BURSTS --seqlens "$SEQ" --csv "$OUT/fp8_bursts.csv" > /dev/null 2>&1 || status=1
  python3 scripts/compare.py "$OUT/fp8_bursts.csv" "$OUT/cudnn_fp8.csv" 2>&1 | tail -30 | tee "$OUT/fp8_vs_cudnn.md"
fi
exit $status
