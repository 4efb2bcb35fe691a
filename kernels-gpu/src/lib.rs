//! GPU kernels of flash-attn3, compiled to PTX for `sm_90a` (see `ptx-builder`).
//!
//! - [`ptx`]: one typed wrapper per PTX instruction family (the only inline asm);
//! - [`softmax`]: the online softmax on tensor-core accumulator fragments;
//! - [`fa2`]: the FlashAttention-2 forward on `mma.sync`;
//! - [`fa3`]: the FlashAttention-3 forward on TMA, mbarriers, WGMMA and `setmaxnreg`;
//! - [`bwd`]: the FlashAttention-3 backward, on the forward's parts;
//! - [`quantize`]: 16-bit to e4m3 with block scales (and incoherent processing) for the
//!   FP8 forward, which is [`fa3`] with e4m3 operands.
//!
//! The exported entry points are generated from the kernel tables in `common`
//! (`fa2_kernel_table!`, `fa3_kernel_table!`), which also make the host's `common::KERNELS`
//! (`entries`, the default `builtin-kernels` feature). A user's crate compiles the same
//! kernels for its own variants with [`variant_kernels!`].
#![no_std]
#![feature(abi_ptx, asm_experimental_arch, core_intrinsics, gpu_intrinsics, gpu_launch_sized_workgroup_mem, stmt_expr_attributes)]
// Without the built-in entry points (a variant module) some features go unused.
#![allow(internal_features, unused_features)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod bwd;
pub mod element;
pub mod fa2;
pub mod fa3;
pub mod ptx;
pub mod quantize;
pub mod softmax;
pub mod sparse;

#[cfg(feature = "builtin-kernels")]
mod entries;

/// For the exported macros' expansions in a user's crate.
#[doc(hidden)]
pub use common;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Kernels are written so that nothing can panic; trap if that ever changes.
    unsafe { core::arch::asm!("trap;", options(noreturn)) }
}

/// One FA3 forward entry point, exported as `$symbol`, with its traits type (the
/// built-in tables' and the variant modules' entries).
#[doc(hidden)]
#[macro_export]
macro_rules! fa3_entry {
    ($symbol:expr, $dtype:ident, hdim $d:literal, wgs $wgs:literal, keys $keys:literal, cluster $cluster:literal, $tech:ident, $score_mod:ty, $mask:ty) => {
        const _: () = {
            /// FlashAttention-3 forward; grid: one CTA per tile or per SM (see the host's
            /// `Schedule`), `128 * (consumer warpgroups + 1)` threads (without warp
            /// specialization, no producer warpgroup). The TMA descriptors are read through
            /// the parameter's address, never copied.
            #[unsafe(export_name = $symbol)]
            pub unsafe extern "ptx-kernel" fn entry(_tma: $crate::common::TmaDescriptors, p: $crate::common::FwdParams) {
                #[derive(Clone, Copy)]
                struct Traits;
                impl $crate::fa3::KernelTraits for Traits {
                    type Element = $crate::element::$dtype;
                    type OutElement = $crate::element::$dtype;
                    type Scores = [$crate::softmax::Frag; $keys / 8];
                    type Out = [$crate::softmax::Frag; $d / 8];
                    type Mask = $mask;
                    type ScoreMod = $score_mod;
                    const CONFIG: $crate::common::fa3::KernelConfig = $crate::common::fa3::KernelConfig {
                        hdim: $d,
                        consumer_wgs: $wgs,
                        block_n: $keys,
                        cluster: $cluster,
                        techniques: $crate::common::fa3::Techniques::$tech,
                        fp8: false,
                        transpose_v: false,
                        fp8_block_factors: false,
                        key_offsets: <$score_mod as $crate::fa3::mask::ScoreMod>::KEY_OFFSETS,
                    };
                }
                let tma = $crate::kernel_param0_address!($symbol);
                unsafe { $crate::fa3::fwd::<Traits>(tma, p) }
            }
        };
    };
}




/// One backward main entry point, exported as `$symbol` (the built-in table's and the
/// variant modules' entries).
#[doc(hidden)]
#[macro_export]
macro_rules! bwd_main_entry {
    ($symbol:expr, $dtype:ident, hdim $d:literal, deterministic $deterministic:expr, softcap $softcap:expr, alibi $alibi:expr, local $local:expr, wide $wide:expr, $docs:ty, $variant:ty) => {
        const _: () = {
            /// Query rows per step (`wide`: `common::bwd::wide_steps` of the table entry, as
            /// the host reads it).
            const BLOCK_M: u32 = $crate::common::bwd::block_m($d, $wide);
            /// Backward main kernel; grid `(key blocks, heads_k, batch)`, 384 threads. The
            /// TMA descriptors (q, k, v, dO) are read through the parameter's address.
            #[unsafe(export_name = $symbol)]
            pub unsafe extern "ptx-kernel" fn entry(_tma: $crate::common::TmaDescriptors, p: $crate::common::bwd::BwdParams) {
                #[derive(Clone, Copy)]
                struct Traits;
                impl $crate::bwd::BwdTraits for Traits {
                    type Element = $crate::element::$dtype;
                    type Scores = [$crate::softmax::Frag; $crate::common::bwd::wg_queries($d, BLOCK_M) as usize / 8];
                    type KeyGrads = [$crate::softmax::Frag; $crate::common::bwd::wg_grad_cols($d) as usize / 8];
                    type DqTile = [$crate::softmax::Frag; $crate::common::bwd::wg_dq_cols($d, BLOCK_M) as usize / 8];
                    const HDIM: u32 = $d;
                    const BLOCK_M: u32 = BLOCK_M;
                    const DETERMINISTIC: bool = $deterministic;
                    const SOFTCAP: bool = $softcap;
                    const ALIBI: bool = $alibi;
                    const LOCAL: bool = $local;
                    type Docs = $docs;
                    type Variant = $variant;
                }
                let tma = $crate::kernel_param0_address!($symbol);
                unsafe { $crate::bwd::bwd::<Traits>(tma, p) }
            }
        };
    };
}


