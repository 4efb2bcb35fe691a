//! The element types the kernels compute on: 16-bit ([`Element`]: f16, bf16) everywhere,
//! and e4m3 ([`E4M3`]) as the FA3 forward's GEMM operands ([`Operand`]).
use crate::fa3::traits::{ProbTile, ScoreTile};
use crate::ptx::wgmma::WgmmaAcc;
use crate::softmax::Frag;
use crate::ptx::{math, mma};
use common::gmma::{k_major_sw64, k_major_sw128, mn_major_k_step, mn_major_sw128};

/// The element type of the FA3 forward's GEMM operands Q, K and V: a 16-bit type, or
/// e4m3, whose wgmma reads twice the elements per k-step and only K-major tiles (V is
/// then stored transposed, `common::fp8`). Tiles are laid out in bytes the same way:
/// 128-byte swizzled chunks of 64 16-bit or 128 e4m3 elements.
pub trait Operand {
    /// Bytes per element.
    const BYTES: u32;
    /// Elements per wgmma k-step (32 bytes either way).
    const K_STEP: u32;
    /// V is stored transposed (keys contiguous), as e4m3's K-major-only wgmma needs.
    const V_TRANSPOSED: bool;
    /// P of a score tile `S` as the A operand of `O += P V`, one entry per k-step.
    type Probs<S: ScoreTile>: ProbTile;
    /// P = S (the softmax's probabilities) converted to the A operand.
    fn to_probs<S: ScoreTile>(s: &S) -> Self::Probs<S>;
    /// S (+)= Q K^T's k-step: both operands K-major in shared memory.
    fn qk_ss<A: WgmmaAcc>(acc: &mut A, desc_q: u64, desc_k: u64, scale_d: bool);
    /// S (+)= Q K^T's k-step with Q's fragment in registers.
    fn qk_rs<A: WgmmaAcc>(acc: &mut A, q: [u32; 4], desc_k: u64, scale_d: bool);
    /// O += P V's k-step, V as stored.
    fn pv<A: WgmmaAcc>(acc: &mut A, p: [u32; 4], desc_v: u64);
    /// The descriptor of a V tile of `block_n` keys at `addr`.
    fn v_desc(addr: u32, block_n: u32) -> u64;
    /// Byte offset of k-step `kb` (keys) in a V tile of `block_n` keys by `hdim`.
    fn v_k_step(kb: u32, hdim: u32, block_n: u32) -> u32;
}

/// e4m3 (FP8): Q, K and V of the FP8 forward.
pub struct E4M3;

impl Operand for E4M3 {
    const BYTES: u32 = 1;
    const K_STEP: u32 = 32;
    const V_TRANSPOSED: bool = true;
    type Probs<S: ScoreTile> = S::Probs8;
    #[inline(always)]
    fn to_probs<S: ScoreTile>(s: &S) -> Self::Probs<S> {
        s.to_probs_e4m3()
    }
    #[inline(always)]
    fn qk_ss<A: WgmmaAcc>(acc: &mut A, desc_q: u64, desc_k: u64, scale_d: bool) {
        acc.ss_e4m3(desc_q, desc_k, scale_d)
    }
    #[inline(always)]
    fn qk_rs<A: WgmmaAcc>(acc: &mut A, q: [u32; 4], desc_k: u64, scale_d: bool) {
        acc.rs_e4m3(q, desc_k, scale_d)
    }
    #[inline(always)]
    fn pv<A: WgmmaAcc>(acc: &mut A, p: [u32; 4], desc_v: u64) {
        acc.rs_e4m3(p, desc_v, true)
    }
    #[inline(always)]
    fn v_desc(addr: u32, block_n: u32) -> u64 {
        // `hdim` rows of `block_n` keys (bytes): a K-major B operand like a K tile, in
        // chunks of `hdim` rows by one swizzle span (`common::fp8::vt_chunk`).
        if common::fp8::vt_chunk(block_n) == 64 { k_major_sw64(addr) } else { k_major_sw128(addr) }
    }
    #[inline(always)]
    fn v_k_step(kb: u32, hdim: u32, block_n: u32) -> u32 {
        // 32 bytes a step inside a chunk; the chunks follow each other.
        let chunk = common::fp8::vt_chunk(block_n);
        let steps = chunk / 32;
        (kb / steps) * hdim * chunk + (kb % steps) * 32
    }
}

