//! `mbarrier`: shared-memory barriers with arrival counts and TMA transaction bytes
//! (sm_90). A barrier completes a phase when its pending arrivals reach zero and every
//! expected transaction byte has landed; waiters name the phase by its parity.
use super::smem::SmemAddr;
use core::arch::asm;

/// One 8-byte mbarrier in shared memory.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Mbarrier(pub SmemAddr);

impl Mbarrier {
    /// Sets the expected arrival count of every phase. One thread, before any use; follow
    /// with [`fence_init`] and a CTA barrier.
    #[inline(always)]
    pub fn init(self, arrivals: u32) {
        // SAFETY: writes the barrier word; the address is inside the CTA's allocation.
        unsafe { asm!("mbarrier.init.shared::cta.b64 [{0}], {1};", in(reg32) self.0.0, in(reg32) arrivals, options(nostack)) };
    }

    /// Arrives (counts one arrival of the current phase).
    #[inline(always)]
    pub fn arrive(self) {
        // SAFETY: an initialised barrier.
        unsafe { asm!("mbarrier.arrive.shared::cta.b64 _, [{0}];", in(reg32) self.0.0, options(nostack)) };
    }

    /// Arrives on the barrier at the same offset in cluster peer `rank`'s shared memory,
    /// with the default CTA-scope release (as CUTLASS's `ClusterBarrier::arrive`). The
    /// slot this releases was read by wgmmas already waited for, so no memory access
    /// needs ordering at cluster scope; `.release.cluster` put a GPU-wide `MEMBAR` before
    /// every remote arrival, which made the multicast kernel 30-58% slower.
    #[inline(always)]
    pub fn arrive_peer(self, rank: u32) {
        let remote = super::cluster::map_shared(self.0, rank);
        // SAFETY: an initialised barrier in a live peer CTA (the kernel syncs the cluster
        // before the first and after the last remote arrival).
        unsafe { asm!("mbarrier.arrive.shared::cluster.b64 _, [{0}];", in(reg32) remote, options(nostack)) };
    }

    /// Arrives and adds `bytes` to the transaction count the phase waits for (the
    /// producer, before issuing TMA loads that complete on this barrier). Only threads
    /// with `leader` set act: a predicate, not a branch, so a whole warpgroup can run the
    /// producer code without diverging (divergence next to wgmma serializes it).
    #[inline(always)]
    pub fn arrive_expect_tx(self, bytes: u32, leader: bool) {
        // SAFETY: an initialised barrier.
        unsafe {
            asm!("{{ .reg .pred p; setp.ne.b32 p, {2}, 0; @p mbarrier.arrive.expect_tx.shared::cta.b64 _, [{0}], {1}; }}",
                 in(reg32) self.0.0, in(reg32) bytes, in(reg32) leader as u32, options(nostack))
        };
    }

    /// True once the phase with parity `parity` has completed (may suspend briefly).
    #[inline(always)]
    pub fn try_wait(self, parity: u32) -> bool {
        let done: u32;
        // SAFETY: an initialised barrier.
        unsafe {
            asm!("{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [{0}], {1}; selp.u32 {2}, 1, 0, p; }}",
                 in(reg32) self.0.0, in(reg32) parity, out(reg32) done, options(nostack))
        };
        done != 0
    }

    /// Blocks until the phase with parity `parity` has completed.
    #[inline(always)]
    pub fn wait(self, parity: u32) {
        while !self.try_wait(parity) {}
    }
}

/// Makes barrier initialisation visible to the async proxy (TMA) and other threads;
/// follow with a CTA-wide barrier.
#[inline(always)]
pub fn fence_init() {
    // SAFETY: a fence.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) };
}
