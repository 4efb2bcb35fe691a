//! dQ's fp32 accumulator in global memory: every key block adds its `dS K` to the query
//! blocks it sees. By default in whatever order the CTAs come (fp32 reductions,
//! unordered); in deterministic mode in key-block order, each CTA waiting on a per-(query
//! block, head, batch) counter for its turn, so the sums are bit-identical across runs.
use super::traits::{BwdTraits, DqPiece, DqSplit};
use crate::fa3::barriers::NamedBarrier;
use crate::ptx::{fence, global};
use common::bwd::BwdParams;
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

    /// Adds consumer warpgroup `wg`'s 64 x 64 piece, columns `col0..col0 + 64` of query
    /// block `m` of query head `head` ([`DqSplit`]). Every consumer thread of the CTA calls
    /// it once per step.
    #[inline(always)]
    pub fn add(&self, piece: &DqPiece, head: u32, m: u32, col0: u32, wg: u32, thread_in_wg: u32) {
        let semaphore = self.semaphores + 4 * (head as u64 * self.query_blocks as u64 + m as u64);
        let deterministic = self.semaphores != 0;
        if deterministic {
            if self.turn_keeper {
                // Key blocks 0..n_block see every query block this one sees (smaller keys
                // are visible to at least the same rows), and add first.
                // SAFETY: inside the host-sized semaphore array.
                while unsafe { global::ld_acquire_u32(semaphore) } < self.n_block {}
            }
            NamedBarrier::DqTurn.sync(0);
        }
        let head_base = self.accum + head as u64 * self.padded_rows as u64 * K::HDIM as u64 * 4;
        let rows = head_base + (m * K::BLOCK_M) as u64 * K::HDIM as u64 * 4;
        if deterministic && DqSplit::shared::<K>() {
            // Both warpgroups add to the same elements: warpgroup 0 first, always.
            if wg == 0 {
                Self::add_piece(piece, rows, col0, thread_in_wg);
            }
            NamedBarrier::DqTurn.sync(0);
            if wg == 1 {
                Self::add_piece(piece, rows, col0, thread_in_wg);
            }
        } else {
            Self::add_piece(piece, rows, col0, thread_in_wg);
        }
        if deterministic {
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

    /// This thread's 32 elements of a piece into the rows from `rows` (the query block's
    /// first row of the accumulator).
    #[inline(always)]
    fn add_piece(piece: &DqPiece, rows: u64, col0: u32, thread_in_wg: u32) {
        let (warp, lane) = (thread_in_wg / 32, thread_in_wg % 32);
        for r in 0..2 {
            let row = warp * 16 + lane / 4 + 8 * r;
            let row_base = rows + row as u64 * K::HDIM as u64 * 4;
            for (j, frag) in piece.iter().enumerate() {
                let col = col0 + 8 * j as u32 + 2 * (lane % 4);
                // SAFETY: `row` is inside the padded rows (whole query blocks), `col` inside
                // the head dimension; 4 B aligned.
                unsafe {
                    global::red_add_f32(row_base + 4 * col as u64, frag[2 * r as usize]);
                    global::red_add_f32(row_base + 4 * (col as u64 + 1), frag[2 * r as usize + 1]);
                }
            }
        }
    }
}
