//! `flash_attn_func` and `flash_attn_backward`: the public entry points.
use crate::error::{AttnError, Result};
use crate::gpu::Gpu;
use crate::documents::DocsDesc;
use crate::variant::VariantDesc;
use crate::plan::{AlibiDesc, AttnOptions, DeviceVec, FwdPlan, TensorDesc, plan_forward};
use crate::plan_bwd::{BwdTensors, backward_workspace_bytes, plan_backward};
use crate::tensor::{DeviceTensor, TensorMut, TensorRef};
use crate::tma::TensorMapSpec;
use common::{FwdParams, KernelEntry, ScoreModKind, TmaDescriptors};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg, SyncOnDrop};
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

impl TmaBlock {
    /// The four maps, encoded in order (needs the driver).
    fn encode(maps: &[TensorMapSpec; 4]) -> Result<Self> {
        let mut block = [0u64; 64];
        for (i, m) in maps.iter().enumerate() {
            block[16 * i..16 * (i + 1)].copy_from_slice(&m.encode()?);
        }
        Ok(TmaBlock(TmaDescriptors(block)))
    }
}

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
    let (alibi, _alibi_sync) = alibi_desc(opts, stream);
    let (sinks, _sinks_sync) = sinks_desc(opts, stream);
    let (documents, _docs_sync) = docs_desc(opts, stream);
    let (variant, _variant_sync) = variant_desc(opts, stream);
    let _block_mask_sync = opts.block_mask.map(|m| m.read_guards(stream));
    let plan = plan_forward(
        &desc(q, q_ptr),
        &desc(k, k_ptr),
        &desc(v, v_ptr),
        &TensorDesc { addr: o_ptr, ..out_desc },
        (lse_ptr, lse_len),
        opts,
        alibi,
        sinks,
        documents,
        variant,
        gpu.info().sm_count,
    )?;
    launch(gpu, stream, &plan, opts)
}

/// The forward on raw device addresses (for bindings that own their memory, such as a
/// PyTorch extension): the same validation and kernels as [`flash_attn_func_into`],
/// with the tensors, the LSE (`(address, f32 elements)`), the ALiBi slopes, the sink
/// logits, the document bounds and a variant's buffer given as addresses, and `stream`
/// any stream of `gpu`'s context (e.g. one from `CudaContext::wrap_borrowed_stream`).
/// A user-defined variant is `opts.variant` (from its module, without data) with its
/// buffer as `variant`; a buffer without the variant, or a variant holding a buffer but
/// none passed here, is [`AttnError::InvalidVariant`].
///
/// # Safety
/// Every address and extent must describe live device memory of `gpu`'s context that
/// stays valid, and is not written by others, until the launch completes on `stream`
/// (nothing orders other streams' work with it).
#[allow(clippy::too_many_arguments)]
pub unsafe fn flash_attn_raw(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    q: &TensorDesc,
    k: &TensorDesc,
    v: &TensorDesc,
    out: &TensorDesc,
    lse: (u64, usize),
    opts: &AttnOptions,
    alibi: Option<AlibiDesc>,
    sinks: Option<DeviceVec>,
    documents: Option<DocsDesc>,
    variant: Option<VariantDesc>,
) -> Result<()> {
    if !Arc::ptr_eq(stream.context(), gpu.context()) {
        return Err(AttnError::ForeignStream);
    }
    let plan = plan_forward(q, k, v, out, lse, opts, alibi, sinks, documents, variant, gpu.info().sm_count)?;
    launch(gpu, stream, &plan, opts)
}

/// The options' document mask as the planners take it, and its read guard.
fn docs_desc<'a>(opts: &AttnOptions<'a>, stream: &'a Arc<CudaStream>) -> (Option<DocsDesc>, Option<SyncOnDrop<'a>>) {
    match opts.documents {
        Some(d) => {
            let (desc, sync) = d.desc(stream);
            (Some(desc), Some(sync))
        }
        None => (None, None),
    }
}

