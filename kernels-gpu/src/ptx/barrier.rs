//! CTA-level barriers (`bar.sync`, `bar.arrive`) and memory fences.
use core::arch::asm;

/// `__syncthreads()`: all threads of the CTA wait here; orders shared-memory accesses.
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: every thread of the CTA must reach it; callers keep control flow uniform.
    unsafe { asm!("bar.sync 0;", options(nostack)) };
}
