#!/usr/bin/env bash
# The built-in score modifications against the plain kernels in one call (GPU machine):
# 2 rounds of `fa3 bench` plain, `--alibi` and `--softcap 30`, forward and backward, bf16,
# hdim 128, 4k and 16k, both masks, with .device/exp/head/fa3 (scripts/ab-prep.sh head
# target/ptx/kernels.ptx; carry .device/ab.tgz made by `tar czf .device/ab.tgz -C .device exp`).
# usage (device): scripts/variants-vs-plain.sh   (writes $OUT/variants_vs_plain.csv)
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
A="--dtype bf16 --hdims 128 --seqlens 4096,16384 --causal both"
for r in 1 2; do
  for pass in fwd bwd; do
    for m in plain alibi softcap; do
      case $m in plain) arg="" ;; alibi) arg="--alibi" ;; softcap) arg="--softcap 30" ;; esac
      timeout 120 .device/exp/head/fa3 bench $A --pass $pass $arg --csv "$TMP"/${m}_${pass}_r$r.csv > /dev/null || echo "fail $m $pass $r"
    done
  done
done
scripts/label-rows.sh "$TMP"/*.csv > "$OUT"/variants_vs_plain.csv
python3 - "$OUT"/variants_vs_plain.csv <<'PY'
import collections, sys
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    r = l.strip().split(",")
    m, p, _ = r[0].split("_")
    d[(p, r[4], r[7], m)].append(float(r[-1]))
mean = lambda v: sum(v) / len(v)
print("| pass | seqlen | causal | plain | ALiBi | ALiBi/plain | softcap 30 | softcap/plain |")
print("|---|---|---|---|---|---|---|---|")
for p in ("fwd", "bwd"):
    for s in ("4096", "16384"):
        for c in ("0", "1"):
            pl, al, sc = (mean(d[(p, s, c, m)]) for m in ("plain", "alibi", "softcap"))
            print(f"| {p} | {s} | {c} | {pl:.1f} | {al:.1f} | {al/pl:.3f} | {sc:.1f} | {sc/pl:.3f} |")
PY
