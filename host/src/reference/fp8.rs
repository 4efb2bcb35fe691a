//! FP8 (e4m3) on the CPU: the format's rounding, quantization with scales per tensor, per
//! head or per block of rows, incoherent processing (a Hadamard transform with random
//! signs on Q and K), and attention with FP8's "naive low precision": Q, K, V and P
//! rounded to e4m3. The reference an FP8 kernel is checked against, and the paper's
//! accuracy experiment (FlashAttention-3, section 4.3) on the host.
//!
//! Scales are dequantization factors: a tensor's value is `e4m3 code × scale`, with the
//! group's largest magnitude mapped to e4m3's largest finite value, 448, or (V's blocks,
//! [`Granularity::Pow2Blocks`]) the smallest power of two that maps it at most there
//! (`common::fp8::block_factor`, as the quantization kernel).
use super::{AttnResult, HostTensor, Problem, for_each_row};
use crate::tensor::round_to;
use common::DType;
use float8::F8E4M3;
use rand::Rng;
use rand_distr::{Distribution, Normal};

/// e4m3's largest finite magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// `x` rounded to e4m3 (to nearest, ties to even; saturating at ±448, as the GPU's
/// `cvt.rn.satfinite.e4m3x2.f32`), back in f32.
pub fn round_e4m3(x: f32) -> f32 {
    F8E4M3::from_f32(x).to_f32()
}

/// The e4m3 code of `x` (rounded as [`round_e4m3`]).
pub fn e4m3_code(x: f32) -> u8 {
    F8E4M3::from_f32(x).to_bits()
}

/// The value of an e4m3 code.
pub fn e4m3_value(code: u8) -> f32 {
    F8E4M3::from_bits(code).to_f32()
}

/// Which elements share a scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granularity {
    /// One scale for the whole tensor.
    PerTensor,
    /// One per (batch, head) of the tensor (FlashAttention-3's descales, for K and V).
    PerHead,
    /// One per (batch, head, block of `rows` sequence positions): the paper's block
    /// quantization, with the blocks the kernel's tiles (query rows for Q, keys for K, V).
    Blocks {
        /// Sequence positions per block.
        rows: usize,
    },
    /// [`Granularity::Blocks`] with power-of-two factors: V's, as the quantization kernel
    /// gives them (`common::fp8::block_factor`).
    Pow2Blocks {
        /// Sequence positions per block.
        rows: usize,
    },
}

impl Granularity {
    /// The groups and factors of `quantize_fp8` for `role` at head dim `hdim`.
    pub fn of_quantizer(role: crate::fp8::Role, hdim: usize) -> Self {
        let rows = crate::fp8::block_rows(role, hdim);
        if role.pow2_factors() { Granularity::Pow2Blocks { rows } } else { Granularity::Blocks { rows } }
    }
}

/// A quantized tensor: its dequantized values (each an e4m3 code times its scale, so the
/// reference computes with exactly what an FP8 kernel sees) and its scales,
/// `[batch, heads, groups]` packed (one group for [`Granularity::PerHead`], one value in
/// all for [`Granularity::PerTensor`]).
#[derive(Clone, Debug)]
pub struct Quantized {
    /// The dequantized values, `t`'s shape.
    pub values: HostTensor,
    /// The dequantization factors, one per group.
    pub scales: Vec<f32>,
}

