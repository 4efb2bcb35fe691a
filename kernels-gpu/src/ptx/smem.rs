//! Shared memory: the dynamic allocation, typed 32-bit addresses, and the `cp.async`
//! global-to-shared copy (sm_80+).
use core::arch::asm;

/// An address in the CTA's shared-memory window (`.shared::cta`), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct SmemAddr(pub u32);

impl SmemAddr {
    #[inline(always)]
    pub const fn add(self, bytes: u32) -> Self {
        SmemAddr(self.0.wrapping_add(bytes))
    }
}

/// The 1024-byte alignment that 128-byte swizzled TMA/WGMMA tiles need.
#[repr(C, align(1024))]
pub struct SmemAlign([u8; 1024]);

/// Start of the dynamic shared memory given at launch, 1024-byte aligned.
#[inline(always)]
pub fn dynamic_smem_base() -> SmemAddr {
    let generic = core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<SmemAlign>();
    let r: u32;
    // SAFETY: converts a shared-memory generic address to its window offset.
    unsafe {
        asm!("cvta.to.shared.u64 {t}, {g};", "cvt.u32.u64 {r}, {t};",
             g = in(reg64) generic as u64, t = out(reg64) _, r = out(reg32) r,
             options(pure, nomem, nostack))
    };
    SmemAddr(r)
}

/// Copies 16 bytes global -> shared, asynchronously; when `valid` is false the 16 bytes
/// are zero-filled and nothing is read.
///
/// # Safety
/// `src` must be a valid 16-byte aligned global address (even when `!valid`), `dst`
/// 16-byte aligned and inside the allocation.
#[inline(always)]
pub unsafe fn cp_async_16(dst: SmemAddr, src: u64, valid: bool) {
    let src_size: u32 = if valid { 16 } else { 0 };
    unsafe {
        asm!("cp.async.cg.shared.global [{0}], [{1}], 16, {2};",
             in(reg32) dst.0, in(reg64) src, in(reg32) src_size, options(nostack))
    };
}

/// Closes the group of `cp.async` issued since the last commit.
#[inline(always)]
pub fn cp_async_commit() {
    // SAFETY: bookkeeping only.
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}

/// Waits until at most `N` committed `cp.async` groups of this thread are pending.
#[inline(always)]
pub fn cp_async_wait<const N: u32>() {
    // SAFETY: waits only.
    unsafe { asm!("cp.async.wait_group {n};", n = const N, options(nostack)) };
}

/// `stmatrix.sync.aligned.m8n8.x4.shared.b16`: the warp stores four 8 x 8 matrices of
/// 16-bit elements, 16 bytes a row. Lane `l` gives the address of row `l % 8` of matrix
/// `l / 8` and holds in `r[i]` the elements `(l / 4, 2 (l % 4) + {0, 1})` of matrix `i`:
/// the tensor-core C fragment, packed.
///
/// # Safety
/// Every lane's `addr` must be 16-byte aligned and inside the allocation; all 32 lanes
/// take part.
#[inline(always)]
pub unsafe fn stmatrix_x4(addr: SmemAddr, r: [u32; 4]) {
    unsafe {
        asm!("stmatrix.sync.aligned.m8n8.x4.shared.b16 [{0}], {{{1}, {2}, {3}, {4}}};",
             in(reg32) addr.0, in(reg32) r[0], in(reg32) r[1], in(reg32) r[2], in(reg32) r[3], options(nostack))
    };
}

/// Stores 16 bytes to shared memory.
///
/// # Safety
/// `addr` must be 16-byte aligned and inside the allocation.
#[inline(always)]
pub unsafe fn st_v4_u32(addr: SmemAddr, v: [u32; 4]) {
    unsafe {
        asm!("st.shared.v4.b32 [{0}], {{{1}, {2}, {3}, {4}}};",
             in(reg32) addr.0, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3], options(nostack))
    };
}

/// Loads 16 bytes from shared memory.
///
/// # Safety
/// `addr` must be 16-byte aligned and inside the allocation.
#[inline(always)]
pub unsafe fn ld_v4_u32(addr: SmemAddr) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ld.shared.v4.b32 {{{0}, {1}, {2}, {3}}}, [{4}];",
             out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg32) addr.0, options(nostack))
    };
    [a, b, c, d]
}

/// Stores 4 bytes to shared memory.
///
/// # Safety
/// `addr` must be 4-byte aligned and inside the allocation.
#[inline(always)]
pub unsafe fn st_u32(addr: SmemAddr, v: u32) {
    unsafe { asm!("st.shared.b32 [{0}], {1};", in(reg32) addr.0, in(reg32) v, options(nostack)) };
}

/// Loads 4 bytes from shared memory.
///
/// # Safety
/// `addr` must be 4-byte aligned and inside the allocation.
#[inline(always)]
pub unsafe fn ld_u32(addr: SmemAddr) -> u32 {
    let v: u32;
    unsafe { asm!("ld.shared.b32 {0}, [{1}];", out(reg32) v, in(reg32) addr.0, options(nostack, readonly)) };
    v
}

/// Rounds an address up to a multiple of `align` (a power of two).
#[inline(always)]
pub const fn align_up(addr: SmemAddr, align: u32) -> SmemAddr {
    SmemAddr((addr.0 + align - 1) & !(align - 1))
}

/// Loads two consecutive `f32` from shared memory.
///
/// # Safety
/// `addr` must be 8-byte aligned and inside the allocation.
#[inline(always)]
pub unsafe fn ld_v2_f32(addr: SmemAddr) -> [f32; 2] {
    let (a, b): (f32, f32);
    unsafe { asm!("ld.shared.v2.f32 {{{0}, {1}}}, [{2}];", out(reg32) a, out(reg32) b, in(reg32) addr.0, options(nostack, readonly)) };
    [a, b]
}
