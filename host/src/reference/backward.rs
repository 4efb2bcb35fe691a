//! CPU references for the attention backward pass: given q, k, v and dO (`dout`), the
//! gradients dQ, dK, dV of the loss `sum(dO ∘ O)`, packed like q, k, v.
//!
//! - [`attention_backward_f64`]: the exact closed form in f64, the ground truth;
//! - [`attention_backward_lowp`]: the straightforward low-precision backward (f32
//!   accumulation, GEMM operands P and dS rounded to the input dtype, outputs rounded),
//!   whose error sizes the budget a kernel is allowed (FlashAttention's 2x rule, see
//!   [`within_budget`](super::within_budget));
//! - [`attention_backward_tiled`]: the FlashAttention-2/3 recompute backward itself
//!   (D = rowsum(dO ∘ O), LSE in base 2, per K/V block a loop over the query blocks that
//!   can see it, P and dS recomputed per tile, f32 accumulators, final scaling), so the
//!   algorithm is tested without a GPU.
//!
//! With `P = softmax(scale · Q Kᵀ)` (masked entries 0), the gradients are
//! `dV = Pᵀ dO`, `dP = dO Vᵀ`, `D_i = rowsum(dO_i ∘ O_i) = rowsum(P_i ∘ dP_i)`,
//! `dS = P ∘ (dP − D)`, `dQ = scale · dS K`, `dK = scale · dSᵀ Q`. With GQA the dK and dV of
//! a K/V head are the sums over the query heads that share it.
//!
//! All three run on one engine: for every query row (dQ) and every key row (dK, dV), a
//! loop over the (query block, key block) tiles the kernel visits, each tile's product
//! summed on its own before it joins the accumulator, as a tensor-core GEMM tile does.
//! The references differ only in how a visible (row, key) pair's P and dS are computed
//! and rounded, and in the tiling (the exact and naive ones use one tile). Each row of a
//! tile depends on that row alone, so computing the tile row by row, with dQ in a pass
//! over query rows and dK/dV in a pass over key rows, gives the tile's values; the dQ
//! sum over key blocks is in key-block order (the deterministic kernel's order).
//!
//! Causal masks are bottom-right aligned, as in the forward: query `i` sees key `j` iff
//! `j <= i + seqlen_k - seqlen_q`. A row that sees no key (LSE = +inf) has dQ = 0 and
//! adds nothing to dK and dV.
use super::{AttnResult, HostTensor, Problem, attention_f64, attention_lowp, for_each_row, max_abs_err};
use crate::tensor::round_to;
use common::DType;

/// Gradients of attention: `dq` packed like q, `dk` like k, `dv` like v.
#[derive(Clone, Debug)]
pub struct Grads<T> {
    /// dL/dq, `[batch, seqlen_q, heads_q, hdim]`.
    pub dq: Vec<T>,
    /// dL/dk, `[batch, seqlen_k, heads_k, hdim]` (summed over the query heads of a group).
    pub dk: Vec<T>,
    /// dL/dv, `[batch, seqlen_k, heads_k, hdim]` (summed over the query heads of a group).
    pub dv: Vec<T>,
}

impl<T: Copy + Into<f64>> Grads<T> {
    /// [`max_abs_err`] of dQ, dK and dV against a reference.
    pub fn max_abs_err(&self, want: &Grads<f64>) -> [f64; 3] {
        [max_abs_err(&self.dq, &want.dq), max_abs_err(&self.dk, &want.dk), max_abs_err(&self.dv, &want.dv)]
    }
}

/// Tile shape of [`attention_backward_tiled`]: `block_m` query rows by `block_n` key rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BwdTiling {
    /// Query rows of a tile.
    pub block_m: usize,
    /// Key rows of a tile (one K/V block, loaded once per CTA on the GPU).
    pub block_n: usize,
}

