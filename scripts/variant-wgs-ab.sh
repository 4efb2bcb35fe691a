#!/usr/bin/env bash
# A/B of soft-capping and ALiBi forwards: .device/exp/{base,new} (scripts/ab-prep.sh), 2 rounds
# of `fa3 bench --softcap 30` and `--alibi` and the plain kernels, bf16, hdim 64/128, 4k/16k,
# both masks; then the new build's `gpu` tests of each (carry .device/ab.tgz, as in
# scripts/alibi-ab.sh). usage (device): scripts/variant-wgs-ab.sh
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
A="--dtype bf16 --hdims 64,128 --seqlens 4096,16384 --causal both"
for r in 1 2; do
  for v in base new; do
    for m in softcap alibi; do
      arg=$([ $m = softcap ] && echo "--softcap 30" || echo "--alibi")
      timeout 100 .device/exp/$v/fa3 bench $A $arg --csv "$TMP"/${m}_${v}_r$r.csv > /dev/null || echo "fail $m $v $r"
    done
  done
  timeout 100 .device/exp/new/fa3 bench $A --csv "$TMP"/plain_x_r$r.csv > /dev/null || echo "fail plain $r"
done
scripts/label-rows.sh "$TMP"/*.csv > "$OUT"/wg3_ab.csv
python3 - $OUT/wg3_ab.csv <<'PY'
import collections, sys
rows = [l.strip().split(",") for l in open(sys.argv[1])]
d = collections.defaultdict(list)
for r in rows:
    d[(r[0].rsplit("_r", 1)[0], tuple(r[3:-2]))].append(float(r[-1]))
for k in sorted({k for (_, k) in d}):
    pl = sum(d[("plain_x", k)]) / len(d[("plain_x", k)])
    out = [f"plain={pl:.1f}"]
    for m in ("softcap", "alibi"):
        b, n = (sum(d[(f"{m}_{v}", k)]) / len(d[(f"{m}_{v}", k)]) for v in ("base", "new"))
        out.append(f"{m}: {b:.1f}->{n:.1f} ({b/pl:.3f}->{n/pl:.3f})")
    print(k, " ".join(out))
PY
for f in softcap alibi; do FA3_REQUIRE_GPU=1 timeout 150 .device/exp/new/gpu $f > $OUT/gpu_$f.log 2>&1; echo "tests $f rc=$?"; grep -E "test result" $OUT/gpu_$f.log | tail -1; done
