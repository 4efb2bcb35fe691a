#!/usr/bin/env python3
"""Times cuDNN's FP8 (e4m3) attention forward, called through the cudnn-frontend
Python graph API (`pygraph.sdpa_fp8`), as an FP8 peer for the FA3 grid.

What it measures
  One forward: O = softmax(Q K^T * attn_scale) V. Q, K and V are e4m3
  (torch.randn(...).to(torch.float8_e4m3fn)). Every descale and scale tensor
  (descale_q/k/v/s, scale_s, scale_o) is a float32 1.0 of shape [1,1,1,1], and
  attn_scale = 1/sqrt(hdim). On Hopper cuDNN only writes an e4m3 O for FP8 (a
  bf16/f16 O needs Blackwell), so O is e4m3; the CSV says so in o_dtype. No
  softmax stats are made (generate_stats=False, inference). Amax_S and Amax_O are
  declared as graph outputs, as the cudnn-frontend FP8 tests do; both are
  [1,1,1,1] float32 scalars that the kernel also writes.
  Causal masking is top-left: diagonal_alignment=TOP_LEFT with right_bound=0,
  which is what use_causal_mask=True means. seqlen_q == seqlen_kv, so top-left
  and bottom-right give the same mask, and cudnn-frontend refuses bottom-right
  for FP8 forward before Blackwell.
  Layout: the tensors have logical dims [batch, heads, seqlen, hdim] and the
  strides of a contiguous [batch, seqlen, heads, hdim] (BSHD) buffer, as in
  cudnn-frontend's FP8 tests. O uses the same layout.

Grid (as in the FA3 paper and `fa3 bench`): hdim in --hdims, seqlen in --seqlens,
causal off/on; batch = 16384 // seqlen, heads = 2048 // hdim.
FLOPs = 4*b*h*s*s*d, halved when causal; TFLOP/s = FLOPs / median time.

Timing (--mode):
  bursts (default): sleep --idle-ms (1 s) with the GPU idle, then --warmup (5)
      untimed executions, then --iters (20) executions, each between its own pair
      of CUDA events, all queued back to back. Reports the median.
  steady: --steady-warm-ms (1 s) of back-to-back untimed executions, then
      executions timed one by one with event pairs, at least --iters (20) of
      them and at least --steady-ms (300 ms) of measured GPU time. Reports the median.
The graph is built (heuristics mode A then FALLBACK) before any timing starts.

A config that fails (not supported, out of memory, any exception) prints a line
with the exception and the run goes on to the next config.

--check runs one small config (b=1, h=2, s=256, d=128, causal off and on),
compares cuDNN's O (as float) with a float32 torch reference
softmax(QK^T * scale) V computed from the same e4m3 inputs, prints the max abs
error (expect e4m3-level, a few 1e-2) and exits; it exits 1 if the error is too large.

Running it on the device (torch with CUDA and cuDNN 9.x; the cudnn-frontend wheel
installed with `pip install --no-deps --target <dir> nvidia_cudnn_frontend-*.whl`):
  PYTHONPATH=<dir with the installed wheel> python3 scripts/cudnn_fp8_peer.py --csv out.csv
  PYTHONPATH=<dir> python3 scripts/cudnn_fp8_peer.py --check
  PYTHONPATH=<dir> python3 scripts/cudnn_fp8_peer.py --mode steady --hdims 128 --csv out.csv

CSV header: impl,pass,dtype,hdim,seqlen,batch,heads,causal,ms,tflops,o_dtype
e.g.        cudnn-fp8,fwd,e4m3,128,16384,1,16,0,2.1400,1027.2,e4m3
"""
import argparse
import gc
import math
import statistics
import sys
import time

import torch  # import torch first: it loads CUDA and the cuDNN library that cudnn-frontend reuses
import cudnn

IMPL = "cudnn-fp8"
O_DTYPE_NAME = "e4m3"  # Hopper FP8 SDPA forward only supports an FP8 O
CSV_HEADER = "impl,pass,dtype,hdim,seqlen,batch,heads,causal,ms,tflops,o_dtype"
SCALAR_DIM = [1, 1, 1, 1]
SCALAR_STRIDE = [1, 1, 1, 1]
SCALE_NAMES = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")