/// The first query block (of `block_m` rows) that sees any key of key block
/// `block_n_index` (of `block_n` keys) under the bottom-right causal mask; the number of
/// query blocks, `seqlen_q.div_ceil(block_m)`, if no query sees it.
///
/// The first key of the block, `n·N`, is the easiest to see: row `i` sees it iff
/// `i >= n·N + seqlen_q - seqlen_k`, so the first row that sees anything in the block is
/// `max(0, n·N + seqlen_q - seqlen_k)` and its block is the first one visited. Every
/// later block contains a row at or past it (its last row), every earlier one does not.
pub fn causal_first_query_block(
    block_n_index: usize,
    block_m: usize,
    block_n: usize,
    seqlen_q: usize,
    seqlen_k: usize,
) -> usize {
    assert!(block_m > 0 && block_n > 0, "empty tile {block_m} x {block_n}");
    let first_row = (block_n_index * block_n + seqlen_q).saturating_sub(seqlen_k);
    if first_row >= seqlen_q { seqlen_q.div_ceil(block_m) } else { first_row / block_m }
}

/// The (query block, key block) tiles the backward visits, in the kernel's order: key
/// blocks outer, then the query blocks that can see each (all of them without a mask,
/// from [`causal_first_query_block`] on with one). A key block that no query sees has
/// no tile (its dK and dV are 0).
pub fn visited_block_pairs(causal: bool, tiling: BwdTiling, seqlen_q: usize, seqlen_k: usize) -> Vec<(usize, usize)> {
    let BwdTiling { block_m, block_n } = tiling;
    (0..seqlen_k.div_ceil(block_n))
        .flat_map(|n| {
            let first = first_query_block(causal, n, tiling, seqlen_q, seqlen_k);
            (first..seqlen_q.div_ceil(block_m)).map(move |m| (m, n))
        })
        .collect()
}

/// The query rows of batch `b` that see key `j` (the transpose of
/// [`Problem::visible_range`]): row `i` sees it iff `j − off − right <= i <= j − off + left`,
/// `off = seqlen_k − seqlen_q`, with the causal mask's `right = 0`, and with documents iff
/// its position `i + off` is in `j`'s document.
pub fn rows_seeing(p: &Problem<'_>, b: usize, j: usize) -> std::ops::Range<usize> {
    let (sq, sk) = (p.q.shape[1] as i64, p.k.shape[1] as i64);
    let (left, mut right) = p.window.map_or((None, None), |w| (w.left, w.right));
    if p.causal {
        right = Some(right.map_or(0, |r| r.min(0)));
    }
    let anti = j as i64 - (sk - sq);
    let mut lo = right.map_or(0, |r| (anti - r as i64).max(0)).min(sq);
    let mut hi = left.map_or(sq, |l| (anti + l as i64 + 1).clamp(0, sq));
    if let Some(d) = p.docs {
        let doc = d.run(b, j, sk as usize);
        lo = lo.max(doc.start as i64 - (sk - sq));
        hi = hi.min(doc.end as i64 - (sk - sq));
    }
    lo as usize..(hi.max(lo)) as usize
}

/// The query blocks (of `tiling.block_m` rows) of batch `b` that visit key block `n` (of
/// `tiling.block_n` keys): those with a row that sees one of its keys. Both ends move up
/// with the key, so they come from the block's first and last keys.
pub fn query_block_range(p: &Problem<'_>, b: usize, n: usize, tiling: BwdTiling) -> std::ops::Range<usize> {
    let sk = p.k.shape[1];
    let keys = n * tiling.block_n..((n + 1) * tiling.block_n).min(sk);
    if keys.is_empty() {
        return 0..0;
    }
    let (first, last) = (rows_seeing(p, b, keys.start), rows_seeing(p, b, keys.end - 1));
    let (lo, hi) = (first.start, last.end);
    if lo >= hi { 0..0 } else { lo / tiling.block_m..hi.div_ceil(tiling.block_m) }
}

/// The first query block visited for key block `n`, with or without the mask.
fn first_query_block(causal: bool, n: usize, tiling: BwdTiling, seqlen_q: usize, seqlen_k: usize) -> usize {
    if causal { causal_first_query_block(n, tiling.block_m, tiling.block_n, seqlen_q, seqlen_k) } else { 0 }
}

/// Exact gradients in f64 (P from the exact LSE, D from the exact O).
pub fn attention_backward_f64(p: &Problem<'_>, dout: &HostTensor) -> Grads<f64> {
    let fwd = attention_f64(p);
    backward_naive(p, dout, &fwd, None)
}

