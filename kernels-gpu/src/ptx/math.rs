//! Scalar math, warp shuffles and votes used by the softmax.
use core::arch::asm;

/// `2^x`, approximate (the SFU's `ex2`), denormals flushed. `exp2(-inf) = 0`.
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    let r: f32;
    // SAFETY: pure arithmetic.
    unsafe { asm!("ex2.approx.ftz.f32 {0}, {1};", out(reg32) r, in(reg32) x, options(pure, nomem, nostack)) };
    r
}

/// Natural logarithm through `lg2.approx` (used once per row for the LSE).
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    let r: f32;
    // SAFETY: pure arithmetic.
    unsafe { asm!("lg2.approx.ftz.f32 {0}, {1};", out(reg32) r, in(reg32) x, options(pure, nomem, nostack)) };
    r * core::f32::consts::LN_2
}

/// Hyperbolic tangent, approximate (the SFU's `tanh`, sm_75+: max relative error about
/// 2^-11, one instruction, as FlashAttention's soft-capping uses).
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let r: f32;
    // SAFETY: pure arithmetic.
    unsafe { asm!("tanh.approx.f32 {0}, {1};", out(reg32) r, in(reg32) x, options(pure, nomem, nostack)) };
    r
}

/// Fast `1/x`.
#[inline(always)]
pub fn rcp(x: f32) -> f32 {
    let r: f32;
    // SAFETY: pure arithmetic.
    unsafe { asm!("rcp.approx.ftz.f32 {0}, {1};", out(reg32) r, in(reg32) x, options(pure, nomem, nostack)) };
    r
}

/// `max` that returns the non-NaN operand (PTX `max.f32`).
#[inline(always)]
pub fn fmax(a: f32, b: f32) -> f32 {
    let r: f32;
    // SAFETY: pure arithmetic.
    unsafe { asm!("max.f32 {0}, {1}, {2};", out(reg32) r, in(reg32) a, in(reg32) b, options(pure, nomem, nostack)) };
    r
}

/// Butterfly shuffle across the full warp: returns `v` of lane `lane ^ mask`.
#[inline(always)]
pub fn shfl_xor_f32(v: f32, mask: u32) -> f32 {
    let r: f32;
    // SAFETY: all 32 lanes take part (callers keep the warp converged).
    unsafe {
        asm!("shfl.sync.bfly.b32 {0}, {1}, {2}, 0x1f, 0xffffffff;",
             out(reg32) r, in(reg32) v, in(reg32) mask, options(nomem, nostack))
    };
    r
}

/// Lane 0's `v`, in every lane of the warp. Also tells ptxas the value is warp-uniform
/// (a plain shared-memory load is not, and a branch on it would count as divergent).
#[inline(always)]
pub fn shfl_broadcast_u32(v: u32) -> u32 {
    let r: u32;
    // SAFETY: all 32 lanes take part (callers keep the warp converged).
    unsafe { asm!("shfl.sync.idx.b32 {0}, {1}, 0, 0x1f, 0xffffffff;", out(reg32) r, in(reg32) v, options(nomem, nostack)) };
    r
}

/// Whether `p` holds in any lane of the warp (the same answer in every lane, which ptxas
/// also knows: a branch on it is warp-uniform).
#[inline(always)]
pub fn vote_any(p: bool) -> bool {
    let r: u32;
    // SAFETY: all 32 lanes take part (callers keep the warp converged).
    unsafe {
        asm!("{{ .reg .pred p, q; setp.ne.u32 p, {1}, 0; vote.sync.any.pred q, p, 0xffffffff; selp.u32 {0}, 1, 0, q; }}",
             out(reg32) r, in(reg32) p as u32, options(nomem, nostack))
    };
    r != 0
}

/// Whether `p` holds in every lane of the warp (warp-uniform, as [`vote_any`]).
#[inline(always)]
pub fn vote_all(p: bool) -> bool {
    let r: u32;
    // SAFETY: all 32 lanes take part (callers keep the warp converged).
    unsafe {
        asm!("{{ .reg .pred p, q; setp.ne.u32 p, {1}, 0; vote.sync.all.pred q, p, 0xffffffff; selp.u32 {0}, 1, 0, q; }}",
             out(reg32) r, in(reg32) p as u32, options(nomem, nostack))
    };
    r != 0
}

