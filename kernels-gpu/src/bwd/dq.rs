//! dQ's fp32 accumulator in global memory: every key block adds its `dS K` to the query
//! blocks it sees. Each consumer warpgroup stages its 64 x 64 piece in its shared-memory
//! slot in fragment order (`common::bwd::dq_accum_index`: 16-byte stores, no bank
//! conflict) and signals the slot's full barrier; the dQ writer, a warp of the producer
//! warpgroup, adds the piece to the accumulator with one bulk reduction
//! (`cp.reduce.async.bulk`, summed in L2) and frees the slot once it has been read (FA3's
//! layout: a per-element `red` from every thread made the backward bound by L2 atomics,
//! and the consumers never wait on global memory).
//!
//! Where the consumer warpgroups split the head dimension (hdim 256), their dQ of a step
//! (64 x 128 floats each) would need 64 KB of staging: there each thread adds its
//! fragments with vector reductions ([`add_direct`], as FA3 does at hdim 256).
//!
//! By default the pieces are added in whatever order the CTAs come. In deterministic mode
//! in a fixed order per query block ([`common::bwd::DqOrder`]): the writer waits on a
//! per-(query block, head, batch) counter for its CTA's turn, adds, waits until the sums
//! are done and hands the turn on, so the sums are bit-identical across runs.
use super::producer::BwdStorage;
use super::traits::{BwdTraits, DqSplit};
use crate::fa3::traits::FragTile;
use crate::fa3::barriers::NamedBarrier;
use crate::ptx::compiler::opaque_u32;
use crate::ptx::{fence, global, smem, tma};
use common::bwd::{BwdParams, DQ_PIECE, MMA_WGS};
use core::marker::PhantomData;

/// A consumer warpgroup's side: stages its piece of each step.
#[derive(Clone, Copy)]
pub struct DqStager {
    /// Parity of the slot's current phase (the slot is used once per step).
    phase: u32,
}

impl DqStager {
    #[inline(always)]
    pub fn new() -> Self {
        DqStager { phase: 0 }
    }

    /// Stages consumer warpgroup `wg`'s piece for this step. Every thread of the
    /// warpgroup calls it.
    #[inline(always)]
    pub fn stage<K: BwdTraits>(&mut self, storage: &BwdStorage, piece: &K::DqTile, wg: u32, thread_in_wg: u32) {
        let slot = storage.dq.slot(wg);
        // The writer has read the previous step's piece (a fresh barrier passes at once).
        storage.dq.empty(wg).wait(self.phase ^ 1);
        let (warp, lane) = (thread_in_wg / 32, thread_in_wg % 32);
        for j in 0..<K::DqTile as FragTile>::FRAGS {
            let at = slot.add(((warp * 8 + j as u32) * 32 + lane) * 16);
            // SAFETY: inside this warpgroup's slot; 16 B aligned.
            unsafe { smem::st_v4_u32(at, piece.frag(j).map(f32::to_bits)) };
        }
        // The bulk reduction reads through the async proxy.
        fence::proxy_async_shared();
        NamedBarrier::Epilogue.sync(wg);
        if thread_in_wg == 0 {
            storage.dq.full(wg).arrive();
        }
        self.phase ^= 1;
    }

    /// Where the warpgroups split the head dimension: adds consumer warpgroup `wg`'s dQ
    /// of query block `m` of query head `head` (`BLOCK_M` rows by its columns, `DqSplit`)
    /// to the accumulator, each thread its fragments, in the accumulator's fragment order
    /// (one 16-byte reduction a fragment). In deterministic mode after the writer warp
    /// said it is the CTA's turn (the slot's full barrier), and then signals the slot's
    /// empty barrier once the warpgroup's reductions are ordered before it, for the
    /// writer to release the turn. Every thread of the warpgroup calls it.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn add_direct<K: BwdTraits>(&mut self, p: &BwdParams, storage: &BwdStorage, dq: &K::DqTile, head: u32, batch: u32, m: u32, wg: u32, thread_in_wg: u32) {
        if K::DETERMINISTIC {
            storage.dq.full(wg).wait(self.phase);
        }
        let (warp, lane) = (thread_in_wg / 32, thread_in_wg % 32);
        let row = (batch * p.heads_q + head) as u64 * p.padded_rows as u64 + (m * K::BLOCK_M) as u64;
        let block = p.dq_accum + 4 * row * K::HDIM as u64;
        let piece0 = DqSplit::of::<K>(wg).col0 / 64;
        for j in 0..<K::DqTile as FragTile>::FRAGS as u32 {
            let (piece, jj) = (piece0 + j / 8, j % 8);
            let at = block + 4 * (piece * DQ_PIECE + ((warp * 8 + jj) * 32 + lane) * 4) as u64;
            // SAFETY: inside this query block's accumulator (whole blocks are
            // allocated); 16 B aligned.
            unsafe { global::red_add_v4_f32(at, *dq.frag(j as usize)) };
        }
        if K::DETERMINISTIC {
            // Every thread's reductions before the signal, and so before the release.
            fence::acq_rel_gpu();
            NamedBarrier::Epilogue.sync(wg);
            if thread_in_wg == 0 {
                storage.dq.empty(wg).arrive();
            }
            self.phase ^= 1;
        }
    }
}