/// The straightforward low-precision backward, whose error against
/// [`attention_backward_f64`] sizes a kernel's budget. Inputs (q, k, v, dout) are taken as
/// already rounded to `dtype`. O and LSE come from [`attention_lowp`] (O rounded to
/// `dtype`); D = rowsum(dO ∘ O) in f32; P = exp(scale·s − LSE) in f32, then stored in
/// `dtype` (so the rounded P also enters dS, as in a framework's non-upcast autograd);
/// dS = P ∘ (dP − D) rounded to `dtype` before its GEMMs; f32 accumulation; dQ, dK, dV
/// rounded to `dtype`.
pub fn attention_backward_lowp(p: &Problem<'_>, dout: &HostTensor, dtype: DType) -> Grads<f32> {
    let fwd = attention_lowp(p, dtype);
    backward_naive(p, dout, &fwd, Some(dtype))
}

/// Exact gradient of the sink logits (`p.sinks`, `[heads_q]`) in f64: a sink's
/// probability `exp(sink_h − LSE_i)` times its `dP` (0: it has no value) less `D_i`,
/// summed over the head's rows of every batch: `−Σ exp(sink_h − LSE_i) · D_i`. Empty
/// without sinks. (dQ, dK and dV need nothing more: the LSE includes the sink.)
pub fn sink_grads_f64(p: &Problem<'_>, dout: &HostTensor) -> Vec<f64> {
    sink_grads(p, dout, &attention_f64(p))
}

/// [`sink_grads_f64`] in f32 from the naive low-precision forward (its budget).
pub fn sink_grads_lowp(p: &Problem<'_>, dout: &HostTensor, dtype: DType) -> Vec<f32> {
    sink_grads(p, dout, &attention_lowp(p, dtype))
}

/// `−Σ exp(sink_h − LSE_i) · D_i` per head, from a forward's O and LSE.
fn sink_grads<T: Real>(p: &Problem<'_>, dout: &HostTensor, fwd: &AttnResult<T>) -> Vec<T> {
    sink_grad_terms(p, dout, fwd).into_iter().map(|(g, _)| g).collect()
}

/// Per head: the sinks' gradient and the sum of its terms' magnitudes
/// `Σ exp(sink_h − LSE_i) · |D_i|` (the scale of its rounding error).
fn sink_grad_terms<T: Real>(p: &Problem<'_>, dout: &HostTensor, fwd: &AttnResult<T>) -> Vec<(T, T)> {
    let Some(sinks) = p.sinks else { return Vec::new() };
    let (b, sq, _, hq, _, _) = p.dims();
    let delta = row_dots(dout, &fwd.o);
    let mut g = vec![(T::default(), T::default()); hq];
    for bi in 0..b {
        for (h, (gh, mag)) in g.iter_mut().enumerate() {
            for i in 0..sq {
                let r = (bi * hq + h) * sq + i;
                let w = (T::of(sinks[h]) - fwd.lse[r]).exp();
                *gh += T::default() - w * delta[r];
                *mag += w * delta[r].abs();
            }
        }
    }
    g
}

/// The sinks' gradient in f64 from a given forward's `o` (packed like q) and `lse`
/// (natural log), e.g. a kernel's: what a backward given those outputs must compute,
/// up to f32 rounding. Per head: the gradient and `Σ exp(sink_h − LSE_i) · |D_i|`.
pub fn sink_grads_given(p: &Problem<'_>, dout: &HostTensor, o: &[f32], lse: &[f32]) -> Vec<(f64, f64)> {
    let fwd = AttnResult { o: o.iter().map(|&x| x as f64).collect(), lse: lse.iter().map(|&x| x as f64).collect() };
    sink_grad_terms(p, dout, &fwd)
}

