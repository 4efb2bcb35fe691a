//! Online softmax over accumulator fragments, shared by every kernel whose score tile
//! has the tensor-core C layout (`mma.sync` m16n8 and `wgmma` m64nN alike): a lane holds
//! two rows (g and g+8 of its warp's 16) and, in n-tile `j`, columns `8j + 2t, 8j + 2t + 1`
//! (g = lane/4, t = lane%4). Row statistics are reduced over the 4 lanes of a quad.
//!
//! Scores stay unscaled in the tile; the scale is folded into the `exp2` argument
//! (`softmax_scale * log2 e`), as in FlashAttention-2.
use crate::ptx::math::{exp2, fma, fmax, ln, rcp, shfl_xor_f32};

/// An n-tile of the C fragment: `[c0, c1, c2, c3]` = row g cols 2t,2t+1; row g+8 cols 2t,2t+1.
pub type Frag = [f32; 4];

/// Per-lane running statistics of its two rows.
#[derive(Clone, Copy)]
pub struct OnlineSoftmax {
    /// Running maximum of the raw scores (`-inf` until a row sees a key).
    pub row_max: [f32; 2],
    /// This lane's partial sum of `exp2((s - max) * scale_log2)`; quad-reduced at the end.
    pub row_sum: [f32; 2],
}

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

    /// Folds a new score block in: replaces `s` by `exp2((s - max) * scale_log2)` with the
    /// updated row maxima and returns, per row, the factor the output accumulator must be
    /// multiplied by (`exp2((old_max - new_max) * scale_log2)`, 1 on the first block).
    #[inline(always)]
    pub fn update<const NT: usize>(&mut self, s: &mut [Frag; NT], scale_log2: f32) -> [f32; 2] {
        let mut alpha = [1.0f32; 2];
        for r in 0..2 {
            let mut m = self.row_max[r];
            for j in 0..NT {
                m = fmax(m, fmax(s[j][2 * r], s[j][2 * r + 1]));
            }
            let m = quad_max(m);
            let m_scaled = scaled_max(m, scale_log2);
            // A row that had no key yet has a zero sum and accumulator: any finite factor works.
            if self.row_max[r] != f32::NEG_INFINITY {
                alpha[r] = exp2(fma(self.row_max[r], scale_log2, -m_scaled));
            }
            self.row_max[r] = m;
            let mut sum = 0.0f32;
            for j in 0..NT {
                for e in 0..2 {
                    let p = exp2(fma(s[j][2 * r + e], scale_log2, -m_scaled));
                    s[j][2 * r + e] = p;
                    sum += p;
                }
            }
            self.row_sum[r] = fma(self.row_sum[r], alpha[r], sum);
        }
        alpha
    }

    /// Multiplies each row of an output accumulator by its factor.
    #[inline(always)]
    pub fn rescale<const DT: usize>(o: &mut [Frag; DT], alpha: [f32; 2]) {
        for j in 0..DT {
            o[j][0] *= alpha[0];
            o[j][1] *= alpha[0];
            o[j][2] *= alpha[1];
            o[j][3] *= alpha[1];
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
