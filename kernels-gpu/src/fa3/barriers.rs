//! The named barriers (`bar.sync` / `bar.arrive` ids 1..16) of the FA3 kernels, forward
//! and backward, in one enum so that no two roles can share an id by accident. Each role that is per consumer
//! warpgroup owns [`MAX_CONSUMER_WGS`] consecutive ids from its variant's value; id 0 is
//! `__syncthreads`.
use crate::ptx::barrier;
use super::traits::WARPGROUP_THREADS;
use common::fa3::MAX_CONSUMER_WGS;

/// A role's first id.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum NamedBarrier {
    /// Ids 1..=3: a consumer warpgroup's 128 threads staging a tile for a bulk copy
    /// together (the forward's O, the backward's dQ piece).
    Epilogue = 1,
    /// Ids 4..=6: a consumer warpgroup's turn to issue GEMMs (pingpong, 256 threads: the
    /// warpgroup that waits and the one that hands over).
    PingPong = 1 + MAX_CONSUMER_WGS,
    /// Backward: every consumer thread is done reading the previous step's `dSᵀ` (its dQ
    /// product waited for), so it may be overwritten (both warpgroups, 256 threads).
    DsFree = 1 + 2 * MAX_CONSUMER_WGS,
    /// Backward: both warpgroups wrote their rows of this step's `dSᵀ` (256 threads).
    DsReady = 1 + 3 * MAX_CONSUMER_WGS,
    /// FP8 forward with the in-kernel V transpose: the producer warpgroup's transposing
    /// warps all wrote (and fenced) their part of a V tile (`super::transpose`; id 0 only).
    Transpose = 1 + 4 * MAX_CONSUMER_WGS,
}

/// Every role, for the check below.
const ROLES: [NamedBarrier; 5] =
    [NamedBarrier::Epilogue, NamedBarrier::PingPong, NamedBarrier::DsFree, NamedBarrier::DsReady, NamedBarrier::Transpose];

// The id ranges are disjoint and inside 1..16.
const _: () = {
    let mut i = 0;
    while i < ROLES.len() {
        let a = ROLES[i] as u32;
        assert!(a >= 1 && a + MAX_CONSUMER_WGS <= 16);
        let mut j = i + 1;
        while j < ROLES.len() {
            let b = ROLES[j] as u32;
            assert!(a + MAX_CONSUMER_WGS <= b || b + MAX_CONSUMER_WGS <= a);
            j += 1;
        }
        i += 1;
    }
};

impl NamedBarrier {
    /// Threads that meet at one of this role's barriers.
    #[inline(always)]
    pub const fn threads(self) -> u32 {
        match self {
            NamedBarrier::Epilogue => WARPGROUP_THREADS,
            NamedBarrier::PingPong | NamedBarrier::DsFree | NamedBarrier::DsReady => 2 * WARPGROUP_THREADS,
            NamedBarrier::Transpose => super::transpose::TRANSPOSER_THREADS,
        }
    }

    /// The id of consumer warpgroup `wg` (< [`MAX_CONSUMER_WGS`]) in this role.
    #[inline(always)]
    pub fn id(self, wg: u32) -> u32 {
        self as u32 + wg
    }

    /// Waits at warpgroup `wg`'s barrier of this role until all its threads arrived.
    #[inline(always)]
    pub fn sync(self, wg: u32) {
        barrier::named_sync(self.id(wg), self.threads());
    }

    /// Arrives at warpgroup `wg`'s barrier of this role without waiting.
    #[inline(always)]
    pub fn arrive(self, wg: u32) {
        barrier::named_arrive(self.id(wg), self.threads());
    }
}