/// The FlashAttention-2/3 recompute backward in f32, as the GPU kernel runs it:
///
/// 1. preprocess: D = rowsum(dO ∘ O) in f32, LSE in base 2 (`lse · log2 e`; a +inf row
///    gives P = 0);
/// 2. per query head and key block of `block_n` keys, a loop over the query blocks of
///    `block_m` rows that can see it ([`visited_block_pairs`]); per tile: S = Q Kᵀ,
///    P = exp2(S · scale · log2 e − LSE₂) (masked entries 0), dP = dO Vᵀ,
///    dS = P ∘ (dP − D) with the f32 P, then dV += Pᵀ dO, dK += dSᵀ Q, dQ += dS K, each
///    tile's product summed on its own before it is added to the f32 accumulator;
/// 3. postprocess: dQ ·= scale, dK ·= scale; with GQA, dK and dV summed in f32 over the
///    query heads of a group.
///
/// `o` (packed like q) and `lse` (`[batch, heads_q, seqlen_q]`, natural log) are the
/// forward's outputs, e.g. from [`attention_tiled`](super::attention_tiled).
/// `op_dtype`: round P and dS to this type before the GEMMs, as the tensor cores'
/// operands are, and dQ, dK, dV at the end, as the kernel stores them; `None` keeps f32.
pub fn attention_backward_tiled(
    p: &Problem<'_>,
    dout: &HostTensor,
    o: &[f32],
    lse: &[f32],
    tiling: BwdTiling,
    op_dtype: Option<DType>,
) -> Grads<f32> {
    let (_, sq, _, hq, hk, _) = p.dims();
    assert_eq!(lse.len(), p.q.shape[0] * hq * sq, "lse is not [batch, heads_q, seqlen_q]");
    let delta = row_dots(dout, o);
    let lse2: Vec<f32> = lse.iter().map(|&l| l * std::f32::consts::LOG2_E).collect();
    let scale_log2 = p.scale * std::f32::consts::LOG2_E;
    let group = hq / hk;
    let pair = |b: usize, h: usize, i: usize, j: usize| {
        let r = (b * hq + h) * sq + i;
        let s: f32 = dot(p.q.row(b, i, h), p.k.row(b, j, h / group));
        // Soft-capping as the kernel: t = tanh(s · scale / c), P = exp2(t · c log2 e − LSE₂),
        // dS times 1 − t².
        // ALiBi as the kernel: the bias joins the score in its units (raw-score units
        // before the scale; after the tanh, tanh units).
        let bias = p.alibi_bias(b, h, i, j);
        let (pij, grad) = match p.softcap {
            // A user variant as the kernel: its logit of `s · scale`, in log2 units.
            _ if p.variant.is_some() => match p.variant_logit((s * p.scale) as f64, b, h, i, j) {
                Some((logit, grad)) => ((logit as f32).mul_add(std::f32::consts::LOG2_E, -lse2[r]).exp2(), grad as f32),
                None => (0.0, 0.0),
            },
            None => ((s - bias / p.scale).mul_add(scale_log2, -lse2[r]).exp2(), 1.0),
            Some(c) => {
                let t = (s * (p.scale / c)).tanh();
                ((t - bias / c).mul_add(c * std::f32::consts::LOG2_E, -lse2[r]).exp2(), 1.0 - t * t)
            }
        };
        let dp: f32 = dot(dout.row(b, i, h), p.v.row(b, j, h / group));
        let ds = pij * (dp - delta[r]) * grad;
        (pij.rounded(op_dtype), ds.rounded(op_dtype))
    };
    backward_tiles(p, dout, tiling, op_dtype, pair)
}

/// The exact (`T = f64`, `dtype = None`) and naive low-precision (`T = f32`) backward:
/// P from the forward's LSE and D from its O, P and dS rounded to `dtype`, one tile.
fn backward_naive<T: Real>(p: &Problem<'_>, dout: &HostTensor, fwd: &AttnResult<T>, dtype: Option<DType>) -> Grads<T> {
    let (_, sq, sk, hq, hk, _) = p.dims();
    let delta = row_dots(dout, &fwd.o);
    let (scale, group) = (T::of(p.scale), hq / hk);
    let pair = |b: usize, h: usize, i: usize, j: usize| {
        let r = (b * hq + h) * sq + i;
        let s: T = dot(p.q.row(b, i, h), p.k.row(b, j, h / group));
        // The logit and its derivative by `scale · s` (1, or 1 − tanh² with soft-capping,
        // or a user variant's, in f32 as the kernels evaluate it; a hidden pair has P = 0).
        let (logit, grad) = match p.variant {
            Some(_) => match p.variant_logit((s * scale).to_f64(), b, h, i, j) {
                Some((l, g)) => (T::of_f64(l), T::of_f64(g)),
                None => return (T::default(), T::default()),
            },
            None => T::logit(s * scale, p.softcap),
        };
        let logit = logit - T::of(p.alibi_bias(b, h, i, j));
        let pij = (logit - fwd.lse[r]).exp().rounded(dtype);
        let dp: T = dot(dout.row(b, i, h), p.v.row(b, j, h / group));
        (pij, (pij * (dp - delta[r]) * grad).rounded(dtype))
    };
    backward_tiles(p, dout, BwdTiling { block_m: sq.max(1), block_n: sk.max(1) }, dtype, pair)
}

