//! CPU references for attention, on packed `[batch, seqlen, heads, hdim]` host tensors.
//!
//! - [`attention_f64`]: exact attention accumulated in f64, the ground truth;
//! - [`attention_lowp`]: the straightforward low-precision implementation (f32
//!   accumulation, P rounded to the input dtype before PV, O rounded), whose error
//!   sizes the budget a kernel is allowed (FlashAttention's rule: at most twice it);
//! - [`fp8`]: FP8 (e4m3) quantization, incoherent processing, and attention with e4m3
//!   rounding of Q, K, V and P;
//! - [`attention_tiled`]: the FlashAttention-2 algorithm itself (tiles, online softmax
//!   in base 2, unscaled accumulator, one final rescale, causal block skipping), so the
//!   algorithm is tested without a GPU.
//!
//! Causal masks are bottom-right aligned: query `i` sees key `j` iff
//! `j <= i + seqlen_k - seqlen_q`. A row that sees no key gets O = 0 and LSE = +inf.
pub mod backward;
pub mod fp8;

use crate::tensor::round_to;
use common::DType;
use common::fa3::RESCALE_THRESHOLD_LOG2;
use common::variant::{self, Coords, Variant};
use rand::{Rng, SeedableRng, rngs::StdRng};
use rand_distr::{Distribution, Normal};

/// A packed host tensor `[batch, seqlen, heads, hdim]`.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// `[batch, seqlen, heads, hdim]`.
    pub shape: [usize; 4],
    /// The values in packed row-major order, as many as the shape holds.
    pub data: Vec<f32>,
}

impl HostTensor {
    /// Wraps packed row-major `data`; panics if its length does not match `shape`.
    pub fn new(shape: [usize; 4], data: Vec<f32>) -> Self {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "data does not match shape {shape:?}");
        HostTensor { shape, data }
    }

    /// `N(0, std^2)` values, rounded to `dtype` so the GPU sees exactly the same numbers.
    pub fn randn(shape: [usize; 4], dtype: DType, std: f32, rng: &mut impl Rng) -> Self {
        let dist = Normal::new(0.0f32, std).expect("finite std");
        let n = shape.iter().product();
        HostTensor { shape, data: (0..n).map(|_| round_to(dtype, dist.sample(rng))).collect() }
    }

    /// The `hdim` values at `[b, s, h, :]`.
    #[inline]
    pub fn row(&self, b: usize, s: usize, h: usize) -> &[f32] {
        let [_, sl, hl, d] = self.shape;
        let o = ((b * sl + s) * hl + h) * d;
        &self.data[o..o + d]
    }
}

/// A seeded RNG (fresh seeds come from the caller, printed on failure).
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// One attention problem on host tensors.
#[derive(Clone, Copy, Debug)]
pub struct Problem<'a> {
    /// Queries, `[batch, seqlen_q, heads_q, hdim]`.
    pub q: &'a HostTensor,
    /// Keys, `[batch, seqlen_k, heads_k, hdim]` with `heads_q` a multiple of `heads_k`.
    pub k: &'a HostTensor,
    /// Values, k's shape.
    pub v: &'a HostTensor,
    /// Causal mask, aligned to the bottom-right corner of the score matrix.
    pub causal: bool,
    /// Softmax scale of `QK^T`.
    pub scale: f32,
    /// Soft-capping: logits `c · tanh(scale · QKᵀ / c)` instead of `scale · QKᵀ`.
    pub softcap: Option<f32>,
    /// ALiBi: `slope_h · |i + seqlen_k − seqlen_q − j|` subtracted from the logits.
    pub alibi: Option<HostAlibi<'a>>,
    /// Sliding window (with `causal`, its right edge is at most the diagonal).
    pub window: Option<Window>,
    /// Attention sinks: one logit per query head, `[heads_q]`, that joins every row's
    /// softmax denominator (and nothing else: it has no value).
    pub sinks: Option<&'a [f32]>,
    /// Packed documents: query `i` sees key `j` only if the key position
    /// `i + seqlen_k − seqlen_q` has `j`'s document id (needs `seqlen_q <= seqlen_k`).
    pub docs: Option<HostDocs<'a>>,
    /// A user-defined variant ([`HostVariantOf`]): its logit of every scaled score and its
    /// mask (on top of the others), evaluated in f32 as the kernels do.
    pub variant: Option<&'a dyn HostVariant>,
}

