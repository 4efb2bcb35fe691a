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
//! (`fa2_kernel_table!`, `fa3_kernel_table!`), which also make the host's `common::KERNELS`.
#![no_std]
#![feature(abi_ptx, asm_experimental_arch, core_intrinsics, gpu_intrinsics, gpu_launch_sized_workgroup_mem, stmt_expr_attributes)]
#![allow(internal_features)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod bwd;
pub mod element;
pub mod fa2;
pub mod fa3;
pub mod ptx;
pub mod quantize;
pub mod softmax;

use common::bwd::BwdParams;
use common::{FwdParams, TmaDescriptors};

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Kernels are written so that nothing can panic; trap if that ever changes.
    unsafe { core::arch::asm!("trap;", options(noreturn)) }
}

/// The FA2 entry points, from `common::fa2_kernel_table`.
macro_rules! fa2_entries {
    ($($name:ident => $dtype:ident, hdim $d:literal;)*) => {$(
        /// FlashAttention-2 forward; grid `(ceil(seqlen_q / 64), heads_q, batch)`, 128 threads.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: FwdParams) {
            unsafe { fa2::fwd::<element::$dtype, $d, { $d / 8 }, { $d / 16 }>(p) }
        }
    )*};
}

common::fa2_kernel_table!(fa2_entries);

/// The score-modification type of a kernel table's `ScoreModKind` name.
macro_rules! score_mod_type {
    (None) => {
        fa3::mask::NoScoreMod
    };
    (Softcap) => {
        fa3::mask::Softcap
    };
    (Alibi) => {
        fa3::mask::Alibi
    };
    (SoftcapAlibi) => {
        fa3::mask::SoftcapAlibi
    };
}

/// The mask type of a kernel table's `MaskKind` name.
macro_rules! mask_type {
    (Causal) => {
        fa3::mask::CausalMask
    };
    (Local) => {
        fa3::mask::LocalMask
    };
    (Document) => {
        fa3::mask::LocalMask<fa3::mask::DeviceDocs>
    };
}

/// The document source of a kernel table's `MaskKind` name (backward).
macro_rules! docs_type {
    (Document) => {
        fa3::mask::DeviceDocs
    };
    ($other:ident) => {
        common::window::NoDocuments
    };
}

/// The FA3 entry points, from `common::fa3_kernel_table`: each gets its traits type.
macro_rules! fa3_entries {
    ($($name:ident => $dtype:ident, hdim $d:literal, wgs $wgs:literal, keys $keys:literal, cluster $cluster:literal, $tech:ident, $score_mod:ident, $mask:ident;)*) => {$(
        /// FlashAttention-3 forward; grid: one CTA per tile or per SM (see the host's
        /// `Schedule`), `128 * (consumer warpgroups + 1)` threads (without warp
        /// specialization, no producer warpgroup). The TMA descriptors are read through the
        /// parameter's address, never copied.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(_tma: TmaDescriptors, p: FwdParams) {
            #[derive(Clone, Copy)]
            struct Traits;
            impl fa3::KernelTraits for Traits {
                type Element = element::$dtype;
                type OutElement = element::$dtype;
                type Scores = [softmax::Frag; $keys / 8];
                type Out = [softmax::Frag; $d / 8];
                type Mask = mask_type!($mask);
                type ScoreMod = score_mod_type!($score_mod);
                const CONFIG: common::fa3::KernelConfig = common::fa3::KernelConfig {
                    hdim: $d,
                    consumer_wgs: $wgs,
                    block_n: $keys,
                    cluster: $cluster,
                    techniques: common::fa3::Techniques::$tech,
                    fp8: false,
                };
            }
            let tma = kernel_param0_address!($name);
            unsafe { fa3::fwd::<Traits>(tma, p) }
        }
    )*};
}

common::fa3_kernel_table!(fa3_entries);

/// The FP8 forward entry points, from `common::fp8_kernel_table`: the FA3 kernel with
/// e4m3 operands and a 16-bit O.
macro_rules! fp8_entries {
    ($($name:ident => $dtype:ident, hdim $d:literal, keys $keys:literal;)*) => {$(
        /// FlashAttention-3 FP8 forward; launched as the FA3 forward, with the descales
        /// in `p.fp8` and V transposed (`common::fp8`).
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(_tma: TmaDescriptors, p: FwdParams) {
            #[derive(Clone, Copy)]
            struct Traits;
            impl fa3::KernelTraits for Traits {
                type Element = element::E4M3;
                type OutElement = element::$dtype;
                type Scores = [softmax::Frag; $keys / 8];
                type Out = [softmax::Frag; $d / 8];
                type Mask = fa3::mask::CausalMask;
                type ScoreMod = fa3::mask::NoScoreMod;
                const CONFIG: common::fa3::KernelConfig = common::fp8::config($d, $keys);
            }
            let tma = kernel_param0_address!($name);
            unsafe { fa3::fwd::<Traits>(tma, p) }
        }
    )*};
}

