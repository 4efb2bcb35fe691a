//! The backward's shared storage and its producer: TMA loads of the CTA's K and V (once),
//! then per step the query block's Q with its LSE and dO with its D, through two-stage
//! rings, in the order the consumers use them.
use super::traits::BwdTraits;
use crate::fa3::pipeline::{PipelineState, TmaPipeline};
use crate::fa3::storage::TensorMaps;
use crate::ptx::compiler::opaque_u32;
use crate::ptx::smem::{SmemAddr, align_up, dynamic_smem_base};
use crate::ptx::tma;
use common::bwd::{BwdParams, BwdTensorMap, MMA_WGS, STAGES};
use common::fa3::{MAX_SMEM, SMEM_ALIGN};

/// The main kernel's shared memory as typed views (`common::bwd::SmemLayout`).
#[derive(Clone, Copy)]
pub struct BwdStorage {
    /// K and V of the CTA's key block: one slot each, loaded once.
    pub k: TmaPipeline<1>,
    pub v: TmaPipeline<1>,
    /// Q (with the LSE) and dO (with D) of a query block.
    pub q: TmaPipeline<STAGES>,
    pub dout: TmaPipeline<STAGES>,
    /// `dSᵀ`'s first slot (`common::bwd::ds_stages`: [`BwdStorage::ds_slot`]).
    pub ds: SmemAddr,
    /// `Pᵀ` of the current step, where the warpgroups split the head dimension.
    pub p: SmemAddr,
    /// The LSE (log2) and D vectors, `BLOCK_M` f32 per stage.
    pub lse: SmemAddr,
    pub dpsum: SmemAddr,
    /// The consumer warpgroups' dQ pieces, one slot each: full once staged, empty once
    /// the dQ writer's reduction has read it (one arrival each). Where the head dimension
    /// is split, no data ([`BwdStorage::dq_split_slot`]): full barrier `s` counts both
    /// warpgroups' dQ of Q stage `s`.
    pub dq: TmaPipeline<MMA_WGS>,
}

impl BwdStorage {
    #[inline(always)]
    pub fn new<K: BwdTraits>() -> Self {
        Self::at::<K>(align_up(dynamic_smem_base(), SMEM_ALIGN))
    }

    /// As [`BwdStorage::new`], every address derived afresh from an opaque base: for the
    /// dQ writer, on 24 registers, where the loop-invariant addresses would stay live.
    #[inline(always)]
    pub fn rederived<K: BwdTraits>() -> Self {
        Self::at::<K>(SmemAddr(opaque_u32(align_up(dynamic_smem_base(), SMEM_ALIGN).0)))
    }

    #[inline(always)]
    fn at<K: BwdTraits>(base: SmemAddr) -> Self {
        const { assert!(K::SMEM.total <= MAX_SMEM) };
        let l = K::SMEM;
        BwdStorage {
            k: TmaPipeline::at(base, l.k, None),
            v: TmaPipeline::at(base, l.v, None),
            q: TmaPipeline::at(base, l.q, None),
            dout: TmaPipeline::at(base, l.dout, None),
            ds: base.add(l.ds.offset),
            p: base.add(l.p.offset),
            lse: base.add(l.lse.offset),
            dpsum: base.add(l.dpsum.offset),
            dq: TmaPipeline::at(base, l.dq, None),
        }
    }

    /// The `dSᵀ` slot of Q stage `stage` (the only slot where there is one).
    #[inline(always)]
    pub fn ds_slot<K: BwdTraits>(&self, stage: u32) -> SmemAddr {
        if common::bwd::ds_stages(K::HDIM) == 1 { self.ds } else { self.ds.add(stage * K::BLOCK_N * K::BLOCK_M * 2) }
    }

    /// Stage `stage`'s LSE (log2) vector.
    #[inline(always)]
    pub fn lse_slot<K: BwdTraits>(&self, stage: u32) -> SmemAddr {
        self.lse.add(stage * K::VECTOR_BYTES)
    }

    /// Stage `stage`'s D vector.
    #[inline(always)]
    pub fn dpsum_slot<K: BwdTraits>(&self, stage: u32) -> SmemAddr {
        self.dpsum.add(stage * K::VECTOR_BYTES)
    }

    /// One thread, before first use: `consumers` releases per phase. Where the
    /// warpgroups split the head dimension, a stage's Q and dO slots take its dQ once the
    /// products are done, so the dQ writer releases them too (one more arrival) once it
    /// has added that dQ, and a dQ slot's full barrier counts both warpgroups' dQ of a
    /// stage.
    #[inline(always)]
    pub fn init<K: BwdTraits>(&self, consumers: u32) {
        self.k.init(consumers);
        self.v.init(consumers);
        let q_releases = if K::SPLIT { consumers + 1 } else { consumers };
        self.q.init(q_releases);
        self.dout.init(q_releases);
        if K::SPLIT {
            for s in 0..STAGES {
                self.dq.full(s).init(MMA_WGS);
            }
        } else {
            self.dq.init(1);
        }
    }

