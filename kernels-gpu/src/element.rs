//! The 16-bit element types the kernels compute on.
use crate::ptx::{math, mma};

/// A 16-bit floating-point input type (f16 or bf16) with f32 accumulation.
pub trait Element {
    /// Packs two f32 into one register of two elements, `lo` first in memory.
    fn pack2(lo: f32, hi: f32) -> u32;
    /// `mma.sync.m16n8k16` with this element type.
    fn mma_m16n8k16(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]);
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
}
