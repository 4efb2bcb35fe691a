//! Which tiles a CTA computes, in which order, and which key blocks each visits.
//!
//! Tiles are numbered in sections of `2^p.section_log2` (batch, head) pairs, then batch
//! and head. Within a section the query block is the slow index, heaviest first (under a
//! causal mask the last query block sees the most keys): the heaviest blocks of all the
//! section's heads come before the lighter ones, while their K/V fit in L2 together (the
//! tiles running at one time share them). With sections of one head (the static orders,
//! and the counter without a mask or where sections were not measured to win) query
//! blocks are the fast index.
//!
//! CTA `c` of a grid of `G` starts with tile `c`. Its next tiles are either `c + G,
//! c + 2G, ...` (static: with `G` = number of tiles, one tile per CTA, scheduled by the
//! hardware; with `G` = number of SMs, persistent), or claimed from a global counter
//! (dynamic persistent: whichever CTA frees up first takes the next tile, which balances
//! causal tiles of unequal cost). With warp specialization the producer claims and
//! publishes each tile to the consumers through a shared-memory [`TileHandoff`].
use super::pipeline::{CountState, PipelineState, TmaPipeline};
use super::mask::Mask;
use super::traits::KernelTraits;
use crate::ptx::{global, math, smem, sreg};
use crate::sparse::BlockList;
use common::FwdParams;
use common::fa3::{self, TILE_HANDOFF_STAGES};
use core::marker::PhantomData;

/// One tile of work: `K::BLOCK_M` query rows of one (batch, head), and the key blocks
/// `n_block_min..n_block_min + n_blocks` it must visit (visited from the last down, so
/// that the blocks a causal mask cuts come first).
#[derive(Clone, Copy)]
pub struct Tile {
    pub m_block: u32,
    /// Its first query row ([`fa3::tile_row0`]): negative for the short first tile of a
    /// causal call (tiles end on the last row); rows before 0 load as zeros and are never
    /// stored.
    pub row0: i32,
    pub head: u32,
    pub head_k: u32,
    pub batch: u32,
    /// The first key block (0 but for local masks, [`super::mask::Mask::tile_blocks`]).
    pub n_block_min: u32,
    pub n_blocks: u32,
    /// Block-sparse kernels ([`super::mask::Mask::SPARSE`]): the tile's list, whose
    /// entry `i` is step `i`'s key block, and its header word (`n_blocks` and how many
    /// leading steps need the mask, [`Tile::partial`]; unused elsewhere).
    pub list: BlockList,
    pub header: u32,
}

impl Tile {
    /// The tile of query block `m_block` of `head` in `batch`, with its key blocks.
    #[inline(always)]
    pub fn new<K: KernelTraits>(p: &FwdParams, m_block: u32, head: u32, batch: u32) -> Self {
        let row0 = Self::row0::<K>(p, m_block);
        if K::Mask::SPARSE {
            let header = BlockList::of(&p.block_mask.fwd, batch, head, m_block).header_word(&p.block_mask.fwd);
            return Self::listed(p, m_block, row0, head, batch, header);
        }
        let (first, end) = K::Mask::tile_blocks(p, batch, row0, K::BLOCK_M, K::BLOCK_N);
        let n_blocks = if end > first { end - first } else { 0 };
        Tile { m_block, row0, head, head_k: p.kv_head(head), batch, n_block_min: first, n_blocks, list: BlockList::NONE, header: 0 }
    }

    /// A block-sparse kernel's tile (`K::Mask::SPARSE`) from its list's header word.
    #[inline(always)]
    fn listed(p: &FwdParams, m_block: u32, row0: i32, head: u32, batch: u32, header: u32) -> Self {
        let list = BlockList::of(&p.block_mask.fwd, batch, head, m_block);
        let n_blocks = common::sparse::split_header(header).0;
        Tile { m_block, row0, head, head_k: p.kv_head(head), batch, n_block_min: 0, n_blocks, list, header }
    }

    /// The first query row of query block `m_block` ([`fa3::tile_row0`]); the FP8
    /// kernels' tiles are never shifted: Q's block factors are per tile.
    #[inline(always)]
    pub fn row0<K: KernelTraits>(p: &FwdParams, m_block: u32) -> i32 {
        if K::FP8 { (m_block * K::BLOCK_M) as i32 } else { fa3::tile_row0(p, m_block, K::BLOCK_M, K::BLOCK_N) }
    }

    /// How many leading steps of a block-sparse tile need the mask.
    #[inline(always)]
    pub fn partial(&self) -> u32 {
        common::sparse::split_header(self.header).1
    }

