//! FlashAttention for NVIDIA Hopper as candle ops, forward **and backward**, with the
//! kernels written in Rust (the `flash-attn3` crate): nothing of this crate is compiled by
//! `nvcc`.
//!
//! The public functions mirror `candle-flash-attn-v3` 0.11 (`flash_attn`,
//! `flash_attn_windowed`, `flash_attn_alibi`, `flash_attn_alibi_windowed`, same arguments),
//! so switching is a change of crate name. Unlike that crate, each op registers its
//! gradient: `Tensor::backward` reaches dQ, dK and dV through the backward kernels.
//! [`flash_attn_with`] takes what exists only here (soft-capping, attention sinks, the
//! deterministic backward, packed documents, and user-defined variants: FlexAttention's
//! `score_mod` / `mask_mod` written in Rust, a variant crate's PTX loaded with
//! [`load_variants`] and passed with [`FlashAttnOptions::variant`]).
//!
//! Tensors are `(batch, seq_len, num_heads, head_size)` on a CUDA device of compute
//! capability 9.0, f16 or bf16, head size 64, 128 or 256; K and V may have fewer heads
//! than Q (MQA / GQA), dividing them. Any strides with a unit last one are taken as they
//! are (no copies). The kernels run on the tensors' device stream, in its context.
//!
//! ```no_run
//! use candle::{DType, Device, Tensor};
//! # fn main() -> candle::Result<()> {
//! let dev = Device::new_cuda(0)?;
//! let q = Tensor::randn(0f32, 1., (2, 1024, 16, 128), &dev)?.to_dtype(DType::BF16)?;
//! let k = Tensor::randn(0f32, 1., (2, 1024, 4, 128), &dev)?.to_dtype(DType::BF16)?;
//! let v = Tensor::randn(0f32, 1., (2, 1024, 4, 128), &dev)?.to_dtype(DType::BF16)?;
//! let o = candle_flash_attn3::flash_attn(&q, &k, &v, 1. / 128f32.sqrt(), true, false)?;
//! # Ok(()) }
//! ```
use candle::backend::BackendStorage;
use candle::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, SyncOnDrop};
use candle::cuda_backend::{CudaDType, CudaDevice};
use candle::{CpuStorage, CudaStorage, DType, Layout, Result, Shape, Storage, Tensor};
use flash_attn3::{AlibiDesc, AttnOptions, BwdTensors, DeviceVec, DocsDesc, Gpu, TensorDesc, VariantDesc, Window};
pub use flash_attn3::{DocumentMask, VariantModule};
use half::{bf16, f16};
use std::sync::{Arc, Mutex};

/// What a call may ask for beyond q, k and v; [`flash_attn_with`] takes it.
#[derive(Clone, Debug)]
pub struct FlashAttnOptions {
    /// Scale of `QKᵀ` before the softmax (`1/sqrt(head_size)` is usual).
    pub softmax_scale: f32,
    /// Keys a query row sees to its left (`None`: unbounded), FlashAttention's
    /// `window_size_left`: row `i` sees key `j` iff `i + sk − sq − left ≤ j`.
    pub window_size_left: Option<usize>,
    /// Keys a query row sees to its right (`None`: unbounded; `Some(0)` is the causal
    /// mask, aligned to the bottom-right corner): `j ≤ i + sk − sq + right`.
    pub window_size_right: Option<usize>,
    /// ALiBi slopes, f32 `(num_heads)` or `(batch, num_heads)` on the same device:
    /// the logit of `(i, j)` gets `− slope · |i + sk − sq − j|`.
    pub alibi_slopes: Option<Tensor>,
    /// Soft-capping: logits `c · tanh(scale · q·k / c)`; `None` for plain logits.
    pub softcap: Option<f32>,
    /// Attention sinks: f32 logits `(num_heads)` that join every row's softmax
    /// denominator. When they track gradients (a `Var`, or computed from one), candle's
    /// autograd gets their gradient too.
    pub sinks: Option<Tensor>,
    /// A backward whose dQ, dK and dV are bit-identical across runs (10-12% slower at
    /// head size 128).
    pub deterministic: bool,
    /// Packed documents (`DocumentMask::from_lengths(&device.cuda_stream(), &lengths)` or
    /// `from_ids`, on q's device): each query row sees only the keys of its own document.
    /// Combines with the causal mask, windows, sinks and soft-capping, not with ALiBi.
    pub documents: Option<Arc<DocumentMask>>,
    /// A user-defined variant ([`FlashAttnOptions::variant`]): its score and mask
    /// functions on the scaled scores, forward and backward. Combines with the causal
    /// mask and sinks; windows, documents, soft-capping and ALiBi go into its functions.
    pub variant: Option<FlashAttnVariant>,
}

