#!/usr/bin/env python3
"""List-scheduling model of the causal dynamic tile order (docs/perf-history.md item 64).

Tiles are claimed in the kernels' order (sections of S heads; within a section the query
block is the slow index, last first), each by whichever of the SMs frees up first. A
tile costs the key blocks its warpgroups visit (a warpgroup skips blocks past its
diagonal where tiles and key blocks differ in size), averaged over its warpgroups (they
share the tensor core), plus a fixed per-tile overhead in the same units. Prints the
share of the machine left idle at the end. It models neither L2 nor HBM: it says how
much the tail could give, not what a section size costs in memory traffic.

usage: tail_model.py [--sms 132] [--overhead 1.0]   (the FA3 paper's grid, causal)
"""
import argparse, heapq, math

TILES = {64: (192, 128), 128: (128, 128), 256: (128, 80)}  # hdim: (block_m, block_n)

def tile_costs(hdim, seqlen, heads, section, overhead):
    bm, bn = TILES[hdim]
    def cost(m):
        blocks = [math.ceil(min(r0 + 64, seqlen) / bn) for r0 in range(m * bm, min((m + 1) * bm, seqlen), 64)]
        return sum(blocks) / (bm // 64) + overhead
    units = math.ceil(seqlen / bm)
    return [cost(u) for s0 in range(0, heads, section) for u in reversed(range(units)) for _ in range(min(section, heads - s0))]

def idle(costs, sms):
    free = [0.0] * sms
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c)
    return 1 - sum(costs) / sms / max(free)

p = argparse.ArgumentParser()
p.add_argument("--sms", type=int, default=132)
p.add_argument("--overhead", type=float, default=1.0)
a = p.parse_args()
print("idle share at the end, by heads per section")
print("| hdim | seqlen | " + " | ".join(str(s) for s in (1, 8, 16, 32, 64)) + " |")
print("|---|---|" + "---|" * 5)
for hdim in (64, 128, 256):
    for seqlen in (512, 1024, 2048, 4096, 8192):
        heads = 16384 // seqlen * (2048 // hdim)
        cells = [f"{100 * idle(tile_costs(hdim, seqlen, heads, s, a.overhead), a.sms):.1f}%" for s in (1, 8, 16, 32, 64)]
        print(f"| {hdim} | {seqlen} | " + " | ".join(cells) + " |")
