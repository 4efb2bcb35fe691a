#!/usr/bin/env bash
# Soft-capping with Q pre-scaled (hdim 128, bf16): forward base/new --softcap 30 and the
# plain kernel, 4k and 16k, 1 round; then the hdim 128 soft-capped GPU tests.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
export CUDA_CACHE_MAXSIZE=4294967296
[ -d .device/exp ] || unpack_exp
A="--dtype bf16 --hdims 128 --seqlens 4096,16384 --causal both --pass fwd --warmup-ms 400 --timing-ms 200"
timeout 150 .device/exp/base/fa3 bench $A --softcap 30 --csv "$OUT"/softcap-base.csv > /dev/null || echo "fail base"
timeout 150 .device/exp/new/fa3 bench $A --softcap 30 --csv "$OUT"/softcap-new.csv > /dev/null || echo "fail new"
timeout 60 .device/exp/base/fa3 bench $A --csv "$OUT"/plain-base.csv > /dev/null || echo "fail plain"
paste -d, "$OUT"/plain-base.csv "$OUT"/softcap-base.csv "$OUT"/softcap-new.csv | awk -F, 'NR>1 {printf "%s %s causal %s: plain %s softcap base %s new %s new/base %.3f new/plain %.3f\n", $2,$4,$7,$9,$18,$27,$27/$18,$27/$9}'
FA3_REQUIRE_GPU=1 timeout 90 .device/exp/new/gpu softcap > "$OUT"/gpu_softcap.log 2>&1
echo "gpu rc=$?: $(grep -c PASS "$OUT"/gpu_softcap.log) PASS $(grep -c FAIL "$OUT"/gpu_softcap.log) FAIL"
