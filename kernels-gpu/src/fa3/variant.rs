//! User-defined variants (`common::variant::Variant`) in the kernels: the forward's
//! score-modification hook ([`UserScore`], a [`ScoreMod`]) and the backward's
//! ([`UserVariant`], a [`LogitHook`]), both evaluating the user's functions per score.
//!
//! The kernel takes `x = S · softcap_scale` (the host sets `softcap_scale` to the
//! softmax scale and the softmax's `scale_log2` to `log2 e`), so the user's functions
//! see FlexAttention's scaled scores; a hidden pair's logit is `-inf` (and its
//! derivative 0), which the softmax and the backward's `P` turn into 0.
use super::mask::{CausalMask, Mask, ScoreMod};
use super::scheduler::Tile;
use super::traits::FragTile;
use crate::ptx::global;
use common::FwdParams;
use common::bwd::BwdParams;
use common::variant::{self, Coords, Variant, VariantArgs, VariantData};
use core::marker::PhantomData;

/// The variant's buffer in device memory; a read past its end yields 0.
#[derive(Clone, Copy)]
pub struct DeviceData {
    addr: u64,
    words: u32,
}

impl DeviceData {
    /// The buffer of a call's parameters.
    #[inline(always)]
    pub fn new(args: &VariantArgs) -> Self {
        DeviceData { addr: args.data, words: args.words }
    }
}

impl VariantData for DeviceData {
    #[inline(always)]
    fn u32_at(&self, index: u32) -> u32 {
        if index < self.words {
            // SAFETY: inside the buffer the host checked (4-byte aligned, `words` long,
            // not written during the launch).
            unsafe { global::ld_nc_invariant_u32(self.addr + 4 * index as u64) }
        } else {
            0
        }
    }
}

/// The call's values a variant's functions see besides the coordinates of a score (the
/// backward reads them from its parameter block where they are used).
#[derive(Clone, Copy)]
pub struct VariantCall<'a> {
    pub args: &'a VariantArgs,
    pub seqlen_q: &'a u32,
    pub seqlen_k: &'a u32,
}

impl<'a> VariantCall<'a> {
    #[inline(always)]
    pub fn of_fwd(p: &'a FwdParams) -> Self {
        VariantCall { args: &p.variant, seqlen_q: &p.seqlen_q, seqlen_k: &p.seqlen_k }
    }

    #[inline(always)]
    pub fn of_bwd(p: &'a BwdParams) -> Self {
        VariantCall { args: &p.variant, seqlen_q: &p.seqlen_q, seqlen_k: &p.seqlen_k }
    }

    /// The buffer.
    #[inline(always)]
    fn data(&self) -> DeviceData {
        DeviceData::new(self.args)
    }
}