    /// Where the warpgroups split the head dimension: the slot that takes warpgroup
    /// `wg`'s dQ of stage `stage` (half the head dimension, `BLOCK_M` x `HDIM / 2` f32 in
    /// the accumulator's order: the 32 KB of the stage's Q slot, or of its dO slot).
    #[inline(always)]
    pub fn dq_split_slot(&self, stage: u32, wg: u32) -> SmemAddr {
        if wg == 0 { self.q.slot(stage) } else { self.dout.slot(stage) }
    }
}

/// The producer thread's loads.
pub struct BwdLoader<K: BwdTraits> {
    pub maps: TensorMaps,
    pub storage: BwdStorage,
    pub q_state: PipelineState<STAGES>,
    pub dout_state: PipelineState<STAGES>,
    pub kernel: core::marker::PhantomData<K>,
}

impl<K: BwdTraits> BwdLoader<K> {
    #[inline(always)]
    pub fn new(maps: TensorMaps, storage: BwdStorage) -> Self {
        BwdLoader { maps, storage, q_state: PipelineState::new(), dout_state: PipelineState::new(), kernel: core::marker::PhantomData }
    }

    #[inline(always)]
    pub fn prefetch_descriptors(&self) {
        self.maps.get(BwdTensorMap::Q).prefetch();
        self.maps.get(BwdTensorMap::K).prefetch();
        self.maps.get(BwdTensorMap::V).prefetch();
        self.maps.get(BwdTensorMap::DOut).prefetch();
    }

    /// K and V of key block `n_block` of K/V head `head_k`.
    #[inline(always)]
    pub fn load_kv(&self, n_block: u32, head_k: u32, batch: u32) {
        let coords = [0, (n_block * K::BLOCK_N) as i32, 0, head_k as i32, batch as i32];
        let (k, v) = (&self.storage.k, &self.storage.v);
        k.producer_acquire(PipelineState::new(), true);
        // SAFETY: the slot holds one box; its full barrier expects the bytes.
        unsafe { self.maps.get_rederived(BwdTensorMap::K).load_5d(k.slot(0), k.full(0), coords, true) };
        v.producer_acquire(PipelineState::new(), true);
        // SAFETY: as for K.
        unsafe { self.maps.get_rederived(BwdTensorMap::V).load_5d(v.slot(0), v.full(0), coords, true) };
    }

    /// Q and its LSE, then dO and its D, of query block `m_block` of query head `head`.
    #[inline(always)]
    pub fn load_step(&mut self, p: &BwdParams, m_block: u32, head: u32, batch: u32) {
        let coords = [0, (m_block * K::BLOCK_M) as i32, 0, head as i32, batch as i32];
        // Row `m_block * BLOCK_M` of this (batch, head)'s padded vectors.
        let vector_row = ((batch * p.heads_q + head) as u64 * p.padded_rows as u64 + (m_block * K::BLOCK_M) as u64) * 4;
        let st = self.q_state;
        let (q, vec) = (&self.storage.q, self.storage.lse_slot::<K>(st.index()));
        q.producer_acquire_bytes(st, K::Q_BYTES + K::VECTOR_BYTES, true);
        // SAFETY: the slot holds one box and the vector slot BLOCK_M f32; the padded
        // workspace has whole blocks; the full barrier expects both.
        unsafe {
            self.maps.get_rederived(BwdTensorMap::Q).load_5d(q.slot(st.index()), q.full(st.index()), coords, true);
            tma::bulk_load(vec, p.lse_log2 + vector_row, K::VECTOR_BYTES, q.full(st.index()), true);
        }
        self.q_state.advance();
        let st = self.dout_state;
        let (dout, vec) = (&self.storage.dout, self.storage.dpsum_slot::<K>(st.index()));
        dout.producer_acquire_bytes(st, K::Q_BYTES + K::VECTOR_BYTES, true);
        // SAFETY: as for Q.
        unsafe {
            self.maps.get_rederived(BwdTensorMap::DOut).load_5d(dout.slot(st.index()), dout.full(st.index()), coords, true);
            tma::bulk_load(vec, p.dpsum + vector_row, K::VECTOR_BYTES, dout.full(st.index()), true);
        }
        self.dout_state.advance();
    }
}
