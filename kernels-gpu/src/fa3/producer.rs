//! The producer: TMA loads of each tile's Q into its one-slot buffer, and of the K and V
//! tiles into their rings, in the order the consumers use them (K of step i is fetched
//! before V of step i-1, since the overlapped mainloop needs S_i before PV_{i-1}). The
//! ring positions carry over from tile to tile, so the next tile's loads start as soon
//! as slots free up, while the consumers still finish the current one.
use super::pipeline::{PipelineState, TmaPipeline};
use super::scheduler::Tile;
use super::storage::{SharedStorage, TensorMaps};
use super::mask::Mask;
use super::traits::KernelTraits;
use crate::element::Operand;
use crate::ptx::tma::TensorMap;
use common::FwdParams;
use common::fa3::{KV_STAGES, TensorMapSlot};
use common::gmma::sw128_rows;
use core::marker::PhantomData;

#[derive(Clone, Copy)]
pub struct Loader<K: KernelTraits> {
    /// The descriptor block: maps of q, k, v (and o).
    pub maps: TensorMaps,
    /// One slot: Q of the current tile.
    pub q: TmaPipeline<1>,
    pub k: TmaPipeline<KV_STAGES>,
    /// The ring V's loads fill: the consumers' V ring, or the raw V ring of the kernels
    /// that transpose V in shared memory (`super::transpose`).
    pub v: TmaPipeline<KV_STAGES>,
    pub q_state: PipelineState<1>,
    pub k_state: PipelineState<KV_STAGES>,
    pub v_state: PipelineState<KV_STAGES>,
    /// The one thread that arms barriers and issues copies; the others calling the
    /// loader (a whole warpgroup without warp specialization) only wait along.
    pub leader: bool,
    /// In a 2-CTA cluster, this CTA's rank: it loads half of each K/V tile's rows and
    /// multicasts them to both CTAs (the K/V maps' boxes are then `BLOCK_N / 2` rows of
    /// one 64-column chunk). `None`: whole tiles, this CTA only.
    pub multicast_rank: Option<u32>,
    pub kernel: PhantomData<K>,
}

impl<K: KernelTraits> Loader<K> {
    /// The loader of `storage`'s Q and K/V rings, all at their first slot. `leader`: this
    /// thread issues.
    #[inline(always)]
    pub fn new(maps: TensorMaps, storage: &SharedStorage, leader: bool, multicast_rank: Option<u32>) -> Self {
        Loader {
            maps,
            q: storage.q,
            k: storage.k,
            v: if K::TRANSPOSE_V { storage.v_raw } else { storage.v },
            q_state: PipelineState::new(),
            k_state: PipelineState::new(),
            v_state: PipelineState::new(),
            leader,
            multicast_rank,
            kernel: PhantomData,
        }
    }

    #[inline(always)]
    fn map(&self, slot: TensorMapSlot) -> TensorMap {
        self.maps.get_rederived(slot)
    }

    #[inline(always)]
    pub fn prefetch_descriptors(&self) {
        self.map(TensorMapSlot::Q).prefetch();
        self.map(TensorMapSlot::K).prefetch();
        self.map(TensorMapSlot::V).prefetch();
    }

    /// Loads Q of `tile` once the consumers released the previous one. A tile with no
    /// key to see gets the slot without a load (its output is zeros, staged in memory a
    /// late Q load must not land on).
    #[inline(always)]
    pub fn load_q(&mut self, tile: &Tile) {
        let st = self.q_state;
        if tile.n_blocks == 0 {
            self.q.producer_acquire_bytes(st, 0, self.leader);
        } else {
            self.q.producer_acquire(st, self.leader);
            // SAFETY: the slot holds one box; its full barrier expects the bytes.
            unsafe {
                self.map(TensorMapSlot::Q).load_5d(self.q.slot(0), self.q.full(0), [0, tile.row0, 0, tile.head as i32, tile.batch as i32], self.leader)
            };
        }
        self.q_state.advance();
    }

    /// Loads K of step `i` into the next K slot (waits for it to be free). Refills
    /// without warp specialization, which block-sparse kernels always have.
    #[inline(always)]
    pub fn load_k(&mut self, tile: &Tile, i: u32) {
        const { assert!(!K::Mask::SPARSE || K::WARP_SPECIALIZED) };
        self.load_k_block(tile, tile.range_block(i));
    }

