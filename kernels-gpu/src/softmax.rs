//! Online softmax over accumulator fragments, shared by every kernel whose score tile
//! has the tensor-core C layout (`mma.sync` m16n8 and `wgmma` m64nN alike): a lane holds
//! two rows (g and g+8 of its warp's 16) and, in n-tile `j`, columns `8j + 2t, 8j + 2t + 1`
//! (g = lane/4, t = lane%4). Row statistics are reduced over the 4 lanes of a quad.
//!
//! Scores stay unscaled in the tile; the scale is folded into the `exp2` argument
//! (`softmax_scale * log2 e`), as in FlashAttention-2.
//!
//! Lazy rescaling (FlashAttention-4's, here on Hopper): a warp keeps its rows' running
//! maxima while none of them grows by more than [`RESCALE_THRESHOLD_LOG2`] (in `exp2`
//! units), so that the output accumulator is rescaled only when some row's maximum
//! jumps. It stays exact: the probabilities are then at most `2^threshold` (4, well
//! within f16 and bf16), and the sum and the output are normalised by the same stale max.
use crate::ptx::math::{exp2, fma, fmax, ln, rcp, shfl_xor_f32, vote_any};
use common::fa3::RESCALE_THRESHOLD_LOG2;
use core::f32::consts::LOG2_E;

/// An n-tile of the C fragment: `[c0, c1, c2, c3]` = row g cols 2t,2t+1; row g+8 cols 2t,2t+1.
pub type Frag = [f32; 4];

/// What a block's probabilities are multiplied by: `2^p_log2` as they enter the PV GEMM,
/// and `sum` more as they join the row sums (so that the sums take `2^p_log2 · sum`).
/// The 16-bit kernels use [`Weight::ONE`], which folds away; the FP8 forward moves P into
/// e4m3's normal range and carries per-block V factors in it (`crate::fa3::descale`).
#[derive(Clone, Copy)]
pub struct Weight {
    pub p_log2: f32,
    pub sum: f32,
}

impl Weight {
    pub const ONE: Weight = Weight { p_log2: 0.0, sum: 1.0 };
}

/// Per-lane running statistics of its two rows.
#[derive(Clone, Copy)]
pub struct OnlineSoftmax {
    /// Running maximum of the raw scores (`-inf` until a row sees a key).
    pub row_max: [f32; 2],
    /// This lane's partial sum of `exp2((s - max) * scale_log2)`; quad-reduced at the end.
    pub row_sum: [f32; 2],
}

/// Keep a warp's row maxima until one grows by more than [`RESCALE_THRESHOLD_LOG2`]. A
/// compile-time switch so that its worth can be measured.
pub const LAZY_RESCALE: bool = true;

#[inline(always)]
fn quad_max(v: f32) -> f32 {
    let v = fmax(v, shfl_xor_f32(v, 1));
    fmax(v, shfl_xor_f32(v, 2))
}

#[inline(always)]
fn quad_sum(v: f32) -> f32 {
    let v = v + shfl_xor_f32(v, 1);
    v + shfl_xor_f32(v, 2)
}

/// `max * scale_log2`, with a row that has seen no key yet mapped to 0 so that
/// `exp2(-inf - 0) = 0` instead of `exp2(-inf + inf) = NaN`.
#[inline(always)]
fn scaled_max(max: f32, scale_log2: f32) -> f32 {
    if max == f32::NEG_INFINITY { 0.0 } else { max * scale_log2 }
}

impl OnlineSoftmax {
    #[inline(always)]
    pub fn new() -> Self {
        OnlineSoftmax { row_max: [f32::NEG_INFINITY; 2], row_sum: [0.0; 2] }
    }

    /// Folds a new score block in: replaces `s` by `exp2((s - max) * scale_log2)` and
    /// returns, when the row maxima moved, the factor per row that the output accumulator
    /// must be multiplied by (`exp2((old_max - new_max) * scale_log2)`, 1 on the first
    /// block). `None`: the maxima were kept (see the module's lazy rescaling), and the
    /// accumulator stays as it is.
    #[inline(always)]
    pub fn update<const NT: usize>(&mut self, s: &mut [Frag; NT], scale_log2: f32) -> Option<[f32; 2]> {
        self.update_offset(s, scale_log2, 1.0, None, Weight::ONE, LAZY_RESCALE)
    }

