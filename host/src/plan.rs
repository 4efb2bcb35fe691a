//! Host-side validation and launch planning. Pure functions of shapes, strides, dtypes
//! and addresses, so every misuse is caught (and tested) without a GPU.
use crate::error::{Arg, AttnError, Result};
use crate::tensor::Layout;
use crate::tma::TensorMapSpec;
use crate::documents::{DocsDesc, DocumentMask};
use crate::variant::{UserVariant, VariantDesc};
use common::variant::VariantArgs;
use cudarc::driver::CudaSlice;
use common::fa3::{self, Techniques};
use common::bwd;
use common::window::{DocumentBounds, KeyWindow};
use common::{Algo, DType, FwdParams, HEAD_DIMS, KernelEntry, KernelKind, MaskKind, ScoreModKind, Strides, fa2};

/// ALiBi slopes on the device (f32), for [`AttnOptions::alibi`].
#[derive(Clone, Copy)]
pub struct AlibiSlopes<'a> {
    /// `[heads_q]`, or `[batch, heads_q]` when `per_batch`.
    pub slopes: &'a CudaSlice<f32>,
    /// One slope per (batch, head) rather than per head.
    pub per_batch: bool,
}

impl std::fmt::Debug for AlibiSlopes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlibiSlopes").field("len", &self.slopes.len()).field("per_batch", &self.per_batch).finish()
    }
}

/// The ALiBi slopes of a call as the planners see them: a device address and a length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlibiDesc {
    /// Device address of the f32 slopes.
    pub addr: u64,
    /// Slopes in the buffer.
    pub len: usize,
    /// `[batch, heads_q]` rather than `[heads_q]`.
    pub per_batch: bool,
}

/// A sliding window, FlashAttention's `window_size`: query row `i` sees key `j` iff
/// `i + seqlen_k − seqlen_q − left <= j <= i + seqlen_k − seqlen_q + right`; `None` leaves
/// that side unbounded (`right: Some(0)` is the causal mask, and a causal call caps
/// `right` at 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// Keys visible before the row's diagonal.
    pub left: Option<usize>,
    /// Keys visible after it.
    pub right: Option<usize>,
}

impl Window {
    /// Whether some side is bounded (else the window hides nothing).
    pub fn is_bounded(&self) -> bool {
        self.left.is_some() || self.right.is_some()
    }

    /// The kernels' form of the window of a call (the planner checks first that both
    /// lengths are at most `common::window::MAX_SEQLEN`).
    pub fn key_window(&self, causal: bool, seqlen_q: usize, seqlen_k: usize) -> KeyWindow {
        // Wider than any distance: the same as unbounded.
        let side = |w: Option<usize>| w.map(|w| w.min(seqlen_q.max(seqlen_k)) as u32);
        KeyWindow::new(side(self.left), side(self.right), causal, seqlen_q as u32, seqlen_k as u32)
    }
}

/// The keys query row `i` sees (of `seqlen_k`, with `seqlen_q` rows): all of them; up to
/// its bottom-right diagonal under the causal mask; within the window around the
/// diagonal.
pub fn visible_keys(i: usize, seqlen_q: usize, seqlen_k: usize, causal: bool, window: Option<Window>) -> std::ops::Range<usize> {
    let (sq, sk) = (seqlen_q as i64, seqlen_k as i64);
    let diag = i as i64 + sk - sq;
    let (left, mut right) = window.map_or((None, None), |w| (w.left, w.right));
    if causal {
        right = Some(right.map_or(0, |r| r.min(0)));
    }
    let lo = left.map_or(0, |l| (diag - l as i64).max(0));
    let hi = right.map_or(sk, |r| (diag + r as i64 + 1).min(sk));
    let (lo, hi) = (lo.min(sk) as usize, hi.max(0) as usize);
    lo..hi.max(lo)
}

/// A device vector of f32 as the planners see it: address and length (attention sinks
/// and their gradient).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceVec {
    /// Device address of element 0.
    pub addr: u64,
    /// Elements in the buffer.
    pub len: usize,
}

impl DeviceVec {
    /// Checks that the vector holds `needed` f32 at a 4-byte aligned address.
    pub(crate) fn check(&self, arg: Arg, needed: usize) -> Result<()> {
        if self.len < needed {
            return Err(AttnError::OutOfBounds { arg, needed, len: self.len });
        }
        if self.addr % 4 != 0 {
            return Err(AttnError::Misaligned { arg, detail: format!("address {:#x} is not 4-byte aligned", self.addr) });
        }
        Ok(())
    }
}

