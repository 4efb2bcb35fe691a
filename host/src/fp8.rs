//! The FP8 (e4m3) forward: [`quantize_fp8`] turns 16-bit Q, K, V into e4m3 with block
//! scales (optionally after incoherent processing), and [`flash_attn_fp8`] runs the FA3
//! forward on them with f32 accumulation and a 16-bit O.
//!
//! ```no_run
//! use flash_attn3::fp8::{Fp8Descales, Fp8Options, QuantizeOptions, Role, flash_attn_fp8, hadamard_signs, quantize_fp8};
//! use flash_attn3::{DType, DeviceTensor, Gpu};
//! # fn main() -> Result<(), flash_attn3::AttnError> {
//! let gpu = Gpu::new(0)?;
//! let stream = gpu.new_stream()?;
//! let (b, s, h, d) = (1, 4096, 16, 128);
//! let x = DeviceTensor::from_f32(&stream, DType::BF16, [b, s, h, d], &vec![0.5; b * s * h * d])?;
//! // Incoherent processing: Q and K share one random-sign Hadamard transform.
//! let signs = hadamard_signs(&stream, d, 7)?;
//! let q8 = quantize_fp8(&gpu, &stream, &x.as_ref(), &QuantizeOptions::new(Role::Q).hadamard(&signs))?;
//! let k8 = quantize_fp8(&gpu, &stream, &x.as_ref(), &QuantizeOptions::new(Role::K).hadamard(&signs))?;
//! let v8 = quantize_fp8(&gpu, &stream, &x.as_ref(), &QuantizeOptions::new(Role::V))?;
//! let scales = Fp8Descales { q: &q8.scales, k: &k8.scales, v: &v8.scales };
//! let res = flash_attn_fp8(&gpu, &stream, &q8.tensor, &k8.tensor, &v8.tensor, &scales, &Fp8Options::default().causal(true))?;
//! # Ok(()) }
//! ```
//!
//! Layouts: Q and K are e4m3 `[batch, seqlen, heads, hdim]`, packed; the kernel reads V
//! transposed, `[batch, heads_k, hdim, common::fp8::vt_len(seqlen_k)]` with the keys of
//! every 16 permuted (`common::fp8::vt_position`), as [`quantize_fp8`] writes it for
//! [`Role::V`]: FP8 tensor-core products read only K-major operands, and `P V` reduces
//! over keys. A V in `[batch, seqlen, heads, hdim]` is accepted too: the kernel's
//! producer warpgroup then transposes each V tile in shared memory as it arrives (a
//! kernel of its own; [`transpose_v_fp8`] does the same over a whole tensor, for a
//! caller that keeps V transposed). Dequantization factors: one per (batch, head) (FlashAttention-3's
//! `q_descale`, `k_descale`, `v_descale`, `[batch, heads_k]`), or one per block of rows
//! of the kernel's tiles (`[batch, heads, blocks]`: 128 query rows for Q, the key block
//! of [`common::fp8::block_n`] for K and V). Any positive normal factors work; V's run
//! fastest as powers of two within 4x of each other ([`quantize_fp8`]'s for [`Role::V`]
//! and [`Role::VRows`] are powers of two, `common::fp8::block_factor`): the kernel then
//! carries them in P's `exp2` offset instead of converting O before each key block's PV
//! (`common::fp8::VUnit`).
use crate::api::{AttnOutput, launch};
use crate::error::{Arg, AttnError, Result};
use crate::gpu::Gpu;
use crate::plan::{AttnOptions, DeviceVec, FwdPlan, MAX_GRID_YZ, MAX_SEQLEN, persistent_ctas, section_log2};
use crate::tensor::{DeviceTensor, Layout, TensorMut, TensorRef};
use crate::tma::{TensorMapSpec, TmaElem};
use common::fp8::{self, Fp8Descales as DescaleParams, QuantizeOutput, QuantizeParams, ScaleIndex};
use common::{DType, FwdParams, KernelEntry, Strides};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg};
use std::sync::Arc;

/// Head dimensions with an FP8 forward kernel.
pub use common::fp8::HEAD_DIMS;

/// How an e4m3 tensor is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Layout {
    /// `[batch, seqlen, heads, hdim]`, packed (Q, K).
    Bshd,
    /// `[batch, heads, hdim, vt_len(seqlen)]` with permuted keys (V for the kernel).
    VTransposed,
}

/// An e4m3 tensor on the device: its codes and its logical shape `[batch, seqlen, heads, hdim]`.
pub struct Fp8Tensor {
    /// The e4m3 codes.
    pub data: CudaSlice<u8>,
    /// `[batch, seqlen, heads, hdim]`.
    pub shape: [usize; 4],
    /// Where each element is in `data`.
    pub layout: Fp8Layout,
}

impl Fp8Tensor {
    /// An e4m3 tensor from host codes laid out as `layout` says (checked for length; `arg`
    /// names it in errors).
    /// A transposed V's padding keys must be zero (a NaN code there would reach O through
    /// `0 · NaN`).
    pub fn from_codes(stream: &Arc<CudaStream>, arg: Arg, codes: &[u8], shape: [usize; 4], layout: Fp8Layout) -> Result<Self> {
        check_shape(arg, shape)?;
        let needed = Self::needed(shape, layout);
        if codes.len() != needed {
            return Err(AttnError::HostData(format!("{} e4m3 codes for shape {shape:?} in {layout:?} (needs {needed})", codes.len())));
        }
        if layout == Fp8Layout::VTransposed {
            let [_, s, _, _] = shape;
            let n = padded_keys(s);
            let pads: Vec<usize> = (s..n).map(|key| fp8::vt_position(key as u32) as usize).collect();
            if let Some(row) = codes.chunks(n).position(|row| pads.iter().any(|&p| row[p] != 0)) {
                return Err(AttnError::HostData(format!("transposed v: row {row} has a non-zero code in its padding keys {s}..{n}")));
            }
        }
        Ok(Fp8Tensor { data: stream.clone_htod(codes)?, shape, layout })
    }

