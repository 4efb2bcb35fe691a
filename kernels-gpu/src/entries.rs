//! The library's own entry points (the `builtin-kernels` feature), generated from the
//! kernel tables in `common` (`fa2_kernel_table!`, `fa3_kernel_table!`, ...), which also
//! make the host's `common::KERNELS`. A variant module (`crate::variant_kernels!`) is
//! built without them.
use crate::{bwd, element, fa2, fa3, quantize, softmax};
use common::bwd::BwdParams;
use common::{FwdParams, TmaDescriptors};

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

/// The score-modification type of a kernel table's `ScoreModKind` name at head dim `$d`.
macro_rules! score_mod_type {
    (None, $d:literal) => {
        fa3::mask::NoScoreMod
    };
    (Softcap, $d:literal) => {
        fa3::mask::Softcap
    };
    // Row constants and the column term on the tensor cores where the host lays out the
    // key-offset tile (hdim 256's consumers have no registers for the row constants): one
    // rule for the kernel and the host's shared-memory size.
    (Alibi, $d:literal) => {
        fa3::mask::Alibi<{ common::fa3::key_offsets($d, common::ScoreModKind::Alibi) }>
    };
    (SoftcapAlibi, $d:literal) => {
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

/// The FA3 entry points, from `common::fa3_kernel_table`.
macro_rules! fa3_entries {
    ($($name:ident => $dtype:ident, hdim $d:literal, wgs $wgs:literal, keys $keys:literal, cluster $cluster:literal, $tech:ident, $score_mod:ident, $mask:ident;)*) => {$(
        crate::fa3_entry!(stringify!($name), $dtype, hdim $d, wgs $wgs, keys $keys, cluster $cluster, $tech, score_mod_type!($score_mod, $d), mask_type!($mask));
    )*};
}

common::fa3_kernel_table!(fa3_entries);

/// The FP8 forward entry points, from `common::fp8_kernel_table`: the FA3 kernel with
/// e4m3 operands and a 16-bit O.
macro_rules! fp8_entries {
    ($($name:ident => $dtype:ident, hdim $d:literal, keys $keys:literal, $v:ident, $f:ident;)*) => {$(
        /// FlashAttention-3 FP8 forward; launched as the FA3 forward, with the descales
        /// in `p.fp8` and V transposed (`common::fp8`), by the caller or (`rows`) by the
        /// kernel.
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
                const CONFIG: common::fa3::KernelConfig =
                    common::fp8::config($d, $keys, common::fp8_transposes_v!($v), common::fp8_block_factors!($f));
            }
            let tma = crate::kernel_param0_address!(stringify!($name));
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
        /// Backward preprocess; grid `(heads_q, min(padded rows / 64, 65535), batch)` (row
        /// blocks strided over y: `bwd::preprocess::row_blocks`), 256 threads.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: BwdParams) {
            unsafe { bwd::preprocess::preprocess::<element::$dtype, $d>(p) }
        }
    };
    (@ Postprocess $name:ident, $dtype:ident, $d:literal, $score_mod:ident, $mask:ident) => {
        /// Backward postprocess; grid `(heads_q, min(ceil(seqlen_q / 64), 65535), batch)`,
        /// 256 threads.
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
        crate::bwd_main_entry!(
            stringify!($name), $dtype, hdim $d, deterministic $deterministic,
            softcap matches!(common::ScoreModKind::$score_mod, common::ScoreModKind::Softcap | common::ScoreModKind::SoftcapAlibi),
            alibi matches!(common::ScoreModKind::$score_mod, common::ScoreModKind::Alibi | common::ScoreModKind::SoftcapAlibi),
            local matches!(common::MaskKind::$mask, common::MaskKind::Local | common::MaskKind::Document),
            wide common::bwd::wide_steps($d, common::ScoreModKind::$score_mod, common::MaskKind::$mask),
            docs_type!($mask), fa3::variant::NoVariant
        );
    };
}

common::bwd_kernel_table!(bwd_entries);
