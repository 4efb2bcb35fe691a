//! CTA-level barriers (`bar.sync`, `bar.arrive`) and memory fences.
use core::arch::asm;

/// `__syncthreads()`: all threads of the CTA wait here; orders shared-memory accesses.
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: every thread of the CTA must reach it; callers keep control flow uniform.
    unsafe { asm!("bar.sync 0;", options(nostack)) };
}

/// Named barrier `id` (1..16): waits until `count` threads (a multiple of 32) arrived,
/// counting this one.
#[inline(always)]
pub fn named_sync(id: u32, count: u32) {
    // SAFETY: every participant uses the same id and count.
    unsafe { asm!("bar.sync {0}, {1};", in(reg32) id, in(reg32) count, options(nostack)) };
}

/// Arrives at named barrier `id` without waiting.
#[inline(always)]
pub fn named_arrive(id: u32, count: u32) {
    // SAFETY: every participant uses the same id and count.
    unsafe { asm!("bar.arrive {0}, {1};", in(reg32) id, in(reg32) count, options(nostack)) };
}
