#!/usr/bin/env python3
"""Times PyTorch SDPA's FlashAttention-2 and cuDNN backends on the FA3 paper's grid,
forward (default) or backward (--pass bwd: `torch.autograd.grad` of dQ, dK, dV from a
saved forward, FLOPs 2.5x the forward's; impl names get a -bwd suffix).

Same grid, FLOP count and timing method as `fa3 bench`: batch = 16384 / seqlen,
heads = 2048 / hdim, random normal inputs, CUDA events; after --warmup launches and
--warmup-ms of sustained load, the median of at least --iters launches spanning
--timing-ms. Writes CSV: impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops
"""
import argparse, math, sys, time
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
p.add_argument("--hdims", default="64,128,256")
p.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
p.add_argument("--causal", default="both", choices=["off", "on", "both"])
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--iters", type=int, default=20)
p.add_argument("--warmup-ms", type=int, default=1000, help="per config and backend, run it this long before timing (as fa3 bench: under sustained load the card reaches its power cap and its clock drops)")
p.add_argument("--timing-ms", type=int, default=300, help="time at least --iters calls and as many as span this long (as fa3 bench)")
p.add_argument("--cooldown-ms", type=int, default=0, help="idle before each config and backend (as fa3 bench): with --warmup-ms 0, a short burst on a cool card")
p.add_argument("--backends", default="torch-fa2,torch-cudnn")
p.add_argument("--pass", dest="pass_", default="fwd", choices=["fwd", "bwd"])
p.add_argument("--csv", required=True)
a = p.parse_args()
dt = torch.float16 if a.dtype == "f16" else torch.bfloat16
backends = {"torch-fa2": SDPBackend.FLASH_ATTENTION, "torch-cudnn": SDPBackend.CUDNN_ATTENTION}
backends = {n: backends[n] for n in a.backends.split(",")}
causals = {"off": [False], "on": [True], "both": [False, True]}[a.causal]
rows = ["impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops"]

for d in map(int, a.hdims.split(",")):
    for s in map(int, a.seqlens.split(",")):
        b, h = 16384 // s, 2048 // d
        bwd = a.pass_ == "bwd"
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dt, requires_grad=bwd) for _ in range(3))
        do = torch.randn(b, h, s, d, device="cuda", dtype=dt) if bwd else None
        for causal in causals:
            flops = 4 * b * h * s * s * d / (2 if causal else 1) * (2.5 if bwd else 1)
            for name, be in backends.items():
                try:
                    time.sleep(a.cooldown_ms / 1000)
                    with sdpa_kernel(be):
                        if bwd:
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            call = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
                        else:
                            call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        for _ in range(a.warmup):
                            call()
                        torch.cuda.synchronize()
                        t0, calls = time.time(), 0
                        while time.time() - t0 < max(a.warmup_ms, 1) / 1000:
                            for _ in range(8):
                                call()
                            torch.cuda.synchronize()
                            calls += 8
                        per_call_ms = (time.time() - t0) * 1e3 / calls
                        iters = max(a.iters, min(20000, math.ceil(a.timing_ms / per_call_ms)))
                        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
                        for st, en in ev:
                            st.record()
                            call()
                            en.record()
                        torch.cuda.synchronize()
                    ms = sorted(st.elapsed_time(en) for st, en in ev)[iters // 2]
                    tf = flops / (ms * 1e-3) / 1e12
                    impl = name + ("-bwd" if bwd else "")
                    rows.append(f"{impl},{a.dtype},{d},{s},{b},{h},{int(causal)},{ms:.4f},{tf:.1f}")
                    print(f"{name:12} d={d:3} s={s:5} causal={int(causal)} {ms:8.4f} ms {tf:6.1f} TFLOP/s", flush=True)
                except Exception as e:  # a backend may not support a config
                    print(f"{name} d={d} s={s} causal={causal}: {e}", file=sys.stderr)
        del q, k, v, do
open(a.csv, "w").write("\n".join(rows) + "\n")