/// Variant `name` of a loaded [`VariantModule`] and the buffer its functions read.
#[derive(Clone)]
pub struct FlashAttnVariant {
    module: Arc<VariantModule>,
    name: String,
    data: Option<Tensor>,
}

impl std::fmt::Debug for FlashAttnVariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let data = self.data.as_ref().map(|t| (t.dtype(), t.elem_count()));
        f.debug_struct("FlashAttnVariant").field("name", &self.name).field("data", &data).finish()
    }
}

/// Loads a variant crate's module (`ptx`, built by `ptx_builder::build_variant_module`;
/// e.g. `examples/variants`, whose `variants-ptx` binary writes it to a file) with its
/// variants `names` into the CUDA context of `device`, for [`FlashAttnOptions::variant`].
/// Use it with tensors of this `Device` (or its clones): another `Device` has a context
/// of its own, and the call is refused.
pub fn load_variants(device: &candle::Device, ptx: &str, names: &[&str]) -> Result<Arc<VariantModule>> {
    let candle::Device::Cuda(dev) = device else { candle::bail!("flash-attn3: variant modules load on a CUDA device, got {device:?}") };
    // The handle the ops use for this context, so that the module's context is theirs.
    let gpu = gpu_for(&dev.cuda_stream())?;
    Ok(Arc::new(VariantModule::load(&gpu, ptx, names).map_err(wrap)?))
}

impl FlashAttnOptions {
    /// Plain attention with this softmax scale.
    pub fn new(softmax_scale: f32) -> Self {
        FlashAttnOptions {
            softmax_scale,
            window_size_left: None,
            window_size_right: None,
            alibi_slopes: None,
            softcap: None,
            sinks: None,
            deterministic: false,
            documents: None,
            variant: None,
        }
    }

    /// With variant `name` of `module` ([`load_variants`]), reading `data`: a contiguous
    /// f32 or u32 tensor on q's device (the words its functions read with `f32_at` /
    /// `u32_at`; `None`: every read yields 0). The buffer gets no gradient. A name the
    /// module lacks or data of another dtype is an error here.
    pub fn variant(mut self, module: &Arc<VariantModule>, name: &str, data: Option<Tensor>) -> Result<Self> {
        module.variant(name).map_err(wrap)?;
        if let Some(t) = &data {
            check_vec("variant data", t, &[DType::F32, DType::U32])?;
        }
        self.variant = Some(FlashAttnVariant { module: module.clone(), name: name.to_string(), data });
        Ok(self)
    }

    /// With (`true`) or without the bottom-right causal mask.
    pub fn causal(mut self, causal: bool) -> Self {
        self.window_size_right = if causal { Some(0) } else { None };
        self
    }

    /// The library's options (the slopes, sinks and the variant's buffer travel as device
    /// addresses).
    fn attn_options(&self) -> Result<AttnOptions<'_>> {
        let mut o = AttnOptions::default().softmax_scale(self.softmax_scale).deterministic(self.deterministic);
        if let Some(c) = self.softcap {
            o = o.softcap(c);
        }
        // `right = 0` runs the causal kernels, with a left bound the windowed ones.
        let causal = self.window_size_right == Some(0);
        let window = Window { left: self.window_size_left, right: self.window_size_right.filter(|_| !causal) };
        o = o.causal(causal);
        if window.is_bounded() {
            o.window = Some(window);
        }
        if let Some(v) = &self.variant {
            o = o.variant(v.module.variant(&v.name).map_err(wrap)?);
        }
        Ok(o)
    }
}

fn wrap(e: flash_attn3::AttnError) -> candle::Error {
    candle::Error::wrap(e)
}

