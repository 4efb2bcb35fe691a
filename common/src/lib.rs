//! Types shared by the GPU kernels (compiled for `nvptx64-nvidia-cuda`) and the host.
//!
//! Everything here is `#[repr(C)]` plain data, so the host writes exactly the bytes the
//! kernel reads. Keep it `no_std` and free of anything target-specific.
#![no_std]

/// Head dimensions with a compiled kernel.
pub const HEAD_DIMS: [u32; 3] = [64, 128, 256];

/// Element type of Q, K, V and O.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F16 = 0,
    BF16 = 1,
}

impl DType {
    pub const ALL: [DType; 2] = [DType::F16, DType::BF16];

    pub const fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }
}

pub mod bwd;
pub mod fa3;
pub mod fp8;
pub mod gmma;
pub mod sparse;
pub mod variant;
pub mod window;

/// Which forward kernel family to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algo {
    /// FlashAttention-2 on `mma.sync` (any sm_80+ part; the portable fallback).
    Fa2,
    /// FlashAttention-3 on Hopper: TMA, mbarrier pipeline, WGMMA, with the given techniques.
    Fa3(fa3::Techniques),
}

/// What a kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// The forward pass (parameters: [`FwdParams`]).
    Forward,
    /// One launch of the backward pass (parameters: [`bwd::BwdParams`]).
    Backward(bwd::BwdStage),
    /// The FP8 forward pass (parameters: [`FwdParams`], with its descales); the entry's
    /// `dtype` is O's. `transpose_v`: V as stored (`[b, s, h, d]`), transposed by the
    /// kernel's producer; else V transposed beforehand (`fp8::vt_position`).
    /// `block_factors`: K and V may have per-block factors (`fp8::VUnit`); else both have
    /// one per (batch, head), and the kernel no per-block code.
    ForwardFp8 { transpose_v: bool, block_factors: bool },
    /// The FP8 quantization kernel (parameters: [`fp8::QuantizeParams`]); the entry's
    /// `dtype` is the input's.
    Fp8Quantize,
    /// A variant's block-mask build kernel (parameters: [`sparse::BuildParams`]); the
    /// entry's `dtype` and `hdim` mean nothing.
    BlockMask,
}

/// What a kernel applies to the scores before the softmax (the variants that change the
/// logits; masks are the other hook). Each kind is a type plugged into the kernel's
/// score-modification hook; the plain kernels carry [`ScoreModKind::None`] and compile
/// it to nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ScoreModKind {
    /// Logits `scale · S`.
    #[default]
    None,
    /// Logits `c · tanh(scale · S / c)` (Gemma 2's soft-capping, FlashAttention's
    /// `softcap`): the kernel takes `tanh(S · scale / c)` as the score and `c` joins the
    /// softmax's scale.
    Softcap,
    /// Logits `scale · S − slope · |i + seqlen_k − seqlen_q − j|` (ALiBi, FlashAttention's
    /// convention), one slope per (batch, query head) from a device array.
    Alibi,
    /// Both, soft-capping first (FlashAttention 2's order): logits
    /// `c · tanh(scale · S / c) − slope · |i + seqlen_k − seqlen_q − j|`.
    SoftcapAlibi,
    /// A user-defined variant (`variant::Variant`), from the user's own module: its
    /// `score` of the logit `x = scale · S` (the kernel takes `S · softcap_scale` with
    /// `softcap_scale = scale` and the softmax's scale is `log2 e`) and its mask.
    User,
}

/// Which keys a kernel's mask hides, besides those past `seqlen_k`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MaskKind {
    /// None, or under a causal mask (a run-time flag) those past a row's diagonal.
    #[default]
    Causal,
    /// Those outside a sliding window ([`window::KeyWindow`], causal folded in): key
    /// blocks start past 0 and masked blocks sit at both ends of a tile's range.
    Local,
    /// Those outside the row's document (packed sequences, [`window::DocumentBounds`])
    /// or window: [`MaskKind::Local`] with each row's range narrowed to its document.
    Document,
    /// Those a block mask leaves out ([`sparse`], built from a user variant's mask mod):
    /// each tile visits the key blocks of its list, the partial ones masked (the causal
    /// flag, the lengths and the variant's `visible`), the full ones without mask code.
    Sparse,
}

impl MaskKind {
    /// Whether a row's keys are a range that may start past key 0 (a window or documents).
    pub const fn is_local(self) -> bool {
        matches!(self, MaskKind::Local | MaskKind::Document)
    }
}