/// A user-defined variant as the CPU references evaluate it: `common::variant::Variant`
/// with its buffer on the host ([`HostVariantOf`]).
pub trait HostVariant: Sync + std::fmt::Debug {
    /// The logit of pair `at` from the scaled score `x` and its derivative; `None` for a
    /// pair the variant hides. (A score function runs in f32, as in the kernels; without
    /// one `x` passes through unrounded.)
    fn logit(&self, at: Coords, x: f64) -> Option<(f64, f64)>;

    /// [`HostVariant::logit`] without asking the mask (a block mask's full blocks).
    fn unmasked_logit(&self, at: Coords, x: f64) -> (f64, f64);
}

/// Variant `V` reading `data` (the words the kernels read from the device buffer).
pub struct HostVariantOf<V> {
    /// The buffer, in 4-byte words.
    pub data: Vec<u32>,
    variant: std::marker::PhantomData<fn() -> V>,
}

impl<V> HostVariantOf<V> {
    /// `V` with buffer `data`.
    pub fn new(data: Vec<u32>) -> Self {
        HostVariantOf { data, variant: std::marker::PhantomData }
    }
}

impl<V> std::fmt::Debug for HostVariantOf<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostVariantOf<{}>({} words)", std::any::type_name::<V>(), self.data.len())
    }
}

/// How far variant `V`'s derivative (`score_grad`, or 1 without `SCORE_GRAD`) is from
/// central differences of its `score`, at each pair of `at` and scaled score of `xs`
/// that the variant shows: the largest `|grad − fd| / max(1, |grad|)`. The GPU tests
/// compare the kernels with the variant's own functions, so a wrong derivative passes
/// them; this catches it (a wrong derivative is off by O(1); differencing in f32 with
/// steps of 1/64 leaves ~1e-3 for smooth functions of logits up to ~30).
pub fn score_grad_error<V: Variant>(data: &[u32], at: &[Coords], xs: &[f32]) -> f64 {
    let mut worst = 0.0f64;
    for &c in at {
        for &x in xs {
            // Hidden pairs have no derivative to check.
            let Some((_, grad)) = variant::logit::<V, _>(data, c, x, true) else { continue };
            let score = |x: f32| variant::logit::<V, _>(data, c, x, false).map_or(0.0, |(l, _)| l as f64);
            let h = 1.0 / 64.0 * x.abs().max(1.0);
            let fd = (score(x + h) - score(x - h)) / (2.0 * h as f64);
            worst = worst.max((grad as f64 - fd).abs() / (grad as f64).abs().max(1.0));
        }
    }
    worst
}

/// A breach of variant `V`'s key bound (`Variant::key_end`, when `KEY_END`) over a call
/// of `batch` sequences of `seqlen_q` queries, `seqlen_k` keys and `heads` query heads: a
/// pair `visible` shows at or past its row's bound, a row whose bound is below the
/// previous row's, or with `KEY_END_EXACT` a pair below the bound that `visible` hides.
/// `None` when the bound holds (or the variant has none).
pub fn key_end_error<V: Variant>(data: &[u32], batch: usize, heads: usize, seqlen_q: usize, seqlen_k: usize) -> Option<String> {
    if !V::KEY_END {
        return None;
    }
    let (sq, sk) = (seqlen_q as u32, seqlen_k as u32);
    for b in 0..batch as u32 {
        let mut previous = 0;
        for q in 0..sq {
            let end = V::key_end(data, b, q, sq, sk).min(sk);
            if end < previous {
                return Some(format!("batch {b}: row {q}'s bound {end} is below row {}'s {previous}", q - 1));
            }
            previous = end;
            for head in 0..heads as u32 {
                let at = |kv| Coords { batch: b, head, q, kv, seqlen_q: sq, seqlen_k: sk };
                if let Some(kv) = (end..sk).find(|&kv| !V::MASK_MOD || V::visible(data, at(kv))) {
                    return Some(format!("batch {b} head {head}: row {q} sees key {kv}, past its bound {end}"));
                }
                if V::KEY_END_EXACT {
                    if let Some(kv) = (0..end).find(|&kv| V::MASK_MOD && !V::visible(data, at(kv))) {
                        return Some(format!("batch {b} head {head}: row {q} hides key {kv}, below its exact bound {end}"));
                    }
                }
            }
        }
    }
    None
}