/// Quantizes `t` to e4m3 with scales of granularity `g` (a group of zeros gets scale 1).
pub fn quantize(t: &HostTensor, g: Granularity) -> Quantized {
    let [b, s, h, d] = t.shape;
    let (groups_per_head, rows) = match g {
        Granularity::PerTensor | Granularity::PerHead => (1, s.max(1)),
        Granularity::Blocks { rows } | Granularity::Pow2Blocks { rows } => (s.div_ceil(rows.max(1)), rows.max(1)),
    };
    let group_of = |bi: usize, si: usize, hi: usize| match g {
        Granularity::PerTensor => 0,
        _ => (bi * h + hi) * groups_per_head + si / rows,
    };
    let n_groups = if g == Granularity::PerTensor { 1 } else { b * h * groups_per_head };
    let mut amax = vec![0f32; n_groups];
    for bi in 0..b {
        for si in 0..s {
            for hi in 0..h {
                let a = &mut amax[group_of(bi, si, hi)];
                *a = t.row(bi, si, hi).iter().fold(*a, |m, x| m.max(x.abs()));
            }
        }
    }
    let pow2 = matches!(g, Granularity::Pow2Blocks { .. });
    let scales: Vec<f32> = amax.iter().map(|&a| common::fp8::block_factor(a, pow2)).collect();
    let mut values = t.clone();
    for bi in 0..b {
        for si in 0..s {
            for hi in 0..h {
                let sc = scales[group_of(bi, si, hi)];
                let o = ((bi * s + si) * h + hi) * d;
                for x in &mut values.data[o..o + d] {
                    *x = round_e4m3(*x / sc) * sc;
                }
            }
        }
    }
    Quantized { values, scales }
}

/// Incoherent processing: `x ↦ x·M` on every row, `M = diag(signs) · H / sqrt(d)` with `H`
/// the Sylvester Hadamard matrix of order `d` (a power of two) and random signs. `M` is
/// orthogonal, so `(QM)(KM)ᵀ = QKᵀ`, and an outlier in one coordinate is spread over all
/// `d` of them before quantization.
#[derive(Clone, Debug)]
pub struct Hadamard {
    signs: Vec<f32>,
}

impl Hadamard {
    /// The transform of order `hdim` (a power of two) with signs drawn from `rng`.
    pub fn new(hdim: usize, rng: &mut impl Rng) -> Self {
        assert!(hdim.is_power_of_two(), "hdim {hdim} must be a power of two");
        Hadamard { signs: (0..hdim).map(|_| if rng.random::<bool>() { 1.0 } else { -1.0 }).collect() }
    }

    /// The transform the quantization kernel applies for `seed` ([`crate::fp8::hadamard_sign_values`]).
    pub fn from_seed(hdim: usize, seed: u64) -> Self {
        Self::from_signs(crate::fp8::hadamard_sign_values(hdim, seed))
    }

    /// The transform with these signs (±1; `hdim` of them, a power of two).
    pub fn from_signs(signs: Vec<f32>) -> Self {
        assert!(signs.len().is_power_of_two(), "{} signs: not a power of two", signs.len());
        Hadamard { signs }
    }

    /// `row · M` in place: the signs, then the fast Walsh–Hadamard transform
    /// (`d log d` additions), then `1/sqrt(d)`.
    pub fn apply_row(&self, row: &mut [f32]) {
        let d = self.signs.len();
        assert_eq!(row.len(), d);
        for (x, s) in row.iter_mut().zip(&self.signs) {
            *x *= s;
        }
        let mut half = 1;
        while half < d {
            for block in (0..d).step_by(2 * half) {
                for i in block..block + half {
                    let (a, b) = (row[i], row[i + half]);
                    row[i] = a + b;
                    row[i + half] = a - b;
                }
            }
            half *= 2;
        }
        let norm = 1.0 / (d as f32).sqrt();
        for x in row.iter_mut() {
            *x *= norm;
        }
    }

    /// `t` with every `[b, s, h, :]` row transformed.
    pub fn apply(&self, t: &HostTensor) -> HostTensor {
        let mut out = t.clone();
        for row in out.data.chunks_mut(t.shape[3]) {
            self.apply_row(row);
        }
        out
    }
}

/// FlashAttention-3's factor on P before its conversion to e4m3: P = exp(s − max) ≤ 1
/// times 2^8 sits in e4m3's normal range down to 2^-14 of the row's largest weight (e4m3
/// numbers below 2^-6 are subnormal); the row sum is taken before the rounding, and the
/// factor leaves with it.
pub const P_FACTOR: f32 = 256.0;