/// Options of an attention call, as in `flash_attn_func`.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnOptions<'a> {
    /// Scale of `QK^T` before the softmax; `None` means `1 / sqrt(hdim)`.
    pub softmax_scale: Option<f32>,
    /// Causal mask aligned to the bottom-right corner of the score matrix (query `i`
    /// sees keys `j <= i + seqlen_k - seqlen_q`), as FlashAttention 2.1+.
    pub causal: bool,
    /// Kernel family; `None` picks the fastest available: FlashAttention-3 with every
    /// technique.
    /// `Algo::Fa3(Techniques::NO_PINGPONG)` etc. leave one out.
    pub algo: Option<Algo>,
    /// How FA3 tiles are spread over the GPU.
    pub schedule: Schedule,
    /// Backward: dQ, dK and dV bit-identical across runs and stream states (each query
    /// block's fp32 dQ is then summed in a fixed order of key blocks, each waiting for its
    /// turn); otherwise dQ's partial sums land in whatever order the CTAs finish. Costs
    /// 10-12% of the speed at hdim 128 and a third at hdim 64 (8k tokens, H100).
    pub deterministic: bool,
    /// Soft-capping (Gemma 2, FlashAttention's `softcap`): the logits are
    /// `c · tanh(scale · QKᵀ / c)` instead of `scale · QKᵀ`, in the forward and the
    /// backward (whose gradients include `tanh`'s derivative). `None`: plain logits.
    pub softcap: Option<f32>,
    /// ALiBi (FlashAttention's convention): the logits are
    /// `scale · q_i·k_j − slope_h · |i + seqlen_k − seqlen_q − j|`, forward and backward.
    /// With `softcap`, the bias follows the cap: `c · tanh(scale · q_i·k_j / c) − slope_h · |..|`.
    pub alibi: Option<AlibiSlopes<'a>>,
    /// Sliding-window (local) attention, forward and backward; combines with `causal`,
    /// `softcap` and `alibi`. Key blocks outside every row's window are neither loaded
    /// nor computed.
    pub window: Option<Window>,
    /// Attention sinks: f32 logits `[heads_q]` on the device (natural-log units, as the
    /// logits `scale · q·k`), one per query head, that join every row's softmax
    /// denominator and nothing else. A row then has `LSE = log(exp(sink) + Σ exp(logits))`
    /// (the sink's LSE and a zero output if it sees no key); the backward returns their
    /// gradient. FlashAttention-3 kernels only.
    pub sinks: Option<&'a CudaSlice<f32>>,
    /// Packed documents: each query row sees only the keys of its own document
    /// (FlexAttention's document mask), forward and backward; combines with `causal`, a
    /// `window`, `sinks` and `softcap` (the soft-capped backward at head dim 64 only; not
    /// with `alibi`). Key blocks of other
    /// documents are neither loaded nor computed. Needs `seqlen_q <= seqlen_k`.
    pub documents: Option<&'a DocumentMask>,
    /// A user-defined variant (`common::variant::Variant`, from a [`VariantModule`]):
    /// its score and mask functions, forward and backward, with FlashAttention-3 and
    /// every technique. Combines with `causal` and `sinks`; a window, documents,
    /// soft-capping or ALiBi go into the variant's own functions instead.
    ///
    /// [`VariantModule`]: crate::VariantModule
    pub variant: Option<UserVariant<'a>>,
    /// A block-sparse mask built from `variant`'s mask mod ([`BlockMask`]), for calls of
    /// the shape it was built for: each tile visits the key blocks its list holds, and
    /// those whose pairs are all visible run without mask code. Forward, and the
    /// backward but in deterministic mode (which runs the dense kernel).
    ///
    /// [`BlockMask`]: crate::BlockMask
    pub block_mask: Option<&'a crate::sparse::BlockMask>,
}

/// The mask of a call as the planners pass it on: the kernel column and its parameters.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MaskPlan {
    pub kind: MaskKind,
    /// The window, causal folded in (default for [`MaskKind::Causal`]).
    pub window: KeyWindow,
    /// The documents (default without).
    pub docs: DocumentBounds,
}

/// Grid of the FA3 kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Schedule {
    /// Without a causal mask and with whole query blocks: persistent with the static
    /// order (every tile costs the same); otherwise persistent with the dynamic order
    /// (tiles differ in cost), or one tile per CTA for the kernel without warp
    /// specialization (which has no producer to claim tiles).
    #[default]
    Auto,
    /// One CTA per SM, each taking every grid-th tile; a tile's loads overlap the
    /// previous tile's epilogue.
    Persistent,
    /// One CTA per SM; each CTA's producer claims the next tile from a counter in
    /// global memory when it is ready for one (4 bytes per stream, kept by the [`Gpu`]
    /// handle across calls; see `Gpu::with_tile_counter`). Needs warp specialization.
    ///
    /// [`Gpu`]: crate::Gpu
    PersistentDynamic,
    /// One CTA per tile, scheduled by the hardware.
    TilePerCta,
    /// Persistent (static order) over clusters of two CTAs on neighbouring query blocks
    /// of one head, which share each K/V tile by TMA multicast (half the L2 traffic).
    /// Non-causal only (both CTAs must visit the same key blocks), hdim 128, all
    /// techniques on. `Auto` picks it from 4096 query rows and keys
    /// (`common::fa3::multicast_pays`).
    PersistentMulticast,
}

