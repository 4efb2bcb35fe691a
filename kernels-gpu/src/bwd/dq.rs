//! dQ's fp32 accumulator in global memory: every key block adds its `dS K` to the query
//! blocks it sees. Each consumer warpgroup stages its 64 x 64 piece in shared memory in
//! fragment order (`common::bwd::dq_accum_index`: 16-byte stores, no bank conflict) and
//! one thread adds it to the accumulator with one bulk reduction (`cp.reduce.async.bulk`,
//! summed in L2): a per-element `red` from every thread made the backward bound by L2
//! atomics. By default in whatever order the CTAs come; in deterministic mode in key-block
//! order, each CTA waiting on a per-(query block, head, batch) counter for its turn, so the
//! sums are bit-identical across runs.
use super::traits::{BwdTraits, DqPiece, DqSplit};
use crate::fa3::barriers::NamedBarrier;
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{fence, global, tma};
use common::bwd::{BwdParams, DQ_PIECE};
use core::marker::PhantomData;

#[derive(Clone, Copy)]
pub struct DqWriter<K: BwdTraits> {
    /// `dq_accum` of this (batch), `[heads_q, padded_rows, hdim]`.
    accum: u64,
    /// `dq_semaphore` of this batch, `[heads_q, query blocks]`; 0 without determinism.
    semaphores: u64,
    padded_rows: u32,
    query_blocks: u32,
    /// This CTA's key block: its turn at every query block.
    n_block: u32,
    /// The consumer thread that waits for and hands on the turn.
    turn_keeper: bool,
    kernel: PhantomData<K>,
}

impl<K: BwdTraits> DqWriter<K> {
    #[inline(always)]
    pub fn new(p: &BwdParams, batch: u32, n_block: u32, turn_keeper: bool) -> Self {
        let query_blocks = p.query_blocks(K::BLOCK_M);
        let per_batch = p.heads_q as u64 * p.padded_rows as u64 * K::HDIM as u64 * 4;
        DqWriter {
            accum: p.dq_accum + batch as u64 * per_batch,
            semaphores: if p.dq_semaphore == 0 { 0 } else { p.dq_semaphore + batch as u64 * p.heads_q as u64 * query_blocks as u64 * 4 },
            padded_rows: p.padded_rows,
            query_blocks,
            n_block,
            turn_keeper,
            kernel: PhantomData,
        }
    }

    /// Adds consumer warpgroup `wg`'s piece (columns `col0..col0 + 64`, [`DqSplit`]) of
    /// query block `m` of query head `head`, through its staging buffer `staging`
    /// ([`DQ_PIECE`] f32). Every consumer thread of the CTA calls it once per step.
    #[inline(always)]
    pub fn add(&self, piece: &DqPiece, head: u32, m: u32, col0: u32, wg: u32, thread_in_wg: u32, staging: SmemAddr) {
        let leader = thread_in_wg == 0;
        // The previous step's reduction from this buffer has read it.
        if leader {
            tma::store_wait_read::<0>();
        }
        NamedBarrier::Epilogue.sync(wg);
        let (warp, lane) = (thread_in_wg / 32, thread_in_wg % 32);
        for (j, frag) in piece.iter().enumerate() {
            let at = staging.add(((warp * 8 + j as u32) * 32 + lane) * 16);
            // SAFETY: inside this warpgroup's staging buffer; 16 B aligned.
            unsafe { smem::st_v4_u32(at, frag.map(f32::to_bits)) };
        }
        // The bulk reduction reads through the async proxy.
        fence::proxy_async_shared();
        NamedBarrier::Epilogue.sync(wg);
        let block = self.accum
            + 4 * ((head as u64 * self.padded_rows as u64 + (m * K::BLOCK_M) as u64) * K::HDIM as u64
                + (col0 / 64 * DQ_PIECE) as u64);
        let reduce = || {
            // SAFETY: a whole piece of the accumulator (16 KB, 16 B aligned), staged and
            // fenced above.
            unsafe { tma::bulk_reduce_add_f32(block, staging, DQ_PIECE * 4) };
            tma::store_commit();
        };
        if self.semaphores == 0 {
            if leader {
                reduce();
            }
            return;
        }
        let semaphore = self.semaphores + 4 * (head as u64 * self.query_blocks as u64 + m as u64);
        if self.turn_keeper {
            // Key blocks 0..n_block see every query block this one sees (smaller keys are
            // visible to at least the same rows), and add first.
            // SAFETY: inside the host-sized semaphore array.
            while unsafe { global::ld_acquire_u32(semaphore) } < self.n_block {}
        }
        NamedBarrier::DqTurn.sync(0);
        // Both warpgroups add to the same piece when they split the keys: warpgroup 0
        // first, always.
        for turn in 0..2 {
            if (!DqSplit::shared::<K>() || wg == turn) && leader {
                reduce();
                // Done, not only read: the next key block's reduction must see it.
                tma::bulk_wait::<0>();
            }
            if DqSplit::shared::<K>() && turn == 0 {
                NamedBarrier::DqTurn.sync(0);
            }
            if !DqSplit::shared::<K>() {
                break;
            }
        }
        NamedBarrier::DqTurn.sync(0);
        if self.turn_keeper {
            fence::acq_rel_gpu();
            // SAFETY: as above.
            unsafe { global::red_release_add_u32(semaphore, 1) };
        }
    }
}
