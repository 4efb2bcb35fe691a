//! The FP8 forward's dequantization factors (`common::fp8`): Q's and, per (batch, head),
//! K's fold into the softmax's scale of a tile; K's per-block factors scale a block's
//! row maxima and its `exp2` argument's scale (`OnlineSoftmax::update_offset`); V's fold
//! into O: per (batch, head) once at the end, per block into P's `exp2` offset relative
//! to O's unit when they are powers of two ([`VUnit`]). The 16-bit kernels read none of
//! this (the `K::FP8` branches fold away).
use super::scheduler::Tile;
use super::traits::KernelTraits;
use crate::ptx::{global, math};
use crate::softmax::Weight;
use common::FwdParams;
use common::fp8::{P_EXP2_OFFSET, ScaleIndex, pow2};

/// The factor of (`batch`, `head`, `block`).
#[inline(always)]
pub fn load(s: &ScaleIndex, batch: u32, head: u32, block: u32) -> f32 {
    // SAFETY: the host checked that the factors cover every (batch, head, block) the
    // call's tiles and key blocks reach.
    f32::from_bits(unsafe { global::ld_nc_u32(s.ptr + 4 * s.offset(batch, head, block)) })
}

/// Whether this kernel reads `s`'s factors per key block (the per-head kernels never do).
#[inline(always)]
fn per_block<K: KernelTraits>(s: &ScaleIndex) -> bool {
    K::FP8_BLOCK_FACTORS && s.block_stride != 0
}

/// FP8's weight of P without a V factor in it: P times `2^8`, in e4m3's normal range.
const FP8_WEIGHT: Weight = Weight { p_log2: P_EXP2_OFFSET, sum: 1.0 };

/// A tile's softmax scales `(scale · log2 e, scale)` with Q's factor and K's per-head
/// factor folded in (the kernel's scores are the raw e4m3 products).
#[inline(always)]
pub fn tile_scales<K: KernelTraits>(p: &FwdParams, tile: &Tile) -> (f32, f32) {
    if !K::FP8 {
        return (p.scale_log2, p.softmax_scale);
    }
    let q = load(&p.fp8.q, tile.batch, tile.head, tile.m_block);
    let k = if per_block::<K>(&p.fp8.k) { 1.0 } else { load(&p.fp8.k, tile.batch, tile.head_k, 0) };
    (p.scale_log2 * q * k, p.softmax_scale * q * k)
}

/// A key block's K and V factors (per-block factors only; else K's 1 and V's 0), loaded
/// when the block's QK GEMM is issued, so that their latency hides under it.
#[derive(Clone, Copy)]
pub struct BlockFactors {
    /// Scales the block's scores (K's per-head factor is in the tile's scale).
    pub k: f32,
    /// V's factor ([`VUnit::enter`]).
    pub v: f32,
}

impl BlockFactors {
    /// Per-head factors, and the 16-bit kernels.
    pub const NONE: BlockFactors = BlockFactors { k: 1.0, v: 0.0 };
}

/// Where a tile's per-block K and V factors start (FP8 block-factor kernels; a zero
/// stride: per-head factors), so that a key block's pair costs two loads.
#[derive(Clone, Copy)]
pub struct BlockFactorRows {
    k: u64,
    v: u64,
    k_stride: u32,
    v_stride: u32,
}

impl BlockFactorRows {
    #[inline(always)]
    pub fn new<K: KernelTraits>(p: &FwdParams, tile: &Tile) -> Self {
        let (k, v) = (&p.fp8.k, &p.fp8.v);
        if !K::FP8_BLOCK_FACTORS {
            return BlockFactorRows { k: 0, v: 0, k_stride: 0, v_stride: 0 };
        }
        BlockFactorRows {
            k: k.ptr + 4 * k.offset(tile.batch, tile.head_k, 0),
            v: v.ptr + 4 * v.offset(tile.batch, tile.head_k, 0),
            k_stride: k.block_stride,
            v_stride: v.block_stride,
        }
    }

    /// Key block `block`'s factors.
    #[inline(always)]
    pub fn load<K: KernelTraits>(&self, block: u32) -> BlockFactors {
        let mut f = BlockFactors::NONE;
        if K::FP8_BLOCK_FACTORS {
            // SAFETY: the host checked that the factors cover every key block of the
            // call's tiles.
            if self.k_stride != 0 {
                f.k = f32::from_bits(unsafe { global::ld_nc_u32(self.k + 4 * block as u64 * self.k_stride as u64) });
            }
            if self.v_stride != 0 {
                f.v = f32::from_bits(unsafe { global::ld_nc_u32(self.v + 4 * block as u64 * self.v_stride as u64) });
            }
        }
        f
    }
}

/// O's unit with per-block V factors (`common::fp8::VUnit`): a key block whose factor
/// is a power of two within the unit's span enters PV as `P · 2^shift`, in the `exp2`
/// offset (one FMA per score, as before); any other block converts O to its own factor,
/// with the softmax's rescale, before its PV. With per-head factors, FP8's offset alone.
#[derive(Clone, Copy)]
pub struct VUnit {
    unit: common::fp8::VUnit,
    /// O's factor before the next PV (1: none).
    convert: f32,
}

impl VUnit {
    /// Before the tile's first key block.
    #[inline(always)]
    pub fn new() -> Self {
        VUnit { unit: common::fp8::VUnit::new(), convert: 1.0 }
    }

    /// The weight of the probabilities of a key block with V factor `v` (its
    /// [`BlockFactors`]), before its softmax.
    #[inline(always)]
    pub fn enter<K: KernelTraits>(&mut self, p: &FwdParams, v: f32) -> Weight {
        if !per_block::<K>(&p.fp8.v) {
            return FP8_WEIGHT;
        }
        // Uniform over the warpgroup (one block, one factor).
        match self.unit.enter(v) {
            // P shrinks by 2^shift; the row sums take it back.
            Ok(shift) => Weight { p_log2: P_EXP2_OFFSET + shift as f32, sum: pow2(-shift) },
            Err(old) => {
                if old != 0.0 {
                    self.convert *= old * math::rcp(v);
                }
                FP8_WEIGHT
            }
        }
    }

    /// O's factor before the PV of the block last entered: the softmax's `alpha`,
    /// combined with O's conversion if the unit moved.
    #[inline(always)]
    pub fn before_pv(&mut self, alpha: Option<[f32; 2]>) -> Option<[f32; 2]> {
        let c = self.convert;
        if c == 1.0 {
            return alpha;
        }
        self.convert = 1.0;
        let a = alpha.unwrap_or([1.0; 2]);
        Some([a[0] * c, a[1] * c])
    }

    /// The factor O's accumulator is finally multiplied by.
    #[inline(always)]
    pub fn output<K: KernelTraits>(&self, p: &FwdParams, tile: &Tile) -> f32 {
        if per_block::<K>(&p.fp8.v) { self.unit.factor() } else { load(&p.fp8.v, tile.batch, tile.head_k, 0) }
    }
}
