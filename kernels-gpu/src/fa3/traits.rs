//! The configuration of one FA3 kernel as a traits type: the kernel table
//! (`common::fa3_kernel_table`) gives each entry point a type implementing
//! [`KernelTraits`], and every part of the kernel (producer, mainloop, epilogue,
//! scheduler, shared storage) reads its shapes, register tiles and switches from it.
//! Everything but the table's fields is derived here, once.
use super::mask::{Mask, ScoreMod};
use crate::element::{Element, Operand, a_fragment};
use crate::ptx::math::pack_e4m3x4;
use crate::ptx::regs::RegisterCount;
use crate::ptx::wgmma::{WgmmaAcc, fence_a_operand};
use crate::softmax::{Frag, OnlineSoftmax, Weight, mask_columns, mask_columns_outside};
use common::fa3::{KernelConfig, SmemLayout};
use common::gmma::{k_major_k_step, k_major_sw64, k_major_sw128, sw128_rows};
use core::marker::PhantomData;

/// Threads of a warpgroup (four warps: the unit that issues a WGMMA).
pub const WARPGROUP_THREADS: u32 = 128;
/// Query rows of a consumer warpgroup (the M of `wgmma.m64nNk16`).
pub const WARPGROUP_ROWS: u32 = 64;

/// One FA3 kernel configuration.
pub trait KernelTraits: Copy + 'static {
    /// The element type of Q, K and V (16-bit, or e4m3).
    type Element: Operand;
    /// The 16-bit element type of O.
    type OutElement: Element;
    /// A consumer warpgroup's S = QK^T accumulator: `BLOCK_N / 8` fragments.
    type Scores: ScoreTile;
    /// A consumer warpgroup's O accumulator: `HDIM / 8` fragments.
    type Out: FragTile + WgmmaAcc;
    /// Which keys a query row may see.
    type Mask: Mask;
    /// What is applied to the scores before the softmax.
    type ScoreMod: ScoreMod;
    /// The table's fields.
    const CONFIG: KernelConfig;

    const HDIM: u32 = Self::CONFIG.hdim;
    /// Query rows per CTA: 64 per consumer warpgroup.
    const BLOCK_M: u32 = Self::CONFIG.block_m();
    /// Keys per K/V block.
    const BLOCK_N: u32 = Self::CONFIG.block_n;
    const CONSUMER_WGS: u32 = Self::CONFIG.consumer_wgs;
    /// CTAs per cluster (2: K/V shared by TMA multicast).
    const CLUSTER: u32 = Self::CONFIG.cluster;
    /// A producer warpgroup issues the loads (else a consumer thread does, in line).
    const WARP_SPECIALIZED: bool = Self::CONFIG.techniques.warp_specialized;
    /// The consumer warpgroups take turns issuing GEMMs.
    const PINGPONG: bool = Self::CONFIG.techniques.pingpong;
    /// The softmax of block i overlaps the PV GEMM of block i-1 in one warpgroup.
    const OVERLAP: bool = Self::CONFIG.techniques.intra_overlap;
    /// Q is the register operand of QK^T (loaded once per tile).
    const Q_IN_REGISTERS: bool = Self::CONFIG.q_in_registers();
    /// Warpgroups skip the leading key blocks of a tile that are masked for all their rows.
    const SKIPS_MASKED_BLOCKS: bool = Self::CONFIG.skips_masked_blocks();
    /// The masked steps run their own loop, so that the unmasked loop has no mask code.
    /// Not at hdim 256 with 80-key blocks: there O, S and P take 188 of the consumers' 240
    /// registers, and the second copy of the step made ptxas 13.5 spill a register; that
    /// kernel runs one loop whose step branches around the mask (warp-uniformly). Nor
    /// with a sliding window, whose masked steps sit at both ends: its three loops made
    /// hdim 256 and 64 and soft-capping spill.
    /// Nor in the FP8 kernel at hdim 256, where ptxas 13.x spilled 4 registers with two copies.
    const SEPARATE_MASKED_LOOP: bool =
        !(Self::HDIM == 256 && (Self::BLOCK_N == 80 || Self::CONFIG.fp8)) && !<Self::Mask as Mask>::LOCAL;
    /// Q's descriptor is derived at each QKᵀ rather than held through the tile: at
    /// hdim 256 with documents and ALiBi the consumers (O, S and P in 176 of their 240
    /// registers, the loaded bounds and ALiBi's per-score distances beside them) spilled
    /// it under ptxas 13.5.
    const Q_DESC_PER_STEP: bool =
        Self::HDIM == 256 && <Self::Mask as Mask>::DOCS && <Self::ScoreMod as ScoreMod>::BIAS;
    /// Registers per thread after `setmaxnreg`.
    const PRODUCER_REGS: u32 = Self::CONFIG.register_split().0;
    const CONSUMER_REGS: u32 = Self::CONFIG.register_split().1;
    /// The shared-memory layout.
    const SMEM: SmemLayout = Self::CONFIG.smem();
    /// 64-column (128 B) chunks of the head dim of O.
    const CHUNKS: u32 = Self::HDIM / 64;
    /// e4m3 operands (`common::fp8`): descales, P offset into e4m3's range, V transposed.
    const FP8: bool = Self::CONFIG.fp8;
    /// FP8 with per-block K and V factors (the table's `blocks` kernels, whose key tile
    /// is the factors' block); the per-head kernels have no code for them.
    const FP8_BLOCK_FACTORS: bool = Self::CONFIG.fp8_block_factors;
    /// FP8 with V as stored: the producer warpgroup transposes each V tile
    /// (`super::transpose`).
    const TRANSPOSE_V: bool = Self::CONFIG.transpose_v;
    /// Bytes of a Q or K row's swizzle span: 128, or 64 for 64-byte rows (e4m3 at
    /// hdim 64), laid out by TMA's `SWIZZLE_64B`.
    const QK_SPAN: u32 = if Self::HDIM * <Self::Element as Operand>::BYTES >= 128 { 128 } else { 64 };

    /// The descriptor of a K-major Q or K tile at `addr`.
    #[inline(always)]
    fn qk_desc(addr: u32) -> u64 {
        if Self::QK_SPAN == 64 { k_major_sw64(addr) } else { k_major_sw128(addr) }
    }

    /// Byte offset of k-step `kk` in a Q or K tile of `rows` rows.
    #[inline(always)]
    fn qk_k_step(rows: u32, kk: u32) -> u32 {
        if Self::QK_SPAN == 64 { 32 * kk } else { k_major_k_step(rows, kk) }
    }

    /// Byte offset of row `row` (a multiple of 8) of a Q or K tile's first span.
    #[inline(always)]
    fn qk_rows(rows: u32, row: u32) -> u32 {
        if Self::QK_SPAN == 64 { 64 * row } else { sw128_rows(rows, 0, row) }
    }
}