    /// The codes, back on the host (in the tensor's layout).
    pub fn to_codes(&self, stream: &Arc<CudaStream>) -> Result<Vec<u8>> {
        Ok(stream.clone_dtoh(&self.data)?)
    }

    /// Bytes the layout needs (`usize::MAX` when that overflows, which no buffer holds).
    pub fn needed(shape: [usize; 4], layout: Fp8Layout) -> usize {
        let [b, s, h, d] = shape;
        let keys = match layout {
            Fp8Layout::Bshd => s,
            Fp8Layout::VTransposed => padded_keys(s),
        };
        [b, keys, h, d].into_iter().try_fold(1usize, |n, x| n.checked_mul(x)).unwrap_or(usize::MAX)
    }
}

/// Keys per row of a transposed V: `common::fp8::vt_len` in `usize` (saturating).
fn padded_keys(s: usize) -> usize {
    let step = fp8::VT_ALIGN as usize;
    s.div_ceil(step).saturating_mul(step)
}

/// Checks an e4m3 tensor's shape `[batch, seqlen, heads, hdim]`: no empty dimension, a
/// head dim with a kernel, and sizes the kernels index (32-bit sequence positions, grid
/// extents, byte counts that fit).
fn check_shape(arg: Arg, shape: [usize; 4]) -> Result<()> {
    let [b, s, h, d] = shape;
    if shape.contains(&0) {
        return Err(AttnError::EmptyDim { arg, shape });
    }
    if !HEAD_DIMS.iter().any(|&x| x as usize == d) {
        return Err(AttnError::UnsupportedHeadDim { hdim: d, supported: &HEAD_DIMS });
    }
    if s > MAX_SEQLEN || h > MAX_GRID_YZ || b > MAX_GRID_YZ || Fp8Tensor::needed(shape, Fp8Layout::VTransposed) == usize::MAX {
        return Err(AttnError::TooLarge(format!("{arg}: shape {shape:?}")));
    }
    Ok(())
}

/// Packed `[b, s, h, d]` e4m3 codes rearranged as the FP8 forward's transposed V
/// ([`Fp8Layout::VTransposed`]: `[b, h, d, vt_len(s)]`, keys permuted, padding zero).
pub fn transpose_v_codes(codes: &[u8], shape: [usize; 4]) -> Result<Vec<u8>> {
    check_shape(Arg::V, shape)?;
    let [b, s, h, d] = shape;
    if codes.len() != b * s * h * d {
        return Err(AttnError::HostData(format!("{} e4m3 codes for shape {shape:?}", codes.len())));
    }
    let n = padded_keys(s);
    let mut out = vec![0u8; b * h * d * n];
    for bi in 0..b {
        for si in 0..s {
            let pos = fp8::vt_position(si as u32) as usize;
            for hi in 0..h {
                for c in 0..d {
                    out[((bi * h + hi) * d + c) * n + pos] = codes[((bi * s + si) * h + hi) * d + c];
                }
            }
        }
    }
    Ok(out)
}

/// Which elements share a dequantization factor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DescaleKind {
    /// One per (batch, K/V head): `[batch, heads_k]` (for Q too, as FlashAttention-3).
    PerHead,
    /// One per (batch, head, block of `rows` sequence positions): `[batch, heads, blocks]`.
    Blocks {
        /// Rows per block: the FP8 kernel's tile at the call's head dim.
        rows: usize,
    },
}

/// Dequantization factors on the device (`x ≈ factor · e4m3`), checked finite and
/// positive when made.
pub struct Descale {
    factors: CudaSlice<f32>,
    kind: DescaleKind,
}

impl Descale {
    /// Factors from the host, after checking each is finite and positive.
    pub fn from_host(stream: &Arc<CudaStream>, arg: Arg, factors: &[f32], kind: DescaleKind) -> Result<Self> {
        check_factors(arg, factors)?;
        Ok(Descale { factors: stream.clone_htod(factors)?, kind })
    }

    /// The factors (f32).
    pub fn factors(&self) -> &CudaSlice<f32> {
        &self.factors
    }

    /// Their granularity.
    pub fn kind(&self) -> DescaleKind {
        self.kind
    }
}

/// Checks host factors: at least one, each a positive normal float at most 2^126.
pub fn check_factors(arg: Arg, factors: &[f32]) -> Result<()> {
    // Normal and at most 2^126: the kernel takes reciprocals of V's factors (`rcp`, which
    // flushes subnormals and whose result would be subnormal above 2^126).
    let ok = |x: f32| (f32::MIN_POSITIVE..=common::fp8::pow2(126)).contains(&x);
    if let Some((index, &value)) = factors.iter().enumerate().find(|(_, x)| !ok(**x)) {
        return Err(AttnError::InvalidDescale { arg, index, value });
    }
    if factors.is_empty() {
        return Err(AttnError::ShapeMismatch(format!("{arg}: no factors")));
    }
    Ok(())
}