/// The engine of all three references. `pair(b, h, i, j)` gives the GEMM operands
/// `(P_ij, dS_ij)` of a visible (query row, key) pair; invisible pairs are 0 and skipped.
/// dQ = scale · Σ dS K and dK = scale · Σ dSᵀ Q, dV = Σ Pᵀ dO, summed per visited tile,
/// then over tiles, then (dK, dV) over the query heads of a K/V head; the outputs are
/// rounded to `out_dtype`.
fn backward_tiles<T: Real>(
    p: &Problem<'_>,
    dout: &HostTensor,
    tiling: BwdTiling,
    out_dtype: Option<DType>,
    pair: impl Fn(usize, usize, usize, usize) -> (T, T) + Sync,
) -> Grads<T> {
    let (_, _, sk, hq, hk, d) = p.dims();
    assert_eq!(dout.shape, p.q.shape, "dout must be shaped like q");
    let BwdTiling { block_m, block_n } = tiling;
    assert!(block_m > 0 && block_n > 0, "empty tile {block_m} x {block_n}");
    let (scale, group) = (T::of(p.scale), hq / hk);
    let blocks_of = |b, n| query_block_range(p, b, n, tiling);

    // dQ, per query row: its query block's tile with every key block that visits it.
    let dq = for_each_row(p, |b, h, i, dq| {
        let (m, keys) = (i / block_m, p.visible_range(b, i));
        let mut tile = vec![T::default(); d];
        for n in 0..sk.div_ceil(block_n) {
            let cols = (n * block_n).max(keys.start)..((n + 1) * block_n).min(keys.end);
            if !blocks_of(b, n).contains(&m) {
                debug_assert!(cols.is_empty(), "row {i} sees key block {n}, which skips its query block");
                continue;
            }
            tile.fill(T::default());
            for j in cols {
                axpy(&mut tile, pair(b, h, i, j).1, p.k.row(b, j, h / group));
            }
            add(dq, &tile);
        }
        dq.iter_mut().for_each(|x| *x = (*x * scale).rounded(out_dtype));
        T::default()
    })
    .o;

    // dK, dV, per key row: its key block's tiles with the query blocks it visits, for
    // every query head of its K/V head.
    let (dk, dv) = for_each_key_row(p, |b, kv, j, dk, dv| {
        let rows = rows_seeing(p, b, j);
        let (mut head_k, mut head_v) = (vec![T::default(); d], vec![T::default(); d]);
        let (mut tile_k, mut tile_v) = (vec![T::default(); d], vec![T::default(); d]);
        for h in kv * group..(kv + 1) * group {
            head_k.fill(T::default());
            head_v.fill(T::default());
            for m in blocks_of(b, j / block_n) {
                tile_k.fill(T::default());
                tile_v.fill(T::default());
                for i in (m * block_m).max(rows.start)..((m + 1) * block_m).min(rows.end) {
                    let (pij, ds) = pair(b, h, i, j);
                    axpy(&mut tile_v, pij, dout.row(b, i, h));
                    axpy(&mut tile_k, ds, p.q.row(b, i, h));
                }
                add(&mut head_k, &tile_k);
                add(&mut head_v, &tile_v);
            }
            dk.iter_mut().zip(&head_k).for_each(|(a, &x)| *a += x * scale);
            add(dv, &head_v);
        }
        for x in dk.iter_mut().chain(dv.iter_mut()) {
            *x = x.rounded(out_dtype);
        }
    });
    Grads { dq, dk, dv }
}