/// The library's handle of the context behind `stream`: kernels loaded once per context.
fn gpu_for(stream: &Arc<CudaStream>) -> Result<Arc<Gpu>> {
    static GPUS: Mutex<Vec<Arc<Gpu>>> = Mutex::new(Vec::new());
    let mut gpus = GPUS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(g) = gpus.iter().find(|g| Arc::ptr_eq(g.context(), stream.context())) {
        return Ok(g.clone());
    }
    let g = Arc::new(Gpu::with_context(stream.context().clone()).map_err(wrap)?);
    gpus.push(g.clone());
    Ok(g)
}

fn dtype_of(d: DType) -> Result<flash_attn3::DType> {
    match d {
        DType::F16 => Ok(flash_attn3::DType::F16),
        DType::BF16 => Ok(flash_attn3::DType::BF16),
        d => candle::bail!("flash-attn3: q, k and v must be f16 or bf16, got {d:?}"),
    }
}

/// `(batch, seq_len, heads, head_size)` shape and strides of a rank-4 layout.
fn dims4(name: &str, l: &Layout) -> Result<([usize; 4], [usize; 4])> {
    match (l.dims(), l.stride()) {
        (&[a, b, c, d], &[sa, sb, sc, sd]) => Ok(([a, b, c, d], [sa, sb, sc, sd])),
        (dims, _) => candle::bail!("flash-attn3: {name} must have rank 4 (batch, seq_len, heads, head_size), got shape {dims:?}"),
    }
}

/// A device address and the elements from it on, with the guard that orders its use
/// after the launch on the stream.
struct Addr<'a> {
    addr: u64,
    len: usize,
    _sync: SyncOnDrop<'a>,
}

fn addr_of<'a, T: DeviceRepr>(s: &'a CudaSlice<T>, offset: usize, stream: &'a Arc<CudaStream>) -> Addr<'a> {
    let (addr, sync) = s.device_ptr(stream);
    Addr { addr: addr + (offset * std::mem::size_of::<T>()) as u64, len: s.len().saturating_sub(offset), _sync: sync }
}

/// The attention tensor `name` as the library's planners check it, and its guard.
fn tensor_desc<'a>(name: &str, s: &'a CudaStorage, l: &Layout, stream: &'a Arc<CudaStream>) -> Result<(TensorDesc, Addr<'a>)> {
    let (shape, strides) = dims4(name, l)?;
    let dtype = dtype_of(s.dtype())?;
    let a = match dtype {
        flash_attn3::DType::F16 => addr_of(s.as_cuda_slice::<f16>()?, l.start_offset(), stream),
        _ => addr_of(s.as_cuda_slice::<bf16>()?, l.start_offset(), stream),
    };
    let desc = TensorDesc { dtype, layout: flash_attn3::Layout { shape, strides }, addr: a.addr, buffer_len: a.len };
    Ok((desc, a))
}

/// Checks that `name` is a contiguous tensor of one of `dtypes`.
fn check_vec(name: &str, t: &Tensor, dtypes: &[DType]) -> Result<()> {
    if !dtypes.contains(&t.dtype()) {
        candle::bail!("flash-attn3: {name} must be {}, got {:?}", dtypes.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(" or "), t.dtype())
    }
    if !t.is_contiguous() {
        candle::bail!("flash-attn3: {name} must be contiguous")
    }
    Ok(())
}

/// The storage and start of the contiguous f32 tensor `name`.
fn f32_vec<'a>(name: &str, t: &'a Tensor) -> Result<(candle::StorageRef<'a>, usize)> {
    check_vec(name, t, &[DType::F32])?;
    let (s, l) = t.storage_and_layout();
    Ok((s, l.start_offset()))
}

fn cuda<'a>(name: &str, s: &'a Storage) -> Result<&'a CudaStorage> {
    match s {
        Storage::Cuda(c) => Ok(c),
        _ => candle::bail!("flash-attn3: {name} must be on a CUDA device"),
    }
}

/// The buffers of a call's options as the planners take them.
struct Extras {
    alibi: Option<AlibiDesc>,
    sinks: Option<DeviceVec>,
    documents: Option<DocsDesc>,
    variant: Option<VariantDesc>,
}

