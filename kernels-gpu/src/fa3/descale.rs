//! The FP8 forward's dequantization factors (`common::fp8`): Q's and, per (batch, head),
//! K's fold into the softmax's scale of a tile; K's per-block factors scale a block's
//! row maxima and its `exp2` argument's scale (`OnlineSoftmax::update_offset`); V's fold
//! into O: per (batch, head) once at the end, per block by keeping O in units of the last
//! block's factor and converting it, with the softmax's rescale, before
//! each PV. The 16-bit kernels read none of this (the `K::FP8` branches fold away).
use super::scheduler::Tile;
use super::traits::KernelTraits;
use crate::ptx::global;
use common::FwdParams;
use common::fp8::ScaleIndex;

/// The factor of (`batch`, `head`, `block`).
#[inline(always)]
pub fn load(s: &ScaleIndex, batch: u32, head: u32, block: u32) -> f32 {
    // SAFETY: the host checked that the factors cover every (batch, head, block) the
    // call's tiles and key blocks reach.
    f32::from_bits(unsafe { global::ld_nc_u32(s.ptr + 4 * s.offset(batch, head, block)) })
}

/// A tile's softmax scales `(scale · log2 e, scale)` with Q's factor and K's per-head
/// factor folded in (the kernel's scores are the raw e4m3 products).
#[inline(always)]
pub fn tile_scales<K: KernelTraits>(p: &FwdParams, tile: &Tile) -> (f32, f32) {
    if !K::FP8 {
        return (p.scale_log2, p.softmax_scale);
    }
    let q = load(&p.fp8.q, tile.batch, tile.head, tile.m_block);
    let k = if p.fp8.k.block_stride == 0 { load(&p.fp8.k, tile.batch, tile.head_k, 0) } else { 1.0 };
    (p.scale_log2 * q * k, p.softmax_scale * q * k)
}

/// K's factor of key block `block` when K has one per block (it then scales S).
#[inline(always)]
pub fn k_block(p: &FwdParams, tile: &Tile, block: u32) -> Option<f32> {
    (p.fp8.k.block_stride != 0).then(|| load(&p.fp8.k, tile.batch, tile.head_k, block))
}

/// O's unit: the V factor its accumulator is expressed in.
#[derive(Clone, Copy)]
pub struct VUnit(f32);

impl VUnit {
    /// Before the first PV (O is zero: any factor converts it).
    #[inline(always)]
    pub fn new() -> Self {
        VUnit(0.0)
    }

    /// Before the PV of key block `block`: the softmax's factor `alpha` combined with the
    /// conversion of O to that block's V factor (per-block V factors only).
    #[inline(always)]
    pub fn before_pv(&mut self, p: &FwdParams, tile: &Tile, block: u32, alpha: Option<[f32; 2]>) -> Option<[f32; 2]> {
        if p.fp8.v.block_stride == 0 {
            return alpha;
        }
        let v = load(&p.fp8.v, tile.batch, tile.head_k, block);
        let ratio = self.0 * crate::ptx::math::rcp(v);
        self.0 = v;
        // Uniform over the warpgroup (one block, one factor).
        if ratio == 1.0 {
            alpha
        } else {
            let a = alpha.unwrap_or([1.0; 2]);
            Some([a[0] * ratio, a[1] * ratio])
        }
    }

    /// The factor O's accumulator is finally multiplied by.
    #[inline(always)]
    pub fn output(&self, p: &FwdParams, tile: &Tile) -> f32 {
        if p.fp8.v.block_stride == 0 { load(&p.fp8.v, tile.batch, tile.head_k, 0) } else { self.0 }
    }
}