/// The backward's per-element hook: the logit of a pair and its derivative.
pub trait LogitHook: Copy {
    /// Whether the kernel has a user variant (else nothing here is called).
    const ACTIVE: bool;
    /// Whether the variant changes logits (a mask alone does not).
    const SCORE: bool;
    /// Whether the logit's derivative may differ from 1 (else `dS` skips the product).
    const GRAD: bool;
    /// Whether the kernel walks a block mask's lists (`common::MaskKind::Sparse`): the
    /// mask mod then runs in the partial steps alone.
    const SPARSE: bool = false;
    /// The hook of query head `head` of batch `batch`.
    fn new(batch: u32, head: u32) -> Self;
    /// `(logit, d logit / dx)` of query `q` and key `kv` from `x = scale · q·k`;
    /// `(-inf, 0)` for a hidden pair. `masked`: the step needs the mask (a block mask's
    /// full steps do not ask `visible`; the other kernels ignore it).
    fn logit(&self, call: VariantCall<'_>, q: u32, kv: u32, x: f32, masked: bool) -> (f32, f32);

    /// The first query block (of `block_m` rows) whose rows may see key `key0` of batch
    /// `batch` under the variant's key bound (`Variant::key_end`; 0 without one).
    #[inline(always)]
    fn first_query_block(_call: VariantCall<'_>, _batch: u32, _key0: u32, _block_m: u32) -> u32 {
        0
    }

    /// Whether the key bound is the whole mask (`Variant::KEY_END_EXACT`): the kernels then
    /// mask by it, as by the causal mask, and never call `visible`.
    const EXACT: bool = false;

    /// The first query row whose bound passes key `key` (`seqlen_q` if none; `EXACT` only).
    #[inline(always)]
    fn first_query(_call: VariantCall<'_>, _batch: u32, _key: u32) -> u32 {
        0
    }

    /// Row `q`'s bound, at most `seqlen_k` (`EXACT` only).
    #[inline(always)]
    fn key_end(call: VariantCall<'_>, _batch: u32, _q: u32) -> u32 {
        *call.seqlen_k
    }
}

/// No user variant: the built-in kernels.
#[derive(Clone, Copy)]
pub struct NoVariant;

impl LogitHook for NoVariant {
    const ACTIVE: bool = false;
    const SCORE: bool = false;
    const GRAD: bool = false;
    #[inline(always)]
    fn new(_: u32, _: u32) -> Self {
        NoVariant
    }
    #[inline(always)]
    fn logit(&self, _: VariantCall<'_>, _: u32, _: u32, x: f32, _: bool) -> (f32, f32) {
        (x, 1.0)
    }
}

/// User variant `V` for one (batch, query head); `SPARSE`: in a block-sparse kernel.
#[derive(Clone, Copy)]
pub struct UserVariant<V, const SPARSE: bool = false> {
    batch: u32,
    head: u32,
    variant: PhantomData<V>,
}

impl<V: Variant, const SPARSE: bool> LogitHook for UserVariant<V, SPARSE> {
    const ACTIVE: bool = true;
    const SCORE: bool = V::SCORE_MOD;
    const GRAD: bool = V::SCORE_MOD && V::SCORE_GRAD;
    const SPARSE: bool = SPARSE;

    #[inline(always)]
    fn new(batch: u32, head: u32) -> Self {
        UserVariant { batch, head, variant: PhantomData }
    }

    #[inline(always)]
    fn logit(&self, call: VariantCall<'_>, q: u32, kv: u32, x: f32, masked: bool) -> (f32, f32) {
        let at = Coords { batch: self.batch, head: self.head, q, kv, seqlen_q: *call.seqlen_q, seqlen_k: *call.seqlen_k };
        let mask = !Self::EXACT && (!SPARSE || masked);
        variant::logit::<V, _>(&call.data(), at, x, mask).unwrap_or((f32::NEG_INFINITY, 0.0))
    }

    const EXACT: bool = V::KEY_END && V::KEY_END_EXACT;

    #[inline(always)]
    fn key_end(call: VariantCall<'_>, batch: u32, q: u32) -> u32 {
        V::key_end(&call.data(), batch, q, *call.seqlen_q, *call.seqlen_k).min(*call.seqlen_k)
    }

    /// A binary search over the rows: `key_end` does not decrease with the row.
    #[inline(always)]
    fn first_query(call: VariantCall<'_>, batch: u32, key: u32) -> u32 {
        let (mut lo, mut hi) = (0, *call.seqlen_q);
        while lo < hi {
            let q = lo + (hi - lo) / 2;
            if Self::key_end(call, batch, q) > key {
                hi = q;
            } else {
                lo = q + 1;
            }
        }
        lo
    }

    /// The block of the first row whose bound passes `key0` (the rows before it, and so
    /// the blocks before its block, see no key from `key0` on).
    #[inline(always)]
    fn first_query_block(call: VariantCall<'_>, batch: u32, key0: u32, block_m: u32) -> u32 {
        if !V::KEY_END {
            return 0;
        }
        let first = Self::first_query(call, batch, key0);
        // No row sees it: past the last block (not the last row's own block).
        if first >= *call.seqlen_q { call.seqlen_q.div_ceil(block_m) } else { first / block_m }
    }
}

/// The forward's mask with user variant `V`: the causal flag and the lengths
/// ([`CausalMask`]), and with `Variant::KEY_END` the key blocks past the rows' bound cut
/// from a tile's range (and a warpgroup's), so they are neither loaded nor computed. The
/// pairs the variant hides inside the range are the score hook's ([`UserScore`]).
#[derive(Clone, Copy)]
pub struct VariantMask<V> {
    causal: CausalMask,
    /// This lane's first row (exact bounds mask by each row's bound).
    row_g: i32,
    variant: PhantomData<V>,
}

impl<V: Variant> VariantMask<V> {
    /// `blocks` cut to those rows up to `last_row` of batch `batch` may see.
    #[inline(always)]
    fn bound(p: &FwdParams, batch: u32, last_row: i32, block_n: u32, blocks: u32) -> u32 {
        if !V::KEY_END || last_row < 0 || p.seqlen_q == 0 {
            return blocks;
        }
        let end = Self::row_end(p, batch, last_row.min(p.seqlen_q as i32 - 1)) as u32;
        blocks.min(end.div_ceil(block_n))
    }