common::fp8_kernel_table!(fp8_entries);

/// The quantization entry points, from `common::fp8_quantize_table`.
macro_rules! quantize_entries {
    ($($name:ident => $dtype:ident, hdim $d:literal;)*) => {$(
        /// 16-bit to e4m3 with block scales; grid `(blocks, heads, batch)`,
        /// `common::fp8::QUANTIZE_THREADS` threads.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: common::fp8::QuantizeParams) {
            unsafe { quantize::quantize::<element::$dtype, $d, { $d / 32 }>(p) }
        }
    )*};
}

common::fp8_quantize_table!(quantize_entries);

/// e4m3 V to the FP8 forward's layout (`common::fp8::TRANSPOSE_V`); grid
/// `(vt_len(seqlen) / 32, heads, batch)`, `common::fp8::QUANTIZE_THREADS` threads.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn fp8_transpose_v(p: common::fp8::QuantizeParams) {
    unsafe { quantize::transpose_v(p) }
}

/// The backward entry points, from `common::bwd_kernel_table`.
macro_rules! bwd_entries {
    ($($name:ident => $dtype:ident, hdim $d:literal, $stage:ident, $score_mod:ident, $mask:ident;)*) => {$(
        bwd_entries!(@ $stage $name, $dtype, $d, $score_mod, $mask);
    )*};
    (@ Preprocess $name:ident, $dtype:ident, $d:literal, $score_mod:ident, $mask:ident) => {
        /// Backward preprocess; grid `(padded rows / 64, heads_q, batch)`, 256 threads.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: BwdParams) {
            unsafe { bwd::preprocess::preprocess::<element::$dtype, $d>(p) }
        }
    };
    (@ Postprocess $name:ident, $dtype:ident, $d:literal, $score_mod:ident, $mask:ident) => {
        /// Backward postprocess; grid `(ceil(seqlen_q / 64), heads_q, batch)`, 256 threads.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: BwdParams) {
            unsafe { bwd::postprocess::postprocess::<element::$dtype, $d>(p) }
        }
    };
    (@ Main $name:ident, $dtype:ident, $d:literal, $score_mod:ident, $mask:ident) => {
        bwd_entries!(@ main $name, $dtype, $d, false, $score_mod, $mask);
    };
    (@ MainDeterministic $name:ident, $dtype:ident, $d:literal, $score_mod:ident, $mask:ident) => {
        bwd_entries!(@ main $name, $dtype, $d, true, $score_mod, $mask);
    };
    (@ main $name:ident, $dtype:ident, $d:literal, $deterministic:literal, $score_mod:ident, $mask:ident) => {
        /// Backward main kernel; grid `(key blocks, heads_k, batch)`, 384 threads. The TMA
        /// descriptors (q, k, v, dO) are read through the parameter's address.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(_tma: TmaDescriptors, p: BwdParams) {
            #[derive(Clone, Copy)]
            struct Traits;
            impl bwd::BwdTraits for Traits {
                type Element = element::$dtype;
                type Scores = [softmax::Frag; common::bwd::block_m($d) as usize / 8];
                type KeyGrads = [softmax::Frag; $d / 8];
                const HDIM: u32 = $d;
                const DETERMINISTIC: bool = $deterministic;
                const SOFTCAP: bool = matches!(common::ScoreModKind::$score_mod, common::ScoreModKind::Softcap | common::ScoreModKind::SoftcapAlibi);
                const ALIBI: bool = matches!(common::ScoreModKind::$score_mod, common::ScoreModKind::Alibi | common::ScoreModKind::SoftcapAlibi);
                const LOCAL: bool = matches!(common::MaskKind::$mask, common::MaskKind::Local | common::MaskKind::Document);
                type Docs = docs_type!($mask);
            }
            let tma = kernel_param0_address!($name);
            unsafe { bwd::bwd::<Traits>(tma, p) }
        }
    };
}

common::bwd_kernel_table!(bwd_entries);
