#!/usr/bin/env python3
"""Joins `fa3 bench` and `peers.py` CSVs into one markdown table (TFLOP/s, ratio to cuDNN).

usage: compare.py OURS.csv PEERS.csv [--min-seqlen N]
"""
import csv, math, sys

args = [x for x in sys.argv[1:] if not x.startswith("--")]
min_seqlen = int(sys.argv[sys.argv.index("--min-seqlen") + 1]) if "--min-seqlen" in sys.argv else 1024
if "--min-seqlen" in sys.argv:
    args.remove(str(min_seqlen))
rows = {}
impls = []
for path in args:
    for r in csv.DictReader(open(path)):
        key = (r["dtype"], int(r["hdim"]), int(r["seqlen"]), int(r["causal"]))
        rows.setdefault(key, {})[r["impl"]] = float(r["tflops"])
        if r["impl"] not in impls:
            impls.append(r["impl"])
ours = [i for i in impls if i.startswith("rust-")]
print("| dtype | hdim | seqlen | causal | " + " | ".join(impls) + " | " + " | ".join(f"{o}/cudnn" for o in ours) + " |")
print("|" + "---|" * (4 + len(impls) + len(ours)))
ratios = {o: [] for o in ours}
for key in sorted(rows):
    r = rows[key]
    cells = [f"{r[i]:.1f}" if i in r else "-" for i in impls]
    rc = []
    for o in ours:
        # The backward's rows pair with cuDNN's backward (both carry a "-bwd" suffix).
        peer = "torch-cudnn" + ("-bwd" if o.endswith("-bwd") else "")
        if o in r and peer in r:
            x = r[o] / r[peer]
            rc.append(f"{x:.2f}")
            if key[2] >= min_seqlen:
                ratios[o].append(x)
        else:
            rc.append("-")
    print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cells) + " | " + " | ".join(rc) + " |")
for o, xs in ratios.items():
    if xs:
        g = math.exp(sum(map(math.log, xs)) / len(xs))
        print(f"\n{o} vs cuDNN over seqlen >= {min_seqlen}: geomean {g:.3f}, min {min(xs):.3f}, max {max(xs):.3f} ({len(xs)} configs)")