impl<V: Variant> HostVariant for HostVariantOf<V> {
    fn logit(&self, at: Coords, x: f64) -> Option<(f64, f64)> {
        let data = &self.data[..];
        if !V::SCORE_MOD {
            // No score function: `x` unrounded.
            return (!V::MASK_MOD || V::visible(data, at)).then_some((x, 1.0));
        }
        variant::logit::<V, _>(data, at, x as f32, true).map(|(l, g)| (l as f64, g as f64))
    }

    fn unmasked_logit(&self, at: Coords, x: f64) -> (f64, f64) {
        if !V::SCORE_MOD {
            return (x, 1.0);
        }
        variant::logit::<V, _>(&self.data[..], at, x as f32, false).map_or((f64::NEG_INFINITY, 0.0), |(l, g)| (l as f64, g as f64))
    }
}

/// Document ids on the host, one per key token: `[seqlen_k]` shared by the batch, or
/// `[batch, seqlen_k]` when `per_batch`.
#[derive(Clone, Copy, Debug)]
pub struct HostDocs<'a> {
    /// The ids.
    pub ids: &'a [u32],
    /// One row of ids per batch element.
    pub per_batch: bool,
}

impl HostDocs<'_> {
    /// The keys of the document that holds key position `pos` of batch `b`: the run of
    /// equal ids around it (sequences of `seqlen` keys).
    pub fn run(&self, b: usize, pos: usize, seqlen: usize) -> std::ops::Range<usize> {
        let ids = &self.ids[if self.per_batch { b * seqlen } else { 0 }..][..seqlen];
        let id = ids[pos];
        let start = ids[..pos].iter().rposition(|&x| x != id).map_or(0, |p| p + 1);
        let end = ids[pos..].iter().position(|&x| x != id).map_or(seqlen, |p| pos + p);
        start..end
    }
}

/// ALiBi's standard slopes for `heads` heads (Press et al.): `2^(-8 (h + 1) / heads)`.
pub fn standard_alibi_slopes(heads: usize) -> Vec<f32> {
    (0..heads).map(|h| 2f32.powf(-8.0 * (h + 1) as f32 / heads as f32)).collect()
}

pub use crate::plan::Window;

/// ALiBi slopes on the host: `[heads_q]`, or `[batch, heads_q]` when `per_batch`.
#[derive(Clone, Copy, Debug)]
pub struct HostAlibi<'a> {
    /// The slopes.
    pub slopes: &'a [f32],
    /// `[batch, heads_q]` rather than `[heads_q]`.
    pub per_batch: bool,
}

impl<'a> Problem<'a> {
    /// Attention with no variant: optionally causal, scale `scale`.
    pub fn plain(q: &'a HostTensor, k: &'a HostTensor, v: &'a HostTensor, causal: bool, scale: f32) -> Self {
        Problem { q, k, v, causal, scale, softcap: None, alibi: None, window: None, sinks: None, docs: None, variant: None }
    }
}

