//! Thread-block clusters (sm_90): the cluster-wide barrier and addresses of a peer CTA's
//! shared memory (distributed shared memory).
use super::smem::SmemAddr;
use core::arch::asm;

/// Every non-exited thread of every CTA of the cluster waits here; orders memory
/// (release/acquire at cluster scope), e.g. barrier initialisation before peers use it,
/// or a CTA's last use of a peer's shared memory before that peer exits. Not `.aligned`:
/// callers reach it from diverged paths (the producer's one thread).
#[inline(always)]
pub fn sync() {
    // SAFETY: every thread that has not exited must reach it.
    unsafe { asm!("barrier.cluster.arrive.release;", "barrier.cluster.wait.acquire;", options(nostack)) };
}

/// The address in CTA `rank`'s shared memory of what is at `addr` in ours, in the
/// `.shared::cluster` window.
#[inline(always)]
pub fn map_shared(addr: SmemAddr, rank: u32) -> u32 {
    let r: u32;
    // SAFETY: address arithmetic only.
    unsafe { asm!("mapa.shared::cluster.u32 {0}, {1}, {2};", out(reg32) r, in(reg32) addr.0, in(reg32) rank, options(pure, nomem, nostack)) };
    r
}
