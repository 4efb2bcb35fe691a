#!/usr/bin/env bash
# cuDNN's FP8 forward and ours (192-key block tiles at hdim 128) over the FA3 grid, bursts.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
export CUDA_CACHE_MAXSIZE=4294967296
unpack_exp
TESTS=0 B=.device/exp/new timeout 400 scripts/fp8-peer.sh
exit 0