/// A compiled kernel entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelEntry {
    pub name: &'static str,
    /// The kernel family (the backward kernels are FA3's).
    pub algo: Algo,
    pub kind: KernelKind,
    pub hdim: u32,
    pub dtype: DType,
    /// Bytes of the leading `.param` that holds TMA descriptors, which the PTX builder
    /// aligns to 128 bytes (0: the kernel takes no descriptors).
    pub tma_param_bytes: u32,
    /// Threads per CTA the kernel is built for; non-zero adds `.maxntid N,1,1` and
    /// `.minnctapersm 1` to the entry, which `setmaxnreg` needs (a register cap at entry).
    pub launch_bounds: u32,
    /// CTAs per cluster (1: no cluster); above 1 the PTX builder adds
    /// `.reqnctapercluster N, 1, 1` and the grid must be a multiple of it.
    pub cluster: u32,
    /// FA3: consumer warpgroups (64 query rows each); 0 for FA2.
    pub consumer_wgs: u32,
    /// FA3: keys per K/V block; 0 for FA2.
    pub block_n: u32,
    /// The score modification compiled in.
    pub score_mod: ScoreModKind,
    /// The mask compiled in.
    pub mask: MaskKind,
}

/// The FA2 kernel table, written once (as [`fa3_kernel_table`]): it expands to
/// `callback! { NAME => DTYPE, hdim D; ... }`.
#[macro_export]
macro_rules! fa2_kernel_table {
    ($callback:ident) => {
        $callback! {
            fa2_fwd_hdim64_f16 => F16, hdim 64;
            fa2_fwd_hdim128_f16 => F16, hdim 128;
            fa2_fwd_hdim256_f16 => F16, hdim 256;
            fa2_fwd_hdim64_bf16 => BF16, hdim 64;
            fa2_fwd_hdim128_bf16 => BF16, hdim 128;
            fa2_fwd_hdim256_bf16 => BF16, hdim 256;
        }
    };
}

macro_rules! fa2_entries {
    ($($name:ident => $dtype:ident, hdim $hdim:literal;)*) => {
        &[$(KernelEntry {
            name: stringify!($name),
            algo: Algo::Fa2,
            kind: KernelKind::Forward,
            hdim: $hdim,
            dtype: DType::$dtype,
            tma_param_bytes: 0,
            launch_bounds: 0,
            cluster: 1,
            consumer_wgs: 0,
            block_n: 0,
            score_mod: ScoreModKind::None,
            mask: MaskKind::Causal,
        },)*]
    };
}

const FA2_KERNELS: &[KernelEntry] = fa2_kernel_table!(fa2_entries);

const ALL_KERNELS: usize = FA2_KERNELS.len() + fa3::KERNELS.len() + bwd::KERNELS.len() + fp8::KERNELS.len() + fp8::QUANTIZE_KERNELS.len();

/// Every kernel the PTX module exports: the FA2, FA3, backward and FP8 tables. The kernel
/// crate's entry points are generated from the same tables (the PTX builder checks both
/// directions).
pub const KERNELS: [KernelEntry; ALL_KERNELS] = {
    let mut all = [FA2_KERNELS[0]; ALL_KERNELS];
    let tables: [&[KernelEntry]; 5] = [FA2_KERNELS, fa3::KERNELS, bwd::KERNELS, fp8::KERNELS, fp8::QUANTIZE_KERNELS];
    let (mut i, mut t) = (0, 0);
    while t < tables.len() {
        let mut j = 0;
        while j < tables[t].len() {
            all[i] = tables[t][j];
            i += 1;
            j += 1;
        }
        t += 1;
    }
    all
};

impl KernelEntry {
    /// Bytes of the by-value parameter block the kernel takes after its TMA descriptors.
    pub const fn params_bytes(&self) -> usize {
        match self.kind {
            KernelKind::Forward | KernelKind::ForwardFp8 { .. } => core::mem::size_of::<FwdParams>(),
            KernelKind::Backward(_) => core::mem::size_of::<bwd::BwdParams>(),
            KernelKind::Fp8Quantize => core::mem::size_of::<fp8::QuantizeParams>(),
            KernelKind::BlockMask => core::mem::size_of::<sparse::BuildParams>(),
        }
    }
}