def bshd_strides(b, h, s, d):
    """Strides, in elements, of a contiguous [b, s, h, d] buffer seen as [b, h, s, d]."""
    return [s * h * d, d, h * d, 1]


def make_buffers(b, h, s, d, seed=0):
    """e4m3 Q, K, V and an e4m3 O buffer (contiguous BSHD storage), returned as
    [b, h, s, d] views, plus the float32 scale scalars and the amax outputs."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    fp8 = torch.float8_e4m3fn

    def qkv():
        x = torch.randn(b, s, h, d, device="cuda", dtype=torch.float32, generator=gen)
        y = x.to(fp8)
        del x
        return y.permute(0, 2, 1, 3)  # [b, h, s, d] view of the BSHD buffer

    q, k, v = qkv(), qkv(), qkv()
    o = torch.empty(b, s, h, d, device="cuda", dtype=fp8).permute(0, 2, 1, 3)
    scales = {n: torch.ones(SCALAR_DIM, device="cuda", dtype=torch.float32) for n in SCALE_NAMES}
    amax_s = torch.zeros(SCALAR_DIM, device="cuda", dtype=torch.float32)
    amax_o = torch.zeros(SCALAR_DIM, device="cuda", dtype=torch.float32)
    return q, k, v, o, scales, amax_s, amax_o


def build_graph(handle, b, h, s, d, causal, build=True):
    """Build the cudnn-frontend FP8 SDPA forward graph. Returns (graph, dict of
    the graph's tensor descriptors by role)."""
    fp8 = cudnn.data_type.FP8_E4M3
    f32 = cudnn.data_type.FLOAT
    graph = cudnn.pygraph(
        io_data_type=fp8,
        intermediate_data_type=f32,
        compute_data_type=f32,
        handle=handle,
    )
    dims = [b, h, s, d]
    strides = bshd_strides(b, h, s, d)
    t = {}
    for n in ("q", "k", "v"):
        t[n] = graph.tensor(name=n, dim=dims, stride=strides, data_type=fp8)
    for n in SCALE_NAMES:
        t[n] = graph.tensor(name=n, dim=SCALAR_DIM, stride=SCALAR_STRIDE, data_type=f32)

    mask_kw = {}
    if causal:
        # Top-left causal (== use_causal_mask=True). Bottom-right is rejected for
        # FP8 forward before Blackwell; with s_q == s_kv both are the same mask.
        mask_kw = dict(diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, right_bound=0)

    o, stats, amax_s, amax_o = graph.sdpa_fp8(
        q=t["q"],
        k=t["k"],
        v=t["v"],
        descale_q=t["descale_q"],
        descale_k=t["descale_k"],
        descale_v=t["descale_v"],
        descale_s=t["descale_s"],
        scale_s=t["scale_s"],
        scale_o=t["scale_o"],
        generate_stats=False,  # inference: no softmax stats (is_inference=True in older spelling)
        attn_scale=1.0 / math.sqrt(d),
        name="sdpa_fp8_fwd",
        **mask_kw,
    )
    assert stats is None, "generate_stats=False should give no Stats tensor"
    o.set_output(True).set_dim(dims).set_stride(strides).set_data_type(fp8)
    amax_s.set_output(True).set_dim(SCALAR_DIM).set_stride(SCALAR_STRIDE).set_data_type(f32)
    amax_o.set_output(True).set_dim(SCALAR_DIM).set_stride(SCALAR_STRIDE).set_data_type(f32)
    t["o"], t["amax_s"], t["amax_o"] = o, amax_s, amax_o

    if build:
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
    return graph, t


def plan_description(graph):
    """Best effort: which engine/plan the graph will run."""
    try:
        eng = graph.selected_engine
        if eng is not None:
            return f"python-engine:{eng.name}"
    except Exception:
        pass
    try:
        return graph.get_plan_name_at_index(graph._plan_index)
    except Exception:
        return "?"


class Sdpa:
    """A built graph with its buffers, ready to execute on the handle's stream."""

    def __init__(self, handle, b, h, s, d, causal, seed=0):
        self.handle = handle
        self.q, self.k, self.v, self.o, self.scales, self.amax_s, self.amax_o = make_buffers(b, h, s, d, seed)
        self.graph, t = build_graph(handle, b, h, s, d, causal)
        self.pack = {t["q"]: self.q, t["k"]: self.k, t["v"]: self.v, t["o"]: self.o, t["amax_s"]: self.amax_s, t["amax_o"]: self.amax_o}
        for n in SCALE_NAMES:
            self.pack[t[n]] = self.scales[n]
        ws = self.graph.get_workspace_size()
        self.workspace = torch.empty(max(int(ws), 1), device="cuda", dtype=torch.uint8)
        self.plan = plan_description(self.graph)

    def __call__(self):
        self.graph.execute(self.pack, self.workspace, handle=self.handle)


def time_pairs(fn, n):
    """Queue n executions back to back, each between its own event pair; returns the events."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for st, en in ev:
        st.record()
        fn()
        en.record()
    return ev


def time_bursts(fn, a):
    time.sleep(a.idle_ms / 1000.0)
    for _ in range(a.warmup):
        fn()
    ev = time_pairs(fn, a.iters)
    torch.cuda.synchronize()
    return statistics.median(st.elapsed_time(en) for st, en in ev)


def time_steady(fn, a):
    t0, calls = time.perf_counter(), 0
    while calls == 0 or time.perf_counter() - t0 < a.steady_warm_ms / 1000.0:
        for _ in range(8):
            fn()
        torch.cuda.synchronize()
        calls += 8
    per_call_ms = max((time.perf_counter() - t0) * 1e3 / calls, 1e-3)
    times = []
    while len(times) < a.iters or sum(times) < a.steady_ms:
        if len(times) >= a.max_iters:
            break
        want = max(a.iters - len(times), math.ceil((a.steady_ms - sum(times)) / per_call_ms), 8)
        want = min(want, a.max_iters - len(times))
        ev = time_pairs(fn, want)
        torch.cuda.synchronize()
        times.extend(st.elapsed_time(en) for st, en in ev)
    return statistics.median(times)


def free_gpu():
    gc.collect()
    torch.cuda.empty_cache()


def reference(q, k, v, causal):
    """float32 softmax(Q K^T * scale) V from the same e4m3 inputs ([b, h, s, d] views)."""
    qf, kf, vf = q.float(), k.float(), v.float()
    scale = 1.0 / math.sqrt(q.shape[-1])
    sc = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if causal:
        s_q, s_k = sc.shape[-2], sc.shape[-1]
        mask = torch.ones(s_q, s_k, dtype=torch.bool, device=sc.device).triu(1)  # top-left diagonal
        sc = sc.masked_fill(mask, float("-inf"))
    p = torch.softmax(sc, dim=-1)
    return torch.matmul(p, vf)


def run_check(handle):
    b, h, s, d = 1, 2, 256, 128
    ok = True
    for causal in (False, True):
        try:
            run = Sdpa(handle, b, h, s, d, causal, seed=1234)
            run.amax_o.fill_(-1.0)
            run()
            torch.cuda.synchronize()
            out = run.o.float()
            ref = reference(run.q, run.k, run.v, causal)
            err = (out - ref).abs()
            ref_q = ref.to(torch.float8_e4m3fn).float()  # the reference rounded to e4m3, like cuDNN's O
            err_q = (out - ref_q).abs()
            bad = (err > 0.05 + 0.15 * ref.abs()) | ~torch.isfinite(out)
            print(
                f"check b={b} h={h} s={s} d={d} causal={int(causal)} plan={run.plan}: "
                f"max_abs_err={err.max().item():.4g} mean_abs_err={err.mean().item():.4g} "
                f"max_abs_err_vs_e4m3_ref={err_q.max().item():.4g} max|ref|={ref.abs().max().item():.4g} "
                f"amax_o={run.amax_o.item():.4g} (ref max|O|={ref.abs().max().item():.4g}) "
                f"out_of_tolerance={int(bad.sum().item())}/{bad.numel()}",
                flush=True,
            )
            if bad.any() or not math.isfinite(err.max().item()):
                ok = False
            del run, out, ref, err, ref_q, err_q, bad
        except Exception as e:
            print(f"check causal={int(causal)} FAILED: {type(e).__name__}: {e}", flush=True)
            ok = False
        free_gpu()
    print("check: PASS" if ok else "check: FAIL (tolerance |err| <= 0.05 + 0.15*|ref|)", flush=True)
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hdims", default="64,128,256")
    p.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    p.add_argument("--causal", default="both", choices=["both", "on", "off"])
    p.add_argument("--mode", default="bursts", choices=["bursts", "steady"])
    p.add_argument("--csv", default=None, help="write the results as CSV to this path")
    p.add_argument("--check", action="store_true", help="only run the small correctness check and exit")
    p.add_argument("--warmup", type=int, default=5, help="bursts: untimed executions before the timed ones")
    p.add_argument("--iters", type=int, default=20, help="timed executions (steady: at least this many)")
    p.add_argument("--idle-ms", type=int, default=1000, help="bursts: idle sleep before each config")
    p.add_argument("--steady-warm-ms", type=int, default=1000, help="steady: untimed back-to-back load before timing")
    p.add_argument("--steady-ms", type=int, default=300, help="steady: time at least this much GPU time")
    p.add_argument("--max-iters", type=int, default=20000, help="steady: cap on timed executions")
    a = p.parse_args()

    if not torch.cuda.is_available():
        sys.exit("no CUDA device")
    dev = torch.cuda.get_device_name()
    cc = torch.cuda.get_device_capability()
    print(
        f"device: {dev} (sm_{cc[0]}{cc[1]}), torch {torch.__version__}, "
        f"cudnn-frontend {getattr(cudnn, '__version__', '?')}, cuDNN backend {cudnn.backend_version_string()}",
        flush=True,
    )

    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)

    if a.check:
        ok = run_check(handle)
        sys.exit(0 if ok else 1)

    hdims = [int(x) for x in a.hdims.split(",") if x]
    seqlens = [int(x) for x in a.seqlens.split(",") if x]
    causals = {"off": [False], "on": [True], "both": [False, True]}[a.causal]
    timer = time_bursts if a.mode == "bursts" else time_steady

    rows = [CSV_HEADER]
    print(f"mode={a.mode}  O dtype={O_DTYPE_NAME}  layout=BSHD storage, [b,h,s,d] logical", flush=True)
    print(f"{'impl':10} {'hdim':>4} {'seqlen':>6} {'batch':>5} {'heads':>5} {'causal':>6} {'ms':>9} {'TFLOP/s':>8}  plan", flush=True)
    for d in hdims:
        for s in seqlens:
            b, h = 16384 // s, 2048 // d
            for causal in causals:
                flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
                try:
                    run = Sdpa(handle, b, h, s, d, causal)
                    run()  # one execution outside timing: surfaces execute-time errors early
                    torch.cuda.synchronize()
                    ms = timer(run, a)
                    tf = flops / (ms * 1e-3) / 1e12
                    rows.append(f"{IMPL},fwd,e4m3,{d},{s},{b},{h},{int(causal)},{ms:.4f},{tf:.1f},{O_DTYPE_NAME}")
                    print(f"{IMPL:10} {d:4d} {s:6d} {b:5d} {h:5d} {int(causal):6d} {ms:9.4f} {tf:8.1f}  {run.plan}", flush=True)
                    del run
                except Exception as e:  # unsupported config, OOM, anything: report and go on
                    msg = str(e).strip().replace("\n", " | ")
                    print(f"{IMPL:10} {d:4d} {s:6d} {b:5d} {h:5d} {int(causal):6d} FAILED: {type(e).__name__}: {msg}", flush=True)
                    run = None
                free_gpu()

    try:
        cudnn.destroy_handle(handle)
    except Exception:
        pass
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("\n".join(rows) + "\n")
        print(f"wrote {len(rows) - 1} rows to {a.csv}", flush=True)


if __name__ == "__main__":
    main()