/// The three tensors' factors of a call.
#[derive(Clone, Copy)]
pub struct Fp8Descales<'a> {
    /// Q's factors.
    pub q: &'a Descale,
    /// K's factors.
    pub k: &'a Descale,
    /// V's factors.
    pub v: &'a Descale,
}

/// Options of [`flash_attn_fp8`].
#[derive(Clone, Copy, Debug)]
pub struct Fp8Options {
    /// Bottom-right-aligned causal mask.
    pub causal: bool,
    /// Scale of `QKᵀ` (of the dequantized values); `None`: `1 / sqrt(hdim)`.
    pub softmax_scale: Option<f32>,
    /// O's dtype (bf16 by default).
    pub out_dtype: DType,
}

impl Default for Fp8Options {
    fn default() -> Self {
        Fp8Options { causal: false, softmax_scale: None, out_dtype: DType::BF16 }
    }
}

impl Fp8Options {
    /// Turns the causal mask on or off.
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }
    /// Scales `QKᵀ` by `scale` (finite, non-negative).
    pub fn softmax_scale(mut self, scale: f32) -> Self {
        self.softmax_scale = Some(scale);
        self
    }
    /// Writes O in `dtype`.
    pub fn out_dtype(mut self, dtype: DType) -> Self {
        self.out_dtype = dtype;
        self
    }
}

/// What a tensor is quantized for: its blocks and layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Blocks of the kernel's 128 query rows, `[b, s, h, d]`.
    Q,
    /// Blocks of the kernel's key block, `[b, s, h, d]`.
    K,
    /// Blocks of the kernel's key block, transposed ([`Fp8Layout::VTransposed`]), with
    /// power-of-two factors (`common::fp8::block_factor`), which the kernel carries in
    /// the softmax instead of converting O per key block.
    V,
    /// V kept as stored, `[b, s, h, d]` (the kernel transposes it): K's blocks and layout,
    /// V's power-of-two factors.
    VRows,
}

impl Role {
    /// Whether [`quantize_fp8`] gives this role power-of-two factors (V's, both layouts).
    pub fn pow2_factors(self) -> bool {
        matches!(self, Role::V | Role::VRows)
    }
}

/// Options of [`quantize_fp8`].
#[derive(Clone, Copy)]
pub struct QuantizeOptions<'a> {
    /// Which operand: sets the block size and the layout.
    pub role: Role,
    /// Incoherent processing: `hdim` f32 signs (±1, from [`hadamard_signs`]); each row
    /// becomes `H · diag(signs) · x / sqrt(hdim)`. Give Q and K the same signs (QKᵀ is
    /// then unchanged); not V.
    pub hadamard: Option<&'a CudaSlice<f32>>,
}

impl<'a> QuantizeOptions<'a> {
    /// Plain block quantization for `role`.
    pub fn new(role: Role) -> Self {
        QuantizeOptions { role, hadamard: None }
    }
    /// With incoherent processing by these signs.
    pub fn hadamard(mut self, signs: &'a CudaSlice<f32>) -> Self {
        self.hadamard = Some(signs);
        self
    }
}

/// An e4m3 tensor and its block factors.
pub struct Quantized {
    /// The e4m3 codes.
    pub tensor: Fp8Tensor,
    /// One factor per block of rows of each (batch, head).
    pub scales: Descale,
}

/// `hdim` random signs (±1) from `seed`: SplitMix64, a fixed, documented stream of bits
/// for a seed, so that a host emulation of the transform (`reference::fp8::Hadamard::from_seed`)
/// uses the device's signs.
pub fn hadamard_sign_values(hdim: usize, seed: u64) -> Vec<f32> {
    let mut x = seed;
    (0..hdim)
        .map(|_| {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            if (z ^ (z >> 31)) & 1 == 1 { -1.0 } else { 1.0 }
        })
        .collect()
}

/// [`hadamard_sign_values`] on the device, for incoherent processing.
pub fn hadamard_signs(stream: &Arc<CudaStream>, hdim: usize, seed: u64) -> Result<CudaSlice<f32>> {
    Ok(stream.clone_htod(&hadamard_sign_values(hdim, seed))?)
}

/// Rows per scale block of `role` at head dim `hdim`.
pub fn block_rows(role: Role, hdim: usize) -> usize {
    match role {
        Role::Q => fp8::block_m(hdim as u32) as usize,
        Role::K | Role::V | Role::VRows => fp8::block_n(hdim as u32) as usize,
    }
}

#[repr(transparent)]
struct QuantizeBlock(QuantizeParams);
// SAFETY: plain `#[repr(C)]` data the kernel reads by value.
unsafe impl DeviceRepr for QuantizeBlock {}