/// Looks up the kernel for a configuration (`cluster`: CTAs per cluster, 1 for none) over
/// `seqlen_k` keys (FA3 picks its key block by it, [`fa3::key_block`]).
pub fn find_kernel(algo: Algo, hdim: u32, dtype: DType, cluster: u32, seqlen_k: u32, score_mod: ScoreModKind, mask: MaskKind) -> Option<&'static KernelEntry> {
    let (wgs, block_n) = match algo {
        Algo::Fa2 => (0, 0),
        Algo::Fa3(_) => (fa3::consumer_wgs_of(hdim, score_mod, mask), fa3::key_block_of(hdim, seqlen_k, score_mod, mask)),
    };
    KERNELS.iter().find(|k| {
        k.kind == KernelKind::Forward
            && k.algo == algo
            && k.hdim == hdim
            && k.dtype == dtype
            && k.cluster == cluster
            && k.consumer_wgs == wgs
            && k.block_n == block_n
            && k.score_mod == score_mod
            && k.mask == mask
    })
}

/// Strides, in elements, of a `[batch, seqlen, heads, hdim]` tensor whose last
/// dimension is contiguous.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Strides {
    pub batch: u64,
    pub row: u64,
    pub head: u64,
}

impl Strides {
    /// The element index of (`batch`, `row`, `head`, `col`).
    #[inline(always)]
    pub const fn element(self, batch: u32, row: u32, head: u32, col: u32) -> u64 {
        batch as u64 * self.batch + row as u64 * self.row + head as u64 * self.head + col as u64
    }
}

/// The TMA descriptors of the FA3 kernels (`CUtensorMap`s of q, k, v, o, 128 B each),
/// the kernels' first parameter. The PTX builder raises its `.param` alignment to 128
/// bytes, as nvcc emits for a `__grid_constant__ CUtensorMap` (the TMA unit needs 64;
/// rustc's PTX ABI stops at 16).
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct TmaDescriptors(pub [u64; 64]);

/// The forward pass' launch parameters (one kernel argument, passed by value).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FwdParams {
    /// Device addresses.
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    /// `[batch, heads_q, seqlen_q]` f32, contiguous.
    pub lse: u64,
    pub q_strides: Strides,
    pub k_strides: Strides,
    pub v_strides: Strides,
    pub o_strides: Strides,
    pub batch: u32,
    pub heads_q: u32,
    pub heads_k: u32,
    /// `heads_q / heads_k`: query heads that share one K/V head (GQA/MQA).
    pub kv_group: u32,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    /// `softmax_scale * log2(e)`: the kernels exponentiate with `exp2`.
    pub scale_log2: f32,
    /// Natural-log scale, for the LSE.
    pub softmax_scale: f32,
    /// Non-zero: causal, aligned to the bottom-right corner of the score matrix.
    pub causal: u32,
    /// Soft-capping kernels ([`ScoreModKind::Softcap`]): `scale / c`. Their logits are
    /// `c · tanh(S · scale / c)`: the kernel takes `tanh(S · softcap_scale)` as the score
    /// and the host sets `scale_log2 = c · log2 e` and `softmax_scale = c`.
    pub softcap_scale: f32,
    /// ALiBi kernels ([`ScoreModKind::Alibi`]): f32 slopes, `[heads_q]` or
    /// `[batch, heads_q]` (`alibi_batch_stride` 0 or `heads_q`), and `1 / scale`, which turns
    /// a slope into raw-score units (the bias joins `S` before the softmax's scale).
    pub alibi_slopes: u64,
    pub alibi_batch_stride: u32,
    pub alibi_inv_scale: f32,
    /// Local kernels ([`MaskKind::Local`]): the window, causal folded in.
    pub window: window::KeyWindow,
    /// Local kernels: packed documents (rows see only keys of their own document).
    pub docs: window::DocumentBounds,
    /// Attention sinks (FA3 kernels): device address of f32 logits `[heads_q]` that join
    /// every row's softmax denominator (natural-log units, as the logits); 0: none.
    pub sinks: u64,
    /// FA3: device address of a u32 from which CTAs claim tiles in order (a dynamic
    /// persistent schedule); 0: each CTA takes every grid-th tile.
    pub tile_counter: u64,
    /// FA3: tiles are numbered in sections of `2^section_log2` (batch, head) pairs (a
    /// power of two dividing `batch * heads_q`); within a section query blocks are the
    /// slow index, so the heaviest blocks of all its heads come first.
    pub section_log2: u32,
    /// The counter's value when the launch starts: it is never reset, each launch moves
    /// it on by exactly its number of tiles (every tile past the first `ctas` is one
    /// claim, and every CTA that ran a tile makes one failing claim), so that launches on
    /// one stream can share it without a memset between them.
    pub tile_counter_base: u32,
    /// FP8 kernels: the dequantization factors of Q, K and V.
    pub fp8: fp8::Fp8Descales,
    /// User-defined variants ([`ScoreModKind::User`]): the buffer their functions read.
    pub variant: variant::VariantArgs,
    /// Block-sparse kernels ([`MaskKind::Sparse`]): each tile's key blocks.
    pub block_mask: sparse::BlockMaskArgs,
}

