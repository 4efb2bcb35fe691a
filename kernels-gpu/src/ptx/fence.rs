//! Memory-proxy fences.
use core::arch::asm;

/// Orders this thread's generic-proxy shared-memory accesses before later async-proxy
/// ones once a barrier has been passed: its writes before TMA stores or WGMMA operand
/// reads, and its reads (`ldmatrix` of Q) before the TMA load that overwrites the slot.
#[inline(always)]
pub fn proxy_async_shared() {
    // SAFETY: a fence.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) };
}

/// Orders this thread's generic-proxy global-memory accesses (and those it observed,
/// through an acquire) with its async-proxy ones (bulk copies and reductions) on either
/// side of it.
#[inline(always)]
pub fn proxy_async_global() {
    // SAFETY: a fence.
    unsafe { asm!("fence.proxy.async.global;", options(nostack)) };
}

/// Orders every memory access this thread made or observed before it with those after
/// it, at GPU scope (`__threadfence()`).
#[inline(always)]
pub fn acq_rel_gpu() {
    // SAFETY: a fence.
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) };
}
