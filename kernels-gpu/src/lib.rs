//! GPU kernels of flash-attn3, compiled to PTX for `sm_90a` (see `ptx-builder`).
//!
//! - [`ptx`]: one typed wrapper per PTX instruction family (the only inline asm);
//! - [`softmax`]: the online softmax on tensor-core accumulator fragments;
//! - [`fa2`]: the FlashAttention-2 forward on `mma.sync`;
//! - [`fa3`]: the FlashAttention-3 forward on TMA, mbarriers, WGMMA and `setmaxnreg`.
//!
//! The exported entry points are listed in `common::KERNELS`.
#![no_std]
#![feature(abi_ptx, asm_experimental_arch, core_intrinsics, gpu_intrinsics, gpu_launch_sized_workgroup_mem)]
#![allow(internal_features)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod element;
pub mod fa2;
pub mod fa3;
pub mod ptx;
pub mod softmax;

use common::fa3::TileConfig;
use common::{FwdParams, TmaDescriptors};
use element::{BF16, F16};

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Kernels are written so that nothing can panic; trap if that ever changes.
    unsafe { core::arch::asm!("trap;", options(noreturn)) }
}

macro_rules! fa2_entry {
    ($name:ident, $elem:ty, $d:literal) => {
        /// FlashAttention-2 forward; grid `(ceil(seqlen_q / 64), heads_q, batch)`, 128 threads.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: FwdParams) {
            unsafe { fa2::fwd::<$elem, $d, { $d / 8 }, { $d / 16 }>(p) }
        }
    };
}

fa2_entry!(fa2_fwd_hdim64_f16, F16, 64);
fa2_entry!(fa2_fwd_hdim128_f16, F16, 128);
fa2_entry!(fa2_fwd_hdim256_f16, F16, 256);
fa2_entry!(fa2_fwd_hdim64_bf16, BF16, 64);
fa2_entry!(fa2_fwd_hdim128_bf16, BF16, 128);
fa2_entry!(fa2_fwd_hdim256_bf16, BF16, 256);

macro_rules! fa3_entry {
    ($name:ident, $elem:ty, $d:literal, wgs: $wgs:literal, keys: $keys:literal, cluster: $cluster:literal, ws: $ws:literal, pingpong: $pp:literal, overlap: $ov:literal) => {
        /// FlashAttention-3 forward; grid: one CTA per tile or per SM (see the host's
        /// `Schedule`), `128 * (consumer warpgroups + 1)` threads (without warp
        /// specialization, no producer warpgroup). The TMA descriptors are read through the
        /// parameter's address, never copied.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(_tma: TmaDescriptors, p: FwdParams) {
            let tma = kernel_param0_address!($name);
            const CFG: TileConfig = TileConfig::new($d, $wgs, $keys);
            const PINGPONG: bool = $pp && CFG.pingpong;
            unsafe {
                fa3::fwd::<
                    $elem,
                    $d,
                    { CFG.block_m() },
                    { CFG.block_n },
                    { CFG.stages },
                    { CFG.register_split($cluster).0 },
                    { CFG.register_split($cluster).1 },
                    { CFG.block_n as usize / 8 },
                    { $d / 8 },
                    { CFG.block_n as usize / 16 },
                    $cluster,
                    $ws,
                    PINGPONG,
                    $ov,
                >(tma, p)
            }
        }
    };
}

fa3_entry!(fa3_fwd_hdim64_f16, F16, 64, wgs: 3, keys: 128, cluster: 1, ws: true, pingpong: true, overlap: true);
fa3_entry!(fa3_fwd_hdim128_f16, F16, 128, wgs: 2, keys: 128, cluster: 1, ws: true, pingpong: true, overlap: true);
fa3_entry!(fa3_fwd_hdim256_f16, F16, 256, wgs: 2, keys: 80, cluster: 1, ws: true, pingpong: true, overlap: true);
fa3_entry!(fa3_fwd_hdim256_f16_n64, F16, 256, wgs: 2, keys: 64, cluster: 1, ws: true, pingpong: true, overlap: true);
fa3_entry!(fa3_fwd_hdim64_bf16, BF16, 64, wgs: 3, keys: 128, cluster: 1, ws: true, pingpong: true, overlap: true);
fa3_entry!(fa3_fwd_hdim128_bf16, BF16, 128, wgs: 2, keys: 128, cluster: 1, ws: true, pingpong: true, overlap: true);
fa3_entry!(fa3_fwd_hdim256_bf16, BF16, 256, wgs: 2, keys: 80, cluster: 1, ws: true, pingpong: true, overlap: true);
fa3_entry!(fa3_fwd_hdim256_bf16_n64, BF16, 256, wgs: 2, keys: 64, cluster: 1, ws: true, pingpong: true, overlap: true);
fa3_entry!(fa3_fwd_hdim128_f16_multicast, F16, 128, wgs: 2, keys: 128, cluster: 2, ws: true, pingpong: true, overlap: true);
fa3_entry!(fa3_fwd_hdim128_bf16_multicast, BF16, 128, wgs: 2, keys: 128, cluster: 2, ws: true, pingpong: true, overlap: true);
fa3_entry!(fa3_fwd_hdim128_f16_nopingpong, F16, 128, wgs: 2, keys: 128, cluster: 1, ws: true, pingpong: false, overlap: true);
fa3_entry!(fa3_fwd_hdim128_bf16_nopingpong, BF16, 128, wgs: 2, keys: 128, cluster: 1, ws: true, pingpong: false, overlap: true);
fa3_entry!(fa3_fwd_hdim128_f16_nooverlap, F16, 128, wgs: 2, keys: 128, cluster: 1, ws: true, pingpong: true, overlap: false);
fa3_entry!(fa3_fwd_hdim128_f16_nows, F16, 128, wgs: 2, keys: 128, cluster: 1, ws: false, pingpong: true, overlap: true);
