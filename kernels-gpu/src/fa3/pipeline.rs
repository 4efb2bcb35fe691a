//! The circular shared-memory pipeline between the TMA producer and the consumer
//! warpgroups: per stage a "full" mbarrier (the producer's arrival plus the TMA's
//! transaction bytes) and an "empty" one (every consumer thread's release).
use crate::ptx::mbarrier::Mbarrier;
use crate::ptx::smem::SmemAddr;
use common::fa3::{MBARRIER_BYTES, SmemRing};

/// Position in the ring: the stage, and the parity of the phase to wait for there.
#[derive(Clone, Copy)]
pub struct PipelineState<const STAGES: u32> {
    idx: u32,
    ph: u32,
}

impl<const STAGES: u32> PipelineState<STAGES> {
    #[inline(always)]
    pub fn new() -> Self {
        PipelineState { idx: 0, ph: 0 }
    }

    #[inline(always)]
    pub fn index(self) -> u32 {
        self.idx
    }

    #[inline(always)]
    pub fn phase(self) -> u32 {
        self.ph
    }

    #[inline(always)]
    pub fn advance(&mut self) {
        self.idx += 1;
        if self.idx == STAGES {
            self.idx = 0;
            self.ph ^= 1;
        }
    }
}

/// [`PipelineState`] in one register (the slot count), for the producer thread, which
/// runs on 24 registers. Kept apart from [`PipelineState`]: the consumers' code with this
/// form made ptxas serialize the wgmma of the kernel without warp specialization.
#[derive(Clone, Copy)]
pub struct CountState<const STAGES: u32> {
    count: u32,
}

impl<const STAGES: u32> CountState<STAGES> {
    #[inline(always)]
    pub fn new() -> Self {
        CountState { count: 0 }
    }

    #[inline(always)]
    pub fn index(self) -> u32 {
        self.count % STAGES
    }

    #[inline(always)]
    pub fn phase(self) -> u32 {
        (self.count / STAGES) & 1
    }

    #[inline(always)]
    pub fn advance(&mut self) {
        self.count = self.count.wrapping_add(1);
    }
}

/// `STAGES` slots of `stage_bytes` each, with their barriers.
#[derive(Clone, Copy)]
pub struct TmaPipeline<const STAGES: u32> {
    /// First slot's data.
    pub data: SmemAddr,
    pub stage_bytes: u32,
    /// `STAGES` full barriers, then `STAGES` empty barriers, 8 bytes each.
    pub barriers: SmemAddr,
    /// The cluster peer whose producer also fills our slots (K/V multicast): releases go
    /// to its empty barrier too, and ours wait for its consumers as well.
    pub peer: Option<u32>,
}

impl<const STAGES: u32> TmaPipeline<STAGES> {
    /// The ring `ring` of the shared-memory layout, from the dynamic base `base`.
    #[inline(always)]
    pub fn at(base: SmemAddr, ring: SmemRing, peer: Option<u32>) -> Self {
        // A ring the kernel does not use has no stage in the layout.
        debug_assert!(ring.stages == STAGES || ring.stages == 0);
        TmaPipeline { data: base.add(ring.data), stage_bytes: ring.stage_bytes, barriers: base.add(ring.barriers), peer }
    }

    #[inline(always)]
    pub fn full(&self, stage: u32) -> Mbarrier {
        Mbarrier(self.barriers.add(MBARRIER_BYTES * stage))
    }

    #[inline(always)]
    pub fn empty(&self, stage: u32) -> Mbarrier {
        Mbarrier(self.barriers.add(MBARRIER_BYTES * (STAGES + stage)))
    }

    #[inline(always)]
    pub fn slot(&self, stage: u32) -> SmemAddr {
        self.data.add(stage * self.stage_bytes)
    }

    /// One thread, before first use: one producer arrival per phase; `consumers` releases
    /// from this CTA (and one per warp of the peer's).
    #[inline(always)]
    pub fn init(&self, consumers: u32) {
        let releases = if self.peer.is_some() { consumers + consumers / 32 } else { consumers };
        for s in 0..STAGES {
            self.full(s).init(1);
            self.empty(s).init(releases);
        }
    }

    /// Producer: waits until the slot was released by every consumer (the first round
    /// passes at once: a fresh barrier counts its "previous" phase as done), then arms the
    /// full barrier for the bytes the TMA will deliver.
    /// Only `leader` arms the barrier; every calling thread waits.
    #[inline(always)]
    pub fn producer_acquire(&self, st: PipelineState<STAGES>, leader: bool) {
        self.producer_acquire_bytes(st, self.stage_bytes, leader);
    }

    /// As [`Self::producer_acquire`] for `bytes` (0: the slot is handed over without data).
    #[inline(always)]
    pub fn producer_acquire_bytes(&self, st: PipelineState<STAGES>, bytes: u32, leader: bool) {
        self.empty(st.index()).wait(st.phase() ^ 1);
        self.full(st.index()).arrive_expect_tx(bytes, leader);
    }

    /// Consumer: waits until the slot's data landed.
    #[inline(always)]
    pub fn consumer_wait(&self, st: PipelineState<STAGES>) {
        self.full(st.index()).wait(st.phase());
    }

    /// Consumer: this thread is done reading the slot. With multicast the peer's copy
    /// is released too, by lane 0 of each warp only (remote arrivals cross the cluster
    /// network; the slot is read only by wgmma, which completes for the whole
    /// warpgroup at once, so one lane's word suffices).
    #[inline(always)]
    pub fn consumer_release(&self, st: PipelineState<STAGES>) {
        self.empty(st.index()).arrive();
        if let Some(peer) = self.peer {
            if crate::ptx::sreg::lane_id() == 0 {
                self.empty(st.index()).arrive_peer(peer);
            }
        }
    }
}