impl Problem<'_> {
    /// Row `i`'s logits (of batch `b`, query head `h`) for `keys` as the low-precision
    /// references compute them: f32 dot products times the scale, then the score
    /// modifications.
    pub(crate) fn logits_f32(&self, b: usize, h: usize, i: usize, keys: std::ops::Range<usize>) -> Vec<f32> {
        let (_, _, _, hq, hk, _) = self.dims();
        let (q, hkv) = (self.q.row(b, i, h), h / (hq / hk));
        keys.map(|j| self.logit_f32(q.iter().zip(self.k.row(b, j, hkv)).map(|(&a, &b)| a * b).sum::<f32>() * self.scale, b, h, i, j))
            .collect()
    }

    /// [`Self::logits_f32`] with soft-capping's `tanh` rounded to `dtype` ([`attention_lowp`]).
    fn logits_lowp(&self, b: usize, h: usize, i: usize, keys: std::ops::Range<usize>, dtype: DType) -> Vec<f32> {
        let (Some(c), None) = (self.softcap, self.variant) else { return self.logits_f32(b, h, i, keys) };
        let (_, _, _, hq, hk, _) = self.dims();
        let (q, hkv) = (self.q.row(b, i, h), h / (hq / hk));
        keys.map(|j| {
            let x = q.iter().zip(self.k.row(b, j, hkv)).map(|(&a, &b)| a * b).sum::<f32>() * self.scale;
            c * round_to(dtype, (x / c).tanh()) - self.alibi_bias(b, h, i, j)
        })
        .collect()
    }

    fn dims(&self) -> (usize, usize, usize, usize, usize, usize) {
        let [b, sq, hq, d] = self.q.shape;
        let [_, sk, hk, _] = self.k.shape;
        assert_eq!(self.k.shape, self.v.shape);
        assert!(hq % hk == 0 && self.k.shape[0] == b && self.k.shape[3] == d);
        (b, sq, sk, hq, hk, d)
    }

    /// The logit of a scaled score `x = scale · q·k` of query `i` and key `j` of head `h`
    /// of batch `b`: `x`, or `c · tanh(x / c)` with soft-capping, minus the ALiBi bias
    /// (in f64, for the exact reference).
    /// With a user variant, its logit (`-inf` for a pair it hides), evaluated in f32.
    pub fn logit_f64(&self, x: f64, b: usize, h: usize, i: usize, j: usize) -> f64 {
        if self.variant.is_some() {
            return self.variant_logit(x, b, h, i, j).map_or(f64::NEG_INFINITY, |(l, _)| l);
        }
        self.softcap.map_or(x, |c| c as f64 * (x / c as f64).tanh()) - self.alibi_bias(b, h, i, j) as f64
    }

    /// [`Problem::logit_f64`] in f32.
    pub fn logit_f32(&self, x: f32, b: usize, h: usize, i: usize, j: usize) -> f32 {
        self.logit_f32_masked(x, b, h, i, j, true)
    }

    /// [`Problem::logit_f32`]; `masked = false`: without asking a user variant's mask (a
    /// block mask's full blocks).
    pub fn logit_f32_masked(&self, x: f32, b: usize, h: usize, i: usize, j: usize, masked: bool) -> f32 {
        if let Some(v) = self.variant {
            if !masked {
                let (seqlen_q, seqlen_k) = (self.q.shape[1] as u32, self.k.shape[1] as u32);
                let at = Coords { batch: b as u32, head: h as u32, q: i as u32, kv: j as u32, seqlen_q, seqlen_k };
                return v.unmasked_logit(at, x as f64).0 as f32;
            }
            return self.variant_logit(x as f64, b, h, i, j).map_or(f32::NEG_INFINITY, |(l, _)| l as f32);
        }
        self.softcap.map_or(x, |c| c * (x / c).tanh()) - self.alibi_bias(b, h, i, j)
    }

    /// The user variant's logit of the scaled score `x` of query `i` and key `j` of head
    /// `h` of batch `b`, and its derivative: `(x, 1)` without a variant, `None` for a
    /// pair it hides.
    pub fn variant_logit(&self, x: f64, b: usize, h: usize, i: usize, j: usize) -> Option<(f64, f64)> {
        let Some(v) = self.variant else { return Some((x, 1.0)) };
        let (seqlen_q, seqlen_k) = (self.q.shape[1] as u32, self.k.shape[1] as u32);
        v.logit(Coords { batch: b as u32, head: h as u32, q: i as u32, kv: j as u32, seqlen_q, seqlen_k }, x)
    }

    /// Head `h`'s sink logit, if any.
    pub fn sink(&self, h: usize) -> Option<f32> {
        self.sinks.map(|s| s[h])
    }

    /// ALiBi's `slope_h · |i + seqlen_k − seqlen_q − j|` (0 without ALiBi).
    pub fn alibi_bias(&self, b: usize, h: usize, i: usize, j: usize) -> f32 {
        self.alibi.map_or(0.0, |a| {
            let heads = self.q.shape[2];
            let slope = a.slopes[if a.per_batch { b * heads + h } else { h }];
            let dist = (i as i64 + self.k.shape[1] as i64 - self.q.shape[1] as i64 - j as i64).unsigned_abs();
            slope * dist as f32
        })
    }

    /// Whether the logits are modified (soft-capping, ALiBi or a variant): the tiled
    /// algorithm then
    /// works on the logits rather than on raw scores.
    pub fn modifies_scores(&self) -> bool {
        self.softcap.is_some() || self.alibi.is_some() || self.variant.is_some()
    }

    /// The keys query row `i` of batch `b` sees: all of them; up to its bottom-right
    /// diagonal under the causal mask; within the window around the diagonal; in its
    /// document.
    pub fn visible_range(&self, b: usize, i: usize) -> std::ops::Range<usize> {
        let (sq, sk) = (self.q.shape[1], self.k.shape[1]);
        let keys = crate::plan::visible_keys(i, sq, sk, self.causal, self.window);
        match self.docs {
            Some(d) => {
                assert!(sq <= sk, "documents need seqlen_q <= seqlen_k");
                let doc = d.run(b, i + sk - sq, sk);
                let (lo, hi) = (keys.start.max(doc.start), keys.end.min(doc.end));
                lo..hi.max(lo)
            }
            None => keys,
        }
    }

    /// Whether query row `i` of batch `b` sees key `j`.
    pub fn sees(&self, b: usize, i: usize, j: usize) -> bool {
        self.visible_range(b, i).contains(&j)
    }
}

