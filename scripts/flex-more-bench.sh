#!/usr/bin/env bash
# GPU machine: the FlexAttention comparison's remaining rows, bf16, causal, TFLOP/s on
# visible pairs, same shapes for both: attention sinks at hdim 128 16k (batch 1, 16
# heads), and hdim 64 at 4k (batch 4, 32 heads: `fa3 bench`'s grid) plain, soft-capped,
# ALiBi and with sinks. usage: scripts/flex-more-bench.sh (results in $OUT)
source "$(dirname "$0")/device-env.sh"
for pass in fwd bwd; do
  timeout 120 $B/fa3 bench --dtype bf16 --hdims 128 --seqlens 16384 --causal on --pass $pass --sinks -1,-0.5,0,0.5,-1,-0.5,0,0.5,-1,-0.5,0,0.5,-1,-0.5,0,0.5 --csv "$TMP/sinks128_$pass.csv" > /dev/null || status=1
  for v in "" "--softcap 30" "--alibi" "--sinks -1"; do
    n=$(echo "x$v" | tr -dc 'a-z0-9')
    timeout 120 $B/fa3 bench --dtype bf16 --hdims 64 --seqlens 4096 --causal on --pass $pass $v --csv "$TMP/h64_${n}_$pass.csv" > /dev/null || status=1
  done
done
for f in "$TMP"/*.csv; do echo "# $(basename "$f")"; cat "$f"; done | tee "$OUT/ours.csv"
timeout 200 python3 scripts/flex_peers.py --hdim 128 --seqlen 16384 --variants causal,causal_sinks --csv "$OUT/flex128.csv" 2>&1 | tail -n 6 || status=1
timeout 240 python3 scripts/flex_peers.py --hdim 64 --seqlen 4096 --batch 4 --heads 32 --variants causal,causal_softcap30,causal_alibi,causal_sinks --csv "$OUT/flex64.csv" 2>&1 | tail -n 10 || status=1
exit $status