/// What the kernels add to a claimed counter value to get a tile: the launch's claims are
/// `base, base + 1, ...` (wrapping), and its first `ctas` tiles go by CTA index, so claim
/// `v` is tile `v - base + ctas`. Shared by the kernels and the CPU test of the protocol.
#[inline(always)]
pub const fn claim_stride(ctas: u32, base: u32) -> u32 {
    ctas.wrapping_sub(base)
}

/// The tile of a claimed counter value `claim` ([`claim_stride`]).
#[inline(always)]
pub const fn claimed_tile(claim: u32, stride: u32) -> u32 {
    claim.wrapping_add(stride)
}

/// Tile shape of the FA2 (`mma.sync`) kernel: query rows per CTA, keys per inner step,
/// warps per CTA (each warp owns 16 query rows).
pub mod fa2 {
    pub const BLOCK_M: u32 = 64;
    pub const BLOCK_N: u32 = 64;
    pub const WARPS: u32 = BLOCK_M / 16;
    pub const THREADS: u32 = WARPS * 32;

    /// Dynamic shared memory: one Q tile, one K tile, one V tile of `BLOCK x hdim` halves.
    pub const fn smem_bytes(hdim: u32) -> u32 {
        (BLOCK_M + 2 * BLOCK_N) * hdim * 2
    }
}

impl FwdParams {
    /// The key ranges of the local kernels (window and documents) of one batch.
    #[inline(always)]
    pub fn key_ranges<D: window::Documents>(&self, docs: D) -> window::KeyRanges<D> {
        window::KeyRanges { window: self.window, seqlen_q: self.seqlen_q, seqlen_k: self.seqlen_k, docs }
    }

    /// With a causal mask, query `i` (0-based) may attend key `j` iff `j <= i + offset`
    /// (bottom-right alignment, as in FlashAttention 2.1+); `None` without a mask.
    #[inline(always)]
    pub fn causal_offset(&self) -> Option<i32> {
        if self.causal != 0 { Some(self.seqlen_k as i32 - self.seqlen_q as i32) } else { None }
    }

    /// The K/V head that query head `head` reads (GQA/MQA). The host guarantees
    /// `kv_group > 0`; the checked division keeps panics out of the kernels.
    #[inline(always)]
    pub fn kv_head(&self, head: u32) -> u32 {
        head.checked_div(self.kv_group).unwrap_or(0)
    }

    /// Key blocks of `block_n` keys that any row of the query tile of `block_m` rows from
    /// `row0` can see: all of them, or under a causal mask those up to the last row's
    /// diagonal (none if even that row sees no key). `row0 > -block_m`: a tile may start
    /// above row 0 (FA3's causal tiles, [`fa3::tile_row0`]), never wholly.
    #[inline(always)]
    pub fn n_blocks(&self, row0: i32, block_m: u32, block_n: u32) -> u32 {
        debug_assert!(row0 > -(block_m as i32), "a tile wholly before row 0");
        self.blocks_through_row((row0 + block_m as i32 - 1).max(0) as u32, block_n)
    }

    /// How many leading key blocks of `block_n` keys some query row in `[row0, row0 + rows)`
    /// may attend (rows before 0 or past `seqlen_q` attend nothing). A consumer warpgroup
    /// of a tile skips the tile's blocks past this count: they are masked for all of its
    /// rows.
    #[inline(always)]
    pub fn visible_blocks(&self, row0: i32, rows: u32, block_n: u32) -> u32 {
        let end = (row0 + rows as i32).min(self.seqlen_q as i32);
        if row0 >= self.seqlen_q as i32 || end <= 0 || rows == 0 {
            return 0;
        }
        self.blocks_through_row(end as u32 - 1, block_n)
    }

