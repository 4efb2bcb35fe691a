#!/usr/bin/env bash
# GPU machine: hdim 64, 4k, causal, bf16 (batch 4, 32 heads), forward and backward: ours
# plain, with ALiBi and with soft-capping at 30 (.device/exp/head/fa3, carried in
# .device/ab.tgz), then FlexAttention on the same three, in one call.
# usage (device): scripts/flex64-bwd.sh   (writes $OUT/ours64.csv, $OUT/flex64.csv)
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
for pass in fwd bwd; do
  for v in "" "--alibi" "--softcap 30"; do
    n=plain$(echo "x$v" | tr -dc 'a-z0-9')
    timeout 120 .device/exp/head/fa3 bench --dtype bf16 --hdims 64 --seqlens 4096 --causal on --pass $pass $v --csv "$TMP"/h64_${n}_$pass.csv > /dev/null || echo "fail $v $pass"
  done
done
scripts/label-rows.sh "$TMP"/h64_*.csv | tee "$OUT"/ours64.csv
timeout 400 python3 scripts/flex_peers.py --hdim 64 --seqlen 4096 --batch 4 --heads 32 --variants causal,causal_alibi,causal_softcap30 --csv $OUT/flex64.csv 2>&1 | tail -n 4
cat $OUT/flex64.csv
exit $status
