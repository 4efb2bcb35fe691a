#!/usr/bin/env bash
# On the GPU machine: the FP8 GPU tests, then cuDNN's FP8 forward (cudnn-frontend's
# `sdpa_fp8`, its wheel carried in .device/wheels) and ours in the same call, in bursts
# (1 s idle, 5 warm-ups, median of 20), as the anchors.
source "$(dirname "$0")/device-env.sh"
if [ "${TESTS:-1}" = 1 ]; then
  FA3_REQUIRE_GPU=1 timeout 150 "$B/gpu_fp8" > "$OUT/gpu_fp8.txt" 2>&1 || status=1
  grep -E "test result|FAIL" "$OUT/gpu_fp8.txt"
fi
# The wheel of this machine's Python (one per CPython version is carried).
for w in .device/wheels/nvidia_cudnn_frontend-*.whl; do
  pip install -q --no-deps --target "$TMP/cfe" "$w" > "$OUT/pip.txt" 2>&1 && break
done
SEQ=${SEQ:-1024,4096,16384}
PYTHONPATH="$TMP/cfe" timeout 60 python3 scripts/cudnn_fp8_peer.py --check 2>&1 | tail -5 | tee "$OUT/cudnn_fp8_check.txt"
PYTHONPATH="$TMP/cfe" timeout 150 python3 scripts/cudnn_fp8_peer.py --seqlens "$SEQ" --csv "$OUT/cudnn_fp8.csv" > "$OUT/cudnn_fp8.txt" 2>&1 || status=1
tail -22 "$OUT/cudnn_fp8.txt"
[ "${OURS:-1}" = 1 ] && timeout 150 "$B/fa3" bench --dtype e4m3 --seqlens "$SEQ" --cooldown-ms 1000 --warmup 5 --warmup-ms 0 --iters 20 --timing-ms 0 --csv "$OUT/fp8_bursts.csv" > "$OUT/fp8_bursts.txt" 2>&1 || status=1
[ "${OURS:-1}" = 1 ] && cat "$OUT/fp8_bursts.txt"
exit $status