/// The options' variant buffer as the planners take it, and its read guard.
fn variant_desc<'a>(opts: &AttnOptions<'a>, stream: &'a Arc<CudaStream>) -> (Option<VariantDesc>, Option<SyncOnDrop<'a>>) {
    match opts.variant {
        Some(v) => {
            let (desc, sync) = v.desc(stream);
            (Some(desc), sync)
        }
        None => (None, None),
    }
}

/// The loaded function of `k`: the library's, or for a user variant's kernel the
/// variant module's (`opts.variant`); for a cluster kernel also the most CTAs that run
/// at once.
pub(crate) fn function<'g>(gpu: &'g Gpu, opts: &AttnOptions<'g>, k: &KernelEntry) -> Result<(&'g CudaFunction, Option<u32>)> {
    if k.score_mod == ScoreModKind::User {
        let v = opts.variant.ok_or_else(|| AttnError::InvalidVariant(format!("{} needs the call's variant", k.name)))?;
        return Ok((v.function(gpu, k)?, None));
    }
    gpu.function(k).ok_or_else(|| AttnError::KernelLoad(format!("{} is not loaded", k.name)))
}

/// The options' sink logits as the planners take them, and their read guard.
fn sinks_desc<'a>(opts: &AttnOptions<'a>, stream: &'a Arc<CudaStream>) -> (Option<DeviceVec>, Option<SyncOnDrop<'a>>) {
    match opts.sinks {
        Some(s) => {
            let (addr, sync) = s.device_ptr(stream);
            (Some(DeviceVec { addr, len: s.len() }), Some(sync))
        }
        None => (None, None),
    }
}

/// The options' ALiBi slopes as the planners take them, and the guard that orders the
/// launch after their last write (held until the launch is queued).
fn alibi_desc<'a>(opts: &AttnOptions<'a>, stream: &'a Arc<CudaStream>) -> (Option<AlibiDesc>, Option<SyncOnDrop<'a>>) {
    match opts.alibi {
        Some(a) => {
            let (addr, sync) = a.slopes.device_ptr(stream);
            (Some(AlibiDesc { addr, len: a.slopes.len(), per_batch: a.per_batch }), Some(sync))
        }
        None => (None, None),
    }
}

pub(crate) fn launch(gpu: &Gpu, stream: &Arc<CudaStream>, plan: &FwdPlan, opts: &AttnOptions) -> Result<()> {
    let k = plan.kernel;
    let (f, resident) = function(gpu, opts, k)?;
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
        tma = TmaBlock::encode(maps)?;
        builder.arg(&tma);
    }
    builder.arg(&params);
    // SAFETY: the plan was validated: every address the kernel derives from the
    // parameters (and every tensor map's extent) lies inside the buffers borrowed above,
    // which outlive the launch (cudarc's events order their reuse and release).
    unsafe { builder.launch(cfg) }?;
    Ok(())
}

/// dQ, dK and dV of a backward pass (and the sinks' gradient, with sinks).
pub struct Grads {
    /// `[batch, seqlen_q, heads_q, hdim]`, q's dtype, packed.
    pub dq: DeviceTensor,
    /// `[batch, seqlen_k, heads_k, hdim]`, k's dtype, packed: under GQA/MQA the sum over
    /// the query heads that share each K/V head.
    pub dk: DeviceTensor,
    /// As `dk`.
    pub dv: DeviceTensor,
    /// With `AttnOptions::sinks`: the gradient of the sink logits, `[heads_q]` f32 (summed
    /// over the batch in a fixed order: bit-identical across runs).
    pub dsinks: Option<CudaSlice<f32>>,
}