/// The forward entries of a variant module (`variant_kernels!`), from
/// `common::variant_fwd_kernel_table`: `{variant}__{kernel}`.
#[doc(hidden)]
#[macro_export]
macro_rules! __variant_fwd_entries {
    ($variant:ident $v:tt $($name:ident => $dtype:ident, hdim $d:literal, wgs $wgs:literal, keys $keys:literal, cluster $cluster:literal, $tech:ident, $score_mod:ident, $mask:ident;)*) => {$(
        $crate::__variant_fwd_entries!(@ $mask concat!(stringify!($variant), "__", stringify!($name)), $v, $dtype, $d, $wgs, $keys, $cluster, $tech);
    )*};
    (@ Causal $symbol:expr, $v:tt, $dtype:ident, $d:literal, $wgs:literal, $keys:literal, $cluster:literal, $tech:ident) => {
        $crate::fa3_entry!(
            $symbol, $dtype, hdim $d, wgs $wgs, keys $keys, cluster $cluster, $tech,
            $crate::fa3::variant::UserScore<$v>, $crate::fa3::variant::VariantMask<$v>
        );
    };
    // Block-sparse: the mask hook runs `visible`, in the partial steps alone.
    (@ Sparse $symbol:expr, $v:tt, $dtype:ident, $d:literal, $wgs:literal, $keys:literal, $cluster:literal, $tech:ident) => {
        $crate::fa3_entry!(
            $symbol, $dtype, hdim $d, wgs $wgs, keys $keys, cluster $cluster, $tech,
            $crate::fa3::variant::UserScore<$v, false>, $crate::fa3::variant::SparseMask<$v>
        );
    };
}

/// The backward entries of a variant module, from `common::variant_bwd_kernel_table`.
#[doc(hidden)]
#[macro_export]
macro_rules! __variant_bwd_entries {
    ($variant:ident $v:tt $($name:ident => $dtype:ident, hdim $d:literal, $stage:ident, $score_mod:ident, $mask:ident;)*) => {$(
        $crate::bwd_main_entry!(
            concat!(stringify!($variant), "__", stringify!($name)), $dtype, hdim $d,
            deterministic matches!($crate::common::bwd::BwdStage::$stage, $crate::common::bwd::BwdStage::MainDeterministic),
            softcap false, alibi false, local false,
            wide $crate::common::bwd::wide_steps($d, $crate::common::ScoreModKind::$score_mod, $crate::common::MaskKind::$mask),
            $crate::common::window::NoDocuments,
            $crate::fa3::variant::UserVariant<$v, { matches!($crate::common::MaskKind::$mask, $crate::common::MaskKind::Sparse) }>
        );
    )*};
}

/// The block-mask build entry of a variant module: `{variant}__variant_block_mask`
/// (`common::variant::BLOCK_MASK_KERNEL`).
#[doc(hidden)]
#[macro_export]
macro_rules! __variant_block_mask_entry {
    ($variant:ident $v:tt) => {
        const _: () = {
            /// Builds one pass's block-mask lists from the variant's mask mod; grid
            /// `(lists per head, list heads, list batches)`, `common::sparse::BUILD_THREADS`
            /// threads.
            #[unsafe(export_name = concat!(stringify!($variant), "__variant_block_mask"))]
            pub unsafe extern "ptx-kernel" fn entry(p: $crate::common::sparse::BuildParams) {
                unsafe { $crate::sparse::build::<$v>(p) }
            }
        };
    };
}

/// Compiles the library's forward and backward kernels for user-defined variants
/// (`common::variant::Variant` impls), in a `no_std` kernel crate that depends on this
/// one without its built-in kernels (`default-features = false`) and is built by
/// `ptx-builder` (`BuildConfig::variant`): `variant_kernels!(name: Type, ...)` exports
/// `name__{kernel}` for every kernel of `common::variant::KERNELS`, which the host loads
/// with `VariantModule::load(gpu, ptx, &["name"])`. The crate needs
/// `#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, asm_experimental_arch))]` (the
/// entry points' ABI and inline PTX) and calls the macro under
/// `#[cfg(target_arch = "nvptx64")]`, so that it also builds for the host, where the CPU
/// reference evaluates the same `Variant` impls.
#[macro_export]
macro_rules! variant_kernels {
    ($($name:ident: $variant:ty),* $(,)?) => {$(
        const _: () = {
            use $crate::{__variant_bwd_entries, __variant_fwd_entries};
            $crate::common::variant_fwd_kernel_table!(__variant_fwd_entries, $name ($variant));
            $crate::common::variant_bwd_kernel_table!(__variant_bwd_entries, $name ($variant));
            $crate::__variant_block_mask_entry!($name ($variant));
        };
    )*};
}
