//! dQ's fp32 accumulator in global memory: every key block adds its `dS K` to the query
//! blocks it sees. Each consumer warpgroup stages its part of the step's dQ (64 rows: half
//! the head dimension, or every column of its rows in 128-row steps, `DqSplit`) in its
//! shared-memory slot in fragment order
//! (`common::bwd::dq_accum_index`: 16-byte stores, no bank conflict) and hands it over
//! (each thread fences its stores and arrives at a named barrier the writer waits at,
//! without waiting itself: `BwdTraits::DQ_ARRIVE_ONLY`; else a warpgroup sync and the
//! slot's full mbarrier); the dQ writer, a warp of the producer warpgroup, adds them to
//! the accumulator with one bulk reduction
//! (`cp.reduce.async.bulk`, summed in L2) and frees the slot once it has been read (FA3's
//! layout: a per-element `red` from every thread made the backward bound by L2 atomics,
//! and the consumers never wait on global memory).
//!
//! Where the consumer warpgroups split the head dimension (hdim 256), their dQ of a step
//! (64 x 128 floats each, 64 KB) has no room of its own in shared memory: it is staged in
//! the step's Q and dO slots, which the products no longer read once both warpgroups are
//! done, and the writer releases those slots to the producer (beside the consumers'
//! releases) after adding it. (Vector reductions from registers, FA3's way at hdim 256,
//! made the kernel bound by L2's reduction rate: without them it ran 1.46x faster.)
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
use crate::fa3::pipeline::CountState;
use common::bwd::{BwdParams, MMA_WGS, STAGES, dq_piece, dq_piece_cols, wg_dq_cols};
use common::fa3::MAX_CONSUMER_WGS;
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
        if <K::DqTile as FragTile>::FRAGS as u32 * 8 == dq_piece_cols(K::HDIM) {
            // One piece: n-tile j at `((warp · tiles + j) · 32 + lane) · 16` bytes (written
            // as one product: the hdim 128 kernels' registers were fitted with this form).
            let tiles = <K::DqTile as FragTile>::FRAGS as u32;
            for j in 0..<K::DqTile as FragTile>::FRAGS {
                let at = slot.add(((warp * tiles + j as u32) * 32 + lane) * 16);
                // SAFETY: inside this warpgroup's slot; 16 B aligned.
                unsafe { smem::st_v4_u32(at, piece.frag(j).map(f32::to_bits)) };
            }
        } else {
            for j in 0..<K::DqTile as FragTile>::FRAGS {
                let at = slot.add(stage_offset::<K>(warp, lane, j as u32));
                // SAFETY: inside this warpgroup's slot; 16 B aligned.
                unsafe { smem::st_v4_u32(at, piece.frag(j).map(f32::to_bits)) };
            }
        }
        publish::<K>(storage, wg, wg, thread_in_wg);
        self.phase ^= 1;
    }

    /// Where the warpgroups split the head dimension: stages consumer warpgroup `wg`'s
    /// dQ of Q stage `stage` (`BLOCK_M` rows by its half of the columns, `DqSplit`) in
    /// its slot of that stage ([`BwdStorage::dq_split_slot`]) in the accumulator's order,
    /// and signals the stage's dQ barrier. Both warpgroups' products of the step must be
    /// done. Every thread of the warpgroup calls it.
    #[inline(always)]
    pub fn stage_split<K: BwdTraits>(&mut self, storage: &BwdStorage, dq: &K::DqTile, stage: u32, wg: u32, thread_in_wg: u32) {
        let slot = storage.dq_split_slot(stage, wg);
        let (warp, lane) = (thread_in_wg / 32, thread_in_wg % 32);
        for j in 0..<K::DqTile as FragTile>::FRAGS as u32 {
            let at = slot.add(stage_offset::<K>(warp, lane, j));
            // SAFETY: inside the 32 KB slot; 16 B aligned.
            unsafe { smem::st_v4_u32(at, dq.frag(j as usize).map(f32::to_bits)) };
        }
        publish::<K>(storage, stage, wg, thread_in_wg);
    }
}

/// The named barrier of a staged dQ slot ([`BwdTraits::DQ_ARRIVE_ONLY`]): one id per
/// consumer warpgroup's slot, or per Q stage where the warpgroups split the head
/// dimension (both stage into it).
#[inline(always)]
fn full_barrier<K: BwdTraits>() -> NamedBarrier {
    const { assert!(STAGES <= MAX_CONSUMER_WGS && MMA_WGS <= MAX_CONSUMER_WGS) };
    if K::SPLIT { NamedBarrier::DqFullSplit } else { NamedBarrier::DqFull }
}

/// After warpgroup `wg`'s stores to the slot of full barrier `full`: makes them visible
/// to the bulk reduction (which reads through the async proxy) and hands them to the
/// writer: each thread arrives at the slot's named barrier without waiting for the rest
/// of its warpgroup ([`BwdTraits::DQ_ARRIVE_ONLY`]), or, once the whole warpgroup has
/// stored, one thread arrives at the slot's full mbarrier.
#[inline(always)]
fn publish<K: BwdTraits>(storage: &BwdStorage, full: u32, wg: u32, thread_in_wg: u32) {
    fence::proxy_async_shared();
    if K::DQ_ARRIVE_ONLY {
        full_barrier::<K>().arrive(full);
    } else {
        NamedBarrier::Epilogue.sync(wg);
        if thread_in_wg == 0 {
            storage.dq.full(full).arrive();
        }
    }
}