/// Runs `row_fn(b, kv_head, j, dk_row, dv_row)` for every key row, in parallel:
/// [`for_each_row`] over a problem whose "queries" are the keys, so its rows are the key
/// rows and its output is packed like k.
fn for_each_key_row<T: Copy + Send + Sync + Default>(
    p: &Problem<'_>,
    row_fn: impl Fn(usize, usize, usize, &mut [T], &mut [T]) + Sync,
) -> (Vec<T>, Vec<T>) {
    let keys = Problem { q: p.k, k: p.k, v: p.v, causal: false, scale: p.scale, softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None };
    let d = p.k.shape[3];
    let rows = for_each_row(&keys, |b, kv, j, out: &mut [(T, T)]| {
        let (mut dk, mut dv) = (vec![T::default(); d], vec![T::default(); d]);
        row_fn(b, kv, j, &mut dk, &mut dv);
        out.iter_mut().zip(dk.into_iter().zip(dv)).for_each(|(o, kv)| *o = kv);
        Default::default()
    });
    rows.o.into_iter().unzip()
}

/// D = rowsum(dO ∘ O) in `T`, laid out like the LSE (`[batch, heads_q, seqlen_q]`).
fn row_dots<T: Real>(dout: &HostTensor, o: &[T]) -> Vec<T> {
    let [b, sq, hq, d] = dout.shape;
    assert_eq!(o.len(), dout.data.len(), "O must be shaped like dout");
    let mut delta = vec![T::default(); b * hq * sq];
    for (bi, i, h) in (0..b).flat_map(|bi| (0..sq).flat_map(move |i| (0..hq).map(move |h| (bi, i, h)))) {
        let at = ((bi * sq + i) * hq + h) * d;
        delta[(bi * hq + h) * sq + i] =
            dout.data[at..at + d].iter().zip(&o[at..at + d]).fold(T::default(), |s, (&a, &x)| s + T::of(a) * x);
    }
    delta
}

/// `a · b` accumulated in `T`.
fn dot<T: Real>(a: &[f32], b: &[f32]) -> T {
    a.iter().zip(b).fold(T::default(), |s, (&x, &y)| s + T::of(x) * T::of(y))
}

/// `acc += w · x`.
fn axpy<T: Real>(acc: &mut [T], w: T, x: &[f32]) {
    acc.iter_mut().zip(x).for_each(|(a, &x)| *a += w * T::of(x));
}

/// `acc += x`.
fn add<T: Real>(acc: &mut [T], x: &[T]) {
    acc.iter_mut().zip(x).for_each(|(a, &x)| *a += x);
}

/// The accumulation types of the references: f64 (exact) and f32.
trait Real:
    Copy
    + Default
    + Send
    + Sync
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::AddAssign
{
    fn of(x: f32) -> Self;
    fn of_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn exp(self) -> Self;
    fn abs(self) -> Self;
    /// The logit of a scaled score and its derivative: `(x, 1)`, or with soft-capping at
    /// `c`, `(c · tanh(x / c), 1 − tanh²(x / c))`.
    fn logit(x: Self, softcap: Option<f32>) -> (Self, Self);
    /// Rounded to `dtype` (a tensor-core operand or a stored output); `None` keeps it.
    fn rounded(self, dtype: Option<DType>) -> Self;
}

impl Real for f32 {
    fn of(x: f32) -> Self {
        x
    }
    fn of_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn abs(self) -> Self {
        f32::abs(self)
    }
    fn exp(self) -> Self {
        f32::exp(self)
    }
    fn logit(x: Self, softcap: Option<f32>) -> (Self, Self) {
        softcap.map_or((x, 1.0), |c| {
            let t = (x / c).tanh();
            (c * t, 1.0 - t * t)
        })
    }
    fn rounded(self, dtype: Option<DType>) -> Self {
        dtype.map_or(self, |t| round_to(t, self))
    }
}

impl Real for f64 {
    fn of(x: f32) -> Self {
        x as f64
    }
    fn of_f64(x: f64) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn abs(self) -> Self {
        f64::abs(self)
    }
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn logit(x: Self, softcap: Option<f32>) -> (Self, Self) {
        softcap.map_or((x, 1.0), |c| {
            let t = (x / c as f64).tanh();
            (c as f64 * t, 1.0 - t * t)
        })
    }
    fn rounded(self, dtype: Option<DType>) -> Self {
        assert!(dtype.is_none(), "the f64 reference is never rounded");
        self
    }
}