/// Runs `f` with the ALiBi slopes, sinks, documents and variant buffer of `opts` as the
/// planners take them, for q of `shape`.
fn with_extras<R>(opts: &FlashAttnOptions, shape: [usize; 4], stream: &Arc<CudaStream>, f: impl FnOnce(Extras) -> Result<R>) -> Result<R> {
    let [b, _, hq, _] = shape;
    let slopes = opts.alibi_slopes.as_ref().map(|t| f32_vec("alibi_slopes", t)).transpose()?;
    let sinks = opts.sinks.as_ref().map(|t| f32_vec("sinks", t)).transpose()?;
    let variant_data = opts.variant.as_ref().and_then(|v| v.data.as_ref());
    let words = match variant_data {
        Some(t) => {
            check_vec("variant data", t, &[DType::F32, DType::U32])?;
            Some((t.storage_and_layout(), t))
        }
        None => None,
    };
    let slopes_addr = match (&slopes, &opts.alibi_slopes) {
        (Some((s, off)), Some(t)) => {
            let per_batch = match t.dims() {
                &[h] if h == hq => false,
                &[bb, h] if bb == b && h == hq => true,
                d => candle::bail!("flash-attn3: alibi_slopes must be ({hq}) or ({b}, {hq}), got {d:?}"),
            };
            let a = addr_of(cuda("alibi_slopes", s)?.as_cuda_slice::<f32>()?, *off, stream);
            Some((AlibiDesc { addr: a.addr, len: t.elem_count().min(a.len), per_batch }, a))
        }
        _ => None,
    };
    let sinks_addr = match (&sinks, &opts.sinks) {
        (Some((s, off)), Some(t)) => {
            if t.dims() != [hq] {
                candle::bail!("flash-attn3: sinks must be ({hq}), got {:?}", t.dims())
            }
            let a = addr_of(cuda("sinks", s)?.as_cuda_slice::<f32>()?, *off, stream);
            Some((DeviceVec { addr: a.addr, len: hq.min(a.len) }, a))
        }
        _ => None,
    };
    let words_addr = match &words {
        Some(((s, l), t)) => {
            let s = cuda("variant data", s)?;
            let a = match t.dtype() {
                DType::F32 => addr_of(s.as_cuda_slice::<f32>()?, l.start_offset(), stream),
                _ => addr_of(s.as_cuda_slice::<u32>()?, l.start_offset(), stream),
            };
            Some((VariantDesc { data: a.addr, words: t.elem_count().min(a.len) }, a))
        }
        None => None,
    };
    let docs = opts.documents.as_ref().map(|d| d.desc(stream));
    f(Extras {
        alibi: slopes_addr.as_ref().map(|(d, _)| *d),
        sinks: sinks_addr.as_ref().map(|(d, _)| *d),
        documents: docs.as_ref().map(|(d, _)| *d),
        variant: words_addr.as_ref().map(|(d, _)| *d),
    })
}

/// One of q, k, v as a custom op gets it.
type Storage3<'a> = (&'a CudaStorage, &'a Layout);

/// Where an op launches: q's device, its stream, and the kernels loaded in its context.
struct Launch<'a> {
    dev: &'a CudaDevice,
    stream: Arc<CudaStream>,
    gpu: Arc<Gpu>,
}

/// An op's launches on (q, k, v), for either element type.
trait QkvKernels {
    fn run<T: CudaDType + DeviceRepr>(&self, at: &Launch, q: Storage3, k: Storage3, v: Storage3) -> Result<(CudaStorage, Shape)>;
}

/// `op.run` on q's device for q's element type.
fn run_typed(op: &impl QkvKernels, q: Storage3, k: Storage3, v: Storage3) -> Result<(CudaStorage, Shape)> {
    let dev = q.0.device();
    let stream = dev.cuda_stream();
    let at = Launch { dev, gpu: gpu_for(&stream)?, stream };
    match q.0.dtype() {
        DType::F16 => op.run::<f16>(&at, q, k, v),
        DType::BF16 => op.run::<bf16>(&at, q, k, v),
        d => candle::bail!("flash-attn3: q, k and v must be f16 or bf16, got {d:?}"),
    }
}