/// Quantizes a 16-bit `[batch, seqlen, heads, hdim]` tensor (hdim 64, 128 or 256; any
/// strides with a contiguous last dim) to e4m3 with one factor per block of rows of a
/// head (the block the FP8 kernel tiles `role` by), in one launch on `stream`. V's
/// factors are powers of two (`common::fp8::block_factor`).
pub fn quantize_fp8(gpu: &Gpu, stream: &Arc<CudaStream>, x: &TensorRef<'_>, opts: &QuantizeOptions) -> Result<Quantized> {
    if !Arc::ptr_eq(stream.context(), gpu.context()) {
        return Err(AttnError::ForeignStream);
    }
    let arg = match opts.role {
        Role::Q => Arg::Q,
        Role::K => Arg::K,
        Role::V | Role::VRows => Arg::V,
    };
    let [b, s, h, d] = x.layout.shape;
    check_shape(arg, x.layout.shape)?;
    let kernel = fp8::find_quantize(d as u32, x.dtype()).ok_or(AttnError::UnsupportedHeadDim { hdim: d, supported: &common::HEAD_DIMS })?;
    let (x_ptr, _x_sync) = x.slice.device_ptr(stream);
    crate::plan::check_tensor(arg, &crate::plan::TensorDesc { dtype: x.dtype(), layout: x.layout, addr: x_ptr, buffer_len: x.buffer_len() })?;
    if opts.hadamard.is_some() && matches!(opts.role, Role::V | Role::VRows) {
        return Err(AttnError::Unsupported("incoherent processing applies to q and k, not v (QKᵀ is what it preserves)".into()));
    }
    let (signs, _signs_sync) = match opts.hadamard {
        Some(sg) => {
            if sg.len() < d {
                return Err(AttnError::OutOfBounds { arg: Arg::Signs, needed: d, len: sg.len() });
            }
            let (a, sync) = sg.device_ptr(stream);
            (a, Some(sync))
        }
        None => (0, None),
    };
    let rows = block_rows(opts.role, d);
    let layout = if opts.role == Role::V { Fp8Layout::VTransposed } else { Fp8Layout::Bshd };
    let blocks = s.div_ceil(rows);
    // SAFETY: the kernel writes every code of the layout (and a transposed V's padding)
    // and every factor before anyone reads them.
    let mut data = unsafe { stream.alloc::<u8>(Fp8Tensor::needed([b, s, h, d], layout)) }?;
    let mut factors = unsafe { stream.alloc::<f32>(b * h * blocks) }?;
    {
        let (dst, _d) = data.device_ptr_mut(stream);
        let (sc, _s) = factors.device_ptr_mut(stream);
        let params = QuantizeParams {
            src: x_ptr,
            src_strides: crate::plan::strides(&x.layout),
            dst,
            output: if layout == Fp8Layout::VTransposed { QuantizeOutput::VTransposed } else { QuantizeOutput::Bshd },
            scales: sc,
            batch: b as u32,
            seqlen: s as u32,
            heads: h as u32,
            block_rows: rows as u32,
            signs,
            hdim: d as u32,
            pow2_factors: opts.role.pow2_factors() as u32,
        };
        launch_quantize(gpu, stream, kernel, (blocks as u32, h as u32, b as u32), params)?;
    }
    Ok(Quantized {
        tensor: Fp8Tensor { data, shape: [b, s, h, d], layout },
        scales: Descale { factors, kind: DescaleKind::Blocks { rows } },
    })
}

/// e4m3 V `[batch, seqlen, heads, hdim]` (packed) rearranged as [`Fp8Layout::VTransposed`],
/// on `stream`: what [`flash_attn_fp8`] does first when given V in `[b, s, h, d]` (one pass
/// over V and an allocation per call; a V from [`quantize_fp8`] with [`Role::V`] is already
/// transposed).
pub fn transpose_v_fp8(gpu: &Gpu, stream: &Arc<CudaStream>, v: &Fp8Tensor) -> Result<Fp8Tensor> {
    if !Arc::ptr_eq(stream.context(), gpu.context()) {
        return Err(AttnError::ForeignStream);
    }
    if v.layout != Fp8Layout::Bshd {
        return Err(AttnError::Unsupported("transpose_v_fp8 takes v in [batch, seqlen, heads, hdim] (Fp8Layout::Bshd)".into()));
    }
    let [b, s, h, d] = v.shape;
    check_shape(Arg::V, v.shape)?;
    let needed = Fp8Tensor::needed(v.shape, Fp8Layout::Bshd);
    if v.data.len() < needed {
        return Err(AttnError::OutOfBounds { arg: Arg::V, needed, len: v.data.len() });
    }
    // SAFETY: the kernel writes every byte of the layout, padding included.
    let mut data = unsafe { stream.alloc::<u8>(Fp8Tensor::needed(v.shape, Fp8Layout::VTransposed)) }?;
    {
        let (src, _s) = v.data.device_ptr(stream);
        let (dst, _d) = data.device_ptr_mut(stream);
        let params = QuantizeParams { src, dst, batch: b as u32, seqlen: s as u32, heads: h as u32, hdim: d as u32, ..Default::default() };
        let blocks = fp8::vt_len(s as u32) / fp8::TRANSPOSE_KEYS;
        launch_quantize(gpu, stream, &fp8::TRANSPOSE_V, (blocks, h as u32, b as u32), params)?;
    }
    Ok(Fp8Tensor { data, shape: v.shape, layout: Fp8Layout::VTransposed })
}

fn launch_quantize(gpu: &Gpu, stream: &Arc<CudaStream>, k: &KernelEntry, grid: (u32, u32, u32), params: QuantizeParams) -> Result<()> {
    let (f, _) = gpu.function(k).ok_or_else(|| AttnError::KernelLoad(format!("{} is not loaded", k.name)))?;
    let cfg = LaunchConfig { grid_dim: grid, block_dim: (fp8::QUANTIZE_THREADS, 1, 1), shared_mem_bytes: 4 * fp8::QUANTIZE_THREADS / 32 };
    let p = QuantizeBlock(params);
    let mut builder = stream.launch_builder(f);
    builder.arg(&p);
    // SAFETY: the caller checked the input's extent; the outputs were sized for the
    // layout and the grid.
    unsafe { builder.launch(cfg) }?;
    Ok(())
}