/// The producer warpgroup's register count of a kernel (`setmaxnreg` takes an immediate).
pub struct ProducerRegs<K>(PhantomData<K>);
/// The consumer warpgroups' register count of a kernel.
pub struct ConsumerRegs<K>(PhantomData<K>);

impl<K: KernelTraits> RegisterCount for ProducerRegs<K> {
    const N: u32 = K::PRODUCER_REGS;
}

impl<K: KernelTraits> RegisterCount for ConsumerRegs<K> {
    const N: u32 = K::CONSUMER_REGS;
}

/// An f32 accumulator tile in the tensor-core C layout (`N` fragments of 8 columns), with
/// the row-wise operations of the online softmax.
pub trait FragTile: Copy {
    /// Fragments of 8 columns.
    const FRAGS: usize;
    fn zeroed() -> Self;
    /// Fragment `j`.
    fn frag(&self, j: usize) -> &Frag;
    /// Fragment `j`, to modify.
    fn frag_mut(&mut self, j: usize) -> &mut Frag;
    /// Multiplies each row by its factor, if any (the online softmax's rescale).
    fn rescale(&mut self, alpha: Option<[f32; 2]>);
    /// Sets to `-inf` the scores of keys at or past each row's limit (see
    /// [`mask_columns`]).
    fn mask_columns(&mut self, col_2t: i32, limits: [i32; 2]);
    /// Sets to `-inf` the scores of keys outside `[first[r], end[r])` in row `r` of this
    /// lane (see [`mask_columns_outside`]).
    fn mask_columns_outside(&mut self, col_2t: i32, first: [i32; 2], end: [i32; 2]);
    /// Folds the tile, times `s_factor`, plus `row_bias` per row, into the running
    /// statistics (see [`OnlineSoftmax::update_offset`]); the probabilities come out times
    /// `2^weight.p_log2`, and join the row sums times `weight.sum` more.
    fn softmax_update(&mut self, softmax: &mut OnlineSoftmax, scale_log2: f32, s_factor: f32, row_bias: Option<[f32; 2]>, weight: Weight, lazy: bool) -> Option<[f32; 2]>;
}