/// The lanes in which `p` holds, as a bit mask (lane `i`: bit `i`), in every lane.
#[inline(always)]
pub fn ballot(p: bool) -> u32 {
    let r: u32;
    // SAFETY: all 32 lanes take part (callers keep the warp converged).
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.u32 p, {1}, 0; vote.sync.ballot.b32 {0}, p, 0xffffffff; }}",
             out(reg32) r, in(reg32) p as u32, options(nomem, nostack))
    };
    r
}

/// Packs two `f32` into `f16x2` (round to nearest even); `lo` in the low half.
#[inline(always)]
pub fn pack_f16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    // SAFETY: pure arithmetic. cvt's first source lands in the upper half.
    unsafe { asm!("cvt.rn.f16x2.f32 {0}, {1}, {2};", out(reg32) r, in(reg32) hi, in(reg32) lo, options(pure, nomem, nostack)) };
    r
}

/// Packs two `f32` into `bf16x2` (round to nearest even); `lo` in the low half.
#[inline(always)]
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    // SAFETY: pure arithmetic. cvt's first source lands in the upper half.
    unsafe { asm!("cvt.rn.bf16x2.f32 {0}, {1}, {2};", out(reg32) r, in(reg32) hi, in(reg32) lo, options(pure, nomem, nostack)) };
    r
}

/// Packs four `f32` into four e4m3 bytes (round to nearest even, saturating to ±448;
/// NaN stays NaN), `v[0]` in the low byte.
#[inline(always)]
pub fn pack_e4m3x4(v: [f32; 4]) -> u32 {
    let r: u32;
    // SAFETY: pure arithmetic. cvt's first source lands in the upper byte of each pair.
    unsafe {
        asm!("{{ .reg .b16 l, h; cvt.rn.satfinite.e4m3x2.f32 l, {2}, {1}; cvt.rn.satfinite.e4m3x2.f32 h, {4}, {3}; mov.b32 {0}, {{l, h}}; }}",
             out(reg32) r, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3], options(pure, nomem, nostack))
    };
    r
}

/// `prmt.b32` (byte permute, default mode): byte `i` of the result is byte
/// `(SEL >> 4i) & 7` of the eight bytes of `a` (0-3, low first) and `b` (4-7).
#[inline(always)]
pub fn byte_perm<const SEL: u32>(a: u32, b: u32) -> u32 {
    let r: u32;
    // SAFETY: pure arithmetic.
    unsafe { asm!("prmt.b32 {0}, {1}, {2}, {sel};", out(reg32) r, in(reg32) a, in(reg32) b, sel = const SEL, options(pure, nomem, nostack)) };
    r
}

/// Square root, correctly rounded.
#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    let r: f32;
    // SAFETY: pure arithmetic.
    unsafe { asm!("sqrt.rn.f32 {0}, {1};", out(reg32) r, in(reg32) x, options(pure, nomem, nostack)) };
    r
}

/// `|x|` (ptxas folds it into the operand of the instruction that reads it).
#[inline(always)]
pub fn abs(x: f32) -> f32 {
    let r: f32;
    // SAFETY: pure arithmetic.
    unsafe { asm!("abs.f32 {0}, {1};", out(reg32) r, in(reg32) x, options(pure, nomem, nostack)) };
    r
}

/// Fused `a * b + c`, rounded once.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    let r: f32;
    // SAFETY: pure arithmetic.
    unsafe { asm!("fma.rn.f32 {0}, {1}, {2}, {3};", out(reg32) r, in(reg32) a, in(reg32) b, in(reg32) c, options(pure, nomem, nostack)) };
    r
}

/// Unpacks `f16x2` into two `f32` (exact); the low half first.
#[inline(always)]
pub fn unpack_f16x2(v: u32) -> [f32; 2] {
    let (lo, hi): (f32, f32);
    // SAFETY: pure arithmetic.
    unsafe {
        asm!("{{ .reg .b16 l, h; mov.b32 {{l, h}}, {2}; cvt.f32.f16 {0}, l; cvt.f32.f16 {1}, h; }}",
             out(reg32) lo, out(reg32) hi, in(reg32) v, options(pure, nomem, nostack))
    };
    [lo, hi]
}
