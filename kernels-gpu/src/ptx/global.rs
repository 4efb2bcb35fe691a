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

/// Stores 2 bytes at a generic address that points to global memory.
///
/// # Safety
/// `addr` must be a valid, 2-byte aligned global address.
#[inline(always)]
pub unsafe fn st_u16(addr: u64, v: u16) {
    unsafe { asm!("st.global.b16 [{0}], {1};", in(reg64) addr, in(reg16) v, options(nostack)) };
}

/// Stores one byte at a generic address that points to global memory.
///
/// # Safety
/// `addr` must be a valid global address.
#[inline(always)]
pub unsafe fn st_u8(addr: u64, v: u8) {
    // PTX has no 8-bit registers: the low byte of a 16-bit one is stored.
    unsafe { asm!("st.global.b8 [{0}], {1};", in(reg64) addr, in(reg16) v as u16, options(nostack)) };
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

/// Loads 4 bytes from global memory through the read-only (non-coherent) path: data no
/// thread of the launch writes.
///
/// # Safety
/// `addr` must be a valid, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn ld_nc_u32(addr: u64) -> u32 {
    let v: u32;
    unsafe { asm!("ld.global.nc.b32 {0}, [{1}];", out(reg32) v, in(reg64) addr, options(nostack, readonly)) };
    v
}

/// [`ld_nc_u32`] of memory that no thread writes for the whole launch, as a pure
/// function of `addr`: the compiler may merge equal loads, hoist them out of loops and
/// drop unused ones.
///
/// # Safety
/// As [`ld_nc_u32`]; the data must not change while the kernel runs.
#[inline(always)]
pub unsafe fn ld_nc_invariant_u32(addr: u64) -> u32 {
    let v: u32;
    unsafe { asm!("ld.global.nc.b32 {0}, [{1}];", out(reg32) v, in(reg64) addr, options(pure, readonly, nostack)) };
    v
}

/// Loads two consecutive `u32` from global memory through the read-only (non-coherent)
/// path.
///
/// # Safety
/// `addr` must be a valid, 8-byte aligned global address of data no thread of the launch
/// writes.
#[inline(always)]
pub unsafe fn ld_nc_v2_u32(addr: u64) -> [u32; 2] {
    let (a, b): (u32, u32);
    unsafe { asm!("ld.global.nc.v2.b32 {{{0}, {1}}}, [{2}];", out(reg32) a, out(reg32) b, in(reg64) addr, options(nostack, readonly)) };
    [a, b]
}

/// Loads 16 bytes (four consecutive `u32`) from global memory through the read-only
/// (non-coherent) path.
///
/// # Safety
/// `addr` must be a valid, 16-byte aligned global address of data no thread of the launch
/// writes.
#[inline(always)]
pub unsafe fn ld_nc_v4_u32(addr: u64) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ld.global.nc.v4.b32 {{{0}, {1}, {2}, {3}}}, [{4}];",
             out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) addr, options(nostack, readonly))
    };
    [a, b, c, d]
}

/// Loads one byte from global memory through the read-only (non-coherent) path.
///
/// # Safety
/// `addr` must be a valid global address of data no thread of the launch writes.
#[inline(always)]
pub unsafe fn ld_nc_u8(addr: u64) -> u8 {
    let v: u16;
    // PTX has no 8-bit registers: the byte is zero-extended into a 16-bit one.
    unsafe { asm!("ld.global.nc.u8 {0}, [{1}];", out(reg16) v, in(reg64) addr, options(nostack, readonly)) };
    v as u8
}

/// Loads one byte from global memory, through L1 as any load (data this launch wrote,
/// ordered before by a barrier).
///
/// # Safety
/// `addr` must be a valid global address.
#[inline(always)]
pub unsafe fn ld_u8(addr: u64) -> u8 {
    let v: u16;
    // PTX has no 8-bit registers: the byte is zero-extended into a 16-bit one.
    unsafe { asm!("ld.global.u8 {0}, [{1}];", out(reg16) v, in(reg64) addr, options(nostack, readonly)) };
    v as u8
}

/// Loads two consecutive `f32` from global memory.
///
/// # Safety
/// `addr` must be a valid, 8-byte aligned global address.
#[inline(always)]
pub unsafe fn ld_v2_f32(addr: u64) -> [f32; 2] {
    let (a, b): (f32, f32);
    unsafe { asm!("ld.global.v2.f32 {{{0}, {1}}}, [{2}];", out(reg32) a, out(reg32) b, in(reg64) addr, options(nostack, readonly)) };
    [a, b]
}

/// Stores four consecutive `f32` to global memory.
///
/// # Safety
/// `addr` must be a valid, 16-byte aligned global address.
#[inline(always)]
pub unsafe fn st_v4_f32(addr: u64, v: [f32; 4]) {
    unsafe {
        asm!("st.global.v4.f32 [{0}], {{{1}, {2}, {3}, {4}}};",
             in(reg64) addr, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3], options(nostack))
    };
}

/// Adds `v` to the `f32` at a global address, without returning the old value (relaxed,
/// GPU scope): a reduction several CTAs make into one accumulator.
///
/// # Safety
/// `addr` must be a valid, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn red_add_f32(addr: u64, v: f32) {
    unsafe { asm!("red.relaxed.gpu.global.add.f32 [{0}], {1};", in(reg64) addr, in(reg32) v, options(nostack)) };
}

/// Loads a u32 with acquire semantics at GPU scope: what the thread that released it
/// wrote before is visible after.
///
/// # Safety
/// `addr` must be a valid, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn ld_acquire_u32(addr: u64) -> u32 {
    let v: u32;
    unsafe { asm!("ld.acquire.gpu.global.b32 {0}, [{1}];", out(reg32) v, in(reg64) addr, options(nostack)) };
    v
}

/// Adds `v` to a u32 with release semantics at GPU scope: the writes this thread made
/// (or observed, through a barrier) before are visible to whoever acquires the new value.
///
/// # Safety
/// `addr` must be a valid, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn red_release_add_u32(addr: u64, v: u32) {
    unsafe { asm!("red.release.gpu.global.add.u32 [{0}], {1};", in(reg64) addr, in(reg32) v, options(nostack)) };
}