/// The 16-bit types as operands: V MN-major as stored, P rounded to the type.
macro_rules! operand_16bit {
    ($($t:ty),*) => {$(
        impl Operand for $t {
            const BYTES: u32 = 2;
            const K_STEP: u32 = 16;
            const V_TRANSPOSED: bool = false;
            type Probs<S: ScoreTile> = S::Probs;
            #[inline(always)]
            fn to_probs<S: ScoreTile>(s: &S) -> Self::Probs<S> {
                s.to_probs::<Self>()
            }
            #[inline(always)]
            fn qk_ss<A: WgmmaAcc>(acc: &mut A, desc_q: u64, desc_k: u64, scale_d: bool) {
                <Self as Element>::wgmma_ss(acc, desc_q, desc_k, scale_d)
            }
            #[inline(always)]
            fn qk_rs<A: WgmmaAcc>(acc: &mut A, q: [u32; 4], desc_k: u64, scale_d: bool) {
                <Self as Element>::wgmma_rs_k(acc, q, desc_k, scale_d)
            }
            #[inline(always)]
            fn pv<A: WgmmaAcc>(acc: &mut A, p: [u32; 4], desc_v: u64) {
                <Self as Element>::wgmma_rs_mn(acc, p, desc_v, true)
            }
            #[inline(always)]
            fn v_desc(addr: u32, block_n: u32) -> u64 {
                mn_major_sw128(addr, block_n)
            }
            #[inline(always)]
            fn v_k_step(kb: u32, _hdim: u32, _block_n: u32) -> u32 {
                mn_major_k_step(kb)
            }
        }
    )*};
}

operand_16bit!(F16, BF16);

/// A 16-bit floating-point input type (f16 or bf16) with f32 accumulation.
pub trait Element {
    /// Packs two f32 into one register of two elements, `lo` first in memory.
    fn pack2(lo: f32, hi: f32) -> u32;
    /// `mma.sync.m16n8k16` with this element type.
    fn mma_m16n8k16(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]);
    /// `wgmma` with A and B (K-major) from shared memory.
    fn wgmma_ss<A: WgmmaAcc>(acc: &mut A, desc_a: u64, desc_b: u64, scale_d: bool);
    /// `wgmma` with A from registers and an MN-major B from shared memory.
    fn wgmma_rs_mn<A: WgmmaAcc>(acc: &mut A, a: [u32; 4], desc_b: u64, scale_d: bool);
    /// `wgmma` with A from registers and a K-major B from shared memory.
    fn wgmma_rs_k<A: WgmmaAcc>(acc: &mut A, a: [u32; 4], desc_b: u64, scale_d: bool);
    /// `wgmma` with a K-major A and an MN-major B, both from shared memory.
    fn wgmma_ss_k_mn<A: WgmmaAcc>(acc: &mut A, desc_a: u64, desc_b: u64, scale_d: bool);
    /// `wgmma` with A and B both MN-major in shared memory (tiles stored K-row by K-row).
    fn wgmma_ss_mn_mn<A: WgmmaAcc>(acc: &mut A, desc_a: u64, desc_b: u64, scale_d: bool);
    /// Unpacks one register of two elements into `f32`, the one first in memory first.
    fn unpack2(v: u32) -> [f32; 2];
}

