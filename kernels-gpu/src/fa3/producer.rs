//! The producer: TMA loads of each tile's Q into its one-slot buffer, and of the K and V
//! tiles into their rings, in the order the consumers use them (K of step i is fetched
//! before V of step i-1, since the overlapped mainloop needs S_i before PV_{i-1}). The
//! ring positions carry over from tile to tile, so the next tile's loads start as soon
//! as slots free up, while the consumers still finish the current one.
use super::pipeline::{PipelineState, TmaPipeline};
use super::scheduler::Tile;
use crate::ptx::tma::TensorMap;

#[derive(Clone, Copy)]
pub struct Loader<const STAGES: u32, const BLOCK_N: u32> {
    pub tma_q: TensorMap,
    pub tma_k: TensorMap,
    pub tma_v: TensorMap,
    /// One slot: Q of the current tile.
    pub q: TmaPipeline<1>,
    pub k: TmaPipeline<STAGES>,
    pub v: TmaPipeline<STAGES>,
    pub q_state: PipelineState<1>,
    pub k_state: PipelineState<STAGES>,
    pub v_state: PipelineState<STAGES>,
    /// The one thread that arms barriers and issues copies; the others calling the
    /// loader (a whole warpgroup without warp specialization) only wait along.
    pub leader: bool,
}

impl<const STAGES: u32, const BLOCK_N: u32> Loader<STAGES, BLOCK_N> {
    #[inline(always)]
    pub fn prefetch_descriptors(&self) {
        self.tma_q.prefetch();
        self.tma_k.prefetch();
        self.tma_v.prefetch();
    }

    /// Loads Q of `tile` once the consumers released the previous one. A tile with no
    /// key to see gets the slot without a load (its output is zeros, staged in memory a
    /// late Q load must not land on).
    #[inline(always)]
    pub fn load_q(&mut self, tile: &Tile, row0: u32) {
        let st = self.q_state;
        if tile.n_blocks == 0 {
            self.q.producer_acquire_bytes(st, 0, self.leader);
        } else {
            self.q.producer_acquire(st, self.leader);
            // SAFETY: the slot holds one box; its full barrier expects the bytes.
            unsafe {
                self.tma_q.load_5d(self.q.slot(0), self.q.full(0), [0, row0 as i32, 0, tile.head as i32, tile.batch as i32], self.leader)
            };
        }
        self.q_state.advance();
    }

    /// Key row of step `i` (steps run from the last block down).
    #[inline(always)]
    fn key_row(tile: &Tile, i: u32) -> i32 {
        ((tile.n_blocks - 1 - i) * BLOCK_N) as i32
    }

    /// Loads K of step `i` into the next K slot (waits for it to be free).
    #[inline(always)]
    pub fn load_k(&mut self, tile: &Tile, i: u32) {
        Self::load_kv(self.tma_k, &self.k, &mut self.k_state, tile, i, self.leader);
    }

    /// Loads V of step `i` into the next V slot (waits for it to be free).
    #[inline(always)]
    pub fn load_v(&mut self, tile: &Tile, i: u32) {
        Self::load_kv(self.tma_v, &self.v, &mut self.v_state, tile, i, self.leader);
    }

    #[inline(always)]
    fn load_kv(
        map: TensorMap,
        ring: &TmaPipeline<STAGES>,
        st: &mut PipelineState<STAGES>,
        tile: &Tile,
        i: u32,
        leader: bool,
    ) {
        ring.producer_acquire(*st, leader);
        let coords = [0, Self::key_row(tile, i), 0, tile.head_k as i32, tile.batch as i32];
        // SAFETY: the slot holds one box; its full barrier expects the bytes.
        unsafe { map.load_5d(ring.slot(st.index()), ring.full(st.index()), coords, leader) };
        st.advance();
    }

    /// All loads of one tile, in consumption order (the warp-specialized producer).
    #[inline(always)]
    pub fn load_tile(&mut self, tile: &Tile, row0: u32) {
        self.load_q(tile, row0);
        let n = tile.n_blocks;
        if n == 0 {
            return;
        }
        self.load_k(tile, 0);
        for i in 1..n {
            self.load_k(tile, i);
            self.load_v(tile, i - 1);
        }
        self.load_v(tile, n - 1);
    }
}
