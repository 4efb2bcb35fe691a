#!/usr/bin/env python3
"""Times PyTorch FlexAttention (`torch.nn.attention.flex_attention` under torch.compile)
on the variants our kernels have, bf16, forward and backward, causal with a block mask:
plain causal, soft-capping at 30, ALiBi with the standard slopes 2^(-8 (h + 1) / heads),
a causal sliding window of --window keys (row i sees keys i - W ..= i), that window
with soft-capping at 30, causal packed documents of --doc-len tokens (FlexAttention's
document mask, `doc[q] == doc[kv]`), the user-defined variants of examples/variants
(`causal_relbias`: a learned bias table[h, clamp(kv − q, −128, 128) + 128] under the
causal mask; `prefixlm`: keys below a prefix of a quarter of the sequence, or causal;
`localglobal`: keys within --lg-window of the diagonal plus --lg-globals global tokens),
and attention sinks (one logit per head, 0.5 · (h mod 4) − 1:
FlexAttention has no sinks, so a key 0 of zero value whose score the score_mod replaces
by the head's logit and which every row sees stands for it; one extra key).
Same timing method as `fa3 bench` and peers.py (steady state: --warmup-ms of sustained
load, then the median of at least --iters calls spanning --timing-ms). TFLOP/s on visible
pairs: 4 d per pair forward, 2.5x that backward (`fa3 bench`'s causal count, to 1/seqlen).
Writes CSV: impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops (impl: flex-VARIANT[-bwd]).
"""
import argparse, math, time
import torch
from torch.nn.attention.flex_attention import flex_attention, create_block_mask

p = argparse.ArgumentParser()
p.add_argument("--hdim", type=int, default=128)
p.add_argument("--seqlen", type=int, default=16384)
p.add_argument("--heads", type=int, default=16)
p.add_argument("--batch", type=int, default=1)
p.add_argument("--variants", default="", help="comma-separated names to run (default: all)")
p.add_argument("--warmup-ms", type=int, default=1000)
p.add_argument("--timing-ms", type=int, default=300)
p.add_argument("--iters", type=int, default=20)
p.add_argument("--window", type=int, default=4096)
p.add_argument("--doc-len", type=int, default=2048)
p.add_argument("--lg-window", type=int, default=1024)
p.add_argument("--lg-globals", type=int, default=256)
p.add_argument("--csv", required=True)
a = p.parse_args()
# Without a higher limit dynamo silently falls back to the dense eager path after a few
# recompiles (one per score_mod).
torch._dynamo.config.cache_size_limit = 64
if hasattr(torch._dynamo.config, "recompile_limit"):
    torch._dynamo.config.recompile_limit = 64
