//! Compiler-only hints (empty asm statements: no instruction is emitted).
use core::arch::asm;

/// Returns `x` unchanged, but LLVM can no longer see where it came from. Applied to a
/// base address at the top of a loop, it stops LICM from hoisting every address derived
/// from it out of the loop (each would hold a register for the whole kernel).
#[inline(always)]
pub fn opaque_u32(mut x: u32) -> u32 {
    // SAFETY: a PTX comment: no instruction.
    unsafe { asm!("// opaque {0}", inout(reg32) x, options(nomem, nostack)) };
    x
}

/// [`opaque_u32`] for 64-bit values.
#[inline(always)]
pub fn opaque_u64(mut x: u64) -> u64 {
    // SAFETY: a PTX comment: no instruction.
    unsafe { asm!("// opaque {0}", inout(reg64) x, options(nomem, nostack)) };
    x
}