/// The gradients of a loss with respect to q, k and v, given the forward's inputs, its
/// output `out` and LSE `lse` (as [`flash_attn_func`] returned them, with the same
/// `opts`) and `dout`, the loss's gradient with respect to `out` (q's shape and dtype).
///
/// The recompute backward: no `seqlen_q x seqlen_k` matrix is stored. Head dims 64, 128
/// and 256; f16 or bf16; any sequence lengths; causal (bottom-right) or not; MQA/GQA. Rows
/// with LSE = +inf (no visible key) contribute nothing. Scratch is allocated on `stream`
/// for the call; [`flash_attn_backward_into`] takes a caller-owned workspace instead.
/// Nothing is written but the returned tensors. Asynchronous with respect to the host.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_backward(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    q: &TensorRef<'_>,
    k: &TensorRef<'_>,
    v: &TensorRef<'_>,
    out: &TensorRef<'_>,
    lse: &CudaSlice<f32>,
    dout: &TensorRef<'_>,
    opts: &AttnOptions,
) -> Result<Grads> {
    let mut dq = DeviceTensor::alloc(stream, q.dtype(), q.layout.shape)?;
    let mut dk = DeviceTensor::alloc(stream, k.dtype(), k.layout.shape)?;
    let mut dv = DeviceTensor::alloc(stream, v.dtype(), v.layout.shape)?;
    // SAFETY: the postprocess writes every element (one per query head).
    let mut dsinks = match opts.sinks {
        Some(_) => Some(unsafe { stream.alloc::<f32>(q.layout.shape[2]) }?),
        None => None,
    };
    let (mut dq_view, mut dk_view, mut dv_view) = (dq.as_mut(), dk.as_mut(), dv.as_mut());
    flash_attn_backward_into(gpu, stream, q, k, v, out, lse, dout, &mut dq_view, &mut dk_view, &mut dv_view, dsinks.as_mut(), None, opts)?;
    Ok(Grads { dq, dk, dv, dsinks })
}

/// As [`flash_attn_backward`], writing into caller-given (possibly strided) `dq`, `dk`,
/// `dv`, with the scratch in `workspace` when given (at least
/// [`backward_workspace_bytes`] bytes, 256-byte aligned as cudarc allocates; no
/// allocation is made then). The gradients must not overlap each other or the inputs.
/// `dsinks`: with `AttnOptions::sinks`, where their gradient goes (`[heads_q]` f32);
/// `None` leaves the sinks undifferentiated (dQ, dK and dV are the same either way).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_backward_into(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    q: &TensorRef<'_>,
    k: &TensorRef<'_>,
    v: &TensorRef<'_>,
    out: &TensorRef<'_>,
    lse: &CudaSlice<f32>,
    dout: &TensorRef<'_>,
    dq: &mut TensorMut<'_>,
    dk: &mut TensorMut<'_>,
    dv: &mut TensorMut<'_>,
    dsinks: Option<&mut CudaSlice<f32>>,
    workspace: Option<&mut CudaSlice<u8>>,
    opts: &AttnOptions,
) -> Result<()> {
    if !Arc::ptr_eq(stream.context(), gpu.context()) {
        return Err(AttnError::ForeignStream);
    }
    let [b, sq, hq, d] = q.layout.shape;
    let mut own;
    let workspace = match workspace {
        Some(w) => w,
        None => {
            // Sized for the shape q claims; validation below rejects a q whose shape is
            // off before anything runs.
            let bytes = if common::bwd::HEAD_DIMS.contains(&(d as u32)) { backward_workspace_bytes(b, sq, hq, d) } else { 0 };
            // SAFETY: the preprocess kernel writes every byte the others read.
            own = unsafe { stream.alloc::<u8>(bytes.max(1)) }?;
            &mut own
        }
    };
    let (q_ptr, _q_sync) = q.slice.device_ptr(stream);
    let (k_ptr, _k_sync) = k.slice.device_ptr(stream);
    let (v_ptr, _v_sync) = v.slice.device_ptr(stream);
    let (o_ptr, _o_sync) = out.slice.device_ptr(stream);
    let (do_ptr, _do_sync) = dout.slice.device_ptr(stream);
    let lse_len = lse.len();
    let (lse_ptr, _lse_sync) = lse.device_ptr(stream);
    let mut_desc = |t: &TensorMut<'_>| TensorDesc { dtype: t.dtype(), layout: t.layout, addr: 0, buffer_len: t.buffer_len() };
    let (dq_desc, dk_desc, dv_desc) = (mut_desc(dq), mut_desc(dk), mut_desc(dv));
    let (dq_ptr, _dq_sync) = dq.slice.device_ptr_mut(stream);
    let (dk_ptr, _dk_sync) = dk.slice.device_ptr_mut(stream);
    let (dv_ptr, _dv_sync) = dv.slice.device_ptr_mut(stream);
    let ws_len = workspace.len();
    let (ws_ptr, _ws_sync) = workspace.device_ptr_mut(stream);
    let (alibi, _alibi_sync) = alibi_desc(opts, stream);
    let (sinks, _sinks_sync) = sinks_desc(opts, stream);
    let (documents, _docs_sync) = docs_desc(opts, stream);
    let (variant, _variant_sync) = variant_desc(opts, stream);
    let _block_mask_sync = opts.block_mask.map(|m| m.read_guards(stream));
    let dsinks_len = dsinks.as_ref().map_or(0, |d| d.len());
    let (dsinks, _dsinks_sync) = match dsinks {
        Some(d) => {
            let (addr, sync) = d.device_ptr_mut(stream);
            (Some(DeviceVec { addr, len: dsinks_len }), Some(sync))
        }
        None => (None, None),
    };
    let tensors = BwdTensors {
        q: desc(q, q_ptr),
        k: desc(k, k_ptr),
        v: desc(v, v_ptr),
        out: desc(out, o_ptr),
        dout: desc(dout, do_ptr),
        lse: (lse_ptr, lse_len),
        dq: TensorDesc { addr: dq_ptr, ..dq_desc },
        dk: TensorDesc { addr: dk_ptr, ..dk_desc },
        dv: TensorDesc { addr: dv_ptr, ..dv_desc },
        workspace: (ws_ptr, ws_len),
        alibi,
        sinks,
        dsinks,
        documents,
        variant,
    };
    launch_backward(gpu, stream, &tensors, opts)
}