impl<'a> AttnOptions<'a> {
    /// Turns the bottom-right-aligned causal mask on or off.
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }
    /// Scales `QK^T` by `scale` instead of `1 / sqrt(hdim)`; it must be finite and
    /// non-negative, or the call fails with [`AttnError::InvalidScale`].
    pub fn softmax_scale(mut self, scale: f32) -> Self {
        self.softmax_scale = Some(scale);
        self
    }
    /// Picks the kernel family instead of FlashAttention-3 with every technique.
    pub fn algo(mut self, algo: Algo) -> Self {
        self.algo = Some(algo);
        self
    }
    /// Picks how FA3 tiles are spread over the GPU instead of [`Schedule::Auto`].
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedule = schedule;
        self
    }
    /// Soft-caps the logits at `cap` (see
    /// [`AttnOptions::softcap`](struct.AttnOptions.html#structfield.softcap)); it must be
    /// finite and positive, or the call fails with [`AttnError::InvalidSoftcap`].
    pub fn softcap(mut self, cap: f32) -> Self {
        self.softcap = Some(cap);
        self
    }

    /// Adds ALiBi biases with these slopes (see
    /// [`AttnOptions::alibi`](struct.AttnOptions.html#structfield.alibi)): `[heads_q]`, or
    /// `[batch, heads_q]` when `per_batch`.
    pub fn alibi(mut self, slopes: &'a CudaSlice<f32>, per_batch: bool) -> Self {
        self.alibi = Some(AlibiSlopes { slopes, per_batch });
        self
    }

    /// Adds attention sinks with these logits (see
    /// [`AttnOptions::sinks`](struct.AttnOptions.html#structfield.sinks)): `[heads_q]` f32.
    pub fn sinks(mut self, logits: &'a CudaSlice<f32>) -> Self {
        self.sinks = Some(logits);
        self
    }

    /// Restricts each query row to a sliding window of keys (see [`Window`]): `left` keys
    /// before its diagonal key and `right` after (`None`: unbounded).
    pub fn window(mut self, left: Option<usize>, right: Option<usize>) -> Self {
        self.window = Some(Window { left, right });
        self
    }

    /// Restricts each query row to the keys of its own document (see
    /// [`AttnOptions::documents`](struct.AttnOptions.html#structfield.documents)).
    pub fn documents(mut self, documents: &'a DocumentMask) -> Self {
        self.documents = Some(documents);
        self
    }

    /// Runs a user-defined variant's kernels (see
    /// [`AttnOptions::variant`](struct.AttnOptions.html#structfield.variant)).
    pub fn variant(mut self, variant: UserVariant<'a>) -> Self {
        self.variant = Some(variant);
        self
    }

    /// Skips the blocks a block mask leaves out (see
    /// [`AttnOptions::block_mask`](struct.AttnOptions.html#structfield.block_mask)).
    pub fn block_mask(mut self, mask: &'a crate::sparse::BlockMask) -> Self {
        self.block_mask = Some(mask);
        self
    }

    /// The block mask's kernel view for a call of this shape (`variant`: the call's
    /// variant buffer), after checking it serves the call; default without one.
    pub(crate) fn block_mask_args(&self, variant: Option<VariantDesc>, shape: [usize; 6]) -> Result<common::sparse::BlockMaskArgs> {
        let Some(m) = self.block_mask else {
            return Ok(Default::default());
        };
        let [batch, seqlen_q, seqlen_k, heads_q, heads_k, head_dim] = shape;
        let call = crate::sparse::BlockMaskShape::new(batch, seqlen_q, seqlen_k, heads_q, heads_k, head_dim).causal(self.causal);
        m.check(self.variant.as_ref(), variant, &call)
    }

    /// The mask these options compile in and its kernel parameters, for a call of `batch`
    /// sequences of `seqlen_q` queries and `seqlen_k` keys (which a window or documents
    /// limit) with `documents` (checked against the call) and the checked `score_mod`.
    pub(crate) fn mask(
        &self,
        batch: usize,
        seqlen_q: usize,
        seqlen_k: usize,
        documents: Option<DocsDesc>,
        score_mod: ScoreModKind,
    ) -> Result<MaskPlan> {
        if score_mod == ScoreModKind::User && documents.is_some() {
            // The raw API passes documents apart from the options.
            return Err(AttnError::Unsupported("a user-defined variant does not take documents: fold them into its mask".into()));
        }
        if documents.is_none() && !self.window.is_some_and(|w| w.is_bounded()) {
            return Ok(MaskPlan { kind: MaskKind::Causal, window: KeyWindow::default(), docs: DocumentBounds::default() });
        }
        let max = common::window::MAX_SEQLEN as usize;
        if seqlen_q > max || seqlen_k > max {
            return Err(AttnError::TooLarge(format!("sequence length over {max} with a sliding window or documents")));
        }
        // Documents without a window: an unbounded one (causal folded in).
        let window = self.window.unwrap_or_default().key_window(self.causal, seqlen_q, seqlen_k);
        let Some(d) = documents else {
            return Ok(MaskPlan { kind: MaskKind::Local, window, docs: DocumentBounds::default() });
        };
        Ok(MaskPlan { kind: MaskKind::Document, window, docs: d.check(batch, seqlen_q, seqlen_k)? })
    }

    /// The score modification these options compile in, after checking its values
    /// (`alibi`: whether the call passes slopes).
    pub(crate) fn score_mod(&self, alibi: bool) -> Result<ScoreModKind> {
        if let Some(v) = self.variant {
            if self.softcap.is_some() || alibi || self.window.is_some_and(|w| w.is_bounded()) || self.documents.is_some() {
                return Err(AttnError::Unsupported(format!(
                    "variant {:?} combines only with causal and sinks: fold a window, documents, softcap or ALiBi into its functions",
                    v.name()
                )));
            }
            return Ok(ScoreModKind::User);
        }
        match (self.softcap, alibi) {
            (Some(c), _) if !(c.is_finite() && c > 0.0) => Err(AttnError::InvalidSoftcap(c)),
            (Some(_), true) => Ok(ScoreModKind::SoftcapAlibi),
            (Some(_), false) => Ok(ScoreModKind::Softcap),
            (None, true) => Ok(ScoreModKind::Alibi),
            (None, false) => Ok(ScoreModKind::None),
        }
    }

    /// Backward: makes dQ, dK and dV bit-identical across runs (see
    /// [`AttnOptions::deterministic`](struct.AttnOptions.html#structfield.deterministic)).
    pub fn deterministic(mut self, deterministic: bool) -> Self {
        self.deterministic = deterministic;
        self
    }
}