/// The writer's side of [`publish`]: waits until the slot of full barrier `full` holds a
/// staged piece (`phase`: the mbarrier's, where it is used). Every lane of the writer
/// warp calls it.
#[inline(always)]
fn wait_full<K: BwdTraits>(storage: &BwdStorage, full: u32, phase: u32) {
    if K::DQ_ARRIVE_ONLY {
        full_barrier::<K>().sync(full);
    } else {
        storage.dq.full(full).wait(phase);
    }
}

/// Byte offset of n-tile `j` of thread (`warp`, `lane`) in a warpgroup's staged dQ of
/// several pieces: `common::bwd::dq_stage_index`, its pieces in turn.
#[inline(always)]
fn stage_offset<K: BwdTraits>(warp: u32, lane: u32, j: u32) -> u32 {
    let tiles = dq_piece_cols(K::HDIM) / 8;
    let (piece, jj) = (j / tiles, j % tiles);
    (piece * dq_piece(K::HDIM) + ((warp * tiles + jj) * 32 + lane) * 4) * 4
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
        super::cta_steps::<K>(p, n_block, head_k, batch, ranges.as_ref()).for_each(p, |h, m| {
            let head = head_k * p.kv_group + h;
            for wg in 0..MMA_WGS {
                wait_full::<K>(storage, wg, phase);
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
                let block = |wg: u32| p.dq_accum + 4 * (row * K::HDIM as u64 + DqSplit::of::<K>(wg).accum_offset::<K>() as u64);
                for wg in 0..MMA_WGS {
                    // SAFETY: a warpgroup's whole pieces of the accumulator (64 rows, 16 B
                    // aligned), staged and fenced by the consumers before the full barrier.
                    unsafe { tma::bulk_reduce_add_f32(block(wg), storage.dq.slot(wg), 64 * wg_dq_cols(K::HDIM, K::BLOCK_M) * 4) };
                    tma::store_commit();
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

    /// [`DqWriter::run`] where the warpgroups split the head dimension: for every step,
    /// once both warpgroups staged their dQ in the stage's Q and dO slots, adds each
    /// half with one bulk reduction (in deterministic mode at the CTA's turn), then
    /// releases the slots to the producer once they are read. Every lane of the warp
    /// calls it.
    #[inline(always)]
    pub fn run_split(p: &BwdParams, storage: &BwdStorage, n_block: u32, head_k: u32, batch: u32, lane: u32) {
        let leader = lane == 0;
        // One register for the stage (the writer runs on the producer's 24).
        let mut st = CountState::<STAGES>::new();
        let ranges = super::local_ranges::<K>(p, batch);
        super::cta_steps::<K>(p, n_block, head_k, batch, ranges.as_ref()).for_each(p, |h, m| {
            wait_full::<K>(storage, st.index(), st.phase());
            let bh = batch * p.heads_q + head_k * p.kv_group + h;
            if K::DETERMINISTIC {
                let turn = p.dq_order_of(K::LOCAL).turn(n_block, m, p.causal != 0, K::BLOCK_M, K::BLOCK_N, p.seqlen_q, p.seqlen_k, ranges.as_ref());
                // SAFETY: inside the host-sized semaphore array.
                while unsafe { global::ld_acquire_u32(semaphore::<K>(p, bh, m)) } < turn {}
                fence::proxy_async_global();
            }
            if leader {
                // After the wait, as in `run`.
                let bh = opaque_u32(bh);
                let row = bh as u64 * p.padded_rows as u64 + (m * K::BLOCK_M) as u64;
                let half = K::BLOCK_M * K::HDIM / 2;
                // The Q and dO rings' addresses derived afresh: held across the loop
                // they spilled the producer's 24 registers in deterministic mode.
                let s = BwdStorage::rederived::<K>();
                for wg in 0..MMA_WGS {
                    let dst = p.dq_accum + 4 * (row * K::HDIM as u64 + (wg * half) as u64);
                    // SAFETY: half a query block of the accumulator (32 KB, 16 B aligned),
                    // staged and fenced by the warpgroup before the full barrier.
                    unsafe { tma::bulk_reduce_add_f32(dst, s.dq_split_slot(st.index(), wg), half * 4) };
                    tma::store_commit();
                }
                if K::DETERMINISTIC {
                    tma::bulk_wait::<0>();
                    fence::proxy_async_global();
                    fence::acq_rel_gpu();
                    // SAFETY: as above.
                    unsafe { global::red_release_add_u32(semaphore::<K>(p, bh, m), 1) };
                } else {
                    tma::store_wait_read::<0>();
                }
                s.q.empty(st.index()).arrive();
                s.dout.empty(st.index()).arrive();
            }
            st.advance();
        });
        if leader {
            tma::store_wait_read::<0>();
        }
    }
}

/// The deterministic mode's counter of query block `m` of (batch, head) `bh`.
#[inline(always)]
fn semaphore<K: BwdTraits>(p: &BwdParams, bh: u32, m: u32) -> u64 {
    p.dq_semaphore + 4 * (bh * p.query_blocks(K::BLOCK_M) + m) as u64
}

