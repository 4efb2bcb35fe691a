//! User-defined attention variants: FlexAttention's `score_mod` and `mask_mod` as a Rust
//! type, compiled into the library's forward and backward kernels by the user's own
//! crate (see `kernels-gpu`'s `variant_kernels!` and `ptx-builder`'s `BuildConfig::variant`).
//!
//! # The contract
//!
//! A variant is a type implementing [`Variant`]: pure functions of the coordinates of a
//! score ([`Coords`]: batch, query head, query row, key) and, for [`Variant::score`], of
//! the logit. They may read one buffer the caller passes with the call (a table of
//! learned biases, per-batch prefix lengths...) through [`VariantData`]; a read past its
//! end yields 0, so an index bug cannot fault or read other memory. Nothing else: no
//! writes, no state across calls, no dependence on evaluation order (the kernels call
//! the functions in any order, any number of times, for pairs of any tile they visit,
//! including rows past `seqlen_q` and keys past `seqlen_k`, which they drop afterwards).
//!
//! - [`Variant::score`] maps a logit `x = softmax_scale · q·k` to the logit the softmax
//!   takes; [`Variant::score_grad`] is its derivative `d score / d x`, which the backward
//!   multiplies into `dS`. For every coordinate they are called with (padding included)
//!   `score` must return a finite value or `-inf` (which hides the pair), and
//!   `score_grad` a finite value where `score` is finite. The derivative is the user's:
//!   `reference::score_grad_error` (host crate) checks it against finite differences.
//! - [`Variant::visible`] says whether query row `q` sees key `kv`; a hidden pair gets
//!   probability 0, a row that sees no key O = 0 and LSE = +inf, as with the built-in
//!   masks. It combines with the call's `causal` flag (both must allow a pair).
//! - **What makes a block skippable:** the call's `causal` flag, the sequence lengths, and
//!   [`Variant::key_end`] when [`Variant::KEY_END`]: a bound on the keys each query row
//!   sees (prefix-LM, causal-like masks). Key blocks past every row's bound are neither
//!   loaded nor computed, forward and backward (the deterministic backward visits them,
//!   masked). Within the visited blocks `visible` runs on every pair, unless the bound is
//!   the whole mask ([`Variant::KEY_END_EXACT`]): then the kernels mask by the bound as by
//!   the causal mask. A bound that hides a pair `visible` shows gives wrong results:
//!   `reference::key_end_error` (host crate) checks one against `visible`.
//! - **Block masks:** for a mask no bound describes, the host builds a block mask from
//!   `visible` on the GPU (`flash_attn3::BlockMask`, [`crate::sparse`]): the module's
//!   build kernel evaluates it on every pair, with the call's causal flag and lengths,
//!   and the block-sparse kernels then skip the blocks with no visible pair and run those
//!   where every pair is visible without calling `visible`. The lists hold for the buffer
//!   as it was when they were built.
//!
//! The same impl runs in the CPU reference (the host crate reads the data from a slice),
//! so a variant's GPU tests compare against its own definition.

/// The buffer a variant reads: device memory in the kernels, a slice on the host.
/// Indices are in 4-byte words; reads past the end yield 0.
pub trait VariantData {
    /// Word `index` as raw bits.
    fn u32_at(&self, index: u32) -> u32;
    /// Word `index` as an f32.
    #[inline(always)]
    fn f32_at(&self, index: u32) -> f32 {
        f32::from_bits(self.u32_at(index))
    }
}

impl VariantData for [u32] {
    fn u32_at(&self, index: u32) -> u32 {
        self.get(index as usize).copied().unwrap_or(0)
    }
}

/// Where a score sits: query row `q` of query head `head` of batch `batch`, and key `kv`
/// (positions from 0, as FlexAttention's `q_idx` and `kv_idx`; the causal mask's
/// bottom-right offset is `seqlen_k − seqlen_q`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coords {
    pub batch: u32,
    pub head: u32,
    pub q: u32,
    pub kv: u32,
    /// The call's query and key lengths.
    pub seqlen_q: u32,
    pub seqlen_k: u32,
}