/// What validation needs to know about one tensor argument.
#[derive(Clone, Copy, Debug)]
pub struct TensorDesc {
    /// Element type.
    pub dtype: DType,
    /// Shape and element strides.
    pub layout: Layout,
    /// Device address of element 0.
    pub addr: u64,
    /// Elements in the buffer behind it.
    pub buffer_len: usize,
}

/// A checked launch: kernel, grid and the parameter block (device addresses filled in).
#[derive(Clone, Copy, Debug)]
pub struct FwdPlan {
    /// The kernel to launch.
    pub kernel: &'static KernelEntry,
    /// Its by-value parameter block; with a tile counter, `tile_counter` and
    /// `tile_counter_base` are left 0 here and filled in at launch.
    pub params: FwdParams,
    /// Grid in CTAs, `(x, y, z)`. A persistent cluster grid is cut at launch to the
    /// clusters that can run at once.
    pub grid: (u32, u32, u32),
    /// Threads per CTA.
    pub block: u32,
    /// Dynamic shared memory per CTA, bytes.
    pub smem_bytes: u32,
    /// TMA maps of q, k, v, o (FA3 kernels).
    pub tma: Option<[TensorMapSpec; 4]>,
    /// The launch claims tiles from a counter (`params.tile_counter`, based at
    /// `params.tile_counter_base`), moving it on by this many.
    pub tile_counter: Option<u32>,
}

/// Dynamic shared memory of a kernel.
pub fn smem_bytes(k: &KernelEntry) -> u32 {
    match k.kind {
        KernelKind::Backward(s) if s.is_main() => return bwd::SmemLayout::new(k.hdim, bwd::entry_block_m(k)).total,
        KernelKind::Backward(_) => return 0,
        KernelKind::Fp8Quantize => return 4 * common::fp8::QUANTIZE_THREADS / 32,
        KernelKind::BlockMask => return 0,
        KernelKind::Forward | KernelKind::ForwardFp8 { .. } => {}
    }
    match k.algo {
        Algo::Fa2 => fa2::smem_bytes(k.hdim),
        Algo::Fa3(_) => fa3::kernel_config(k).map_or(0, |c| c.smem().total),
    }
}

/// Threads per CTA of a kernel.
pub fn block_threads(k: &KernelEntry) -> u32 {
    match k.kind {
        KernelKind::Backward(s) if s.is_main() => return bwd::THREADS,
        KernelKind::Backward(_) => return bwd::AUX_THREADS,
        KernelKind::Fp8Quantize => return common::fp8::QUANTIZE_THREADS,
        KernelKind::BlockMask => return common::sparse::BUILD_THREADS,
        KernelKind::Forward | KernelKind::ForwardFp8 { .. } => {}
    }
    match k.algo {
        Algo::Fa2 => fa2::THREADS,
        Algo::Fa3(_) => fa3::kernel_config(k).map_or(0, |c| c.threads()),
    }
}

/// Largest grid y/z extent.
pub(crate) const MAX_GRID_YZ: usize = 65_535;
/// Sequence lengths are indexed with i32 in the kernels (with room for tile overrun).
pub(crate) const MAX_SEQLEN: usize = (i32::MAX / 2) as usize;

