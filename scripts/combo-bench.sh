#!/usr/bin/env bash
# GPU machine: the combined variant causal + 4096 window + soft-capping 30 against
# FlexAttention's (and Flex's other variants) in one call, bf16, hdim 128, 16k tokens,
# forward and backward, TFLOP/s on visible pairs. usage: scripts/combo-bench.sh (results in $OUT)
source "$(dirname "$0")/device-env.sh"
timeout 300 python3 scripts/flex_peers.py --hdim 128 --seqlen 16384 --csv "$OUT/flex.csv" > /dev/null 2>&1 || status=1
grid="--dtype bf16 --hdims 128 --seqlens 16384 --causal on"
for pass in fwd bwd; do
  for name in window window_softcap; do
    v="--window 4096,0"; [ $name = window_softcap ] && v="$v --softcap 30"
    timeout 60 $B/fa3 bench $grid --pass $pass $v --csv "$OUT/ours_${pass}_$name.csv" > /dev/null || status=1
  done
done
cat "$OUT/flex.csv" "$OUT"/ours_*.csv | grep -v '^impl' | sort
exit $status