/// A user-defined score and mask modification (see the [module docs](self)).
pub trait Variant: Copy + 'static {
    /// Whether [`Variant::score`] changes logits (else it is never called).
    const SCORE_MOD: bool;
    /// Whether [`Variant::visible`] hides pairs (else it is never called).
    const MASK_MOD: bool;
    /// Whether [`Variant::score_grad`] may differ from 1 (`false`: `score` adds a bias to
    /// `x`, and the backward skips the product and the call).
    const SCORE_GRAD: bool = true;
    /// Whether [`Variant::key_end`] bounds the visible keys (else every key block of the
    /// call is visited).
    const KEY_END: bool = false;
    /// Whether the bound is the whole mask: row `q` sees exactly the keys below
    /// [`Variant::key_end`] (and [`Variant::visible`] says so too). The kernels then mask by
    /// the bound alone, like the causal mask: no `visible` call, and the blocks every row
    /// of a tile sees whole run without mask code. Needs `KEY_END`.
    const KEY_END_EXACT: bool = false;

    /// The logit of pair `at` from the scaled score `x = softmax_scale · q·k`.
    #[inline(always)]
    fn score<D: VariantData + ?Sized>(_data: &D, _at: Coords, x: f32) -> f32 {
        x
    }

    /// `d score / d x` at `x` (the backward's chain rule; called only when
    /// [`Variant::SCORE_GRAD`]).
    #[inline(always)]
    fn score_grad<D: VariantData + ?Sized>(_data: &D, _at: Coords, _x: f32) -> f32 {
        1.0
    }

    /// Whether pair `at` is visible.
    #[inline(always)]
    fn visible<D: VariantData + ?Sized>(_data: &D, _at: Coords) -> bool {
        true
    }

    /// One past the last key query row `q` of batch `batch` may see (called only when
    /// [`Variant::KEY_END`]): `visible` must be false for every key at or past it, for
    /// every head. It must not decrease as `q` grows (the blocks a query block visits are
    /// those below its last row's bound). Values past `seqlen_k` are clamped.
    #[inline(always)]
    fn key_end<D: VariantData + ?Sized>(_data: &D, _batch: u32, _q: u32, _seqlen_q: u32, seqlen_k: u32) -> u32 {
        seqlen_k
    }
}

/// Pair `at`'s logit from `x` under variant `V` and its derivative (1 without
/// `SCORE_GRAD`), `None` when `visible` hides it: the one rule the kernels and the CPU
/// reference share. `mask`: whether to ask `visible` (the kernels mask by an exact key
/// bound instead). The derivative is dead code where unused (the forward).
#[inline(always)]
pub fn logit<V: Variant, D: VariantData + ?Sized>(data: &D, at: Coords, x: f32, mask: bool) -> Option<(f32, f32)> {
    if V::MASK_MOD && mask && !V::visible(data, at) {
        return None;
    }
    if !V::SCORE_MOD {
        return Some((x, 1.0));
    }
    Some((V::score(data, at, x), if V::SCORE_GRAD { V::score_grad(data, at, x) } else { 1.0 }))
}

/// The variant's buffer as the kernels get it (`FwdParams::variant`, `BwdParams::variant`):
/// a device address and its length in words (0, 0 without one).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VariantArgs {
    pub data: u64,
    pub words: u32,
    pub _pad: u32,
}

/// The forward kernels of a variant module, written once (as [`crate::fa3_kernel_table`]).
/// A score function's loads and index arithmetic take registers the built-in kernels use
/// for their tiles: 64-key blocks at hdim 128 (128 spilled 300 bytes with a table
/// lookup), and at hdim 256 without the intra-warpgroup overlap too. Names are prefixed by
/// the variant's name in the module (`variant_kernels!`).
#[macro_export]
macro_rules! variant_fwd_kernel_table {
    ($callback:ident $(, $($extra:tt)*)?) => {
        $callback! {
            $($($extra)*)?
            variant_fwd_hdim64_f16 => F16, hdim 64, wgs 2, keys 128, cluster 1, FULL, User, Causal;
            variant_fwd_hdim128_f16 => F16, hdim 128, wgs 2, keys 64, cluster 1, FULL, User, Causal;
            variant_fwd_hdim256_f16 => F16, hdim 256, wgs 2, keys 64, cluster 1, NO_OVERLAP, User, Causal;
            variant_fwd_hdim64_bf16 => BF16, hdim 64, wgs 2, keys 128, cluster 1, FULL, User, Causal;
            variant_fwd_hdim128_bf16 => BF16, hdim 128, wgs 2, keys 64, cluster 1, FULL, User, Causal;
            variant_fwd_hdim256_bf16 => BF16, hdim 256, wgs 2, keys 64, cluster 1, NO_OVERLAP, User, Causal;
            variant_fwd_hdim64_f16_sparse => F16, hdim 64, wgs 2, keys 128, cluster 1, FULL, User, Sparse;
            variant_fwd_hdim128_f16_sparse => F16, hdim 128, wgs 2, keys 64, cluster 1, FULL, User, Sparse;
            variant_fwd_hdim256_f16_sparse => F16, hdim 256, wgs 2, keys 64, cluster 1, NO_OVERLAP, User, Sparse;
            variant_fwd_hdim64_bf16_sparse => BF16, hdim 64, wgs 2, keys 128, cluster 1, FULL, User, Sparse;
            variant_fwd_hdim128_bf16_sparse => BF16, hdim 128, wgs 2, keys 64, cluster 1, FULL, User, Sparse;
            variant_fwd_hdim256_bf16_sparse => BF16, hdim 256, wgs 2, keys 64, cluster 1, NO_OVERLAP, User, Sparse;
        }
    };
}

