#!/usr/bin/env bash
# ALiBi forward A/B on the GPU machine: the `gpu` tests whose names contain "alibi" (new
# build), then 3 rounds of `fa3 bench --alibi` for .device/exp/{base,new} and the plain
# kernels (new build), bf16, hdim 64/128, 4k/16k, both masks; prints the means per config.
# Prepare here: scripts/ab-prep.sh base BASE.ptx; scripts/ab-prep.sh new NEW.ptx; the new
# build's `gpu` test binary in .device/exp/new (scripts/test-binaries.py), then
# `tar czf .device/ab.tgz -C .device exp` and carry .device/ab.tgz.
# usage (device): scripts/alibi-ab.sh   (writes $OUT/gpu_alibi.log, $OUT/alibi_ab.csv)
cd "$(dirname "$0")/.."
source scripts/device-env.sh
unpack_exp
FA3_REQUIRE_GPU=1 timeout 200 .device/exp/new/gpu alibi > "$OUT"/gpu_alibi.log 2>&1; echo "tests rc=$?"
grep -E "test result" "$OUT"/gpu_alibi.log | tail -1
A="--dtype bf16 --hdims 64,128 --seqlens 4096,16384 --causal both"
for r in 1 2 3; do
  for v in base new; do timeout 120 .device/exp/$v/fa3 bench $A --alibi --csv "$TMP"/alibi_${v}_r$r.csv > /dev/null || echo "fail $v $r"; done
  timeout 120 .device/exp/new/fa3 bench $A --csv "$TMP"/plain_r$r.csv > /dev/null || echo "fail plain $r"
done
# Rows labelled by series and round (alibi_base_r1, plain_r2, ...).
scripts/label-rows.sh "$TMP"/*.csv > "$OUT"/alibi_ab.csv
python3 - "$OUT"/alibi_ab.csv <<'PY'
import collections, sys
rows = [l.strip().split(",") for l in open(sys.argv[1])]
d = collections.defaultdict(list)
for r in rows:
    d[(r[0].rsplit("_r", 1)[0], tuple(r[2:-2]))].append(float(r[-1]))
for k in sorted({k for (_, k) in d}):
    v = {t: sum(d[(t, k)]) / len(d[(t, k)]) for t in ("plain", "alibi_base", "alibi_new") if (t, k) in d}
    print(k, " ".join(f"{t}={x:.1f}" for t, x in v.items()),
          f"new/plain={v['alibi_new'] / v['plain']:.3f} base/plain={v['alibi_base'] / v['plain']:.3f}")
PY