/// The forward op. The LSE it computes is kept for the backward.
struct FlashAttn {
    opts: FlashAttnOptions,
    lse: Arc<Mutex<Option<CudaSlice<f32>>>>,
}

impl QkvKernels for FlashAttn {
    fn run<T: CudaDType + DeviceRepr>(&self, at: &Launch, q: Storage3, k: Storage3, v: Storage3) -> Result<(CudaStorage, Shape)> {
        let (dev, stream, gpu) = (at.dev, &at.stream, &at.gpu);
        let (qd, _qa) = tensor_desc("q", q.0, q.1, &stream)?;
        let (kd, _ka) = tensor_desc("k", k.0, k.1, &stream)?;
        let (vd, _va) = tensor_desc("v", v.0, v.1, &stream)?;
        let shape = qd.layout.shape;
        let [b, sq, hq, _] = shape;
        // SAFETY: the kernel writes every element of O and the LSE (or fails validation,
        // and the buffers are dropped unread).
        let mut out = unsafe { dev.alloc::<T>(shape.iter().product()) }?;
        let mut lse = unsafe { dev.alloc::<f32>(b * hq * sq) }?;
        {
            let (out_len, lse_len) = (out.len(), lse.len());
            let (oa, _os) = out.device_ptr_mut(&stream);
            let (la, _ls) = lse.device_ptr_mut(&stream);
            let od = TensorDesc { dtype: qd.dtype, layout: flash_attn3::Layout::contiguous(shape), addr: oa, buffer_len: out_len };
            let opts = self.opts.attn_options()?;
            with_extras(&self.opts, shape, &stream, |x| {
                // SAFETY: every address comes from a live allocation of this context with
                // its element count; the planner checks each view against it.
                unsafe { flash_attn3::flash_attn_raw(&gpu, &stream, &qd, &kd, &vd, &od, (la, lse_len), &opts, x.alibi, x.sinks, x.documents, x.variant) }
                    .map_err(wrap)
            })?;
        }
        *self.lse.lock().unwrap_or_else(|p| p.into_inner()) = Some(lse);
        Ok((CudaStorage::wrap_cuda_slice(out, dev.clone()), Shape::from(shape.to_vec())))
    }
}