/// The backward main kernels of a variant module (the preprocess and postprocess are the
/// library's own).
#[macro_export]
macro_rules! variant_bwd_kernel_table {
    ($callback:ident $(, $($extra:tt)*)?) => {
        $callback! {
            $($($extra)*)?
            variant_bwd_hdim64_f16 => F16, hdim 64, Main, User, Causal;
            variant_bwd_hdim128_f16 => F16, hdim 128, Main, User, Causal;
            variant_bwd_hdim64_bf16 => BF16, hdim 64, Main, User, Causal;
            variant_bwd_hdim128_bf16 => BF16, hdim 128, Main, User, Causal;
            variant_bwd_hdim64_f16_deterministic => F16, hdim 64, MainDeterministic, User, Causal;
            variant_bwd_hdim128_f16_deterministic => F16, hdim 128, MainDeterministic, User, Causal;
            variant_bwd_hdim64_bf16_deterministic => BF16, hdim 64, MainDeterministic, User, Causal;
            variant_bwd_hdim128_bf16_deterministic => BF16, hdim 128, MainDeterministic, User, Causal;
            variant_bwd_hdim256_f16 => F16, hdim 256, Main, User, Causal;
            variant_bwd_hdim256_bf16 => BF16, hdim 256, Main, User, Causal;
            variant_bwd_hdim256_f16_deterministic => F16, hdim 256, MainDeterministic, User, Causal;
            variant_bwd_hdim256_bf16_deterministic => BF16, hdim 256, MainDeterministic, User, Causal;
            variant_bwd_hdim64_f16_sparse => F16, hdim 64, Main, User, Sparse;
            variant_bwd_hdim128_f16_sparse => F16, hdim 128, Main, User, Sparse;
            variant_bwd_hdim256_f16_sparse => F16, hdim 256, Main, User, Sparse;
            variant_bwd_hdim64_bf16_sparse => BF16, hdim 64, Main, User, Sparse;
            variant_bwd_hdim128_bf16_sparse => BF16, hdim 128, Main, User, Sparse;
            variant_bwd_hdim256_bf16_sparse => BF16, hdim 256, Main, User, Sparse;
        }
    };
}

/// The block-mask build kernel of a variant module (`crate::sparse`): the variant's mask
/// mod over every block of a tile shape, gathered into lists.
pub const BLOCK_MASK_KERNEL: crate::KernelEntry = crate::KernelEntry {
    name: "variant_block_mask",
    algo: crate::Algo::Fa3(crate::fa3::Techniques::FULL),
    kind: crate::KernelKind::BlockMask,
    hdim: 0,
    dtype: crate::DType::F16,
    tma_param_bytes: 0,
    launch_bounds: 0,
    cluster: 1,
    consumer_wgs: 0,
    block_n: 0,
    score_mod: crate::ScoreModKind::User,
    mask: crate::MaskKind::Sparse,
};

const FWD: &[crate::KernelEntry] = crate::fa3::VARIANT_KERNELS;
const BWD: &[crate::KernelEntry] = crate::bwd::VARIANT_KERNELS;

/// Every kernel of a variant module, unprefixed: its forward then its backward kernels,
/// then the block-mask build kernel.
pub const KERNELS: [crate::KernelEntry; FWD.len() + BWD.len() + 1] = {
    let mut all = [BLOCK_MASK_KERNEL; FWD.len() + BWD.len() + 1];
    let mut i = 0;
    while i < FWD.len() + BWD.len() {
        all[i] = if i < FWD.len() { FWD[i] } else { BWD[i - FWD.len()] };
        i += 1;
    }
    all
};

/// Separates a variant's name from the table's kernel name in the exported symbol
/// (`{variant}__{kernel}`; `variant_kernels!` writes the same literal).
pub const SEPARATOR: &str = "__";