pub(crate) fn check_tensor(arg: Arg, t: &TensorDesc) -> Result<()> {
    let l = &t.layout;
    if l.shape.contains(&0) {
        return Err(AttnError::EmptyDim { arg, shape: l.shape });
    }
    if l.strides[3] != 1 {
        return Err(AttnError::NonContiguousLastDim { arg, stride: l.strides[3] });
    }
    let needed = l.extent().ok_or_else(|| AttnError::TooLarge(format!("{arg}: strided extent overflows")))?;
    if needed > t.buffer_len {
        return Err(AttnError::OutOfBounds { arg, needed, len: t.buffer_len });
    }
    if t.addr % 16 != 0 {
        return Err(AttnError::Misaligned { arg, detail: format!("address {:#x} is not 16-byte aligned", t.addr) });
    }
    // 16-byte vector loads of rows: every row must start on a 16-byte boundary.
    if let Some((dim, s)) = ["batch", "seqlen", "heads"].iter().zip(&l.strides).find(|(_, s)| **s % 8 != 0) {
        return Err(AttnError::Misaligned {
            arg,
            detail: format!("{dim} stride {s} is not a multiple of 8 elements (16 bytes)"),
        });
    }
    Ok(())
}

/// The checks the forward and the backward share: the LSE (`(address, elements)`) holds
/// `batch * heads_q * seqlen_q` f32 and is 4-byte aligned; the softmax scale (the
/// default's for `hdim` when not given) is finite and non-negative; sizes fit a launch.
/// Returns the scale.
/// The parameters a score modification sets, shared by the forward and the backward.
pub(crate) struct ScoreModParams {
    /// The natural-log scale of the kernel's scores, for the forward's LSE: the call's
    /// scale, `c` with soft-capping (the score is a tanh), 1 with a user variant (the
    /// score is the logit).
    pub lse_scale: f32,
    pub softcap_scale: f32,
    /// `scale · log2 e`, or with soft-capping `c · log2 e` (the score is then the tanh).
    pub scale_log2: f32,
    pub alibi_slopes: u64,
    pub alibi_batch_stride: u32,
    /// ALiBi's slope to score units: `1 / scale`, or `1 / c` after a tanh.
    pub alibi_inv_scale: f32,
}

impl ScoreModParams {
    pub(crate) fn new(score_mod: ScoreModKind, softcap: Option<f32>, alibi: Option<AlibiDesc>, batch: usize, heads_q: usize, scale: f32) -> Result<Self> {
        let cap = softcap.filter(|_| matches!(score_mod, ScoreModKind::Softcap | ScoreModKind::SoftcapAlibi));
        let mut m = ScoreModParams {
            lse_scale: cap.unwrap_or(if score_mod == ScoreModKind::User { 1.0 } else { scale }),
            softcap_scale: 0.0,
            scale_log2: scale * std::f32::consts::LOG2_E,
            alibi_slopes: 0,
            alibi_batch_stride: 0,
            alibi_inv_scale: 0.0,
        };
        if let Some(c) = cap {
            // The kernel's score is tanh(S · scale / c); c joins exp2's scale.
            m.softcap_scale = scale / c;
            m.scale_log2 = c * std::f32::consts::LOG2_E;
        }
        if score_mod == ScoreModKind::User {
            // The kernel's score is the variant's logit of `x = S · scale`.
            m.softcap_scale = scale;
            m.scale_log2 = std::f32::consts::LOG2_E;
        }
        if let Some(a) = alibi {
            let (batch_stride, inv_scale) = check_alibi(a, batch, heads_q, scale)?;
            m.alibi_slopes = a.addr;
            m.alibi_batch_stride = batch_stride;
            m.alibi_inv_scale = cap.map_or(inv_scale, |c| 1.0 / c);
        }
        Ok(m)
    }
}

/// The kernels' view of a call's variant buffer, `desc` (what the raw API passes, or what
/// the safe API took from `opts.variant`), after checking that it goes with the options.
pub(crate) fn variant_args(opts: &AttnOptions, desc: Option<VariantDesc>) -> Result<VariantArgs> {
    match (opts.variant, desc) {
        (None, None) => Ok(VariantArgs::default()),
        (None, Some(_)) => Err(AttnError::InvalidVariant("a variant buffer without AttnOptions::variant".into())),
        (Some(v), None) if v.has_data() => Err(AttnError::InvalidVariant(format!(
            "variant {:?} has a buffer, but the call passes none (the raw API takes it as its `variant` argument)",
            v.name()
        ))),
        (Some(_), d) => d.unwrap_or_default().check(),
    }
}

/// Checks a call's ALiBi slopes (enough of them, aligned, a positive scale to express the
/// bias in raw-score units) and returns the kernels' batch stride and `1 / scale`.
pub(crate) fn check_alibi(a: AlibiDesc, batch: usize, heads_q: usize, scale: f32) -> Result<(u32, f32)> {
    let needed = if a.per_batch { batch * heads_q } else { heads_q };
    if a.len < needed {
        return Err(AttnError::OutOfBounds { arg: Arg::AlibiSlopes, needed, len: a.len });
    }
    if a.addr % 4 != 0 {
        return Err(AttnError::Misaligned { arg: Arg::AlibiSlopes, detail: format!("address {:#x} is not 4-byte aligned", a.addr) });
    }
    if scale <= 0.0 {
        return Err(AttnError::Unsupported("ALiBi needs a positive softmax_scale (the kernels add the bias before it)".into()));
    }
    Ok((if a.per_batch { heads_q as u32 } else { 0 }, 1.0 / scale))
}