    /// Row `row`'s bound (0 for rows outside the call: they are never stored).
    #[inline(always)]
    fn row_end(p: &FwdParams, batch: u32, row: i32) -> i32 {
        if row < 0 || row >= p.seqlen_q as i32 {
            return 0;
        }
        <UserVariant<V> as LogitHook>::key_end(VariantCall::of_fwd(p), batch, row as u32) as i32
    }
}

impl<V: Variant> Mask for VariantMask<V> {
    const LOCAL: bool = false;

    #[inline(always)]
    fn new(p: &FwdParams, tile: &Tile, row_g: i32) -> Self {
        VariantMask { causal: CausalMask::new(p, tile, row_g), row_g, variant: PhantomData }
    }

    #[inline(always)]
    fn tile_blocks(p: &FwdParams, batch: u32, row0: i32, block_m: u32, block_n: u32) -> (u32, u32) {
        let (first, end) = CausalMask::tile_blocks(p, batch, row0, block_m, block_n);
        (first, Self::bound(p, batch, row0 + block_m as i32 - 1, block_n, end))
    }

    #[inline(always)]
    fn visible_blocks(p: &FwdParams, batch: u32, row0: i32, rows: u32, block_n: u32) -> (u32, u32) {
        let (first, end) = CausalMask::visible_blocks(p, batch, row0, rows, block_n);
        (first, Self::bound(p, batch, row0 + rows as i32 - 1, block_n, end))
    }

    /// With an exact bound, those below the first real row's bound too (later rows' are
    /// no lower).
    #[inline(always)]
    fn whole_blocks(p: &FwdParams, batch: u32, row0: i32, rows: u32, block_n: u32) -> (u32, u32) {
        let (first, end) = CausalMask::whole_blocks(p, batch, row0, rows, block_n);
        if !<UserVariant<V> as LogitHook>::EXACT {
            return (first, end);
        }
        (first, end.min(Self::row_end(p, batch, row0.max(0)) as u32 / block_n))
    }

    #[inline(always)]
    fn apply_with<S: FragTile>(&self, p: &FwdParams, batch: u32, s: &mut S, col_2t: i32) {
        if !<UserVariant<V> as LogitHook>::EXACT {
            return self.causal.apply_with(p, batch, s, col_2t);
        }
        let limits = [0usize, 1].map(|r| self.causal.limits[r].min(Self::row_end(p, batch, self.row_g + 8 * r as i32)));
        s.mask_columns(col_2t, limits)
    }
}

/// User variant `V` as the forward's score modification of one (batch, query head),
/// with the call's values it reads (the score hook has no parameter block at hand).
/// `MASK`: it also hides the pairs `visible` hides (in a block-sparse kernel the mask
/// hook does, [`SparseMask`], in the partial steps alone).
#[derive(Clone, Copy)]
pub struct UserScore<V, const MASK: bool = true> {
    variant: UserVariant<V>,
    args: VariantArgs,
    seqlen_q: u32,
    seqlen_k: u32,
    /// The softmax scale (`FwdParams::softcap_scale`), which makes `x` from `S`.
    scale: f32,
}

impl<V: Variant, const MASK: bool> ScoreMod for UserScore<V, MASK> {
    #[inline(always)]
    fn new(p: &FwdParams, batch: u32, head: u32) -> Self {
        let variant = <UserVariant<V> as LogitHook>::new(batch, head);
        UserScore { variant, args: p.variant, seqlen_q: p.seqlen_q, seqlen_k: p.seqlen_k, scale: p.softcap_scale }
    }