    /// The key block of step `i` (of `n_blocks`, from the last block down; in a
    /// block-sparse kernel, `K::Mask::SPARSE`, its list's entry `i`).
    #[inline(always)]
    pub fn key_block<K: KernelTraits>(&self, p: &FwdParams, i: u32) -> u32 {
        if K::Mask::SPARSE { self.list.block(&p.block_mask.fwd, i) } else { self.range_block(i) }
    }

    /// The key block of step `i` of a range of blocks (not a block-sparse kernel's).
    #[inline(always)]
    pub fn range_block(&self, i: u32) -> u32 {
        self.n_block_min + self.n_blocks - 1 - i
    }
}

/// The numbering of tiles. In a cluster of `c` CTAs a number names `c` consecutive query
/// blocks of one (batch, head), one per CTA by rank, which share their K/V tiles (when
/// the query blocks do not divide evenly, the last rank gets a block past the end: its
/// Q loads as zeros and its stores are clipped, while it still loads its share of K/V).
#[derive(Clone, Copy)]
pub struct TileOrder<K: KernelTraits> {
    pub total: u32,
    /// Query blocks per (batch, head), in units of the cluster size.
    units: u32,
    /// This CTA's rank in its cluster.
    rank: u32,
    kernel: PhantomData<K>,
}

impl<K: KernelTraits> TileOrder<K> {
    /// `rank`: this CTA's rank in its cluster of `K::CLUSTER`.
    #[inline(always)]
    pub fn new(p: &FwdParams, rank: u32) -> Self {
        let units = p.seqlen_q.div_ceil(K::BLOCK_M).div_ceil(K::CLUSTER.max(1));
        TileOrder { total: units * p.heads_q * p.batch, units, rank, kernel: PhantomData }
    }

    /// Tile number `t` (< `total`).
    #[inline(always)]
    pub fn tile(&self, t: u32, p: &FwdParams) -> Tile {
        let (unit, hb) = fa3::tile_unit_and_head(t, self.units, p.section_log2);
        let (head, batch) = (hb.checked_rem(p.heads_q).unwrap_or(0), hb.checked_div(p.heads_q).unwrap_or(0));
        let m_block = if K::Mask::SPARSE && p.block_mask.fwd_order != 0 {
            // A block mask's order, heaviest tile first (the unit counts down from the
            // last; cluster 1).
            let at = p.block_mask.fwd.row_index(batch, head, self.units - 1 - unit);
            // SAFETY: the host wrote one entry per query block of every (batch, head) of
            // the lists.
            unsafe { global::ld_nc_u32(p.block_mask.fwd_order + 4 * at as u64) }
        } else {
            unit * K::CLUSTER + self.rank
        };
        Tile::new::<K>(p, m_block, head, batch)
    }
}

/// Claims this CTA's tile numbers, one at a time (a number `>= total` means done).
#[derive(Clone, Copy)]
pub struct TileClaims {
    current: u32,
    /// Added to a claim: the grid stride, less the counter's base when claiming from it.
    stride: u32,
    /// Global address of the shared counter; 0: static order.
    counter: u64,
}

impl TileClaims {
    /// Claims from `p.tile_counter` when the host gave one. The CTAs of a cluster of
    /// `cluster` take the same numbers (the cluster is the unit of work); the host gives
    /// clusters no counter.
    #[inline(always)]
    pub fn new(p: &FwdParams, cluster: u32) -> Self {
        // Constant-folded away in the cluster kernels, whose producer has no register to
        // spare.
        let counter = if cluster > 1 { 0 } else { p.tile_counter };
        let order = Self::static_order(cluster);
        if counter == 0 {
            return order;
        }
        TileClaims { counter, stride: common::claim_stride(order.stride, p.tile_counter_base), ..order }
    }

    /// Every grid-th tile (of clusters of `cluster` CTAs), without a counter.
    #[inline(always)]
    pub fn static_order(cluster: u32) -> Self {
        let cluster = cluster.max(1);
        TileClaims { current: sreg::block_idx_x() / cluster, stride: sreg::grid_dim_x() / cluster, counter: 0 }
    }

    /// The tile this CTA works on now.
    #[inline(always)]
    pub fn current(&self) -> u32 {
        self.current
    }

    /// Moves to the next tile: the first grid-size tiles are taken by CTA index, the
    /// counter hands out the rest in order.
    #[inline(always)]
    pub fn advance(&mut self) {
        self.current = if self.counter != 0 {
            // SAFETY: the host passes a 4-byte aligned u32 that outlives the launch and that
            // no other launch uses at the same time.
            common::claimed_tile(unsafe { global::atom_add_u32(self.counter, 1) }, self.stride)
        } else {
            self.current.saturating_add(self.stride)
        };
    }
}

