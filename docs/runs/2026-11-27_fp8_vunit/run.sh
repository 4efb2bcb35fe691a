#!/usr/bin/env bash
# base (HEAD) / new (V's power-of-two block factors in P's exp2 offset, factors loaded
# under the QK GEMM, per-head kernels without per-block code): FP8 and forward tests,
# FP8 A/B, cuDNN's FP8, the accuracy experiment with the new kernels.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
HDIMS=64,128,256 ROUNDS=2 PEER=0 timeout 400 scripts/fp8-ab.sh || status=1
grep -E "FAILED|panicked" "$OUT"/gpu_fp8.txt | head -5
for w in .device/wheels/nvidia_cudnn_frontend-*.whl; do pip install -q --no-deps --target "$TMP/cfe" "$w" > /dev/null 2>&1 && break; done
PYTHONPATH="$TMP/cfe" timeout 90 python3 scripts/cudnn_fp8_peer.py --seqlens 1024,4096,16384 --csv "$OUT/cudnn_fp8.csv" > "$OUT/cudnn_fp8.txt" 2>&1 || status=1
tail -3 "$OUT/cudnn_fp8.txt"
timeout 90 .device/exp/new/fa3 fp8-accuracy --seqlens 4096,8192,16384 > "$OUT/fp8_accuracy.md" 2>&1 || status=1
cat "$OUT/fp8_accuracy.md"
exit $status

# Then, on the same warm machine (the A/B above ran past its timeout before its table),
# one round each in both orders:
# for v in new base; do .device/exp/$v/fa3 bench --dtype e4m3 --cooldown-ms 1000 --warmup 5 --warmup-ms 0 --iters 20 --timing-ms 0 --hdims 64,128,256 --seqlens 1024,4096,16384 --csv $OUT/$v.r1.csv; done
# (r2: base first, then new); scripts/ab.py base.r*.csv new.r*.csv; scripts/median.py fp8_bursts.csv new.r*.csv