impl candle::CustomOp3 for FlashAttn {
    fn name(&self) -> &'static str {
        "flash-attn3"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        candle::bail!("flash-attn3 runs on CUDA devices only")
    }

    fn cuda_fwd(&self, q: &CudaStorage, q_l: &Layout, k: &CudaStorage, k_l: &Layout, v: &CudaStorage, v_l: &Layout) -> Result<(CudaStorage, Shape)> {
        run_typed(self, (q, q_l), (k, k_l), (v, v_l))
    }

    fn bwd(&self, q: &Tensor, k: &Tensor, v: &Tensor, out: &Tensor, dout: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // A loss like `sum` hands a broadcast (stride 0) gradient.
        let dout = dout.contiguous()?;
        let op = FlashAttnBwd { opts: self.opts.clone(), out: out.clone(), dout, lse: self.lse.clone() };
        let grads = q.apply_op3_no_bwd(k, v, &op)?;
        let (nq, nk) = (q.elem_count(), k.elem_count());
        let dq = grads.narrow(0, 0, nq)?.reshape(q.shape())?;
        let dk = grads.narrow(0, nq, nk)?.reshape(k.shape())?;
        let dv = grads.narrow(0, nq + nk, v.elem_count())?.reshape(v.shape())?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// The backward op on (q, k, v): dQ, dK and dV in one buffer, in that order (one
/// allocation, split into views by the caller).
struct FlashAttnBwd {
    opts: FlashAttnOptions,
    out: Tensor,
    dout: Tensor,
    lse: Arc<Mutex<Option<CudaSlice<f32>>>>,
}

impl QkvKernels for FlashAttnBwd {
    fn run<T: CudaDType + DeviceRepr>(&self, at: &Launch, q: Storage3, k: Storage3, v: Storage3) -> Result<(CudaStorage, Shape)> {
        let (dev, stream, gpu) = (at.dev, &at.stream, &at.gpu);
        let (o_s, o_l) = self.out.storage_and_layout();
        let (do_s, do_l) = self.dout.storage_and_layout();
        let (qd, _qa) = tensor_desc("q", q.0, q.1, &stream)?;
        let (kd, _ka) = tensor_desc("k", k.0, k.1, &stream)?;
        let (vd, _va) = tensor_desc("v", v.0, v.1, &stream)?;
        let (od, _oa) = tensor_desc("out", cuda("out", &o_s)?, o_l, &stream)?;
        let (dod, _doa) = tensor_desc("dout", cuda("dout", &do_s)?, do_l, &stream)?;
        let lse = self.lse.lock().unwrap_or_else(|p| p.into_inner());
        let Some(lse) = lse.as_ref() else { candle::bail!("flash-attn3: the backward ran before its forward") };
        let (nq, nk, nv) = (qd.layout.numel(), kd.layout.numel(), vd.layout.numel());
        let [b, sq, hq, d] = qd.layout.shape;
        // SAFETY: the backward writes every element of dQ, dK and dV; the workspace is
        // initialised by its preprocess kernel.
        let mut grads = unsafe { dev.alloc::<T>(nq + nk + nv) }?;
        let mut workspace = unsafe { dev.alloc::<u8>(flash_attn3::backward_workspace_bytes(b, sq, hq, d).max(1)) }?;
        {
            let workspace_len = workspace.len();
            let (ga, _gs) = grads.device_ptr_mut(&stream);
            let (wa, _ws) = workspace.device_ptr_mut(&stream);
            let (la, _ls) = lse.device_ptr(&stream);
            let elem = std::mem::size_of::<T>() as u64;
            let grad = |src: &TensorDesc, at: usize| TensorDesc {
                dtype: src.dtype,
                layout: flash_attn3::Layout::contiguous(src.layout.shape),
                addr: ga + at as u64 * elem,
                buffer_len: src.layout.numel(),
            };
            let (dq, dk, dv) = (grad(&qd, 0), grad(&kd, nq), grad(&vd, nq + nk));
            let opts = self.opts.attn_options()?;
            with_extras(&self.opts, qd.layout.shape, &stream, |x| {
                let tensors = BwdTensors {
                    q: qd,
                    k: kd,
                    v: vd,
                    out: od,
                    dout: dod,
                    lse: (la, lse.len()),
                    dq,
                    dk,
                    dv,
                    workspace: (wa, workspace_len),
                    alibi: x.alibi,
                    // The sinks shape the forward's softmax, so the backward needs them;
                    // their own gradient is not asked for.
                    sinks: x.sinks,
                    dsinks: None,
                    documents: x.documents,
                    variant: x.variant,
                };
                // SAFETY: as in the forward; the three gradients are disjoint views of
                // one allocation, each sized to its tensor.
                unsafe { flash_attn3::flash_attn_backward_raw(&gpu, &stream, &tensors, &opts) }.map_err(wrap)
            })?;
        }
        Ok((CudaStorage::wrap_cuda_slice(grads, dev.clone()), Shape::from(nq + nk + nv)))
    }
}

impl candle::CustomOp3 for FlashAttnBwd {
    fn name(&self) -> &'static str {
        "flash-attn3-bwd"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        candle::bail!("flash-attn3 runs on CUDA devices only")
    }

    fn cuda_fwd(&self, q: &CudaStorage, q_l: &Layout, k: &CudaStorage, k_l: &Layout, v: &CudaStorage, v_l: &Layout) -> Result<(CudaStorage, Shape)> {
        run_typed(self, (q, q_l), (k, k_l), (v, v_l))
    }
}

/// A unit last stride, which the kernels' tensor maps need; other views are copied.
fn unit_last_stride(t: &Tensor) -> Result<Tensor> {
    if t.stride().last() == Some(&1) { Ok(t.clone()) } else { t.contiguous() }
}

