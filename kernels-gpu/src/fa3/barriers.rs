//! The named barriers (`bar.sync` / `bar.arrive` ids 1..16) of the FA3 kernels, forward
//! and backward, in one enum so that no two roles of one kernel family can share an id by
//! accident. Each role that is per consumer warpgroup owns [`MAX_CONSUMER_WGS`]
//! consecutive ids from its first; id 0 is `__syncthreads`.
use crate::ptx::barrier;
use super::traits::WARPGROUP_THREADS;
use common::fa3::MAX_CONSUMER_WGS;

/// A role ([`NamedBarrier::first`]: its first id).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum NamedBarrier {
    /// Ids 1..=3: a consumer warpgroup's 128 threads staging a tile for a bulk copy
    /// together (the forward's O, the backward's dQ piece).
    Epilogue,
    /// Ids 4..=6: a consumer warpgroup's turn to issue GEMMs (pingpong, 256 threads: the
    /// warpgroup that waits and the one that hands over).
    PingPong,
    /// Backward: every consumer thread is done reading the previous step's `dSᵀ` (its dQ
    /// product waited for), so it may be overwritten (both warpgroups, 256 threads).
    DsFree,
    /// Backward: both warpgroups wrote their rows of this step's `dSᵀ` (256 threads).
    DsReady,
    /// FP8 forward with the in-kernel V transpose: the producer warpgroup's transposing
    /// warps all wrote (and fenced) their part of a V tile (`super::transpose`; id 0 only).
    Transpose,
    /// Backward: a consumer warpgroup staged (and fenced) its dQ piece: its 128 threads
    /// arrive without waiting, the dQ writer warp waits (160 threads). The forward's
    /// pingpong ids: no kernel has both.
    DqFull,
    /// Backward where the warpgroups split the head dimension: both staged (and fenced)
    /// their dQ of a Q stage (one id per stage), 256 threads arrive, the writer warp
    /// waits (288). The forward's transpose ids.
    DqFullSplit,
}

/// Which kernels use a role.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Forward,
    Backward,
    Both,
}

/// Every role and its kernels, for the check below.
const ROLES: [(NamedBarrier, Family); 7] = [
    (NamedBarrier::Epilogue, Family::Both),
    (NamedBarrier::PingPong, Family::Forward),
    (NamedBarrier::DsFree, Family::Backward),
    (NamedBarrier::DsReady, Family::Backward),
    (NamedBarrier::Transpose, Family::Forward),
    (NamedBarrier::DqFull, Family::Backward),
    (NamedBarrier::DqFullSplit, Family::Backward),
];

// The id ranges are inside 1..16, and disjoint where one kernel family uses both roles.
const _: () = {
    let mut i = 0;
    while i < ROLES.len() {
        let (a, fa) = (ROLES[i].0.first(), ROLES[i].1 as u32);
        assert!(a >= 1 && a + MAX_CONSUMER_WGS <= 16);
        let mut j = i + 1;
        while j < ROLES.len() {
            let (b, fb) = (ROLES[j].0.first(), ROLES[j].1 as u32);
            let shared = fa == fb || fa == Family::Both as u32 || fb == Family::Both as u32;
            assert!(!shared || a + MAX_CONSUMER_WGS <= b || b + MAX_CONSUMER_WGS <= a);
            j += 1;
        }
        i += 1;
    }
};

impl NamedBarrier {
    /// The role's first id: [`MAX_CONSUMER_WGS`] consecutive ids from it.
    #[inline(always)]
    pub const fn first(self) -> u32 {
        match self {
            NamedBarrier::Epilogue => 1,
            NamedBarrier::PingPong | NamedBarrier::DqFull => 1 + MAX_CONSUMER_WGS,
            NamedBarrier::DsFree => 1 + 2 * MAX_CONSUMER_WGS,
            NamedBarrier::DsReady => 1 + 3 * MAX_CONSUMER_WGS,
            NamedBarrier::Transpose | NamedBarrier::DqFullSplit => 1 + 4 * MAX_CONSUMER_WGS,
        }
    }

    /// Threads that meet at one of this role's barriers.
    #[inline(always)]
    pub const fn threads(self) -> u32 {
        match self {
            NamedBarrier::Epilogue => WARPGROUP_THREADS,
            NamedBarrier::PingPong | NamedBarrier::DsFree | NamedBarrier::DsReady => 2 * WARPGROUP_THREADS,
            NamedBarrier::Transpose => super::transpose::TRANSPOSER_THREADS,
            NamedBarrier::DqFull => WARPGROUP_THREADS + 32,
            NamedBarrier::DqFullSplit => 2 * WARPGROUP_THREADS + 32,
        }
    }

    /// The id of consumer warpgroup `wg` (< [`MAX_CONSUMER_WGS`]) in this role.
    #[inline(always)]
    pub fn id(self, wg: u32) -> u32 {
        self.first() + wg
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
