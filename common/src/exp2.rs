//! `2^x` on the FMA pipe (what FlashAttention-4 does for part of its softmax): the
//! kernels whose score modification already takes a special-function-unit op per score
//! (soft-capping's `tanh`) compute part of their exponentials this way, so the SFU is no
//! longer the bottleneck. Shared with the host so the CPU tests check the very function
//! the kernels run, with the kernels' `fma` / `max` passed in.

/// Coefficients of a degree-4 minimax polynomial for `2^f`, `f` in [-1/2, 1/2]
/// (relative error 2.7e-6 in f32).
pub const EXP2_POLY: [f32; 5] = [0.99999928, 0.69312179, 0.24024743, 0.055917859, 0.0095701003];

/// `2^x` for `x` below about 100 or `-inf`, Cody–Waite: `x = n + f` with `n` an integer
/// (rounded by adding 1.5·2^23) and `f` in [-1/2, 1/2], [`EXP2_POLY`] for `2^f`, and `n`
/// added to its exponent bits. Below 2^-126 it is 0, as `ex2.approx.ftz` gives: a row's
/// hidden keys (`-inf`) must weigh exactly nothing.
#[inline(always)]
pub fn exp2_poly(x: f32, fma: impl Fn(f32, f32, f32) -> f32, fmax: impl Fn(f32, f32) -> f32) -> f32 {
    const ROUND: f32 = 12582912.0;
    let c = EXP2_POLY;
    let xc = fmax(x, -127.0);
    let n = xc + ROUND;
    let f = xc - (n - ROUND);
    let p = fma(fma(fma(fma(c[4], f, c[3]), f, c[2]), f, c[1]), f, c[0]);
    // `n`'s low bits hold the integer; shifted by 23 the rest of its bits fall out.
    let r = f32::from_bits(p.to_bits().wrapping_add(n.to_bits() << 23));
    if x < -126.0 { 0.0 } else { r }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    fn exp2(x: f32) -> f32 {
        exp2_poly(x, f32::mul_add, f32::max)
    }

    #[test]
    fn relative_error_is_below_3e_6_over_the_softmax_range() {
        // The softmax's arguments: scores less the (lazily kept) row maximum, up to the
        // rescaling threshold above it.
        let mut worst = 0f64;
        for i in 0..=2_000_000 {
            let x = -126.0 + 140.0 * i as f64 / 2_000_000.0;
            let got = exp2(x as f32) as f64;
            let want = (x as f32 as f64).exp2();
            worst = worst.max((got / want - 1.0).abs());
        }
        assert!(worst < 3e-6, "worst relative error {worst:e}");
    }

    #[test]
    fn hidden_and_underflowing_arguments_give_exactly_zero() {
        for x in [f32::NEG_INFINITY, -1e30, -127.0, -126.5] {
            assert_eq!(exp2(x).to_bits(), 0, "{x}");
        }
        assert_eq!(exp2(0.0), EXP2_POLY[0]);
        assert!(exp2(-126.0) > 0.0);
    }
}
