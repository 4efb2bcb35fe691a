#!/usr/bin/env bash
# base (main HEAD) / new (FP8 block factors on 192-key tiles at hdim 128) / cur (HEAD's
# kernels, the soft-capping tests at caps 30 and 50): the quantizer's GPU tests, the FP8
# accuracy experiment over seeds for both builds, the 192-key build's FP8 tests, the
# soft-capped forward and backward GPU tests.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
export CUDA_CACHE_MAXSIZE=4294967296
unpack_exp
E=.device/exp
t0=$(date +%s)
el() { echo "t=$(( $(date +%s) - t0 ))"; }
timeout 90 $E/base/gpu_fp8 quantize > "$OUT/gpu_fp8_quantize_base.log" 2>&1; echo "quantize rc=$? $(grep 'test result' "$OUT/gpu_fp8_quantize_base.log") $(el)"
for b in base new; do
  timeout 100 $E/$b/fa3 fp8-accuracy --seqlens 16384 --seeds 0,1,2,3,4,5,6,7 --kernel-only > "$OUT/fp8_accuracy_seeds_$b.md" 2>&1; echo "accuracy $b rc=$? $(el)"
  cat "$OUT/fp8_accuracy_seeds_$b.md"
done
timeout 90 $E/new/gpu_fp8 > "$OUT/gpu_fp8_new.log" 2>&1; echo "gpu_fp8 new rc=$? $(grep 'test result' "$OUT/gpu_fp8_new.log") $(el)"
timeout 120 $E/cur/gpu _softcap > "$OUT/gpu_softcap.log" 2>&1; echo "gpu softcap rc=$? $(grep 'test result' "$OUT/gpu_softcap.log") $(el)"
grep -E "FAIL" "$OUT/gpu_softcap.log" | head -10
timeout 120 $E/cur/gpu_backward _softcap > "$OUT/gpu_backward_softcap.log" 2>&1; echo "gpu_backward softcap rc=$? $(grep 'test result' "$OUT/gpu_backward_softcap.log") $(el)"
grep -E "FAIL" "$OUT/gpu_backward_softcap.log" | head -10
exit 0
