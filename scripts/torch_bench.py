"""Times flash_attn3_torch.flash_attn_func against PyTorch SDPA's cuDNN backend in the same
process (bf16, 16k tokens per batch as `fa3 bench`: batch = 16384 / seqlen, heads = 2048 /
head_dim), forward and forward + backward, CUDA events, median of --iters after --warmup-ms.
TFLOP/s with the FA papers' FLOP counts (causal halved; backward 2.5x the forward).
Writes CSV: impl,pass,hdim,seqlen,causal,ms,tflops."""
import argparse
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flash_attn3_torch import flash_attn_func

p = argparse.ArgumentParser()
p.add_argument("--hdims", default="64,128")
p.add_argument("--seqlens", default="1024,4096,16384")
p.add_argument("--warmup-ms", type=int, default=500)
p.add_argument("--iters", type=int, default=30)
p.add_argument("--csv", required=True)
a = p.parse_args()


def timed(call):
    t0 = time.time()
    while time.time() - t0 < a.warmup_ms / 1000:
        call()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.iters)]
    for st, en in ev:
        st.record()
        call()
        en.record()
    torch.cuda.synchronize()
    return sorted(st.elapsed_time(en) for st, en in ev)[a.iters // 2]


rows = ["impl,pass,hdim,seqlen,causal,ms,tflops"]
for d in map(int, a.hdims.split(",")):
    for s in map(int, a.seqlens.split(",")):
        b, h = 16384 // s, 2048 // d
        q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(4))
        for causal in (False, True):
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            ours = lambda: flash_attn_func(q, k, v, causal=causal)
            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
            for name, f in (("ours", ours), ("sdpa-cudnn", cudnn)):
                for pas, call, factor in (("fwd", f, 1.0), ("fwd+bwd", lambda: torch.autograd.grad(f(), (q, k, v), do if name == "ours" else do.transpose(1, 2)), 3.5)):
                    ms = timed(call)
                    rows.append(f"{name},{pas},{d},{s},{int(causal)},{ms:.4f},{factor * flops / (ms * 1e-3) / 1e12:.1f}")
                    print(rows[-1], flush=True)
open(a.csv, "w").write("\n".join(rows) + "\n")