    /// Coordinates as in [`super::mask::Mask::apply_with`]: rows `row_g`, `row_g + 8`;
    /// in n-tile `j` keys `col_2t + 8j` and `+ 1`.
    #[inline(always)]
    fn apply<S: FragTile>(&self, s: &mut S, row_g: i32, col_2t: i32) -> Option<[f32; 2]> {
        let call = VariantCall { args: &self.args, seqlen_q: &self.seqlen_q, seqlen_k: &self.seqlen_k };
        for j in 0..S::FRAGS {
            let f = s.frag_mut(j);
            for r in 0..2 {
                for c in 0..2 {
                    let (q, kv) = ((row_g + 8 * r as i32) as u32, (col_2t + 8 * j as i32 + c as i32) as u32);
                    let x = f[2 * r + c] * self.scale;
                    f[2 * r + c] = if MASK { self.variant.logit(call, q, kv, x, true).0 } else { self.unmasked(call, q, kv, x) };
                }
            }
        }
        None
    }
}

impl<V: Variant, const MASK: bool> UserScore<V, MASK> {
    /// The score alone, `visible` not asked (`common::variant::logit`'s rule).
    #[inline(always)]
    fn unmasked(&self, call: VariantCall<'_>, q: u32, kv: u32, x: f32) -> f32 {
        let at = Coords { batch: self.variant.batch, head: self.variant.head, q, kv, seqlen_q: *call.seqlen_q, seqlen_k: *call.seqlen_k };
        variant::logit::<V, _>(&call.data(), at, x, false).map_or(f32::NEG_INFINITY, |(logit, _)| logit)
    }
}

/// The forward's mask with user variant `V` in a block-sparse kernel
/// (`common::MaskKind::Sparse`): each tile visits the key blocks of its list; in the
/// partial ones the causal flag, the lengths ([`CausalMask`]) and `visible` hide pairs,
/// the full ones run without mask code.
#[derive(Clone, Copy)]
pub struct SparseMask<V> {
    causal: CausalMask,
    row_g: i32,
    head: u32,
    variant: PhantomData<V>,
}

impl<V: Variant> Mask for SparseMask<V> {
    const LOCAL: bool = false;
    const SPARSE: bool = true;

    #[inline(always)]
    fn new(p: &FwdParams, tile: &Tile, row_g: i32) -> Self {
        SparseMask { causal: CausalMask::new(p, tile, row_g), row_g, head: tile.head, variant: PhantomData }
    }

    /// Not asked: the tile's list gives its blocks.
    #[inline(always)]
    fn tile_blocks(_: &FwdParams, _: u32, _: i32, _: u32, _: u32) -> (u32, u32) {
        (0, 0)
    }

    /// Every block of the list (a warpgroup skips none of it).
    #[inline(always)]
    fn visible_blocks(_: &FwdParams, _: u32, _: i32, _: u32, _: u32) -> (u32, u32) {
        (0, u32::MAX)
    }

    /// Not asked: the list's partial blocks are its leading ones.
    #[inline(always)]
    fn whole_blocks(_: &FwdParams, _: u32, _: i32, _: u32, _: u32) -> (u32, u32) {
        (0, 0)
    }

    #[inline(always)]
    fn apply_with<S: FragTile>(&self, p: &FwdParams, batch: u32, s: &mut S, col_2t: i32) {
        self.causal.apply_with(p, batch, s, col_2t);
        let call = VariantCall::of_fwd(p);
        let data = call.data();
        for j in 0..S::FRAGS {
            let f = s.frag_mut(j);
            for r in 0..2 {
                for c in 0..2 {
                    let (q, kv) = ((self.row_g + 8 * r as i32) as u32, (col_2t + 8 * j as i32 + c as i32) as u32);
                    let at = Coords { batch, head: self.head, q, kv, seqlen_q: p.seqlen_q, seqlen_k: p.seqlen_k };
                    if !V::visible(&data, at) {
                        f[2 * r + c] = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
}