/// What planning needs to know about an e4m3 tensor.
#[derive(Clone, Copy, Debug)]
pub struct Fp8Desc {
    /// `[batch, seqlen, heads, hdim]`.
    pub shape: [usize; 4],
    /// Its layout.
    pub layout: Fp8Layout,
    /// Device address of its first byte.
    pub addr: u64,
    /// Bytes in the buffer.
    pub len: usize,
}

/// What planning needs to know about a tensor's factors.
#[derive(Clone, Copy, Debug)]
pub struct DescaleDesc {
    /// Their granularity.
    pub kind: DescaleKind,
    /// Device address of the f32 factors.
    pub addr: u64,
    /// Factors in the buffer.
    pub len: usize,
}

/// Validates an FP8 forward call and plans its launch (`out`: a packed `[b, sq, hq, d]`
/// buffer of `opts.out_dtype` at `out.0` with `out.1` elements; `lse`: f32).
#[allow(clippy::too_many_arguments)]
pub fn plan_fp8(
    q: &Fp8Desc,
    k: &Fp8Desc,
    v: &Fp8Desc,
    scales: [&DescaleDesc; 3],
    out: (u64, usize),
    lse: (u64, usize),
    opts: &Fp8Options,
    sm_count: u32,
) -> Result<FwdPlan> {
    let [b, sq, hq, d] = q.shape;
    let [bk, sk, hk, dk] = k.shape;
    for (arg, t) in [(Arg::Q, q), (Arg::K, k), (Arg::V, v)] {
        check_shape(arg, t.shape)?;
        let needed = Fp8Tensor::needed(t.shape, t.layout);
        if t.len < needed {
            return Err(AttnError::OutOfBounds { arg, needed, len: t.len });
        }
        if t.addr % 16 != 0 {
            return Err(AttnError::Misaligned { arg, detail: format!("address {:#x} is not 16-byte aligned", t.addr) });
        }
    }
    if q.layout != Fp8Layout::Bshd || k.layout != Fp8Layout::Bshd {
        return Err(AttnError::Unsupported("q and k must be e4m3 [batch, seqlen, heads, hdim] (Fp8Layout::Bshd)".into()));
    }
    // V as stored is transposed by the kernel itself, tile by tile in shared memory.
    let transpose_v = v.layout == Fp8Layout::Bshd;
    if bk != b || dk != d || v.shape != k.shape {
        return Err(AttnError::ShapeMismatch(format!("q {:?}, k {:?}, v {:?}", q.shape, k.shape, v.shape)));
    }
    if !fp8::HEAD_DIMS.contains(&(d as u32)) {
        return Err(AttnError::UnsupportedHeadDim { hdim: d, supported: &fp8::HEAD_DIMS });
    }
    if hq % hk != 0 {
        return Err(AttnError::HeadsNotDivisible { heads_q: hq, heads_k: hk });
    }
    let scale = crate::plan::check_lse_scale_and_sizes(lse, [b, sq, hq, d], sk, &crate::plan::AttnOptions { softmax_scale: opts.softmax_scale, ..Default::default() })?;
    if out.1 < b * sq * hq * d {
        return Err(AttnError::OutOfBounds { arg: Arg::Out, needed: b * sq * hq * d, len: out.1 });
    }
    let (block_m, block_n) = (fp8::block_m(d as u32) as usize, fp8::block_n(d as u32) as usize);
    let index = |arg: Arg, s: &DescaleDesc, heads: usize, seqlen: usize, rows: usize| -> Result<ScaleIndex> {
        let (needed, idx) = match s.kind {
            DescaleKind::PerHead => {
                let div = if arg == Arg::QDescale { hq / hk } else { 1 };
                (b * hk, ScaleIndex { ptr: s.addr, batch_stride: hk as u32, head_stride: 1, block_stride: 0, head_div: div as u32 })
            }
            DescaleKind::Blocks { rows: got } if got != rows => return Err(AttnError::BlockSize { arg, got, expected: rows }),
            DescaleKind::Blocks { .. } => {
                let blocks = seqlen.div_ceil(rows);
                (b * heads * blocks, ScaleIndex { ptr: s.addr, batch_stride: (heads * blocks) as u32, head_stride: blocks as u32, block_stride: 1, head_div: 1 })
            }
        };
        DeviceVec { addr: s.addr, len: s.len }.check(arg, needed)?;
        Ok(idx)
    };
    let descales = DescaleParams {
        q: index(Arg::QDescale, scales[0], hq, sq, block_m)?,
        k: index(Arg::KDescale, scales[1], hk, sk, block_n)?,
        v: index(Arg::VDescale, scales[2], hk, sk, block_n)?,
    };
    // Per-head K and V factors tie no tile to a scale block: the wider tile where there is
    // one and the keys are many enough.
    let per_head_kv = [scales[1], scales[2]].iter().all(|s| matches!(s.kind, DescaleKind::PerHead));
    let kernel = fp8::find(d as u32, opts.out_dtype, per_head_kv, sk as u32, transpose_v)
        .ok_or(AttnError::UnsupportedHeadDim { hdim: d, supported: &fp8::HEAD_DIMS })?;
    let cfg = common::fa3::kernel_config(kernel).ok_or_else(|| AttnError::KernelLoad(kernel.name.into()))?;
    let packed = |shape: [usize; 4]| crate::plan::strides(&Layout::contiguous(shape));
    let mut params = FwdParams {
        q: q.addr,
        k: k.addr,
        v: v.addr,
        o: out.0,
        lse: lse.0,
        q_strides: packed(q.shape),
        k_strides: packed(k.shape),
        v_strides: Strides::default(),
        o_strides: packed(q.shape),
        batch: b as u32,
        heads_q: hq as u32,
        heads_k: hk as u32,
        kv_group: (hq / hk) as u32,
        seqlen_q: sq as u32,
        seqlen_k: sk as u32,
        scale_log2: scale * std::f32::consts::LOG2_E,
        softmax_scale: scale,
        causal: opts.causal as u32,
        section_log2: 0,
        fp8: descales,
        ..Default::default()
    };
    // The forward's schedules: static persistent without a mask over whole query
    // blocks, else persistent CTAs claiming tiles from the stream's counter.
    let units = sq.div_ceil(block_m) * hq * b;
    if units > i32::MAX as usize {
        return Err(AttnError::TooLarge(format!("{units} tiles")));
    }
    let persistent = persistent_ctas(units, sm_count, 1);
    let dynamic = opts.causal || sq % block_m != 0;
    let tile_counter = (dynamic && units > persistent).then_some(units as u32);
    if tile_counter.is_some() && opts.causal {
        params.section_log2 = section_log2(b * hq, hq / hk, sk, d);
    }
    // 128-byte chunks of e4m3 (one 64-byte chunk at hdim 64).
    let chunks = d.div_ceil(128) as u32;
    let tma = [
        TensorMapSpec::bshd(Arg::Q, TmaElem::E4M3, q.addr, &Layout::contiguous(q.shape), block_m as u32, chunks)?,
        TensorMapSpec::bshd(Arg::K, TmaElem::E4M3, k.addr, &Layout::contiguous(k.shape), kernel.block_n, chunks)?,
        if transpose_v {
            TensorMapSpec::bshd(Arg::V, TmaElem::E4M3, v.addr, &Layout::contiguous(v.shape), kernel.block_n, chunks)?
        } else {
            TensorMapSpec::vt(Arg::V, v.addr, b, hk, d, fp8::vt_len(sk as u32) as usize, kernel.block_n)?
        },
        TensorMapSpec::bshd(Arg::Out, opts.out_dtype, out.0, &Layout::contiguous(q.shape), 64, 1)?,
    ];
    Ok(FwdPlan {
        kernel,
        params,
        grid: (persistent as u32, 1, 1),
        block: cfg.threads(),
        smem_bytes: cfg.smem().total,
        tma: Some(tma),
        tile_counter,
    })
}