    /// [`Self::update`] for the scores `s · s_factor` (`s_factor > 0`: the block's
    /// maxima are the raw ones times it, and it joins the `exp2` argument's scale, so it
    /// costs per row, not per score: FP8's per-block K factors), with the probabilities
    /// times `2^weight.p_log2`: `exp2((s·s_factor - max) * scale_log2 + p_log2)`, one FMA
    /// as before (the FP8 forward's P, moved into e4m3's normal range), their row sums
    /// times `weight.sum` more, and lazy rescaling only when `lazy` (the FP8 forward
    /// keeps the exact max: with e4m3's 3 mantissa bits, a row's largest weight rounded
    /// away from a power of two costs up to 6%). The 16-bit kernels pass 1.0 and
    /// [`Weight::ONE`], which fold away.
    /// `row_bias`: an amount added to each of this lane's scores of a row (after
    /// `s_factor`; lanes may differ), folded in per row (ALiBi's row constant,
    /// `crate::fa3::mask::ScoreMod::apply`).
    #[inline(always)]
    pub fn update_offset<const NT: usize>(
        &mut self,
        s: &mut [Frag; NT],
        scale_log2: f32,
        s_factor: f32,
        row_bias: Option<[f32; 2]>,
        weight: Weight,
        lazy: bool,
    ) -> Option<[f32; 2]> {
        let mut m = self.row_max;
        for (r, m) in m.iter_mut().enumerate() {
            let mut block = f32::NEG_INFINITY;
            for f in s.iter() {
                block = fmax(block, fmax(f[2 * r], f[2 * r + 1]));
            }
            // A lane's bias is its own (it may hold the row's columns at another offset):
            // added before the quad's max. `-inf` (no visible key) stays `-inf`.
            let block = match row_bias {
                Some(b) => quad_max(block * s_factor + b[r]),
                None => quad_max(block) * s_factor,
            };
            *m = fmax(*m, block);
        }
        // `-inf` old maxima always move (to any finite max); `-inf` new maxima never do.
        let threshold = if lazy { RESCALE_THRESHOLD_LOG2 } else { 0.0 };
        let grows = |r: usize| m[r] * scale_log2 > fma(self.row_max[r], scale_log2, threshold);
        let alpha = if vote_any(grows(0) || grows(1)) {
            let mut alpha = [1.0f32; 2];
            for r in 0..2 {
                // A row that had no key yet has a zero sum and accumulator: any finite factor works.
                if self.row_max[r] != f32::NEG_INFINITY {
                    alpha[r] = exp2(fma(self.row_max[r], scale_log2, -scaled_max(m[r], scale_log2)));
                }
                self.row_sum[r] *= alpha[r];
            }
            self.row_max = m;
            Some(alpha)
        } else {
            None
        };
        let step_scale = scale_log2 * s_factor;
        for r in 0..2 {
            let m_scaled = scaled_max(self.row_max[r], scale_log2) - weight.p_log2;
            let m_scaled = row_bias.map_or(m_scaled, |b| fma(-b[r], scale_log2, m_scaled));
            let mut sum = 0.0f32;
            for f in s.iter_mut() {
                for e in 0..2 {
                    let p = exp2(fma(f[2 * r + e], step_scale, -m_scaled));
                    f[2 * r + e] = p;
                    sum += p;
                }
            }
            self.row_sum[r] += sum * weight.sum;
        }
        alpha
    }

    /// Multiplies each row of an output accumulator by its factor, if any.
    #[inline(always)]
    pub fn rescale<const DT: usize>(o: &mut [Frag; DT], alpha: Option<[f32; 2]>) {
        let Some(alpha) = alpha else { return };
        for f in o.iter_mut() {
            f[0] *= alpha[0];
            f[1] *= alpha[0];
            f[2] *= alpha[1];
            f[3] *= alpha[1];
        }
    }

