//! The FP8 kernels' in-kernel V transpose (FA3's `Transpose_V`): e4m3 wgmma reads shared
//! operands only K-major, and `O = P V` reduces over keys, so V must sit in shared memory
//! with its keys contiguous. When V comes as stored (`[b, s, h, d]`), the producer thread
//! loads each V tile as it loads K, into the raw V ring, and warps 1-3 of the producer
//! warpgroup transpose it into the V ring that the consumers read, in the same
//! permuted-key layout a transposed V's TMA load gives (`common::fp8::vt_position`), one
//! step behind the loads: `ldmatrix.trans` of 16 keys by 32 columns, two byte permutes,
//! `stmatrix` (`common::fp8::transpose_op` has the lane plan, checked on the CPU;
//! `transpose_lane` the per-lane constants that make each row address two integer ops).
//!
//! Pipelines: the raw ring is filled by TMA (full: the producer's arrival and the bytes)
//! and released by the transposers (empty: one arrival); the V ring is filled by the
//! transposers (full: one arrival, no bytes) and released by the consumers as before.
use super::barriers::NamedBarrier;
use super::pipeline::{PipelineState, TmaPipeline};
use super::scheduler::{HandoffTiles, TileSource};
use super::traits::KernelTraits;
use crate::ptx::math::byte_perm;
use crate::ptx::mma::ldmatrix_x4_trans;
use crate::ptx::smem::stmatrix_x4;
use crate::ptx::compiler::opaque_u32;
use crate::ptx::{fence, sreg};
use common::FwdParams;
use common::fa3::KV_STAGES;
use common::fp8::{TRANSPOSE_PERMUTES, transpose_lane, transpose_load, transpose_store, transpose_unit_slabs, transpose_units};
use core::marker::PhantomData;

/// Warps of the producer warpgroup that transpose (all but the loads' warp 0).
pub const TRANSPOSER_WARPS: u32 = 3;
/// Their threads: the handoff's extra readers and the named barrier's count.
pub const TRANSPOSER_THREADS: u32 = 32 * TRANSPOSER_WARPS;

/// Warps 1-3 of the producer warpgroup, transposing every V tile of every tile of the CTA.
pub struct Transposer<K: KernelTraits> {
    raw: TmaPipeline<KV_STAGES>,
    v: TmaPipeline<KV_STAGES>,
    /// The position in both rings: they have as many stages and move together.
    state: PipelineState<KV_STAGES>,
    /// This warp among the transposers (0-based).
    warp: u32,
    kernel: PhantomData<K>,
}

impl<K: KernelTraits> Transposer<K> {
    /// `warp`: the producer warpgroup's warp index, 1 to 3.
    #[inline(always)]
    pub fn new(raw: TmaPipeline<KV_STAGES>, v: TmaPipeline<KV_STAGES>, warp: u32) -> Self {
        Transposer { raw, v, state: PipelineState::new(), warp: warp - 1, kernel: PhantomData }
    }

    /// Every key block of every tile the producer hands out, in its load order.
    #[inline(always)]
    pub fn run(&mut self, p: &FwdParams, tiles: &mut HandoffTiles<K>) {
        while let Some(tile) = tiles.next_tile(p) {
            for _ in 0..tile.n_blocks {
                self.block();
            }
        }
    }

    /// Transposes the next raw V slot into the next V slot.
    #[inline(always)]
    fn block(&mut self) {
        let st = self.state;
        self.raw.consumer_wait(st);
        // The consumers released this V slot (the first round passes at once).
        self.v.empty(st.index()).wait(st.phase() ^ 1);
        let (src, dst) = (self.raw.slot(st.index()), self.v.slot(st.index()));
        let lane = sreg::lane_id();
        let l = transpose_lane(K::BLOCK_N, K::HDIM, lane);
        let unit_slabs = transpose_unit_slabs(K::HDIM);
        let units_per_group = K::HDIM / 32 / unit_slabs;
        let mut unit = self.warp;
        while unit < transpose_units(K::BLOCK_N, K::HDIM) {
            // Each unit's addresses from its number: carried from unit to unit, they
            // took registers the 32 of the producer warpgroup do not have.
            let u = opaque_u32(unit);
            let (kg, s0) = (u / units_per_group, (u % units_per_group) * unit_slabs);
            for j in 0..unit_slabs {
                let load = transpose_load(K::BLOCK_N, K::HDIM, &l, kg, s0 + j);
                let store = transpose_store(K::BLOCK_N, K::HDIM, &l, kg, s0 + j);
                // SAFETY: both offsets are 16-byte aligned rows inside their slots (CPU
                // tests check the plan); the raw slot's TMA load completed (its full
                // barrier) and no consumer reads this V slot (its empty barrier).
                unsafe {
                    let r = ldmatrix_x4_trans(src.add(load));
                    stmatrix_x4(
                        dst.add(store),
                        [
                            byte_perm::<{ TRANSPOSE_PERMUTES[0] }>(r[0], r[1]),
                            byte_perm::<{ TRANSPOSE_PERMUTES[1] }>(r[0], r[1]),
                            byte_perm::<{ TRANSPOSE_PERMUTES[0] }>(r[2], r[3]),
                            byte_perm::<{ TRANSPOSE_PERMUTES[1] }>(r[2], r[3]),
                        ],
                    );
                }
            }
            unit += TRANSPOSER_WARPS;
        }
        // The stores reach the consumers' wgmma (async proxy), and the loads are done
        // before the next TMA load overwrites the raw slot.
        fence::proxy_async_shared();
        NamedBarrier::Transpose.sync(0);
        if self.warp == 0 && lane == 0 {
            self.v.full(st.index()).arrive();
            self.raw.empty(st.index()).arrive();
        }
        self.state.advance();
    }
}