/// Attention with every option of this crate: `softmax(mask(mod(scale · Q Kᵀ))) V` with
/// the gradient registered for candle's autograd (dQ, dK, dV, and the sinks' when they
/// track gradients).
pub fn flash_attn_with(q: &Tensor, k: &Tensor, v: &Tensor, opts: &FlashAttnOptions) -> Result<Tensor> {
    // The kernels read the variant's buffer by address: it must be memory of q's context.
    if let Some(data) = opts.variant.as_ref().and_then(|v| v.data.as_ref()) {
        if !data.device().same_device(q.device()) {
            candle::bail!("flash-attn3: variant data must be on q's device")
        }
    }
    let lse = Arc::new(Mutex::new(None));
    let op = FlashAttn { opts: opts.clone(), lse: lse.clone() };
    let o = unit_last_stride(q)?.apply_op3(&unit_last_stride(k)?, &unit_last_stride(v)?, op)?;
    match &opts.sinks {
        Some(sinks) if sinks.track_op() => with_sink_gradient(o, sinks, lse),
        _ => Ok(o),
    }
}

/// `o` plus a term that is zero in value and carries the sinks' gradient: a custom op
/// returns gradients for its three inputs only. Row `i` of head `h` has
/// `∂O_i/∂sink_h = −P_sink · O_i` with `P_sink = exp(sink_h − LSE_i)` (the LSE includes
/// the sink), so `o + (s − detach(s)) · detach(−P_sink · O)` has `o`'s value (bit for
/// bit: the difference is exactly zero) and that derivative.
fn with_sink_gradient(o: Tensor, sinks: &Tensor, lse: Arc<Mutex<Option<CudaSlice<f32>>>>) -> Result<Tensor> {
    let (b, sq, hq, _) = o.dims4()?;
    let lse = o.apply_op1_no_bwd(&SavedLse { lse, shape: (b, hq, sq) })?;
    let p_sink = sinks.detach().reshape((1, hq, 1))?.broadcast_sub(&lse)?.exp()?;
    let p_sink = p_sink.transpose(1, 2)?.unsqueeze(3)?;
    let g = p_sink.broadcast_mul(&o.detach().to_dtype(DType::F32)?)?.neg()?;
    let zero = (sinks - sinks.detach())?.reshape((1, 1, hq, 1))?;
    let term = zero.broadcast_mul(&g)?.to_dtype(o.dtype())?;
    o + term
}

/// A copy of the LSE a forward op kept, as a `(batch, heads, seqlen_q)` f32 tensor.
struct SavedLse {
    lse: Arc<Mutex<Option<CudaSlice<f32>>>>,
    shape: (usize, usize, usize),
}

impl candle::CustomOp1 for SavedLse {
    fn name(&self) -> &'static str {
        "flash-attn3-lse"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        candle::bail!("flash-attn3 runs on CUDA devices only")
    }

    fn cuda_fwd(&self, o: &CudaStorage, _: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = o.device();
        let lse = self.lse.lock().unwrap_or_else(|p| p.into_inner());
        let Some(lse) = lse.as_ref() else { candle::bail!("flash-attn3: no LSE kept by the forward") };
        let copy = dev.cuda_stream().clone_dtod(lse).map_err(candle::Error::wrap)?;
        Ok((CudaStorage::wrap_cuda_slice(copy, dev.clone()), Shape::from(self.shape)))
    }
}

/// Scaled dot-product attention, `softmax(Q Kᵀ · softmax_scale) V`, as
/// `candle_flash_attn_v3::flash_attn`.
///
/// * `q`: `(batch, seq_len_q, num_heads_q, head_size)`; `k`, `v`: `(batch, seq_len_kv,
///   num_heads_kv, head_size)`, `num_heads_kv` dividing `num_heads_q` (MQA / GQA).
/// * `causal`: the bottom-right aligned causal mask.
/// * `use_gqa_packing`: accepted for compatibility and ignored (the kernels handle GQA
///   without duplicating K or V).
///
/// The result is `(batch, seq_len_q, num_heads_q, head_size)`, and differentiable.
pub fn flash_attn(q: &Tensor, k: &Tensor, v: &Tensor, softmax_scale: f32, causal: bool, use_gqa_packing: bool) -> Result<Tensor> {
    let _ = use_gqa_packing;
    flash_attn_with(q, k, v, &FlashAttnOptions::new(softmax_scale).causal(causal))
}