/// Attention with FP8's naive low precision: `p`'s tensors hold e4m3-representable values
/// (dequantized, [`quantize`]); f32 scores and softmax, P·2^8 rounded to e4m3 before PV,
/// f32 accumulation, O rounded to `out_dtype` (bf16 or f16). Masks and score
/// modifications are `p`'s; sinks are not part of the FP8 path.
pub fn attention_fp8_lowp(p: &Problem<'_>, out_dtype: DType) -> AttnResult<f32> {
    attention_fp8_with(p, out_dtype, None)
}

/// [`attention_fp8_lowp`] with the scores rounded to bf16, as a bf16 tensor-core matmul
/// of the dequantized inputs gives them (FlashAttention-3's FP8 tests compare with that
/// PyTorch computation): the naive implementation an FP8 kernel is held to. FP8
/// tensor cores accumulate QKᵀ with fewer bits than f32 (about 13-14 of mantissa, more
/// than bf16's 8), so against the f32-score reference a kernel's LSE error is the
/// hardware's, not the kernel's; on inputs whose products sum exactly in that many bits
/// (small integers) both references agree.
pub fn attention_fp8_naive(p: &Problem<'_>, out_dtype: DType) -> AttnResult<f32> {
    attention_fp8_with(p, out_dtype, Some(DType::BF16))
}

fn attention_fp8_with(p: &Problem<'_>, out_dtype: DType, score_dtype: Option<DType>) -> AttnResult<f32> {
    attention_fp8_rows(p, out_dtype, score_dtype, |b, hkv, keys, e, o| {
        for (j, &ej) in keys.zip(e) {
            let w = round_e4m3(ej);
            for (oc, &vc) in o.iter_mut().zip(p.v.row(b, j, hkv)) {
                *oc += w * vc;
            }
        }
        1.0
    })
}

/// [`attention_fp8_lowp`] with V's per-block factors carried as the FP8 kernel carries
/// them (`common::fp8::VUnit`): O accumulated in a unit (a V factor); a key
/// block's `P · 2^8`, times `2^shift` when its factor rides in P's offset, rounded to
/// e4m3 and multiplied by V's e4m3 values; O converted when the unit moves; blocks of
/// `block_n` keys visited last to first, as the kernel's steps visit them. `v_scales`:
/// `[batch, heads_k, blocks]`, the factors `p.v`'s values were quantized with. The row
/// maxima are the rows' own (the kernel's running maxima round P at other points, not
/// with other precision): this isolates what the unit costs.
pub fn attention_fp8_v_unit(p: &Problem<'_>, v_scales: &[f32], block_n: usize, out_dtype: DType) -> AttnResult<f32> {
    let (_, _, sk, _, hk, _) = p.dims();
    let blocks = sk.div_ceil(block_n);
    assert_eq!(v_scales.len(), p.v.shape[0] * hk * blocks, "one factor per (batch, K/V head, key block)");
    attention_fp8_rows(p, out_dtype, None, |b, hkv, keys, e, o| {
        let mut unit = common::fp8::VUnit::new();
        for blk in (keys.start / block_n..keys.end.div_ceil(block_n)).rev() {
            let factor = v_scales[(b * hk + hkv) * blocks + blk];
            let w = match unit.enter(factor) {
                Ok(shift) => common::fp8::pow2(shift),
                Err(old) => {
                    if old != 0.0 {
                        o.iter_mut().for_each(|x| *x *= old / factor);
                    }
                    1.0
                }
            };
            for j in (blk * block_n).max(keys.start)..((blk + 1) * block_n).min(keys.end) {
                let pj = round_e4m3(e[j - keys.start] * w);
                for (oc, &vc) in o.iter_mut().zip(p.v.row(b, j, hkv)) {
                    *oc += pj * (vc / factor);
                }
            }
        }
        unit.factor()
    })
}