/// The forward kernel of a variant for a head dim and dtype.
pub fn find_forward(hdim: u32, dtype: crate::DType, sparse: bool) -> Option<&'static crate::KernelEntry> {
    KERNELS.iter().find(|k| k.kind == crate::KernelKind::Forward && k.hdim == hdim && k.dtype == dtype && (k.mask == crate::MaskKind::Sparse) == sparse)
}

/// The backward main kernel of a variant. There is no deterministic block-sparse kernel:
/// the deterministic mode's turns count every block a dense call visits, so a
/// deterministic call with a block mask runs the dense kernel (same gradients, no skipping).
pub fn find_backward(hdim: u32, dtype: crate::DType, deterministic: bool, sparse: bool) -> Option<&'static crate::KernelEntry> {
    let stage = if deterministic { crate::bwd::BwdStage::MainDeterministic } else { crate::bwd::BwdStage::Main };
    let sparse = sparse && !deterministic;
    KERNELS.iter().find(|k| k.kind == crate::KernelKind::Backward(stage) && k.hdim == hdim && k.dtype == dtype && (k.mask == crate::MaskKind::Sparse) == sparse)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    /// A bias that depends on every coordinate, and a mask hiding odd keys of head 1.
    #[derive(Clone, Copy)]
    struct Probe;
    impl Variant for Probe {
        const SCORE_MOD: bool = true;
        const MASK_MOD: bool = true;
        fn score<D: VariantData + ?Sized>(data: &D, at: Coords, x: f32) -> f32 {
            x + data.f32_at(at.head) * (at.q as f32 - at.kv as f32)
        }
        fn visible<D: VariantData + ?Sized>(_: &D, at: Coords) -> bool {
            at.head != 1 || at.kv % 2 == 0
        }
    }

    #[test]
    fn host_data_reads_words_and_zero_past_the_end() {
        let words = [1.5f32.to_bits(), 7];
        assert_eq!(words[..].f32_at(0), 1.5);
        assert_eq!(words[..].u32_at(1), 7);
        assert_eq!(words[..].u32_at(2), 0);
        assert_eq!(words[..].u32_at(u32::MAX), 0);
    }

    #[test]
    fn variant_functions_see_the_coordinates_and_the_data() {
        let data = [0.5f32.to_bits(), 2.0f32.to_bits()];
        let at = Coords { batch: 0, head: 1, q: 5, kv: 3, seqlen_q: 8, seqlen_k: 8 };
        assert_eq!(Probe::score(&data[..], at, 1.0), 1.0 + 2.0 * 2.0);
        assert_eq!(Probe::score_grad(&data[..], at, 1.0), 1.0, "the default derivative");
        assert!(!Probe::visible(&data[..], at));
        assert!(Probe::visible(&data[..], Coords { kv: 4, ..at }));
        assert!(Probe::visible(&data[..], Coords { head: 0, ..at }));
    }

    #[test]
    fn variant_kernel_names_are_not_the_built_in_kernels_names() {
        for k in KERNELS.iter() {
            assert!(crate::KERNELS.iter().all(|b| b.name != k.name), "{} is a built-in kernel's name too", k.name);
        }
    }

    #[test]
    fn variant_tables_have_one_forward_per_head_dim_and_dtype_and_both_backward_modes() {
        for dtype in crate::DType::ALL {
            for hdim in crate::HEAD_DIMS {
                let k = find_forward(hdim, dtype, false).expect("forward");
                assert_eq!((k.score_mod, k.mask), (crate::ScoreModKind::User, crate::MaskKind::Causal));
                let k = find_forward(hdim, dtype, true).expect("sparse forward");
                assert_eq!((k.score_mod, k.mask), (crate::ScoreModKind::User, crate::MaskKind::Sparse));
            }
            for hdim in crate::bwd::HEAD_DIMS {
                for det in [false, true] {
                    assert_eq!(find_backward(hdim, dtype, det, false).unwrap().mask, crate::MaskKind::Causal);
                    // Deterministic calls with a block mask run the dense kernel.
                    let sparse = find_backward(hdim, dtype, det, true).unwrap();
                    assert_eq!(sparse.mask == crate::MaskKind::Sparse, !det, "{}", sparse.name);
                }
            }
        }
        for (i, a) in KERNELS.iter().enumerate() {
            assert!(KERNELS[i + 1..].iter().all(|b| b.name != a.name), "{} twice", a.name);
        }
    }
}
