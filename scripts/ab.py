#!/usr/bin/env python3
"""Table of an A/B run (scripts/ab.sh): per config the median TFLOP/s of each variant over
its rounds, the ratio of each variant to the first, and to cuDNN (the median over the
peers CSVs given, files named peers*.csv). A CSV with several series (`impl`, e.g. the
FP8 bench's block and per-head factors) gets a row per series, and a geomean per series.

usage: ab.py VARIANT.rN.csv... [peers[.rN].csv...]
"""
import csv, math, os, statistics, sys

runs, cudnn, variants, impls = {}, {}, [], set()
for path in sys.argv[1:]:
    name = os.path.basename(path).split(".")[0]
    for r in csv.DictReader(open(path)):
        key = (r["impl"], int(r["hdim"]), int(r["seqlen"]), int(r["causal"]))
        if name != "peers":
            impls.add(r["impl"])
        if name == "peers":
            if r["impl"] == "torch-cudnn":
                cudnn.setdefault(key[1:], []).append(float(r["tflops"]))
            continue
        if name not in variants:
            variants.append(name)
        runs.setdefault(key, {}).setdefault(name, []).append(float(r["tflops"]))
cudnn = {k: statistics.median(v) for k, v in cudnn.items()}
base = variants[0]
series = len(impls) > 1
head = (["impl"] if series else []) + ["hdim", "seqlen", "causal"] + variants + [f"{v}/{base}" for v in variants[1:]]
if cudnn:
    head += ["cudnn"] + [f"{v}/cudnn" for v in variants]
print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
logs = {(v, i): [] for v in variants for i in sorted(impls)}
for key in sorted(runs):
    med = {v: statistics.median(runs[key][v]) for v in variants if v in runs[key]}
    cells = [str(k) for k in (key if series else key[1:])] + [f"{med[v]:.1f}" if v in med else "-" for v in variants]
    cells += [f"{med[v] / med[base]:.3f}" if v in med and base in med else "-" for v in variants[1:]]
    if cudnn:
        c = cudnn.get(key[1:])
        cells += [f"{c:.1f}" if c else "-"] + [f"{med[v] / c:.3f}" if c and v in med else "-" for v in variants]
    for v in variants[1:]:
        if v in med and base in med:
            logs[(v, key[0])].append(math.log(med[v] / med[base]))
    print("| " + " | ".join(cells) + " |")
for v in variants[1:]:
    for i in sorted(impls):
        l = logs[(v, i)]
        if l:
            print(f"\n{v}/{base}{f' ({i})' if series else ''}: geomean {math.exp(sum(l) / len(l)):.3f} over {len(l)} configs")