    /// Final per-row `1/sum` (0 for a row with no key) and log-sum-exp of the scaled
    /// scores (`+inf` for a row with no key, FlashAttention's convention, so that a
    /// backward pass' `exp(S - LSE)` is 0 there).
    #[inline(always)]
    pub fn finalize(&self, softmax_scale: f32) -> ([f32; 2], [f32; 2]) {
        let mut inv = [0.0f32; 2];
        let mut lse = [f32::INFINITY; 2];
        for r in 0..2 {
            let sum = quad_sum(self.row_sum[r]);
            if sum > 0.0 {
                inv[r] = rcp(sum);
                lse[r] = self.row_max[r] * softmax_scale + ln(sum);
            }
        }
        (inv, lse)
    }

    /// [`Self::finalize`] with an attention sink: the logit `sink` (natural-log units)
    /// joins each row's denominator. Both terms are taken relative to the larger of the
    /// row's max logit and the sink, so neither overflows; a row with no key gets the
    /// sink's LSE and a zero factor.
    #[inline(always)]
    pub fn finalize_with_sink(&self, softmax_scale: f32, sink: f32) -> ([f32; 2], [f32; 2]) {
        let mut inv = [0.0f32; 2];
        let mut lse = [0.0f32; 2];
        for r in 0..2 {
            let sum = quad_sum(self.row_sum[r]);
            let max = self.row_max[r];
            let a = if max == f32::NEG_INFINITY { f32::NEG_INFINITY } else { max * softmax_scale };
            let m = fmax(a, sink);
            let (ea, es) = (exp2((a - m) * LOG2_E), exp2((sink - m) * LOG2_E));
            let total = fma(sum, ea, es);
            inv[r] = ea * rcp(total);
            lse[r] = m + ln(total);
        }
        (inv, lse)
    }
}

/// Sets to `-inf` the scores of keys past `seqlen_k` and, when `causal_offset` is
/// `Some(off)`, of keys `col > row + off`.
///
/// `row_g`: global query row of this lane's first row (g); `col_2t`: global key index of
/// column `2t` of n-tile 0.
#[inline(always)]
pub fn apply_mask<const NT: usize>(
    s: &mut [Frag; NT],
    row_g: i32,
    col_2t: i32,
    seqlen_k: i32,
    causal_offset: Option<i32>,
) {
    for j in 0..NT {
        for e in 0..4 {
            let row = row_g + 8 * (e as i32 / 2);
            let col = col_2t + 8 * j as i32 + (e as i32 % 2);
            let limit = match causal_offset {
                Some(off) => seqlen_k.min(row + off + 1),
                None => seqlen_k,
            };
            if col >= limit {
                s[j][e] = f32::NEG_INFINITY;
            }
        }
    }
}

/// Sets to `-inf` the scores of keys `col >= limits[r]` in row `r` (g, g + 8) of this
/// lane: [`apply_mask`] with each row's limit computed once.
///
/// `col_2t`: global key index of column `2t` of n-tile 0.
#[inline(always)]
pub fn mask_columns<const NT: usize>(s: &mut [Frag; NT], col_2t: i32, limits: [i32; 2]) {
    for j in 0..NT {
        for e in 0..4 {
            let col = col_2t + 8 * j as i32 + (e as i32 % 2);
            if col >= limits[e / 2] {
                s[j][e] = f32::NEG_INFINITY;
            }
        }
    }
}

/// Sets to `-inf` the scores of keys outside `[first[r], end[r])` in row `r` (g, g + 8)
/// of this lane (a sliding window's rows).
///
/// `col_2t`: global key index of column `2t` of n-tile 0.
#[inline(always)]
pub fn mask_columns_outside<const NT: usize>(s: &mut [Frag; NT], col_2t: i32, first: [i32; 2], end: [i32; 2]) {
    for j in 0..NT {
        for e in 0..4 {
            let col = col_2t + 8 * j as i32 + (e as i32 % 2);
            if col < first[e / 2] || col >= end[e / 2] {
                s[j][e] = f32::NEG_INFINITY;
            }
        }
    }
}