impl<const N: usize> FragTile for [Frag; N] {
    const FRAGS: usize = N;
    #[inline(always)]
    fn zeroed() -> Self {
        [[0.0; 4]; N]
    }
    #[inline(always)]
    fn frag(&self, j: usize) -> &Frag {
        &self[j]
    }
    #[inline(always)]
    fn frag_mut(&mut self, j: usize) -> &mut Frag {
        &mut self[j]
    }
    #[inline(always)]
    fn rescale(&mut self, alpha: Option<[f32; 2]>) {
        OnlineSoftmax::rescale(self, alpha)
    }
    #[inline(always)]
    fn mask_columns(&mut self, col_2t: i32, limits: [i32; 2]) {
        mask_columns(self, col_2t, limits)
    }
    #[inline(always)]
    fn mask_columns_outside(&mut self, col_2t: i32, first: [i32; 2], end: [i32; 2]) {
        mask_columns_outside(self, col_2t, first, end)
    }
    #[inline(always)]
    fn softmax_update(&mut self, softmax: &mut OnlineSoftmax, scale_log2: f32, s_factor: f32, row_bias: Option<[f32; 2]>, weight: Weight, lazy: bool) -> Option<[f32; 2]> {
        softmax.update_offset(self, scale_log2, s_factor, row_bias, weight, lazy)
    }
}

/// A score tile S and the matching probability tile P: the A operand of the PV GEMM, two
/// n-tiles of S per k16 step, in registers.
pub trait ScoreTile: FragTile + WgmmaAcc {
    type Probs: ProbTile;
    /// P = S rounded to `E`, in the RS WGMMA A-fragment layout.
    fn to_probs<E: Element>(&self) -> Self::Probs;
    /// k16 step `kb` of [`Self::to_probs`] alone.
    fn probs_step<E: Element>(&self, kb: usize) -> [u32; 4];
    /// P as the e4m3 A operand: `BLOCK_N / 32` k32 steps (the FP8 kernels' key blocks
    /// are whole steps, `common::fp8::block_n`).
    type Probs8: ProbTile;
    /// P = S rounded to e4m3, in the k32 A-fragment layout with the keys permuted as
    /// `common::fp8::vt_position` stores V: a thread's register `a0` (row g, k = 4t..4t+3)
    /// holds its own columns 2t, 2t+1 of fragments 4kb and 4kb+1, so no value leaves its
    /// thread.
    fn to_probs_e4m3(&self) -> Self::Probs8;
}

/// P as `BLOCK_N / 16` RS WGMMA A fragments.
pub trait ProbTile: Copy {
    /// k16 steps.
    const STEPS: usize;
    fn zeroed() -> Self;
    /// The A fragment of k16 step `kb`.
    fn step(&self, kb: usize) -> [u32; 4];
    /// Sets the A fragment of k16 step `kb`.
    fn set_step(&mut self, kb: usize, a: [u32; 4]);
    /// Compiler fence: every register is read and rewritten here (see
    /// [`WgmmaAcc::fence_operand`]).
    fn fence_operand(&mut self);
}

macro_rules! score_tile {
    ($($frags:literal),*) => {$(
        impl ScoreTile for [Frag; $frags] {
            type Probs = [[u32; 4]; $frags / 2];
            type Probs8 = [[u32; 4]; $frags / 4];
            #[inline(always)]
            fn to_probs_e4m3(&self) -> Self::Probs8 {
                core::array::from_fn(|kb| {
                    let f = |j: usize| &self[4 * kb + j];
                    [
                        pack_e4m3x4([f(0)[0], f(0)[1], f(1)[0], f(1)[1]]),
                        pack_e4m3x4([f(0)[2], f(0)[3], f(1)[2], f(1)[3]]),
                        pack_e4m3x4([f(2)[0], f(2)[1], f(3)[0], f(3)[1]]),
                        pack_e4m3x4([f(2)[2], f(2)[3], f(3)[2], f(3)[3]]),
                    ]
                })
            }
            #[inline(always)]
            fn to_probs<E: Element>(&self) -> Self::Probs {
                core::array::from_fn(|kb| a_fragment::<E>(&self[2 * kb], &self[2 * kb + 1]))
            }
            #[inline(always)]
            fn probs_step<E: Element>(&self, kb: usize) -> [u32; 4] {
                a_fragment::<E>(&self[2 * kb], &self[2 * kb + 1])
            }
        }
    )*};
}

// Key blocks of 64, 80, 128 and 192 (FP8 at hdim 128); the hdim-256 backward's 32
// queries a warpgroup.
score_tile!(4, 8, 10, 16, 24);

impl<const STEPS: usize> ProbTile for [[u32; 4]; STEPS] {
    const STEPS: usize = STEPS;
    #[inline(always)]
    fn zeroed() -> Self {
        [[0; 4]; STEPS]
    }
    #[inline(always)]
    fn step(&self, kb: usize) -> [u32; 4] {
        self[kb]
    }
    #[inline(always)]
    fn set_step(&mut self, kb: usize, a: [u32; 4]) {
        self[kb] = a;
    }
    #[inline(always)]
    fn fence_operand(&mut self) {
        for a in self.iter_mut() {
            fence_a_operand(a);
        }
    }
}