/// Output O (packed like q) and LSE (`[batch, heads_q, seqlen_q]`).
#[derive(Clone, Debug)]
pub struct AttnResult<T> {
    /// O, `[batch, seqlen_q, heads_q, hdim]`.
    pub o: Vec<T>,
    /// Natural-log LSE of each query row, `[batch, heads_q, seqlen_q]`; `+inf` for a row
    /// that sees no key.
    pub lse: Vec<T>,
}

/// Runs `row_fn(b, h, i, o_row) -> lse` for every query row, in parallel over chunks of
/// rows (so one long sequence still uses every core).
fn for_each_row<T: Copy + Send + Sync + Default>(
    p: &Problem<'_>,
    row_fn: impl Fn(usize, usize, usize, &mut [T]) -> T + Sync,
) -> AttnResult<T> {
    const ROWS: usize = 32;
    let (b, sq, _, hq, _, d) = p.dims();
    // Tasks: (batch, head, first row) of ROWS-row chunks.
    let tasks: Vec<(usize, usize, usize)> = (0..b)
        .flat_map(|bi| (0..hq).flat_map(move |h| (0..sq).step_by(ROWS).map(move |i| (bi, h, i))))
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(tasks.len()).max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Vec<(usize, Vec<T>, Vec<T>)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (row_fn, tasks, next) = (&row_fn, &tasks, &next);
                scope.spawn(move || {
                    let mut done = Vec::new();
                    loop {
                        let t = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(bi, h, i0)) = tasks.get(t) else { break };
                        let rows = i0..(i0 + ROWS).min(sq);
                        let mut o = vec![T::default(); rows.len() * d];
                        let lse =
                            rows.clone().zip(o.chunks_mut(d)).map(|(i, orow)| row_fn(bi, h, i, orow)).collect();
                        done.push((t, o, lse));
                    }
                    done
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("reference thread panicked")).collect()
    });
    let mut o = vec![T::default(); b * sq * hq * d];
    let mut lse = vec![T::default(); b * hq * sq];
    for (t, to, tl) in results.into_iter().flatten() {
        let (bi, h, i0) = tasks[t];
        for (r, (orow, l)) in to.chunks(d).zip(tl).enumerate() {
            let i = i0 + r;
            let dst = ((bi * sq + i) * hq + h) * d;
            o[dst..dst + d].copy_from_slice(orow);
            lse[(bi * hq + h) * sq + i] = l;
        }
    }
    AttnResult { o, lse }
}

/// Exact attention in f64.
pub fn attention_f64(p: &Problem<'_>) -> AttnResult<f64> {
    let (_, _, _, hq, hk, d) = p.dims();
    let scale = p.scale as f64;
    for_each_row(p, |b, h, i, o| {
        let hkv = h / (hq / hk);
        let keys = p.visible_range(b, i);
        let sink = p.sink(h).map(f64::from);
        if keys.is_empty() {
            // O = 0; the sink alone makes the denominator.
            return sink.unwrap_or(f64::INFINITY);
        }
        let q = p.q.row(b, i, h);
        let s: Vec<f64> = keys
            .clone()
            .map(|j| p.logit_f64(q.iter().zip(p.k.row(b, j, hkv)).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale, b, h, i, j))
            .collect();
        let m = s.iter().cloned().fold(sink.unwrap_or(f64::NEG_INFINITY), f64::max);
        if m == f64::NEG_INFINITY {
            // A variant hides every key of the row.
            return f64::INFINITY;
        }
        let e: Vec<f64> = s.iter().map(|&x| (x - m).exp()).collect();
        let sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |x| (x - m).exp());
        for (j, &ej) in keys.zip(&e) {
            let w = ej / sum;
            for (oc, &vc) in o.iter_mut().zip(p.v.row(b, j, hkv)) {
                *oc += w * vc as f64;
            }
        }
        debug_assert_eq!(o.len(), d);
        m + sum.ln()
    })
}