/// The A operand (m16n8k16 `mma.sync` or `m64nNk16` RS `wgmma`) for keys
/// `16kb..16kb+16` of a probability tile: n-tiles `2kb` and `2kb+1`, rounded to `E`.
#[inline(always)]
pub fn a_fragment<E: Element>(lo: &Frag, hi: &Frag) -> [u32; 4] {
    [E::pack2(lo[0], lo[1]), E::pack2(lo[2], lo[3]), E::pack2(hi[0], hi[1]), E::pack2(hi[2], hi[3])]
}

pub struct F16;
pub struct BF16;

impl Element for F16 {
    #[inline(always)]
    fn pack2(lo: f32, hi: f32) -> u32 {
        math::pack_f16x2(lo, hi)
    }
    #[inline(always)]
    fn mma_m16n8k16(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
        mma::mma_m16n8k16_f16(d, a, b)
    }
    #[inline(always)]
    fn wgmma_ss<A: WgmmaAcc>(acc: &mut A, desc_a: u64, desc_b: u64, scale_d: bool) {
        acc.ss_f16::<0>(desc_a, desc_b, scale_d)
    }
    #[inline(always)]
    fn wgmma_rs_mn<A: WgmmaAcc>(acc: &mut A, a: [u32; 4], desc_b: u64, scale_d: bool) {
        acc.rs_f16::<1>(a, desc_b, scale_d)
    }
    #[inline(always)]
    fn wgmma_rs_k<A: WgmmaAcc>(acc: &mut A, a: [u32; 4], desc_b: u64, scale_d: bool) {
        acc.rs_f16::<0>(a, desc_b, scale_d)
    }
    #[inline(always)]
    fn wgmma_ss_k_mn<A: WgmmaAcc>(acc: &mut A, desc_a: u64, desc_b: u64, scale_d: bool) {
        acc.ss_f16::<1>(desc_a, desc_b, scale_d)
    }
    #[inline(always)]
    fn wgmma_ss_mn_mn<A: WgmmaAcc>(acc: &mut A, desc_a: u64, desc_b: u64, scale_d: bool) {
        acc.ss_f16_mn_a::<1>(desc_a, desc_b, scale_d)
    }
    #[inline(always)]
    fn unpack2(v: u32) -> [f32; 2] {
        math::unpack_f16x2(v)
    }
}

impl Element for BF16 {
    #[inline(always)]
    fn pack2(lo: f32, hi: f32) -> u32 {
        math::pack_bf16x2(lo, hi)
    }
    #[inline(always)]
    fn mma_m16n8k16(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
        mma::mma_m16n8k16_bf16(d, a, b)
    }
    #[inline(always)]
    fn wgmma_ss<A: WgmmaAcc>(acc: &mut A, desc_a: u64, desc_b: u64, scale_d: bool) {
        acc.ss_bf16::<0>(desc_a, desc_b, scale_d)
    }
    #[inline(always)]
    fn wgmma_rs_mn<A: WgmmaAcc>(acc: &mut A, a: [u32; 4], desc_b: u64, scale_d: bool) {
        acc.rs_bf16::<1>(a, desc_b, scale_d)
    }
    #[inline(always)]
    fn wgmma_rs_k<A: WgmmaAcc>(acc: &mut A, a: [u32; 4], desc_b: u64, scale_d: bool) {
        acc.rs_bf16::<0>(a, desc_b, scale_d)
    }
    #[inline(always)]
    fn wgmma_ss_k_mn<A: WgmmaAcc>(acc: &mut A, desc_a: u64, desc_b: u64, scale_d: bool) {
        acc.ss_bf16::<1>(desc_a, desc_b, scale_d)
    }
    #[inline(always)]
    fn wgmma_ss_mn_mn<A: WgmmaAcc>(acc: &mut A, desc_a: u64, desc_b: u64, scale_d: bool) {
        acc.ss_bf16_mn_a::<1>(desc_a, desc_b, scale_d)
    }
    #[inline(always)]
    fn unpack2(v: u32) -> [f32; 2] {
        // bf16 is the upper half of an f32: widening is a shift.
        [f32::from_bits(v << 16), f32::from_bits(v & 0xFFFF_0000)]
    }
}