/// The backward on raw device addresses (as [`flash_attn_raw`] for the forward): the
/// same validation and kernels as [`flash_attn_backward_into`], every buffer given by
/// address in `tensors` (the workspace at least [`backward_workspace_bytes`]).
///
/// # Safety
/// As [`flash_attn_raw`]: every address and extent must describe live device memory of
/// `gpu`'s context, valid until the launches complete on `stream`.
pub unsafe fn flash_attn_backward_raw(gpu: &Gpu, stream: &Arc<CudaStream>, tensors: &BwdTensors, opts: &AttnOptions) -> Result<()> {
    if !Arc::ptr_eq(stream.context(), gpu.context()) {
        return Err(AttnError::ForeignStream);
    }
    launch_backward(gpu, stream, tensors, opts)
}

/// Plans and launches the backward's three kernels.
fn launch_backward(gpu: &Gpu, stream: &Arc<CudaStream>, tensors: &BwdTensors, opts: &AttnOptions) -> Result<()> {
    let plan = plan_backward(tensors, opts, gpu.info().sm_count)?;
    let tma = TmaBlock::encode(&plan.tma)?;
    let params = BwdParamBlock(plan.params);
    for l in &plan.launches {
        let (f, _) = function(gpu, opts, l.kernel)?;
        let cfg = LaunchConfig { grid_dim: l.grid, block_dim: (l.block, 1, 1), shared_mem_bytes: l.smem_bytes };
        let mut builder = stream.launch_builder(f);
        // The main kernel takes the tensor maps first.
        if l.kernel.tma_param_bytes > 0 {
            builder.arg(&tma);
        }
        builder.arg(&params);
        // SAFETY: the plan was validated: every address the kernels derive from the
        // parameters lies inside the buffers the caller holds (the workspace sized by
        // `WorkspaceLayout`), which outlive the launches.
        unsafe { builder.launch(cfg) }?;
    }
    Ok(())
}

/// The backward kernels' parameter block as one by-value kernel argument.
#[repr(transparent)]
struct BwdParamBlock(common::bwd::BwdParams);
// SAFETY: plain `#[repr(C)]` data the kernels read by value.
unsafe impl DeviceRepr for BwdParamBlock {}
