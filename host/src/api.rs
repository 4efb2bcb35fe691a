//! `flash_attn_func`: the public entry points.
use crate::error::{AttnError, Result};
use crate::gpu::Gpu;
use crate::plan::{AttnOptions, FwdPlan, TensorDesc, plan_forward};
use crate::tensor::{DeviceTensor, TensorMut, TensorRef};
use common::{FwdParams, TmaDescriptors};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg};
use std::sync::Arc;

/// O and LSE of a forward pass.
pub struct AttnOutput {
    /// `[batch, seqlen_q, heads_q, hdim]`, q's dtype, packed.
    pub out: DeviceTensor,
    /// `[batch, heads_q, seqlen_q]` f32, packed: `log sum_j exp(scale * q.k_j)`, `+inf` for
    /// a row with no key (causal, `seqlen_q > seqlen_k`).
    pub lse: CudaSlice<f32>,
}

/// The kernel's parameter block as one by-value kernel argument.
#[repr(transparent)]
struct ParamBlock(FwdParams);
// SAFETY: plain `#[repr(C)]` data the kernel reads by value.
unsafe impl DeviceRepr for ParamBlock {}

/// The FA3 kernels' first argument: four encoded tensor maps.
#[repr(transparent)]
struct TmaBlock(TmaDescriptors);
// SAFETY: opaque bytes the kernel hands to the TMA unit.
unsafe impl DeviceRepr for TmaBlock {}

fn desc(t: &TensorRef<'_>, addr: u64) -> TensorDesc {
    TensorDesc { dtype: t.dtype(), layout: t.layout, addr, buffer_len: t.buffer_len() }
}

/// Exact attention `softmax(scale * Q K^T) V` on `stream`, into freshly allocated outputs.
///
/// `q`: `[batch, seqlen_q, heads_q, hdim]`; `k`, `v`: `[batch, seqlen_k, heads_k, hdim]`
/// with `heads_q % heads_k == 0` (MQA/GQA); f16 or bf16; hdim 64, 128 or 256; the last
/// dimension contiguous, other strides free (multiples of 8 elements). Nothing is
/// modified but the returned tensors. Asynchronous with respect to the host.
pub fn flash_attn_func(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    q: &TensorRef<'_>,
    k: &TensorRef<'_>,
    v: &TensorRef<'_>,
    opts: &AttnOptions,
) -> Result<AttnOutput> {
    let [b, sq, hq, _] = q.layout.shape;
    let mut out = DeviceTensor::alloc(stream, q.dtype(), q.layout.shape)?;
    // SAFETY: the kernel writes every LSE element before anyone reads it.
    let mut lse = unsafe { stream.alloc::<f32>(b * hq * sq) }?;
    flash_attn_func_into(gpu, stream, q, k, v, &mut out.as_mut(), &mut lse, opts)?;
    Ok(AttnOutput { out, lse })
}

/// As [`flash_attn_func`], writing O into `out` (q's shape and dtype, any strides with a
/// contiguous last dim) and the LSE into the first `batch * heads_q * seqlen_q` elements
/// of `lse`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_func_into(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    q: &TensorRef<'_>,
    k: &TensorRef<'_>,
    v: &TensorRef<'_>,
    out: &mut TensorMut<'_>,
    lse: &mut CudaSlice<f32>,
    opts: &AttnOptions,
) -> Result<()> {
    if !Arc::ptr_eq(stream.context(), gpu.context()) {
        return Err(AttnError::ForeignStream);
    }
    let (q_ptr, _q_sync) = q.slice.device_ptr(stream);
    let (k_ptr, _k_sync) = k.slice.device_ptr(stream);
    let (v_ptr, _v_sync) = v.slice.device_ptr(stream);
    let out_desc = TensorDesc { dtype: out.dtype(), layout: out.layout, addr: 0, buffer_len: out.buffer_len() };
    let lse_len = lse.len();
    let (o_ptr, _o_sync) = out.slice.device_ptr_mut(stream);
    let (lse_ptr, _lse_sync) = lse.device_ptr_mut(stream);
    let plan = plan_forward(
        &desc(q, q_ptr),
        &desc(k, k_ptr),
        &desc(v, v_ptr),
        &TensorDesc { addr: o_ptr, ..out_desc },
        (lse_ptr, lse_len),
        opts,
        gpu.info().sm_count,
    )?;
    launch(gpu, stream, &plan)
}

fn launch(gpu: &Gpu, stream: &Arc<CudaStream>, plan: &FwdPlan) -> Result<()> {
    let k = plan.kernel;
    let (f, resident) = gpu.function(k).ok_or_else(|| AttnError::KernelLoad(format!("{} is not loaded", k.name)))?;
    let mut grid = plan.grid;
    if let Some(r) = resident {
        // Persistent cluster grids: at most what runs at once, in whole clusters (the
        // kernel loops over any number of tiles per cluster).
        grid.0 = grid.0.min(r.max(k.cluster)) / k.cluster * k.cluster;
    }
    let cfg = LaunchConfig { grid_dim: grid, block_dim: (plan.block, 1, 1), shared_mem_bytes: plan.smem_bytes };
    match plan.tile_counter {
        Some(claims) => gpu.with_tile_counter(stream, claims, |counter, base| {
            launch_with(stream, f, cfg, plan, FwdParams { tile_counter: counter, tile_counter_base: base, ..plan.params })
        }),
        None => launch_with(stream, f, cfg, plan, plan.params),
    }
}

fn launch_with(stream: &Arc<CudaStream>, f: &CudaFunction, cfg: LaunchConfig, plan: &FwdPlan, params: FwdParams) -> Result<()> {
    let params = ParamBlock(params);
    let mut builder = stream.launch_builder(f);
    let tma;
    if let Some(maps) = &plan.tma {
        let mut block = [0u64; 64];
        for (i, m) in maps.iter().enumerate() {
            block[16 * i..16 * (i + 1)].copy_from_slice(&m.encode()?);
        }
        tma = TmaBlock(TmaDescriptors(block));
        builder.arg(&tma);
    }
    builder.arg(&params);
    // SAFETY: the plan was validated: every address the kernel derives from the
    // parameters (and every tensor map's extent) lies inside the buffers borrowed above,
    // which outlive the launch (cudarc's events order their reuse and release).
    unsafe { builder.launch(cfg) }?;
    Ok(())
}