/// FP8 attention `softmax(scale · Q Kᵀ) V` on e4m3 inputs with their dequantization
/// factors, on `stream`, into a fresh O (`opts.out_dtype`, `[batch, seqlen_q, heads_q,
/// hdim]`) and LSE. hdim 64, 128 or 256; causal or not; GQA/MQA. Nothing is modified but
/// the returned tensors.
pub fn flash_attn_fp8(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    q: &Fp8Tensor,
    k: &Fp8Tensor,
    v: &Fp8Tensor,
    scales: &Fp8Descales,
    opts: &Fp8Options,
) -> Result<AttnOutput> {
    let [b, sq, hq, _] = q.shape;
    check_shape(Arg::Q, q.shape)?;
    let mut out = DeviceTensor::alloc(stream, opts.out_dtype, q.shape)?;
    // SAFETY: the kernel writes every LSE element before anyone reads it.
    let mut lse = unsafe { stream.alloc::<f32>(b * hq * sq) }?;
    flash_attn_fp8_into(gpu, stream, q, k, v, scales, &mut out.as_mut(), &mut lse, opts)?;
    Ok(AttnOutput { out, lse })
}

/// As [`flash_attn_fp8`], into `out` (packed, q's shape, `opts.out_dtype`) and the first
/// `batch * heads_q * seqlen_q` elements of `lse`: no allocation.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_fp8_into(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    q: &Fp8Tensor,
    k: &Fp8Tensor,
    v: &Fp8Tensor,
    scales: &Fp8Descales,
    out: &mut TensorMut<'_>,
    lse: &mut CudaSlice<f32>,
    opts: &Fp8Options,
) -> Result<()> {
    if !Arc::ptr_eq(stream.context(), gpu.context()) {
        return Err(AttnError::ForeignStream);
    }
    if out.dtype() != opts.out_dtype {
        return Err(AttnError::ArgDType { arg: Arg::Out, expected: opts.out_dtype, got: out.dtype() });
    }
    if out.layout != Layout::contiguous(q.shape) {
        return Err(AttnError::Unsupported(format!("out must be packed with q's shape {:?} (got {:?})", q.shape, out.layout)));
    }
    let t = |x: &Fp8Tensor, addr| Fp8Desc { shape: x.shape, layout: x.layout, addr, len: x.data.len() };
    let s = |x: &Descale, addr| DescaleDesc { kind: x.kind, addr, len: x.factors.len() };
    let (qa, _qs) = q.data.device_ptr(stream);
    let (ka, _ks) = k.data.device_ptr(stream);
    let (va, _vs) = v.data.device_ptr(stream);
    let (qsa, _q2) = scales.q.factors.device_ptr(stream);
    let (ksa, _k2) = scales.k.factors.device_ptr(stream);
    let (vsa, _v2) = scales.v.factors.device_ptr(stream);
    let out_len = out.buffer_len();
    let lse_len = lse.len();
    let (oa, _os) = out.slice.device_ptr_mut(stream);
    let (la, _ls) = lse.device_ptr_mut(stream);
    let plan = plan_fp8(
        &t(q, qa),
        &t(k, ka),
        &t(v, va),
        [&s(scales.q, qsa), &s(scales.k, ksa), &s(scales.v, vsa)],
        (oa, out_len),
        (la, lse_len),
        opts,
        gpu.info().sm_count,
    )?;
    launch(gpu, stream, &plan, &AttnOptions::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(shape: [usize; 4], layout: Fp8Layout) -> Fp8Desc {
        Fp8Desc { shape, layout, addr: 0x10000, len: Fp8Tensor::needed(shape, layout) }
    }

    fn plan(q: [usize; 4], kv: [usize; 4], scales: [DescaleDesc; 3], opts: &Fp8Options) -> Result<FwdPlan> {
        let [b, sq, hq, d] = q;
        plan_fp8(
            &desc(q, Fp8Layout::Bshd),
            &desc(kv, Fp8Layout::Bshd),
            &desc(kv, Fp8Layout::VTransposed),
            [&scales[0], &scales[1], &scales[2]],
            (0x20000, b * sq * hq * d),
            (0x30000, b * hq * sq),
            opts,
            132,
        )
    }

    fn blocks(rows: usize, len: usize) -> DescaleDesc {
        DescaleDesc { kind: DescaleKind::Blocks { rows }, addr: 0x40000, len }
    }

    #[test]
    fn transposed_v_rows_are_the_kernels_padded_length() {
        // The host sizes and checks V's rows as the quantization and forward kernels
        // address them (`common::fp8::vt_len`), whole chunks of a 64-byte-swizzled tile.
        for s in [1usize, 17, 31, 32, 33, 63, 64, 65, 190, 777, 4097] {
            assert_eq!(padded_keys(s), fp8::vt_len(s as u32) as usize, "seqlen {s}");
            assert_eq!(padded_keys(s) % fp8::VT_ALIGN as usize, 0);
        }
        let shape = [2, 777, 4, 128];
        assert_eq!(Fp8Tensor::needed(shape, Fp8Layout::VTransposed), 2 * 4 * 128 * fp8::vt_len(777) as usize);
    }

    #[test]
    fn block_scales_index_batch_head_and_block() {
        // 1000 queries in 128-row blocks (8 per head), 1000 keys in 192-key blocks (6 per
        // head); 4 K/V heads, 8 query heads.
        let (bm, bn) = (fp8::block_m(128) as usize, fp8::block_n(128) as usize);
        assert_eq!((bm, bn), (128, 192));
        let p = plan([2, 1000, 8, 128], [2, 1000, 4, 128], [blocks(bm, 2 * 8 * 8), blocks(bn, 2 * 4 * 6), blocks(bn, 2 * 4 * 6)], &Fp8Options::default()).unwrap();
        assert_eq!(p.params.fp8.q.offset(1, 3, 2), (8 * 8 + 3 * 8 + 2) as u64);
        assert_eq!(p.params.fp8.k.offset(1, 3, 2), (4 * 6 + 3 * 6 + 2) as u64);
        assert_eq!(p.kernel.name, "fa3_fp8_hdim128_bf16");
        let tma = p.tma.unwrap();
        // V's rows padded to whole 64-key chunks; three 64-key chunks a tile.
        assert_eq!(tma[2].dims, [64, 128, 1024 / 64, 4, 2]);
        assert_eq!(tma[2].box_dims, [64, 128, 3, 1, 1]);
    }

    #[test]
    fn per_head_kv_factors_take_the_wide_tile() {
        let ph = DescaleDesc { kind: DescaleKind::PerHead, addr: 0x40000, len: 8 };
        // Q's factors may still come per block: only K's and V's tie the key tile.
        let p = plan([2, 1000, 8, 128], [2, 3000, 4, 128], [blocks(128, 2 * 8 * 8), ph, ph], &Fp8Options::default()).unwrap();
        assert_eq!((p.kernel.name, p.kernel.block_n), ("fa3_fp8_hdim128_bf16_n192", 192));
        let tma = p.tma.unwrap();
        assert_eq!(tma[1].box_dims[1], 192, "K's box is the tile's keys");
        // Three 64-key chunks of V a tile.
        assert_eq!(tma[2].dims, [64, 128, 3008 / 64, 4, 2]);
        assert_eq!(tma[2].box_dims, [64, 128, 3, 1, 1]);
        // One of K and V with block factors: the block kernel, on the same tile.
        let p = plan([2, 1000, 8, 128], [2, 3000, 4, 128], [ph, ph, blocks(192, 2 * 4 * 16)], &Fp8Options::default()).unwrap();
        assert_eq!(p.kernel.block_n, 192);
        assert_eq!(p.kernel.name, "fa3_fp8_hdim128_bf16");
        // Fewer keys than `WIDE_MIN_KEYS` with per-head factors: 128 keys.
        let p = plan([2, 1000, 8, 128], [2, 1000, 4, 128], [ph, ph, ph], &Fp8Options::default()).unwrap();
        assert_eq!((p.kernel.name, p.kernel.block_n), ("fa3_fp8_hdim128_bf16_headscale", 128), "per-head K and V: no per-block code");
    }

    #[test]
    fn per_head_scales_share_q_factors_across_a_kv_group() {
        let ph = DescaleDesc { kind: DescaleKind::PerHead, addr: 0x40000, len: 8 };
        let p = plan([2, 256, 8, 256], [2, 300, 4, 256], [ph, ph, ph], &Fp8Options::default().causal(true)).unwrap();
        // Query heads 6 and 7 read K/V head 3's factor.
        assert_eq!(p.params.fp8.q.offset(1, 7, 5), 4 + 3);
        assert_eq!(p.params.fp8.v.offset(1, 3, 9), 4 + 3);
        assert_eq!(p.kernel.block_n, 64);
    }

    #[test]
    fn misuse_gets_typed_errors_naming_the_argument() {
        let (bm, bn) = (fp8::block_m(128) as usize, fp8::block_n(128) as usize);
        let ok = || [blocks(bm, 64), blocks(bn, 64), blocks(bn, 64)];
        let shape = [1, 512, 4, 128];
        // Block size that is not the kernel's tile.
        let bad = [blocks(64, 1000), blocks(bn, 64), blocks(bn, 64)];
        assert!(matches!(plan(shape, shape, bad, &Fp8Options::default()), Err(AttnError::BlockSize { arg: Arg::QDescale, got: 64, expected: 128 })));
        // Too few factors.
        let short = [blocks(bm, 16), blocks(bn, 11), blocks(bn, 12)];
        assert!(matches!(plan(shape, shape, short, &Fp8Options::default()), Err(AttnError::OutOfBounds { arg: Arg::KDescale, needed: 12, len: 11 })));
        // hdim 32 has no FP8 kernel.
        let s32 = [1, 512, 4, 32];
        assert!(matches!(plan(s32, s32, ok(), &Fp8Options::default()), Err(AttnError::UnsupportedHeadDim { hdim: 32, .. })));
        // V as stored: the kernel that transposes it, V's map as K's; a short V buffer of
        // that layout is refused.
        let bshd = |v: Fp8Desc| {
            plan_fp8(
                &desc(shape, Fp8Layout::Bshd),
                &desc(shape, Fp8Layout::Bshd),
                &v,
                [&ok()[0], &ok()[1], &ok()[2]],
                (0x20000, 512 * 4 * 128),
                (0x30000, 4 * 512),
                &Fp8Options::default(),
                132,
            )
        };
        let p = bshd(desc(shape, Fp8Layout::Bshd)).unwrap();
        let transposed = plan(shape, shape, ok(), &Fp8Options::default()).unwrap();
        assert_eq!(p.kernel.kind, common::KernelKind::ForwardFp8 { transpose_v: true, block_factors: true });
        assert_eq!(transposed.kernel.kind, common::KernelKind::ForwardFp8 { transpose_v: false, block_factors: true });
        assert_eq!(p.kernel.block_n, transposed.kernel.block_n);
        let [_, k_map, v_map, _] = p.tma.unwrap();
        assert_eq!((v_map.dims, v_map.box_dims, v_map.swizzle), (k_map.dims, k_map.box_dims, k_map.swizzle));
        assert!(p.smem_bytes > transposed.smem_bytes);
        let mut short = desc(shape, Fp8Layout::Bshd);
        short.len -= 1;
        assert!(matches!(bshd(short), Err(AttnError::OutOfBounds { arg: Arg::V, .. })));
        // A negative scale.
        assert!(matches!(plan(shape, shape, ok(), &Fp8Options::default().softmax_scale(-1.0)), Err(AttnError::InvalidScale(_))));
        // A short V buffer.
        let mut v = desc(shape, Fp8Layout::VTransposed);
        v.len -= 1;
        let r = plan_fp8(&desc(shape, Fp8Layout::Bshd), &desc(shape, Fp8Layout::Bshd), &v, [&ok()[0], &ok()[1], &ok()[2]], (0x20000, 512 * 4 * 128), (0x30000, 4 * 512), &Fp8Options::default(), 132);
        assert!(matches!(r, Err(AttnError::OutOfBounds { arg: Arg::V, .. })));
        // Zero, negative, non-finite, subnormal and too large factors.
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY, 1e-40, 2f32.powi(126) * 1.5] {
            assert!(matches!(check_factors(Arg::VDescale, &[1.0, bad]), Err(AttnError::InvalidDescale { arg: Arg::VDescale, index: 1, .. })));
        }
        assert!(check_factors(Arg::QDescale, &[0.5, 2.0, f32::MIN_POSITIVE, 2f32.powi(126)]).is_ok());
    }

    #[test]
    fn huge_or_odd_shapes_are_refused_before_any_size_is_computed() {
        // A head dim past u32 would truncate to 128; sizes whose product overflows.
        assert!(matches!(check_shape(Arg::V, [1, 1, 1, (1 << 32) + 128]), Err(AttnError::UnsupportedHeadDim { .. })));
        assert!(matches!(check_shape(Arg::V, [1, 1, 1, 1 << 27]), Err(AttnError::UnsupportedHeadDim { .. })));
        assert!(matches!(check_shape(Arg::Q, [1 << 15, 1 << 29, 1 << 12, 256]), Err(AttnError::TooLarge(_))));
        assert!(matches!(check_shape(Arg::K, [1, 0, 1, 128]), Err(AttnError::EmptyDim { .. })));
        assert_eq!(Fp8Tensor::needed([usize::MAX, 2, 1, 1], Fp8Layout::Bshd), usize::MAX);
        assert!(matches!(transpose_v_codes(&[0; 3], [1, 2, 1, 64]), Err(AttnError::HostData(_))));
        // The host transpose puts key 3 of a 64-wide head where the kernel reads it.
        let codes: Vec<u8> = (0..2 * 64).map(|i| (i / 64 + 1) as u8).collect();
        let t = transpose_v_codes(&codes, [1, 2, 1, 64]).unwrap();
        assert_eq!(t.len(), 64 * fp8::vt_len(2) as usize);
        assert_eq!((t[fp8::vt_position(1) as usize], t[fp8::vt_position(2) as usize]), (2, 0));
    }
}
