//! Timing with CUDA events, and the FLOP count of the FlashAttention papers.
use crate::api::flash_attn_func_into;
use crate::error::Result;
use crate::gpu::Gpu;
use crate::plan::{AttnOptions, Window, visible_keys};
use crate::tensor::{TensorMut, TensorRef};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, CudaStream};
use std::sync::Arc;

/// Forward FLOPs: `4 * b * h * sq * sk * d`, halved when causal (the papers' convention).
pub fn fwd_flops(batch: usize, heads: usize, seqlen_q: usize, seqlen_k: usize, hdim: usize, causal: bool) -> f64 {
    let f = 4.0 * batch as f64 * heads as f64 * seqlen_q as f64 * seqlen_k as f64 * hdim as f64;
    if causal { f / 2.0 } else { f }
}

/// Forward FLOPs of the (query, key) pairs a call computes: `4 * b * h * d` per pair that
/// some mask leaves visible (the sliding-window and document tables count these; without
/// a mask [`fwd_flops`]' convention stays, which halves the causal square). `doc_ids`:
/// packed documents, one id per key token shared by the batch (rows sit at key
/// `i + seqlen_k − seqlen_q`).
#[allow(clippy::too_many_arguments)]
pub fn fwd_flops_visible(
    batch: usize,
    heads: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    hdim: usize,
    causal: bool,
    window: Option<Window>,
    doc_ids: Option<&[u32]>,
) -> f64 {
    let pairs: usize = (0..seqlen_q)
        .map(|i| {
            let keys = visible_keys(i, seqlen_q, seqlen_k, causal, window);
            match doc_ids {
                Some(ids) => {
                    let id = ids[i + seqlen_k - seqlen_q];
                    keys.filter(|&j| ids[j] == id).count()
                }
                None => keys.len(),
            }
        })
        .sum();
    4.0 * batch as f64 * heads as f64 * pairs as f64 * hdim as f64
}

/// Backward FLOPs: 2.5 times the forward's (the papers' convention: five GEMMs of the
/// forward's two's size, S recomputed).
pub fn bwd_flops(batch: usize, heads: usize, seqlen_q: usize, seqlen_k: usize, hdim: usize, causal: bool) -> f64 {
    2.5 * fwd_flops(batch, heads, seqlen_q, seqlen_k, hdim, causal)
}

/// Per-launch times of one configuration, milliseconds.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Median of the timed launches.
    pub median_ms: f64,
    /// Fastest timed launch.
    pub min_ms: f64,
    /// Slowest timed launch.
    pub max_ms: f64,
    /// Host time per call (validation, tensor maps, launch), averaged over the timed loop.
    pub host_us: f64,
}

/// How long to load the GPU and to time one configuration (see [`time_calls`]).
#[derive(Clone, Copy, Debug)]
pub struct TimingPlan {
    /// Untimed calls first.
    pub warmup: usize,
    /// Then this long of back-to-back calls, untimed.
    pub warmup_ms: u64,
    /// At least this many timed calls...
    pub iters: usize,
    /// ...and as many as span this long.
    pub timing_ms: u64,
}

/// Times at least `iters` calls of `call`, and as many as span `timing_ms` (each between
/// its own pair of events; the median is kept), after at least `warmup` untimed ones and
/// `warmup_ms` of back-to-back calls. The span matters because the capped clock wanders
/// by several percent over tens of milliseconds: 20 launches of a 0.2 ms call sample one
/// moment of it. Under sustained load the H100 here runs into its power cap within a
/// second and its clock falls from 1980 to ~1400-1550 MHz, so a short burst after idle
/// measures a different card than a long run (docs/perf.md, method). Timing every config
/// in that steady state makes runs repeatable and comparable with the peers, timed the
/// same way.
pub fn time_calls(gpu: &Gpu, stream: &Arc<CudaStream>, plan: TimingPlan, mut call: impl FnMut() -> Result<()>) -> Result<Timing> {
    for _ in 0..plan.warmup {
        call()?;
    }
    let t0 = std::time::Instant::now();
    let mut calls = 0u64;
    while t0.elapsed().as_millis() < plan.warmup_ms.max(1) as u128 {
        // Batches keep the GPU busy between the host's checks of the clock.
        for _ in 0..8 {
            call()?;
        }
        stream.synchronize()?;
        calls += 8;
    }
    let per_call_ms = t0.elapsed().as_secs_f64() * 1e3 / calls as f64;
    let ctx = gpu.context();
    let iters = plan.iters.max(1).max((plan.timing_ms as f64 / per_call_ms).ceil().min(20_000.0) as usize);
    let mut events = Vec::with_capacity(iters);
    let mut host = std::time::Duration::ZERO;
    for _ in 0..iters {
        // Timing events (cudarc's default disables timing).
        let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        start.record(stream)?;
        let t0 = std::time::Instant::now();
        call()?;
        host += t0.elapsed();
        end.record(stream)?;
        events.push((start, end));
    }
    stream.synchronize()?;
    let mut ms: Vec<f64> = events
        .iter()
        .map(|(s, e)| s.elapsed_ms(e).map(f64::from))
        .collect::<std::result::Result<_, _>>()?;
    ms.sort_by(f64::total_cmp);
    Ok(Timing {
        median_ms: ms[ms.len() / 2],
        min_ms: ms[0],
        max_ms: ms[ms.len() - 1],
        host_us: host.as_secs_f64() * 1e6 / iters as f64,
    })
}

/// [`time_calls`] of one forward call.
#[allow(clippy::too_many_arguments)]
pub fn time_forward(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    q: &TensorRef<'_>,
    k: &TensorRef<'_>,
    v: &TensorRef<'_>,
    out: &mut TensorMut<'_>,
    lse: &mut CudaSlice<f32>,
    opts: &AttnOptions,
    warmup: usize,
    warmup_ms: u64,
    iters: usize,
    timing_ms: u64,
) -> Result<Timing> {
    let plan = TimingPlan { warmup, warmup_ms, iters, timing_ms };
    time_calls(gpu, stream, plan, || flash_attn_func_into(gpu, stream, q, k, v, out, lse, opts))
}