/// The straightforward low-precision implementation: f32 scores and softmax, P rounded
/// to `dtype`, f32 accumulation of PV, O rounded to `dtype`. With soft-capping, the cap's
/// `tanh` rounded to `dtype`, as an implementation in that type computes the elementwise
/// op (the kernels' `tanh.approx.f32` has a relative error of about 2^-11, an fp16 ulp:
/// with f32 `tanh` here, caps of 30-50 put the kernels' LSE 20-30x above this baseline's
/// on rows with large logits).
pub fn attention_lowp(p: &Problem<'_>, dtype: DType) -> AttnResult<f32> {
    let (_, _, _, hq, hk, _) = p.dims();
    for_each_row(p, |b, h, i, o| {
        let hkv = h / (hq / hk);
        let keys = p.visible_range(b, i);
        let sink = p.sink(h);
        if keys.is_empty() {
            return sink.unwrap_or(f32::INFINITY);
        }
        let s = p.logits_lowp(b, h, i, keys.clone(), dtype);
        let m = s.iter().cloned().fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
        if m == f32::NEG_INFINITY {
            return f32::INFINITY;
        }
        let e: Vec<f32> = s.iter().map(|&x| (x - m).exp()).collect();
        let sum: f32 = e.iter().sum::<f32>() + sink.map_or(0.0, |x| (x - m).exp());
        for (j, &ej) in keys.zip(&e) {
            let w = round_to(dtype, ej / sum);
            for (oc, &vc) in o.iter_mut().zip(p.v.row(b, j, hkv)) {
                *oc += w * vc;
            }
        }
        for oc in o.iter_mut() {
            *oc = round_to(dtype, *oc);
        }
        m + sum.ln()
    })
}

/// Tile shape of [`attention_tiled`], and its rescaling rule.
#[derive(Clone, Copy, Debug)]
pub struct Tiling {
    /// Query rows per tile.
    pub block_m: usize,
    /// Keys per tile.
    pub block_n: usize,
    /// Keep a row's running max until its scores exceed it by more than
    /// [`RESCALE_THRESHOLD_LOG2`] (the FA3 kernels' lazy rescaling); else move it with
    /// every new maximum.
    pub lazy_rescale: bool,
}

/// The FlashAttention-2 forward algorithm, in f32, exactly as the kernels run it:
/// per query tile, loop over the key tiles it can see (causal tiles past the diagonal are
/// skipped), fold each score tile into a running max and sum in base 2
/// (`exp2(s * scale * log2 e - max * scale * log2 e)`), rescale the unscaled output
/// accumulator when the max grows, divide by the sum once at the end.
/// `p_dtype`: round P to this type before PV, as the tensor cores' operand is.
pub fn attention_tiled(p: &Problem<'_>, tiling: Tiling, p_dtype: Option<DType>) -> AttnResult<f32> {
    let (_, sq, ..) = p.dims();
    let Tiling { block_m, block_n, .. } = tiling;
    attention_tiled_over(p, tiling, p_dtype, |b, _, i| {
        // Key tiles this row's query tile visits (the whole tile shares them): from the
        // first row's first visible key to the last row's last (both move right with the
        // row), all masked.
        let m0 = i / block_m * block_m;
        let (lo, hi) = (p.visible_range(b, m0).start, p.visible_range(b, (m0 + block_m).min(sq) - 1).end);
        let tiles = if hi > lo { lo / block_n..hi.div_ceil(block_n) } else { 0..0 };
        tiles.map(|t| (t, true)).collect()
    })
}

