//! Memory-proxy fences.
use core::arch::asm;

/// Orders this thread's generic-proxy shared-memory writes before later async-proxy
/// accesses (TMA stores, WGMMA operand reads) once a barrier has been passed.
#[inline(always)]
pub fn proxy_async_shared() {
    // SAFETY: a fence.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) };
}
