//! The 16-bit element types the kernels compute on.
use crate::ptx::wgmma::WgmmaAcc;
use crate::softmax::Frag;
use crate::ptx::{math, mma};

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
    fn wgmma_ss_mn_mn<A: WgmmaAcc>(acc: &mut A, desc_a: u64, desc_b: u64, scale_d: bool) {
        acc.ss_bf16_mn_a::<1>(desc_a, desc_b, scale_d)
    }
    #[inline(always)]
    fn unpack2(v: u32) -> [f32; 2] {
        // bf16 is the upper half of an f32: widening is a shift.
        [f32::from_bits(v << 16), f32::from_bits(v & 0xFFFF_0000)]
    }
}
