#!/usr/bin/env python3
"""Table of an A/B run (scripts/ab.sh): per config the median TFLOP/s of each variant over
its rounds, the ratio of each variant to the first, and to cuDNN (the median over the
peers CSVs given, files named peers*.csv).

usage: ab.py VARIANT.rN.csv... [peers[.rN].csv...]
"""
import csv, math, os, statistics, sys

runs, cudnn, variants = {}, {}, []
for path in sys.argv[1:]:
    name = os.path.basename(path).split(".")[0]
    for r in csv.DictReader(open(path)):
        key = (int(r["hdim"]), int(r["seqlen"]), int(r["causal"]))
        if name == "peers":
            if r["impl"] == "torch-cudnn":
                cudnn.setdefault(key, []).append(float(r["tflops"]))
            continue
        if name not in variants:
            variants.append(name)
        runs.setdefault(key, {}).setdefault(name, []).append(float(r["tflops"]))
cudnn = {k: statistics.median(v) for k, v in cudnn.items()}
base = variants[0]
head = ["hdim", "seqlen", "causal"] + variants + [f"{v}/{base}" for v in variants[1:]]
if cudnn:
    head += ["cudnn"] + [f"{v}/cudnn" for v in variants]
print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
logs = {v: [] for v in variants}
for key in sorted(runs):
    med = {v: statistics.median(runs[key][v]) for v in variants if v in runs[key]}
    cells = [str(k) for k in key] + [f"{med[v]:.1f}" if v in med else "-" for v in variants]
    cells += [f"{med[v] / med[base]:.3f}" if v in med and base in med else "-" for v in variants[1:]]
    if cudnn:
        c = cudnn.get(key)
        cells += [f"{c:.1f}" if c else "-"] + [f"{med[v] / c:.3f}" if c and v in med else "-" for v in variants]
    for v in variants[1:]:
        if v in med and base in med:
            logs[v].append(math.log(med[v] / med[base]))
    print("| " + " | ".join(cells) + " |")
for v in variants[1:]:
    if logs[v]:
        print(f"\n{v}/{base}: geomean {math.exp(sum(logs[v]) / len(logs[v])):.3f} over {len(logs[v])} configs")