/// Where the consumers get their next tile from.
pub trait TileSource {
    fn next_tile(&mut self, p: &FwdParams) -> Option<Tile>;
}

/// Every thread follows the static order itself (no warp specialization).
#[derive(Clone, Copy)]
pub struct StaticTiles<K: KernelTraits> {
    order: TileOrder<K>,
    claims: TileClaims,
}

impl<K: KernelTraits> StaticTiles<K> {
    /// Every grid-th tile, without a counter; every thread advances its own copy.
    #[inline(always)]
    pub fn new(order: TileOrder<K>) -> Self {
        StaticTiles { order, claims: TileClaims::static_order(1) }
    }
}

impl<K: KernelTraits> TileSource for StaticTiles<K> {
    #[inline(always)]
    fn next_tile(&mut self, p: &FwdParams) -> Option<Tile> {
        let t = self.claims.current();
        self.claims.advance();
        if t < self.order.total { Some(self.order.tile(t, p)) } else { None }
    }
}

/// A slot's query block when there are no more tiles.
const NO_TILE: u32 = u32::MAX;

/// The producer's tiles, handed to the consumer warpgroups through shared memory, decoded
/// (the producer decodes each tile for its loads anyway; the consumers would otherwise
/// redo its integer divisions at every tile boundary, between their last GEMM turn of a
/// tile and their first of the next): per slot a "full" barrier (the producer's arrival
/// after writing) and an "empty" one (every consumer thread's arrival after reading).
#[derive(Clone, Copy)]
pub struct TileHandoff {
    pub ring: TmaPipeline<TILE_HANDOFF_STAGES>,
}

impl TileHandoff {
    /// One thread, before first use.
    #[inline(always)]
    pub fn init(&self, consumers: u32) {
        self.ring.init(consumers);
    }

    /// Producer: writes `tile` (`None`: no more tiles) into the next slot once it is free.
    #[inline(always)]
    pub fn publish(&self, st: &mut CountState<TILE_HANDOFF_STAGES>, tile: Option<&Tile>) {
        let v = match tile {
            // Block-sparse kernels pass the list's header (the partial steps too).
            // (The header itself: its low half is `n_blocks`; 0 elsewhere.)
            Some(t) => [t.m_block, t.head, t.batch, t.n_blocks | (t.header & !0xffff)],
            None => [NO_TILE, 0, 0, 0],
        };
        self.ring.empty(st.index()).wait(st.phase() ^ 1);
        // SAFETY: the 16-byte aligned slot is inside the handoff area and no consumer
        // reads it now.
        unsafe { smem::st_v4_u32(self.ring.slot(st.index()), v) };
        // The arrival releases the store to the consumers' acquiring wait.
        self.ring.full(st.index()).arrive();
        st.advance();
    }
}

/// A consumer's view of the handoff.
#[derive(Clone, Copy)]
pub struct HandoffTiles<K: KernelTraits> {
    handoff: TileHandoff,
    state: PipelineState<TILE_HANDOFF_STAGES>,
    kernel: PhantomData<K>,
}

impl<K: KernelTraits> HandoffTiles<K> {
    #[inline(always)]
    pub fn new(handoff: TileHandoff) -> Self {
        HandoffTiles { handoff, state: PipelineState::new(), kernel: PhantomData }
    }
}

impl<K: KernelTraits> TileSource for HandoffTiles<K> {
    #[inline(always)]
    fn next_tile(&mut self, p: &FwdParams) -> Option<Tile> {
        let ring = &self.handoff.ring;
        ring.consumer_wait(self.state);
        // SAFETY: published by the producer before the barrier phase completed.
        let v = unsafe { smem::ld_v4_u32(ring.slot(self.state.index())) };
        ring.consumer_release(self.state);
        self.state.advance();
        // Broadcast: ptxas then knows the fields are warp-uniform.
        let [m_block, head, batch, n_blocks] = v.map(math::shfl_broadcast_u32);
        if m_block == NO_TILE {
            return None;
        }
        let row0 = Tile::row0::<K>(p, m_block);
        if K::Mask::SPARSE {
            // The slot holds the list's header.
            return Some(Tile::listed(p, m_block, row0, head, batch, n_blocks));
        }
        // The first block is recomputed (a constant 0 but for local masks).
        let n_block_min = K::Mask::tile_blocks(p, batch, row0, K::BLOCK_M, K::BLOCK_N).0;
        Some(Tile { m_block, row0, head, head_k: p.kv_head(head), batch, n_block_min, n_blocks, list: BlockList::NONE, header: 0 })
    }
}