    /// Key blocks that query row `last_row` (and so any row before it) can see.
    #[inline(always)]
    fn blocks_through_row(&self, last_row: u32, block_n: u32) -> u32 {
        let total = self.seqlen_k.div_ceil(block_n);
        match self.causal_offset() {
            None => total,
            Some(off) => {
                let last_key = last_row as i32 + off;
                if last_key < 0 { 0 } else { total.min(last_key as u32 / block_n + 1) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;

    fn params(seqlen_q: u32, seqlen_k: u32, causal: bool) -> FwdParams {
        FwdParams { seqlen_q, seqlen_k, causal: causal as u32, kv_group: 4, ..Default::default() }
    }

    #[test]
    fn non_causal_tiles_visit_every_key_block() {
        assert_eq!(params(1000, 300, false).n_blocks(896, 128, 128), 3);
        assert_eq!(params(1, 1, false).n_blocks(0, 128, 80), 1);
    }

    #[test]
    fn causal_tiles_stop_at_the_bottom_right_diagonal() {
        let p = params(1000, 1000, true);
        assert_eq!(p.causal_offset(), Some(0));
        // Rows 0..127 see keys 0..127: one 128-key block; rows 128..255: two.
        assert_eq!(p.n_blocks(0, 128, 128), 1);
        assert_eq!(p.n_blocks(128, 128, 128), 2);
        // seqlen_q > seqlen_k: the first 700 rows see no key at all.
        let p = params(1000, 300, true);
        assert_eq!(p.causal_offset(), Some(-700));
        assert_eq!(p.n_blocks(512, 128, 128), 0, "rows 512..639 see nothing");
        assert_eq!(p.n_blocks(640, 128, 128), 1, "row 767 sees keys 0..67");
        assert_eq!(p.n_blocks(896, 128, 128), 3, "never past the last key block");
    }

    /// Brute force over small shapes: no key that any row of the range may attend lies in a
    /// block past the count (skipping them loses nothing), and some row attends a key of the
    /// last counted block (the count is tight).
    #[test]
    fn visible_blocks_are_the_tight_prefix_the_rows_attend() {
        for causal in [false, true] {
            for (sq, sk) in [(1, 1), (5, 9), (9, 5), (17, 17), (40, 23), (23, 40), (64, 64)] {
                let p = params(sq, sk, causal);
                let sees = |r: i32, c: u32| {
                    (0..sq as i32).contains(&r) && c < sk && p.causal_offset().is_none_or(|off| c as i64 <= r as i64 + off as i64)
                };
                // Negative starts: FA3's first causal tile may begin above row 0.
                for (row0, rows) in [(0, 1), (0, 8), (3, 5), (8, 8), (16, 16), (32, 64), (60, 8), (-5, 8), (-8, 8), (-60, 64)] {
                    for block_n in [1, 4, 8, 16] {
                        let v = p.visible_blocks(row0, rows, block_n);
                        let seen = |b: u32| (b * block_n..(b + 1) * block_n).any(|c| (row0..row0 + rows as i32).any(|r| sees(r, c)));
                        let ctx = format!("sq {sq} sk {sk} causal {causal} rows {row0}+{rows} block_n {block_n}");
                        assert!((v..sk.div_ceil(block_n) + 1).all(|b| !seen(b)), "skips an attended key: {ctx} -> {v}");
                        assert!(v == 0 || seen(v - 1), "not tight: {ctx} -> {v}");
                    }
                }
            }
        }
        // A 192-row causal tile at rows 0..191 visits key blocks 0 and 1 of 128 keys: its
        // first 64 rows see only block 0, its last 64 rows both.
        let p = params(1024, 1024, true);
        assert_eq!((p.n_blocks(0, 192, 128), p.visible_blocks(0, 64, 128), p.visible_blocks(128, 64, 128)), (2, 1, 2));
        assert_eq!(params(1000, 1000, false).visible_blocks(1024, 64, 128), 0, "padding rows");
    }

    #[test]
    fn query_heads_share_kv_heads_in_groups() {
        let p = params(1, 1, false);
        assert_eq!((p.kv_head(0), p.kv_head(3), p.kv_head(4), p.kv_head(11)), (0, 0, 1, 2));
        assert_eq!(FwdParams::default().kv_head(5), 0, "an empty group never divides by zero");
    }
}