/// The dQ writer: one warp of the producer warpgroup, on the producer's registers.
pub struct DqWriter<K: BwdTraits> {
    kernel: PhantomData<K>,
}

impl<K: BwdTraits> DqWriter<K> {
    /// Adds every step's pieces of the CTA of key block `n_block` (K/V head `head_k`,
    /// `batch`), in the consumers' order. Every lane of the warp calls it.
    #[inline(always)]
    pub fn run(p: &BwdParams, storage: &BwdStorage, n_block: u32, head_k: u32, batch: u32, lane: u32) {
        let leader = lane == 0;
        let mut phase = 0;
        let ranges = super::local_ranges::<K>(p, batch);
        super::cta_steps::<K>(p, n_block, batch, ranges.as_ref()).for_each(|h, m| {
            let head = head_k * p.kv_group + h;
            for wg in 0..MMA_WGS {
                storage.dq.full(wg).wait(phase);
            }
            // (batch, head) of the accumulator and of the semaphores.
            let bh = batch * p.heads_q + head;
            let semaphore = |bh: u32| semaphore::<K>(p, bh, m);
            if K::DETERMINISTIC {
                let turn = p.dq_order_of(K::LOCAL).turn(n_block, m, p.causal != 0, K::BLOCK_M, K::BLOCK_N, p.seqlen_q, p.seqlen_k, ranges.as_ref());
                // The whole warp polls (a warp-uniform loop); one load per poll.
                // SAFETY: inside the host-sized semaphore array.
                while unsafe { global::ld_acquire_u32(semaphore(bh)) } < turn {}
                // The predecessors' reductions, seen through the acquire, come first.
                fence::proxy_async_global();
            }
            if leader {
                // Derived after the wait (through an opaque value, so that it is not
                // hoisted above it): held across it, they spilled the producer's 24
                // registers.
                let bh = opaque_u32(bh);
                let row = bh as u64 * p.padded_rows as u64 + (m * K::BLOCK_M) as u64;
                let block = |wg: u32| p.dq_accum + 4 * (row * K::HDIM as u64 + (DqSplit::of::<K>(wg).col0 / 64 * DQ_PIECE) as u64);
                for wg in 0..MMA_WGS {
                    // SAFETY: a whole piece of the accumulator (16 KB, 16 B aligned),
                    // staged and fenced by the consumers before the full barrier.
                    unsafe { tma::bulk_reduce_add_f32(block(wg), storage.dq.slot(wg), DQ_PIECE * 4) };
                    tma::store_commit();
                    // Where both pieces add to the same floats, the first is summed before
                    // the second starts: their order is fixed.
                    if K::DETERMINISTIC && DqSplit::shared::<K>() && wg == 0 {
                        tma::bulk_wait::<0>();
                    }
                }
                if K::DETERMINISTIC {
                    // Done, not only read: the next CTA's reductions must find them summed.
                    tma::bulk_wait::<0>();
                    fence::proxy_async_global();
                    fence::acq_rel_gpu();
                    // SAFETY: as above.
                    unsafe { global::red_release_add_u32(semaphore(bh), 1) };
                } else {
                    tma::store_wait_read::<0>();
                }
                for wg in 0..MMA_WGS {
                    storage.dq.empty(wg).arrive();
                }
            }
            phase ^= 1;
        });
        // Shared memory must outlive the reductions' reads.
        if leader {
            tma::store_wait_read::<0>();
        }
    }

    /// Deterministic mode where the warpgroups split the head dimension (they add their
    /// dQ themselves, `DqStager::add_direct`): for every step, waits for the CTA's turn at
    /// the query block, hands it to both warpgroups, waits until both have added, and
    /// releases it. Every lane of the warp calls it.
    #[inline(always)]
    pub fn hand_turns(p: &BwdParams, storage: &BwdStorage, n_block: u32, head_k: u32, batch: u32, lane: u32) {
        let mut phase = 0;
        let ranges = super::local_ranges::<K>(p, batch);
        super::cta_steps::<K>(p, n_block, batch, ranges.as_ref()).for_each(|h, m| {
            let bh = batch * p.heads_q + head_k * p.kv_group + h;
            let semaphore = semaphore::<K>(p, bh, m);
            let turn = p.dq_order_of(K::LOCAL).turn(n_block, m, p.causal != 0, K::BLOCK_M, K::BLOCK_N, p.seqlen_q, p.seqlen_k, ranges.as_ref());
            // SAFETY: inside the host-sized semaphore array.
            while unsafe { global::ld_acquire_u32(semaphore) } < turn {}
            if lane == 0 {
                for wg in 0..MMA_WGS {
                    storage.dq.full(wg).arrive();
                }
            }
            for wg in 0..MMA_WGS {
                storage.dq.empty(wg).wait(phase);
            }
            if lane == 0 {
                // The warpgroups' reductions (fenced before their signals) before the count.
                fence::acq_rel_gpu();
                // SAFETY: as above.
                unsafe { global::red_release_add_u32(semaphore, 1) };
            }
            phase ^= 1;
        });
    }
}

/// The deterministic mode's counter of query block `m` of (batch, head) `bh`.
#[inline(always)]
fn semaphore<K: BwdTraits>(p: &BwdParams, bh: u32, m: u32) -> u64 {
    p.dq_semaphore + 4 * (bh * p.query_blocks(K::BLOCK_M) + m) as u64
}