/// [`attention_tiled`] over the key tiles `tiles(batch, head, row)` gives a row's query
/// tile, in order, each with whether it is masked: an unmasked tile's pairs are all taken
/// as visible (the mask is not asked), as a block mask's full blocks run in the kernels.
pub fn attention_tiled_over(
    p: &Problem<'_>,
    tiling: Tiling,
    p_dtype: Option<DType>,
    tiles: impl Fn(usize, usize, usize) -> Vec<(usize, bool)> + Sync,
) -> AttnResult<f32> {
    let (_, _, sk, hq, hk, d) = p.dims();
    // With a score modification the scores are the logits already (scaled).
    let score_scale = if p.modifies_scores() { 1.0 } else { p.scale };
    let scale_log2 = score_scale * std::f32::consts::LOG2_E;
    let Tiling { block_n, lazy_rescale, .. } = tiling;
    let round = |x: f32| p_dtype.map_or(x, |t| round_to(t, x));
    for_each_row(p, |b, h, i, o| {
        let hkv = h / (hq / hk);
        let q = p.q.row(b, i, h);
        let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
        let mut acc = vec![0.0f32; d];
        for (t, masked) in tiles(b, h, i) {
            let cols = t * block_n..((t + 1) * block_n).min(sk);
            let s: Vec<f32> = cols
                .clone()
                .map(|j| {
                    if !masked || p.sees(b, i, j) {
                        let dot: f32 = q.iter().zip(p.k.row(b, j, hkv)).map(|(&a, &b)| a * b).sum();
                        if p.modifies_scores() { p.logit_f32_masked(dot * p.scale, b, h, i, j, masked) } else { dot }
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect();
            let m_new = s.iter().cloned().fold(m, f32::max);
            let moves = !lazy_rescale || m_new * scale_log2 > m.mul_add(scale_log2, RESCALE_THRESHOLD_LOG2);
            let scaled = |m: f32| if m == f32::NEG_INFINITY { 0.0 } else { m * scale_log2 };
            if moves {
                let alpha = if m == f32::NEG_INFINITY { 1.0 } else { (m * scale_log2 - scaled(m_new)).exp2() };
                m = m_new;
                l *= alpha;
                acc.iter_mut().for_each(|a| *a *= alpha);
            }
            let m_scaled = scaled(m);
            for (j, &sj) in cols.zip(&s) {
                let pj = (sj * scale_log2 - m_scaled).exp2();
                l += pj;
                let pr = round(pj);
                for (a, &vc) in acc.iter_mut().zip(p.v.row(b, j, hkv)) {
                    *a += pr * vc;
                }
            }
        }
        if let Some(sink) = p.sink(h) {
            // As the kernels' epilogue: the sink joins the sum, both taken relative to the
            // larger of the row's max logit and the sink.
            let (factor, lse) = fold_sink(m, score_scale, l, sink);
            for (oc, a) in o.iter_mut().zip(&acc) {
                *oc = round(a * factor);
            }
            return lse;
        }
        if l == 0.0 {
            return f32::INFINITY;
        }
        for (oc, a) in o.iter_mut().zip(&acc) {
            *oc = round(a / l);
        }
        m * score_scale + l.ln()
    })
}

/// A sink logit folded into a row's softmax at the end (the FA3 epilogue's rule): `max`
/// is the row's running max of the scores (`-inf` if it saw no key), `score_scale` turns
/// it into a logit, `sum` is `Σ exp(logit − max logit)`. Returns the factor of the
/// unnormalised output (`1 / denominator` relative to the max) and the LSE, both taken
/// relative to the larger of the max logit and the sink, so nothing overflows.
pub fn fold_sink(max: f32, score_scale: f32, sum: f32, sink: f32) -> (f32, f32) {
    let a = if max == f32::NEG_INFINITY { f32::NEG_INFINITY } else { max * score_scale };
    let m = a.max(sink);
    let (ea, es) = ((a - m).exp(), (sink - m).exp());
    let total = sum * ea + es;
    (ea / total, m + total.ln())
}

/// Largest absolute difference; NaN anywhere counts as infinite. Positions where the
/// reference is infinite (LSE of empty rows) must match exactly.
pub fn max_abs_err<T: Copy + Into<f64>>(got: &[T], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).fold(0.0f64, |acc, (&g, &w)| {
        let g: f64 = g.into();
        let e = if g.is_nan() || w.is_nan() {
            f64::INFINITY
        } else if w.is_infinite() || g.is_infinite() {
            if g == w { 0.0 } else { f64::INFINITY }
        } else {
            (g - w).abs()
        };
        acc.max(e)
    })
}

/// FlashAttention's acceptance rule: a kernel's error against the f64 reference is at
/// most twice the naive low-precision error plus a tiny absolute slack.
pub fn within_budget(kernel_err: f64, naive_err: f64, slack: f64) -> bool {
    kernel_err <= 2.0 * naive_err + slack
}