pub(crate) fn check_lse_scale_and_sizes(lse: (u64, usize), q_shape: [usize; 4], seqlen_k: usize, opts: &AttnOptions) -> Result<f32> {
    let [batch, seqlen_q, heads_q, hdim] = q_shape;
    let lse_needed = batch * heads_q * seqlen_q;
    if lse.1 < lse_needed {
        return Err(AttnError::OutOfBounds { arg: Arg::Lse, needed: lse_needed, len: lse.1 });
    }
    if lse.0 % 4 != 0 {
        return Err(AttnError::Misaligned { arg: Arg::Lse, detail: format!("address {:#x} is not 4-byte aligned", lse.0) });
    }
    let scale = opts.softmax_scale.unwrap_or(1.0 / (hdim as f32).sqrt());
    // The kernels keep running maxima of the scaled scores as the max of the raw ones
    // times the scale: a negative scale would turn them into minima (and overflow exp2).
    if !scale.is_finite() || scale < 0.0 {
        return Err(AttnError::InvalidScale(scale));
    }
    if seqlen_q > MAX_SEQLEN || seqlen_k > MAX_SEQLEN {
        return Err(AttnError::TooLarge(format!("sequence length over {MAX_SEQLEN}")));
    }
    if heads_q > MAX_GRID_YZ || batch > MAX_GRID_YZ {
        return Err(AttnError::TooLarge(format!(
            "batch ({batch}) and heads ({heads_q}) must each be at most {MAX_GRID_YZ}"
        )));
    }
    Ok(scale)
}

/// L2 the K/V of one section of tiles may fill (of the H100's 50 MB; FA3 uses 32 MB).
pub const SECTION_L2_BYTES: usize = 32 << 20;
/// Sections are capped at 16 heads: 64 or more lost 0-8% (short sequences: each head's
/// few tiles then run far apart in time), and 16 beat both no section and 32 at 512-2k
/// (see [`section_log2`]).
pub const SECTION_MAX_HEADS_LOG2: u32 = 4;
/// Longest key sequence measured to gain from sections.
pub const SECTION_MAX_SEQLEN_K: usize = 8192;

/// The section size of a causal call's dynamic tile order (`FwdParams::section_log2`):
/// the largest power of two dividing `heads` ((batch, head) pairs) whose K/V fit in
/// [`SECTION_L2_BYTES`] together, used only where sections were measured to win
/// (on the FA3 grid +2-6% at 2k-8k), capped at
/// 2^[`SECTION_MAX_HEADS_LOG2`] heads, and keys up to [`SECTION_MAX_SEQLEN_K`] (at 16k,
/// hdim 128 lost 2.3%). Otherwise 0 (one head per section: query blocks fastest).
pub fn section_log2(heads: usize, kv_group: usize, seqlen_k: usize, hdim: usize) -> u32 {
    // K and V, 2 bytes per element; `kv_group` query heads read one K/V head.
    let kv_bytes = |n: usize| n.div_ceil(kv_group.max(1)) * seqlen_k * hdim * 4;
    let mut k = 0;
    while k < heads.trailing_zeros() && kv_bytes(2 << k) <= SECTION_L2_BYTES {
        k += 1;
    }
    if seqlen_k > SECTION_MAX_SEQLEN_K { 0 } else { k.min(SECTION_MAX_HEADS_LOG2) }
}

/// CTAs of a persistent grid for `units` units of work on `sm_count` SMs, in whole
/// clusters of `cluster`: one per SM, never more than the units.
pub(crate) fn persistent_ctas(units: usize, sm_count: u32, cluster: usize) -> usize {
    units.min((sm_count as usize / cluster).max(1)) * cluster
}

pub(crate) fn strides(l: &Layout) -> Strides {
    Strides { batch: l.strides[0] as u64, row: l.strides[1] as u64, head: l.strides[2] as u64 }
}