/// FP8 attention row by row: f32 scores (rounded to `score_dtype` as a matmul's output),
/// `P · 2^8` from the row's maximum, `pv` accumulating O (zeroed) from the row's keys, their
/// `P · 2^8` and V, and returning the factor O then takes; O divided by the row sum and
/// rounded to `out_dtype`.
fn attention_fp8_rows(
    p: &Problem<'_>,
    out_dtype: DType,
    score_dtype: Option<DType>,
    pv: impl Fn(usize, usize, std::ops::Range<usize>, &[f32], &mut [f32]) -> f32 + Sync,
) -> AttnResult<f32> {
    let (_, _, _, hq, hk, _) = p.dims();
    assert!(p.sinks.is_none(), "the FP8 reference has no sinks");
    for_each_row(p, |b, h, i, o| {
        let keys = p.visible_range(b, i);
        if keys.is_empty() {
            return f32::INFINITY;
        }
        let mut s = p.logits_f32(b, h, i, keys.clone());
        if let Some(dt) = score_dtype {
            // The matmul's output (the scale applied after it, in f32).
            for x in s.iter_mut() {
                *x = round_to(dt, *x / p.scale) * p.scale;
            }
        }
        let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = s.iter().map(|&x| (x - m).exp() * P_FACTOR).collect();
        let sum: f32 = e.iter().sum();
        let factor = pv(b, h / (hq / hk), keys, &e, o);
        for oc in o.iter_mut() {
            *oc = round_to(out_dtype, *oc * factor / sum);
        }
        m + (sum / P_FACTOR).ln()
    })
}

/// Root-mean-square error of `got` against `want`.
pub fn rmse(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    (got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).powi(2)).sum::<f64>() / want.len().max(1) as f64).sqrt()
}

/// The paper's inputs: `N(0, 1)` entries, `outliers` of them (a fraction) drawn from
/// `N(0, sigma²)` instead.
pub fn outlier_tensor(shape: [usize; 4], outliers: f64, sigma: f32, rng: &mut impl Rng) -> HostTensor {
    let (normal, wide) = (Normal::new(0.0f32, 1.0).expect("std 1"), Normal::new(0.0f32, sigma).expect("finite sigma"));
    let n = shape.iter().product();
    HostTensor::new(shape, (0..n).map(|_| if rng.random_bool(outliers) { wide.sample(rng) } else { normal.sample(rng) }).collect())
}

/// RMSE of O against the f64 reference for the paper's three FP8 configurations.
#[derive(Clone, Copy, Debug)]
pub struct Fp8Accuracy {
    /// (b) one scale per tensor.
    pub per_tensor: f64,
    /// (c) one scale per block of rows (`block_m` query rows, `block_n` keys).
    pub blocks: f64,
    /// (d) block scales after incoherent processing of Q and K.
    pub blocks_incoherent: f64,
}

/// The accuracy experiment on inputs `q, k, v` (non-causal, scale `1/sqrt(d)`), with
/// `exact` their f64 output, block scales of `block_m` query rows and `block_n` keys, and
/// `h` the incoherent processing of (d).
pub fn fp8_accuracy(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    exact: &[f64],
    block_m: usize,
    block_n: usize,
    h: &Hadamard,
) -> Fp8Accuracy {
    let scale = 1.0 / (q.shape[3] as f32).sqrt();
    let run = |q: &HostTensor, k: &HostTensor, qg, kg| {
        // V's block factors are powers of two, as the quantization kernel's.
        let vg = match kg {
            Granularity::Blocks { rows } => Granularity::Pow2Blocks { rows },
            g => g,
        };
        let (q8, k8, v8) = (quantize(q, qg), quantize(k, kg), quantize(v, vg));
        let p = Problem::plain(&q8.values, &k8.values, &v8.values, false, scale);
        rmse(&attention_fp8_lowp(&p, DType::BF16).o, exact)
    };
    let (qb, kb) = (Granularity::Blocks { rows: block_m }, Granularity::Blocks { rows: block_n });
    Fp8Accuracy {
        per_tensor: run(q, k, Granularity::PerTensor, Granularity::PerTensor),
        blocks: run(q, k, qb, kb),
        blocks_incoherent: run(&h.apply(q), &h.apply(k), qb, kb),
    }
}