/// [`flash_attn`] with a sliding window, as `candle_flash_attn_v3::flash_attn_windowed`:
/// row `i` sees key `j` iff `i + sk − sq − left ≤ j ≤ i + sk − sq + right`, `None` leaving
/// a side unbounded (`window_size_left = None, window_size_right = Some(0)` is causal).
pub fn flash_attn_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    use_gqa_packing: bool,
) -> Result<Tensor> {
    let _ = use_gqa_packing;
    let opts = FlashAttnOptions { window_size_left, window_size_right, ..FlashAttnOptions::new(softmax_scale) };
    flash_attn_with(q, k, v, &opts)
}

/// [`flash_attn`] with ALiBi, as `candle_flash_attn_v3::flash_attn_alibi`: `alibi_slopes`
/// f32 `(num_heads_q)` (or `(batch, num_heads_q)`), the logit of `(i, j)` getting
/// `− slope · |i + sk − sq − j|`.
pub fn flash_attn_alibi(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    causal: bool,
    use_gqa_packing: bool,
) -> Result<Tensor> {
    let _ = use_gqa_packing;
    let opts = FlashAttnOptions { alibi_slopes: Some(alibi_slopes.clone()), ..FlashAttnOptions::new(softmax_scale).causal(causal) };
    flash_attn_with(q, k, v, &opts)
}

/// [`flash_attn_windowed`] with ALiBi, as `candle_flash_attn_v3::flash_attn_alibi_windowed`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    use_gqa_packing: bool,
) -> Result<Tensor> {
    let _ = use_gqa_packing;
    let opts = FlashAttnOptions {
        window_size_left,
        window_size_right,
        alibi_slopes: Some(alibi_slopes.clone()),
        ..FlashAttnOptions::new(softmax_scale)
    };
    flash_attn_with(q, k, v, &opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn right_bound_zero_runs_the_causal_kernels() {
        let o = FlashAttnOptions::new(0.125).causal(true);
        let o = o.attn_options().unwrap();
        assert!(o.causal && o.window.is_none() && o.variant.is_none());
        let o = FlashAttnOptions { window_size_left: Some(16), ..FlashAttnOptions::new(0.125).causal(true) };
        let o = o.attn_options().unwrap();
        assert!(o.causal);
        assert_eq!(o.window, Some(Window { left: Some(16), right: None }));
    }

    #[test]
    fn windows_and_plain_calls_map_to_the_library_options() {
        let o = FlashAttnOptions { window_size_left: Some(4), window_size_right: Some(3), ..FlashAttnOptions::new(0.5) };
        let o = o.attn_options().unwrap();
        assert!(!o.causal);
        assert_eq!(o.window, Some(Window { left: Some(4), right: Some(3) }));
        let o = FlashAttnOptions { softcap: Some(30.0), deterministic: true, ..FlashAttnOptions::new(0.5) };
        let o = o.attn_options().unwrap();
        assert!(!o.causal && o.window.is_none() && o.deterministic);
        assert_eq!((o.softmax_scale, o.softcap), (Some(0.5), Some(30.0)));
    }

    #[test]
    fn cpu_tensors_are_an_error_not_a_crash() -> Result<()> {
        let t = Tensor::zeros((1, 8, 2, 64), DType::BF16, &candle::Device::Cpu)?;
        let err = flash_attn(&t, &t, &t, 0.125, true, false).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("CUDA"), "{err}");
        Ok(())
    }

    #[test]
    fn variant_modules_load_on_cuda_devices_only() {
        let err = load_variants(&candle::Device::Cpu, "", &["v"]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("CUDA device"), "{err}");
    }

    #[test]
    fn variant_data_must_be_contiguous_words() -> Result<()> {
        let cpu = candle::Device::Cpu;
        assert!(check_vec("variant data", &Tensor::zeros(8, DType::F32, &cpu)?, &[DType::F32, DType::U32]).is_ok());
        assert!(check_vec("variant data", &Tensor::zeros(8, DType::U32, &cpu)?, &[DType::F32, DType::U32]).is_ok());
        let err = check_vec("variant data", &Tensor::zeros(8, DType::F16, &cpu)?, &[DType::F32, DType::U32]).unwrap_err().to_string();
        assert!(err.contains("variant data must be f32 or u32"), "{err}");
        let strided = Tensor::zeros((4, 4), DType::F32, &cpu)?.t()?;
        assert!(check_vec("variant data", &strided, &[DType::F32]).unwrap_err().to_string().contains("contiguous"));
        Ok(())
    }
}
