//! dQ's fp32 accumulator in global memory: every key block adds its `dS K` to the query
//! blocks it sees. Each consumer warpgroup stages its 64 x 64 piece in shared memory in
//! fragment order (`common::bwd::dq_accum_index`: 16-byte stores, no bank conflict) and
//! one thread adds it to the accumulator with one bulk reduction (`cp.reduce.async.bulk`,
//! summed in L2): a per-element `red` from every thread made the backward bound by L2
//! atomics. By default in whatever order the CTAs come; in deterministic mode in key-block
//! order, each CTA waiting on a per-(query block, head, batch) counter for its turn, so the
//! sums are bit-identical across runs (there with per-element fp32 reductions, see
//! [`DqWriter::add`]).
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
    /// `dq_semaphore` of this batch, `[heads_q, query blocks]` (deterministic kernels).
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
        if !K::DETERMINISTIC {
            self.reduce_bulk(piece, self.block(head, m, col0), wg, thread_in_wg, staging);
        } else {
            self.reduce_in_turn(piece, head, m, col0, wg, thread_in_wg);
        }
    }

    /// Address of the accumulator piece of columns `col0..col0 + 64` of query block `m`
    /// of query head `head`.
    #[inline(always)]
    fn block(&self, head: u32, m: u32, col0: u32) -> u64 {
        self.accum
            + 4 * ((head as u64 * self.padded_rows as u64 + (m * K::BLOCK_M) as u64) * K::HDIM as u64
                + (col0 / 64 * DQ_PIECE) as u64)
    }

    /// The piece staged in shared memory and added by one bulk reduction.
    #[inline(always)]
    fn reduce_bulk(&self, piece: &DqPiece, block: u64, wg: u32, thread_in_wg: u32, staging: SmemAddr) {
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
        if leader {
            // SAFETY: a whole piece of the accumulator (16 KB, 16 B aligned), staged and
            // fenced above.
            unsafe { tma::bulk_reduce_add_f32(block, staging, DQ_PIECE * 4) };
            tma::store_commit();
        }
    }

    /// Deterministic mode: once it is this key block's turn at the query block, each
    /// thread adds its fragments with fp32 reductions (to the same fragment-order
    /// addresses), warpgroup 0 before warpgroup 1 where both add to the same piece; then
    /// the turn passes on. (A bulk-reduction form of this protocol hung at hdim 64 on the
    /// H100; this one is the form that passed there.)
    #[inline(always)]
    fn reduce_in_turn(&self, piece: &DqPiece, head: u32, m: u32, col0: u32, wg: u32, thread_in_wg: u32) {
        let semaphore = self.semaphores + 4 * (head as u64 * self.query_blocks as u64 + m as u64);
        if self.turn_keeper {
            // Key blocks 0..n_block see every query block this one sees (smaller keys are
            // visible to at least the same rows), and add first.
            // SAFETY: inside the host-sized semaphore array.
            while unsafe { global::ld_acquire_u32(semaphore) } < self.n_block {}
        }
        NamedBarrier::DqTurn.sync(0);
        let (warp, lane) = (thread_in_wg / 32, thread_in_wg % 32);
        // Derived after the wait: held across it, the address would cost a register the
        // mainloop needs.
        let block = self.block(head, m, col0);
        let add_piece = || {
            for (j, frag) in piece.iter().enumerate() {
                let at = block + 4 * (((warp * 8 + j as u32) * 32 + lane) * 4) as u64;
                for (i, &x) in frag.iter().enumerate() {
                    // SAFETY: inside the piece (fragment order, 16 B per thread and n-tile).
                    unsafe { global::red_add_f32(at + 4 * i as u64, x) };
                }
            }
        };
        if DqSplit::shared::<K>() {
            // Both warpgroups add to the same piece: warpgroup 0 first, always.
            if wg == 0 {
                add_piece();
            }
            NamedBarrier::DqTurn.sync(0);
            if wg == 1 {
                add_piece();
            }
        } else {
            add_piece();
        }
        // Every thread's additions are issued; the release makes them visible to the
        // next key block's acquire.
        NamedBarrier::DqTurn.sync(0);
        if self.turn_keeper {
            fence::acq_rel_gpu();
            // SAFETY: as above.
            unsafe { global::red_release_add_u32(semaphore, 1) };
        }
    }
}
