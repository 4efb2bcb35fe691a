#!/usr/bin/env python3
"""Merges repeated `fa3 bench` / `peers.py` CSVs: per (impl, config) the median time of the
rounds (TFLOP/s recomputed from it), and the spread (max/min - 1) of each config.

usage: median.py OUT.csv IN.csv...   (prints the largest spread per impl)
"""
import csv, statistics, sys

out, inputs = sys.argv[1], sys.argv[2:]
groups, fields = {}, None
for path in inputs:
    for r in csv.DictReader(open(path)):
        fields = list(r.keys())
        key = tuple(r[f] for f in fields if f not in ("ms", "tflops"))
        groups.setdefault(key, []).append((float(r["ms"]), float(r["tflops"])))
spread = {}
with open(out, "w") as f:
    f.write(",".join(fields) + "\n")
    for key, runs in groups.items():
        ms = statistics.median(m for m, _ in runs)
        flop = statistics.median(m * t for m, t in runs)  # identical in every round
        f.write(",".join(key) + f",{ms:.4f},{flop / ms:.1f}\n")
        lo, hi = min(m for m, _ in runs), max(m for m, _ in runs)
        impl = key[0]
        spread[impl] = max(spread.get(impl, (-1.0, key)), (hi / lo - 1, key), key=lambda x: x[0])
for impl, (s, key) in spread.items():
    print(f"{impl}: {len(inputs)} rounds, largest spread {100 * s:.1f}% at {','.join(key[1:])}")
