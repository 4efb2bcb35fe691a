//! Global-memory stores and atomics with explicit state space (no generic-address
//! resolution).
use core::arch::asm;

/// Stores 4 bytes at a generic address that points to global memory.
///
/// # Safety
/// `addr` must be a valid, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn st_u32(addr: u64, v: u32) {
    unsafe { asm!("st.global.b32 [{0}], {1};", in(reg64) addr, in(reg32) v, options(nostack)) };
}

/// Stores an `f32` at a generic address that points to global memory.
///
/// # Safety
/// `addr` must be a valid, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn st_f32(addr: u64, v: f32) {
    unsafe { asm!("st.global.f32 [{0}], {1};", in(reg64) addr, in(reg32) v, options(nostack)) };
}

/// Atomically adds `v` to the u32 at a generic address that points to global memory and
/// returns the old value (relaxed, GPU scope: a work counter, not a synchronisation).
///
/// # Safety
/// `addr` must be a valid, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn atom_add_u32(addr: u64, v: u32) -> u32 {
    let old: u32;
    unsafe {
        asm!("atom.relaxed.gpu.global.add.u32 {0}, [{1}], {2};", out(reg32) old, in(reg64) addr, in(reg32) v, options(nostack))
    };
    old
}
