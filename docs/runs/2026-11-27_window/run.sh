#!/usr/bin/env bash
# The sliding window against plain causal, visible-pair TFLOP/s, bf16, hdim 64 and 128,
# 4k and 16k, forward and backward, 2 rounds (HEAD's kernels).
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
for r in 1 2; do
  for pass in fwd bwd; do
    for m in causal window; do
      arg=""; [ $m = window ] && arg="--window 4096,0"
      timeout 100 .device/exp/new/fa3 bench --dtype bf16 --hdims 64,128 --seqlens 4096,16384 --causal on --pass $pass $arg --csv "$TMP/${m}_${pass}_r$r.csv" > /dev/null 2>&1 || echo "fail $m $pass $r"
    done
  done
done
scripts/label-rows.sh "$TMP"/*.csv > "$OUT/window_vs_causal.csv"
python3 - "$OUT/window_vs_causal.csv" <<'PY' | tee "$OUT/window_vs_causal.md"
import collections, sys
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    r = l.strip().split(",")
    m, p, _ = r[0].split("_")
    d[(p, r[3], r[4], m)].append(float(r[-1]))
mean = lambda v: sum(v) / len(v)
print("| pass | hdim | seqlen | causal | causal + window 4096 | window / causal |")
print("|---|---|---|---|---|---|")
for p in ("fwd", "bwd"):
    for h in ("64", "128"):
        for s in ("4096", "16384"):
            c, w = mean(d[(p, h, s, "causal")]), mean(d[(p, h, s, "window")])
            print(f"| {p} | {h} | {s} | {c:.1f} | {w:.1f} | {w/c:.3f} |")
PY
exit 0