/// Validates a forward call and plans its launch on a GPU with `sm_count` SMs.
pub fn plan_forward(
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
    sm_count: u32,
) -> Result<FwdPlan> {
    if q.dtype != k.dtype || q.dtype != v.dtype {
        return Err(AttnError::DTypeMismatch { q: q.dtype, k: k.dtype, v: v.dtype });
    }
    if out.dtype != q.dtype {
        return Err(AttnError::OutDType { q: q.dtype, out: out.dtype });
    }
    for (arg, t) in [(Arg::Q, q), (Arg::K, k), (Arg::V, v), (Arg::Out, out)] {
        check_tensor(arg, t)?;
    }
    let [batch, seqlen_q, heads_q, hdim] = q.layout.shape;
    let [batch_k, seqlen_k, heads_k, hdim_k] = k.layout.shape;
    if batch_k != batch {
        return Err(AttnError::ShapeMismatch(format!("q has batch {batch}, k has {batch_k}")));
    }
    if v.layout.shape != k.layout.shape {
        return Err(AttnError::ShapeMismatch(format!(
            "k and v must have one shape; k {:?}, v {:?}",
            k.layout.shape, v.layout.shape
        )));
    }
    if hdim_k != hdim {
        return Err(AttnError::ShapeMismatch(format!("q has head dim {hdim}, k/v have {hdim_k}")));
    }
    if out.layout.shape != q.layout.shape {
        return Err(AttnError::ShapeMismatch(format!(
            "out must have q's shape {:?}, got {:?}",
            q.layout.shape, out.layout.shape
        )));
    }
    if !HEAD_DIMS.contains(&(hdim as u32)) {
        return Err(AttnError::UnsupportedHeadDim { hdim, supported: &HEAD_DIMS });
    }
    if heads_q % heads_k != 0 {
        return Err(AttnError::HeadsNotDivisible { heads_q, heads_k });
    }
    let scale = check_lse_scale_and_sizes(lse, [batch, seqlen_q, heads_q, hdim], seqlen_k, opts)?;

    // The schedule depends only on whether the kernel is warp-specialized and has every
    // technique (multicast), which every default is (whatever the cluster).
    let algo = opts.algo.unwrap_or(Algo::Fa3(Techniques::FULL));
    let score_mod = opts.score_mod(alibi.is_some())?;
    if score_mod != ScoreModKind::None && algo != Algo::Fa3(Techniques::FULL) {
        return Err(AttnError::Unsupported(format!("{score_mod:?} has kernels only for FlashAttention-3 with every technique (not {algo:?})")));
    }
    let mask_plan = opts.mask(batch, seqlen_q, seqlen_k, documents, score_mod)?;
    let mask = mask_plan.kind;
    let local = mask.is_local();
    if let Some(s) = sinks {
        s.check(Arg::Sinks, heads_q)?;
        if !matches!(algo, Algo::Fa3(_)) {
            return Err(AttnError::Unsupported("attention sinks have no FlashAttention-2 kernel".into()));
        }
    }
    if local && algo != Algo::Fa3(Techniques::FULL) {
        return Err(AttnError::Unsupported(format!("sliding windows and documents have kernels only for FlashAttention-3 with every technique (not {algo:?})")));
    }
    let tile_rows = fa3::block_m(hdim as u32) as usize;
    let schedule = match (opts.schedule, algo) {
        // Without a mask every tile costs the same unless the last query block is short;
        // then the static order, whose stride (the SM count) is often a multiple of
        // the blocks per head, hands every short tile to the same few CTAs (hdim 64 at
        // 1k: 6 blocks of 192 rows, 132 SMs): the counter balances them (+5% there).
        // Long hdim 128 calls without a mask: pairs of CTAs share each K/V tile over a
        // cluster, half the L2 reads.
        (Schedule::Auto, Algo::Fa3(t))
            if !opts.causal
                && !local
                && t == Techniques::FULL
                && score_mod == ScoreModKind::None
                && fa3::multicast_pays(hdim as u32, seqlen_q as u32, seqlen_k as u32) =>
        {
            Schedule::PersistentMulticast
        }
        // A window's first and last tiles see fewer keys than the others: the counter.
        (Schedule::Auto, Algo::Fa3(_)) if !opts.causal && !local && opts.block_mask.is_none() && seqlen_q % tile_rows == 0 => Schedule::Persistent,
        (Schedule::Auto, Algo::Fa3(t)) if t.warp_specialized => Schedule::PersistentDynamic,
        (Schedule::Auto, _) => Schedule::TilePerCta,
        (Schedule::PersistentDynamic, Algo::Fa3(t)) if !t.warp_specialized => {
            return Err(AttnError::Unsupported(
                "the dynamic persistent schedule needs a warp-specialized kernel (a producer claims the tiles)".into(),
            ));
        }
        (Schedule::PersistentMulticast, _) if score_mod != ScoreModKind::None => {
            return Err(AttnError::Unsupported(format!("multicast clusters have no {score_mod:?} kernel")));
        }
        (Schedule::PersistentMulticast, _) if local => {
            return Err(AttnError::Unsupported("multicast clusters have no sliding-window or document kernel".into()));
        }
        (Schedule::PersistentMulticast, _) if opts.causal => {
            return Err(AttnError::Unsupported(
                "multicast clusters need every query block to visit the same key blocks (no causal mask)".into(),
            ));
        }
        (s, _) => s,
    };
    let cluster = if schedule == Schedule::PersistentMulticast { fa3::MULTICAST_CLUSTER } else { 1 };
    let block_mask = opts.block_mask_args(variant, [batch, seqlen_q, seqlen_k, heads_q, heads_k, hdim])?;
    let kernel = if score_mod == ScoreModKind::User {
        common::variant::find_forward(hdim as u32, q.dtype, opts.block_mask.is_some())
    } else {
        common::find_kernel(algo, hdim as u32, q.dtype, cluster, seqlen_k as u32, score_mod, mask)
    }
    .ok_or(AttnError::NoKernel { algo, hdim, dtype: q.dtype })?;
    let mut params = FwdParams {
        q: q.addr,
        k: k.addr,
        v: v.addr,
        o: out.addr,
        lse: lse.0,
        q_strides: strides(&q.layout),
        k_strides: strides(&k.layout),
        v_strides: strides(&v.layout),
        o_strides: strides(&out.layout),
        batch: batch as u32,
        heads_q: heads_q as u32,
        heads_k: heads_k as u32,
        kv_group: (heads_q / heads_k) as u32,
        seqlen_q: seqlen_q as u32,
        seqlen_k: seqlen_k as u32,
        scale_log2: scale * std::f32::consts::LOG2_E,
        softmax_scale: scale,
        causal: opts.causal as u32,
        softcap_scale: 0.0,
        alibi_slopes: 0,
        alibi_batch_stride: 0,
        alibi_inv_scale: 0.0,
        window: mask_plan.window,
        docs: mask_plan.docs,
        sinks: sinks.map_or(0, |s| s.addr),
        tile_counter: 0,
        section_log2: 0,
        tile_counter_base: 0,
        fp8: Default::default(),
        variant: Default::default(),
        block_mask,
    };
    let m = ScoreModParams::new(score_mod, opts.softcap, alibi, batch, heads_q, scale)?;
    (params.softcap_scale, params.scale_log2) = (m.softcap_scale, m.scale_log2);
    (params.alibi_slopes, params.alibi_batch_stride, params.alibi_inv_scale) = (m.alibi_slopes, m.alibi_batch_stride, m.alibi_inv_scale);
    // The LSE is `softmax_scale · max + ln(sum)`: with soft-capping the max is a tanh,
    // with a user variant the logit.
    params.softmax_scale = m.lse_scale;
    params.variant = variant_args(opts, variant)?;
    let (grid, tile_counter) = match algo {
        Algo::Fa2 => ((seqlen_q.div_ceil(fa2::BLOCK_M as usize) as u32, heads_q as u32, batch as u32), None),
        Algo::Fa3(_) => {
            let cfg = fa3::kernel_config(kernel).ok_or(AttnError::NoKernel { algo, hdim, dtype: q.dtype })?;
            let block_m = cfg.block_m();
            let cluster = cluster as usize;
            // Units of work: one query block, or in a cluster one block per CTA.
            let units = seqlen_q.div_ceil(block_m as usize).div_ceil(cluster) * heads_q * batch;
            if units * cluster > i32::MAX as usize {
                return Err(AttnError::TooLarge(format!("{units} tiles of {block_m} query rows")));
            }
            let persistent = persistent_ctas(units, sm_count, cluster);
            match schedule {
                Schedule::TilePerCta => ((units as u32, 1, 1), None),
                // Dynamic only pays off with more tiles than CTAs.
                Schedule::PersistentDynamic => {
                    // Every tile past the first `persistent` is one claim, and every CTA
                    // makes one failing claim: the counter moves on by `units`.
                    ((persistent as u32, 1, 1), (units > persistent).then_some(units as u32))
                }
                _ => ((persistent as u32, 1, 1), None),
            }
        }
    };
    if tile_counter.is_some() && opts.causal {
        params.section_log2 = section_log2(batch * heads_q, heads_q / heads_k, seqlen_k, hdim);
    }
    let tma = match algo {
        Algo::Fa2 => None,
        Algo::Fa3(_) => {
            let cfg = fa3::kernel_config(kernel).ok_or(AttnError::NoKernel { algo, hdim, dtype: q.dtype })?;
            let chunks = hdim as u32 / 64;
            let map = |arg, t: &TensorDesc, rows, chunks| TensorMapSpec::bshd(arg, t.dtype, t.addr, &t.layout, rows, chunks);
            // Multicast: each CTA of a cluster loads 1/cluster of a K/V tile's rows, one
            // 64-column chunk per copy (a half tile is not contiguous across chunks).
            let (kv_rows, kv_chunks) = if cluster > 1 { (cfg.block_n / cluster, 1) } else { (cfg.block_n, chunks) };
            let maps = [
                map(Arg::Q, q, cfg.block_m(), chunks)?,
                map(Arg::K, k, kv_rows, kv_chunks)?,
                map(Arg::V, v, kv_rows, kv_chunks)?,
                // O leaves one 64-row, 64-column chunk per store.
                map(Arg::Out, out, 64, 1)?,
            ];
            Some(maps)
        }
    };
    Ok(FwdPlan { kernel, params, grid, block: block_threads(kernel), smem_bytes: smem_bytes(kernel), tma, tile_counter })
}