    /// Loads V of step `i` into the next V slot (waits for it to be free); as `load_k`.
    #[inline(always)]
    pub fn load_v(&mut self, tile: &Tile, i: u32) {
        self.load_v_block(tile, tile.range_block(i));
    }

    #[inline(always)]
    fn load_k_block(&mut self, tile: &Tile, block: u32) {
        self.k_state = self.load_kv(self.map(TensorMapSlot::K), &self.k, self.k_state, tile, block, false);
    }

    #[inline(always)]
    fn load_v_block(&mut self, tile: &Tile, block: u32) {
        // A V the kernel transposes is loaded as stored, as K is.
        let transposed = K::Element::V_TRANSPOSED && !K::TRANSPOSE_V;
        self.v_state = self.load_kv(self.map(TensorMapSlot::V), &self.v, self.v_state, tile, block, transposed);
    }

    /// Loads K or V (`map`, `ring`) of key block `block` into slot `st`; returns the next
    /// position. `transposed`: the map is a transposed V's (`[keys, d, 1, h, b]`
    /// innermost first, whose key coordinate comes first, or by chunks `[chunk keys, d,
    /// chunks, h, b]`: `host::tma::TensorMapSpec::vt`).
    #[inline(always)]
    fn load_kv(
        &self,
        map: TensorMap,
        ring: &TmaPipeline<KV_STAGES>,
        mut st: PipelineState<KV_STAGES>,
        tile: &Tile,
        block: u32,
        transposed: bool,
    ) -> PipelineState<KV_STAGES> {
        ring.producer_acquire(st, self.leader);
        let (slot, full) = (ring.slot(st.index()), ring.full(st.index()));
        let (row, head, batch) = ((block * K::BLOCK_N) as i32, tile.head_k as i32, tile.batch as i32);
        match self.multicast_rank {
            // SAFETY: the slot holds one box; its full barrier expects the bytes.
            None => unsafe {
                // A transposed V of several chunks (`common::fp8::vt_chunk`) is addressed
                // by chunk: `(chunk keys, d, chunks, h, b)`.
                let chunk = common::fp8::vt_chunk(K::BLOCK_N);
                let coords = if !transposed {
                    [0, row, 0, head, batch]
                } else if chunk < K::BLOCK_N {
                    [0, 0, row / chunk as i32, head, batch]
                } else {
                    [row, 0, 0, head, batch]
                };
                map.load_5d(slot, full, coords, self.leader)
            },
            Some(rank) => {
                // Rows [rank * BLOCK_N/2, (rank + 1) * BLOCK_N/2) of every chunk, into both
                // CTAs; each CTA's full barrier expects the whole tile (both halves). The
                // half starts on a 1024 B swizzle atom, so the swizzle composes.
                let half = K::BLOCK_N / 2;
                for c in 0..K::CHUNKS {
                    let dst = slot.add(sw128_rows(K::BLOCK_N, c, rank * half));
                    let coords = [0, row + (rank * half) as i32, c as i32, head, batch];
                    // SAFETY: as above, in both CTAs of the cluster.
                    unsafe { map.load_5d_multicast(dst, full, coords, 0b11, self.leader) };
                }
            }
        }
        st.advance();
        st
    }

    /// All loads of one tile, in consumption order (the warp-specialized producer): key
    /// blocks from the last down, counted by block so that the first block (past 0 for
    /// local masks) costs the 24-register producer nothing more.
    #[inline(always)]
    pub fn load_tile(&mut self, p: &FwdParams, tile: &Tile) {
        self.load_q(tile);
        if tile.n_blocks == 0 {
            return;
        }
        if K::Mask::SPARSE {
            // The list's blocks up to its end mark, in the order above.
            let lists = &p.block_mask.fwd;
            let mut at = tile.list.cursor(lists);
            self.load_k_block(tile, at.block(lists, 0));
            loop {
                at.advance();
                let next = at.block(lists, 0);
                if next == common::sparse::END {
                    break;
                }
                self.load_k_block(tile, next);
                // Read again rather than held.
                self.load_v_block(tile, at.block(lists, 1));
            }
            self.load_v_block(tile, at.block(lists, 1));
            return;
        }
        let first = tile.n_block_min;
        let mut block = first + tile.n_blocks - 1;
        self.load_k_block(tile, block);
        while block > first {
            self.load_k_block(tile, block - 1);
            self.load_v_block(tile, block);
            block -= 1;
        }
        self.load_v_block(tile, first);
    }
}
