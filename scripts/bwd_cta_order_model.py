#!/usr/bin/env python3
"""List-scheduling model of the causal backward's launch order (docs/perf-history.md item 126).

One CTA per (key block, K/V head, batch), one per SM; a CTA costs the query blocks that see
its keys under a causal mask (equal lengths) plus a fixed overhead, in steps. CTAs start in
launch order, each on whichever SM frees up first. Prints, for the FA3 paper's grid (16k
tokens per batch), the share of the machine busy until the last CTA ends, for the grid
(key blocks, heads, batch) (head after head) and for sections of S (batch, head) pairs
with the key block as the slow index: S = the heads of a batch is the grid (heads, key
blocks, batch); --section sets another S. It models neither L2 nor HBM, and that is what
decided the measurement: heads first was 0.97x the head-after-head order (item 126).

usage: bwd_cta_order_model.py [--sms 132] [--overhead 2] [--section S]
"""
import argparse, heapq

TILES = {64: (128, 128), 128: (64, 128), 256: (64, 64)}  # hdim: (block_m, block_n)
HEADS = {64: 32, 128: 16, 256: 8}


def makespan(costs, sms):
    free = [0.0] * sms
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free)


def order(costs_of_pair, pairs, key_blocks, section):
    out = []
    for s0 in range(0, pairs, section):
        width = min(section, pairs - s0)
        out += [costs_of_pair[x] for x in range(key_blocks) for _ in range(width)]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--overhead", type=float, default=2.0)
    ap.add_argument("--section", type=int, default=0)
    a = ap.parse_args()
    print("hdim seqlen  section  busy(head after head)  busy(sections)")
    for hdim, (bm, bn) in TILES.items():
        for seqlen in [1024, 2048, 4096, 8192, 16384]:
            batch, heads = 16384 // seqlen, HEADS[hdim]
            pairs, key_blocks, query_blocks = batch * heads, seqlen // bn, seqlen // bm
            cost = [query_blocks - (x * bn) // bm + a.overhead for x in range(key_blocks)]
            section = a.section or heads
            ideal = sum(cost) * pairs / a.sms
            base = makespan(order(cost, pairs, key_blocks, 1), a.sms)
            new = makespan(order(cost, pairs, key_blocks, section), a.sms)
            print(f"{hdim:4} {seqlen:6} {section:8} {ideal / base:22.3f} {ideal / new:15.3f}")


if __name__ == "__main__":
    main()