# The backward is timed repeatedly on one graph (retain_graph), which donated buffers forbid.
torch._functorch.config.donated_buffer = False
flex = torch.compile(flex_attention)
b, h, s, d = a.batch, a.heads, a.seqlen, a.hdim
slopes = torch.tensor([2 ** (-8 * (i + 1) / h) for i in range(h)], device="cuda", dtype=torch.float32)
mods = {
    "causal": None,
    "causal_softcap30": lambda score, bi, hi, qi, ki: 30 * torch.tanh(score / 30),
    "causal_alibi": lambda score, bi, hi, qi, ki: score - slopes[hi] * (qi - ki).abs(),
}
block_mask = create_block_mask(lambda bi, hi, qi, ki: qi >= ki, None, None, s, s, device="cuda")
pairs = s * (s + 1) // 2
w = a.window
window_mask = create_block_mask(lambda bi, hi, qi, ki: (qi >= ki) & (qi - ki <= w), None, None, s, s, device="cuda")
window_pairs = sum(min(i, w) + 1 for i in range(s))
# name: (score_mod, block mask, visible pairs)
variants = {name: (mod, block_mask, pairs) for name, mod in mods.items()}
variants[f"causal_window{w}"] = (None, window_mask, window_pairs)
variants[f"causal_window{w}_softcap30"] = (mods["causal_softcap30"], window_mask, window_pairs)
L = a.doc_len
doc = torch.arange(s, device="cuda") // L
docs_mask = create_block_mask(lambda bi, hi, qi, ki: (qi >= ki) & (doc[qi] == doc[ki]), None, None, s, s, device="cuda")
docs_pairs = sum(n * (n + 1) // 2 for n in [min(L, s - st) for st in range(0, s, L)])
variants[f"causal_docs{L}"] = (None, docs_mask, docs_pairs)
R = 128
table = (torch.arange(h * (2 * R + 1), device="cuda") % 17).float().view(h, 2 * R + 1) / 17 - 0.5
relbias = lambda score, bi, hi, qi, ki: score + table[hi, (ki - qi).clamp(-R, R) + R]
variants["causal_relbias"] = (relbias, block_mask, pairs)
P = s // 4
prefix_mask = create_block_mask(lambda bi, hi, qi, ki: (ki < P) | (qi >= ki), None, None, s, s, device="cuda")
variants["prefixlm"] = (None, prefix_mask, sum(max(i + 1, P) for i in range(s)))
# examples/variants' local_global: keys within --lg-window of the diagonal, or either of the
# first --lg-globals tokens (not causal).
LW, LG = a.lg_window, a.lg_globals
lg_mask = create_block_mask(lambda bi, hi, qi, ki: ((qi - ki).abs() <= LW) | (ki < LG) | (qi < LG), None, None, s, s, device="cuda")
lg_pairs = sum(s if i < LG else min(i + LW + 1, s) - max(i - LW, LG, 0) + LG for i in range(s))
variants["localglobal"] = (None, lg_mask, lg_pairs)
sinks = torch.tensor([0.5 * (i % 4) - 1.0 for i in range(h)], device="cuda", dtype=torch.float32)
sink_mod = lambda score, bi, hi, qi, ki: torch.where(ki == 0, sinks[hi], score)
sink_mask = create_block_mask(lambda bi, hi, qi, ki: (ki == 0) | (qi + 1 >= ki), None, None, s, s + 1, device="cuda")
# (score_mod, block mask, visible pairs, extra sink key)
variants = {n: (m, k, v, False) for n, (m, k, v) in variants.items()}
variants["causal_sinks"] = (sink_mod, sink_mask, pairs, True)
if a.variants:
    variants = {n: x for n, x in variants.items() if n in a.variants.split(",")}
rows = ["impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops"]


def timed(call):
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    t0, calls = time.time(), 0
    while time.time() - t0 < a.warmup_ms / 1000:
        call()
        torch.cuda.synchronize()
        calls += 1
    per_call = (time.time() - t0) * 1e3 / max(calls, 1)
    iters = max(a.iters, min(5000, math.ceil(a.timing_ms / per_call)))
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for st, en in ev:
        st.record()
        call()
        en.record()
    torch.cuda.synchronize()
    return sorted(st.elapsed_time(en) for st, en in ev)[iters // 2]


for name, (mod, mask, visible, sink_key) in variants.items():
    sk = s + 1 if sink_key else s
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, h, sk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, h, sk, d, device="cuda", dtype=torch.bfloat16)
    if sink_key:
        v[:, :, 0] = 0
    v.requires_grad_(True)
    do = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    fwd = lambda: flex(q, k, v, score_mod=mod, block_mask=mask)
    o = fwd()
    bwd = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    for suffix, call, factor in (("", fwd, 1.0), ("-bwd", bwd, 2.5)):
        ms = timed(call)
        tf = 4 * d * visible * b * h * factor / (ms * 1e-3) / 1e12
        rows.append(f"flex-{name}{suffix},bf16,{d},{s},{b},{h},{int(name.startswith('causal'))},{ms:.4f},{tf:.1f}")
        print(rows[-1], flush=True)
open(a.csv, "w").write("\n".join(rows) + "\n")
