//! `setmaxnreg`: per-warpgroup register reallocation (sm_90a). Takes effect only when the
//! kernel has a register cap at entry (`.maxntid` + `.minnctapersm`, added by
//! `ptx-builder` from `KernelEntry::launch_bounds`); every warp of the warpgroup must run
//! the same instruction.
use core::arch::asm;

/// A per-thread register count known at compile time (`setmaxnreg` takes an immediate):
/// a type, so that a kernel's traits type can name its own.
pub trait RegisterCount {
    const N: u32;
}

/// Releases registers down to `R::N` per thread (producer warpgroup).
#[inline(always)]
pub fn dealloc<R: RegisterCount>() {
    const { assert!(R::N >= 24 && R::N <= 256 && R::N % 8 == 0) };
    // SAFETY: warpgroup-uniform; callers hold no more than N live registers after it.
    unsafe { asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const R::N, options(nostack)) };
}

/// Grows the register budget to `R::N` per thread (consumer warpgroups).
#[inline(always)]
pub fn alloc<R: RegisterCount>() {
    const { assert!(R::N >= 24 && R::N <= 256 && R::N % 8 == 0) };
    // SAFETY: warpgroup-uniform.
    unsafe { asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const R::N, options(nostack)) };
}
