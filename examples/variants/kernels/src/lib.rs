//! Two user-defined attention variants, written once for the GPU and the CPU reference
//! (the contract: `common::variant`).
//!
//! - [`RelBias`]: a learned relative-position bias (T5-style), one table row per query
//!   head: the logit is `x + table[head][clamp(kv − (q + seqlen_k − seqlen_q), −R, R) + R]`
//!   with `R = RelBias::MAX_DISTANCE`. Buffer: the f32 table `[heads_q][2R + 1]`.
//! - [`PrefixLm`]: a prefix-LM mask: every query sees the whole prefix of its batch
//!   element and, past it, the keys up to its bottom-right diagonal. Buffer: the prefix
//!   length of each batch element (u32). Run without `causal` (the prefix is not causal);
//!   its key bound (`key_end`) lets the kernels skip the blocks right of both.
//! - [`LocalGlobal`]: a band around the diagonal plus global tokens, a pattern for
//!   block-sparse masks. Buffer: `[window, globals]`.
#![no_std]
// What the kernels' entry points need (nightly, as the library's own kernels).
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, asm_experimental_arch))]

use common::variant::{Coords, Variant, VariantData};

/// A learned relative-position bias.
#[derive(Clone, Copy)]
pub struct RelBias;

impl RelBias {
    /// Distances beyond this share the last bucket (a model constant, so that the
    /// kernels hold no register for it).
    pub const MAX_DISTANCE: u32 = 128;
    /// Buckets per head, `2 MAX_DISTANCE + 1`.
    pub const BUCKETS: u32 = 2 * Self::MAX_DISTANCE + 1;

    /// The distance bucket of pair `at` in `[0, BUCKETS)`.
    #[inline(always)]
    pub fn bucket(at: Coords) -> u32 {
        let diagonal = at.q as i32 + at.seqlen_k as i32 - at.seqlen_q as i32;
        let r = Self::MAX_DISTANCE as i32;
        // `max`/`min`: `clamp` would bring a panic path.
        ((at.kv as i32 - diagonal).max(-r).min(r) + r) as u32
    }
}

impl Variant for RelBias {
    const SCORE_MOD: bool = true;
    const MASK_MOD: bool = false;
    // d score / dx = 1: a bias.
    const SCORE_GRAD: bool = false;

    #[inline(always)]
    fn score<D: VariantData + ?Sized>(data: &D, at: Coords, x: f32) -> f32 {
        x + data.f32_at(at.head * Self::BUCKETS + Self::bucket(at))
    }
}

/// A prefix-LM mask.
#[derive(Clone, Copy)]
pub struct PrefixLm;

impl Variant for PrefixLm {
    const SCORE_MOD: bool = false;
    const MASK_MOD: bool = true;
    // Row q sees exactly the keys below max(prefix, its diagonal + 1): the blocks beyond
    // are skipped, and the kernels mask by the bound (those below every row's run unmasked).
    const KEY_END: bool = true;
    const KEY_END_EXACT: bool = true;

    #[inline(always)]
    fn visible<D: VariantData + ?Sized>(data: &D, at: Coords) -> bool {
        at.kv < data.u32_at(at.batch) || at.kv as i64 <= at.q as i64 + at.seqlen_k as i64 - at.seqlen_q as i64
    }

    #[inline(always)]
    fn key_end<D: VariantData + ?Sized>(data: &D, batch: u32, q: u32, seqlen_q: u32, seqlen_k: u32) -> u32 {
        let diagonal_end = (q as i64 + seqlen_k as i64 - seqlen_q as i64 + 1).max(0) as u32;
        data.u32_at(batch).max(diagonal_end)
    }
}

/// Local attention with global tokens (Longformer / BigBird style): query `q` sees key
/// `kv` when `|kv − q| <= window` (positions of a call with `seqlen_q = seqlen_k`, or
/// measured from the bottom-right diagonal otherwise), or when either is one of the
/// first `globals` tokens. No key bound describes it: run it with a block mask
/// (`flash_attn3::BlockMask`), whose lists skip the blocks outside the band and the
/// global rows and columns. Buffer: `[window, globals]` (u32).
#[derive(Clone, Copy)]
pub struct LocalGlobal;

impl Variant for LocalGlobal {
    const SCORE_MOD: bool = false;
    const MASK_MOD: bool = true;

    #[inline(always)]
    fn visible<D: VariantData + ?Sized>(data: &D, at: Coords) -> bool {
        // 32-bit: sequence lengths are below 2^31 (the host's limit).
        let from_diagonal = at.kv as i32 - (at.q as i32 + at.seqlen_k as i32 - at.seqlen_q as i32);
        let globals = data.u32_at(1);
        from_diagonal.unsigned_abs() <= data.u32_at(0) || at.kv < globals || at.q < globals
    }
}

// The library's forward and backward kernels for the three, as `rel_bias__*`,
// `prefix_lm__*` and `local_global__*` (`common::variant::KERNELS`).
#[cfg(target_arch = "nvptx64")]
kernels_gpu::variant_kernels!(rel_bias: RelBias, prefix_lm: PrefixLm, local_global: LocalGlobal);

/// The names given to `variant_kernels!` above, for the build script and the host.
pub const VARIANTS: [&str; 3] = ["rel_bias", "prefix_lm", "local_global"];
