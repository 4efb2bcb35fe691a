//! `setmaxnreg`: per-warpgroup register reallocation (sm_90a). Takes effect only when the
//! kernel has a register cap at entry (`.maxntid` + `.minnctapersm`, added by
//! `ptx-builder` from `KernelEntry::launch_bounds`); every warp of the warpgroup must run
//! the same instruction.
use core::arch::asm;

/// Releases registers down to `N` per thread (producer warpgroup).
#[inline(always)]
pub fn dealloc<const N: u32>() {
    const { assert!(N >= 24 && N <= 256 && N % 8 == 0) };
    // SAFETY: warpgroup-uniform; callers hold no more than N live registers after it.
    unsafe { asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const N, options(nostack)) };
}

/// Grows the register budget to `N` per thread (consumer warpgroups).
#[inline(always)]
pub fn alloc<const N: u32>() {
    const { assert!(N >= 24 && N <= 256 && N % 8 == 0) };
    // SAFETY: warpgroup-uniform.
    unsafe { asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const N, options(nostack)) };
}
