//! The producer: TMA loads of Q once and of the K and V tiles into their rings, in the
//! order the consumers use them (K of step i is fetched before V of step i-1, since
//! the overlapped mainloop needs S_i before PV_{i-1}).
use super::pipeline::{PipelineState, TmaPipeline};
use super::scheduler::Tile;
use crate::ptx::mbarrier::Mbarrier;
use crate::ptx::smem::SmemAddr;
use crate::ptx::tma::TensorMap;

#[derive(Clone, Copy)]
pub struct Loader<const STAGES: u32, const BLOCK_M: u32, const BLOCK_N: u32> {
    pub tma_q: TensorMap,
    pub tma_k: TensorMap,
    pub tma_v: TensorMap,
    pub q_smem: SmemAddr,
    pub q_full: Mbarrier,
    pub q_bytes: u32,
    pub k: TmaPipeline<STAGES>,
    pub v: TmaPipeline<STAGES>,
    pub k_state: PipelineState<STAGES>,
    pub v_state: PipelineState<STAGES>,
    pub tile: Tile,
}

impl<const STAGES: u32, const BLOCK_M: u32, const BLOCK_N: u32> Loader<STAGES, BLOCK_M, BLOCK_N> {
    /// A copy for reading the shared-memory addresses while the loader itself is lent out.
    #[inline(always)]
    pub fn shared_view(&self) -> Self {
        *self
    }

    #[inline(always)]
    pub fn prefetch_descriptors(&self) {
        self.tma_q.prefetch();
        self.tma_k.prefetch();
        self.tma_v.prefetch();
    }

    #[inline(always)]
    pub fn load_q(&self) {
        let t = &self.tile;
        self.q_full.arrive_expect_tx(self.q_bytes);
        // SAFETY: the Q tile is sized for the box; the barrier expects its bytes.
        unsafe {
            self.tma_q.load_5d(self.q_smem, self.q_full, [0, (t.m_block * BLOCK_M) as i32, 0, t.head as i32, t.batch as i32])
        };
    }

    /// Key block visited at step `i` (steps run from the last block down).
    #[inline(always)]
    fn key_row(&self, i: u32) -> i32 {
        ((self.tile.n_blocks - 1 - i) * BLOCK_N) as i32
    }

    /// Loads K of step `i` into the next K slot (waits for it to be free).
    #[inline(always)]
    pub fn load_k(&mut self, i: u32) {
        let (t, st) = (self.tile, self.k_state);
        self.k.producer_acquire(st);
        // SAFETY: the slot holds one box; its full barrier expects the bytes.
        unsafe {
            self.tma_k.load_5d(self.k.slot(st.index), self.k.full(st.index), [0, self.key_row(i), 0, t.head_k as i32, t.batch as i32])
        };
        self.k_state.advance();
    }

    /// Loads V of step `i` into the next V slot (waits for it to be free).
    #[inline(always)]
    pub fn load_v(&mut self, i: u32) {
        let (t, st) = (self.tile, self.v_state);
        self.v.producer_acquire(st);
        // SAFETY: as for K.
        unsafe {
            self.tma_v.load_5d(self.v.slot(st.index), self.v.full(st.index), [0, self.key_row(i), 0, t.head_k as i32, t.batch as i32])
        };
        self.v_state.advance();
    }

    /// The warp-specialized producer's whole job (one thread).
    #[inline(always)]
    pub fn run(&mut self) {
        let n = self.tile.n_blocks;
        if n == 0 {
            // No key to see: the consumers write zeros through the Q tile's memory, which
            // a Q load landing later would overwrite.
            return;
        }
        self.prefetch_descriptors();
        self.load_q();
        self.load_k(0);
        for i in 1..n {
            self.load_k(i);
            self.load_v(i - 1);
        }
        self.load_v(n - 1);
    }
}
