//! Which tiles a CTA computes, in which order, and which key blocks each visits.
//!
//! Tiles are numbered with query blocks fastest (heaviest first: under a causal mask the
//! last query block sees the most keys), then heads, then batch, so the tiles running at
//! one time share K/V in L2, and the last tiles handed out are the lightest.
//!
//! CTA `c` of a grid of `G` starts with tile `c`. Its next tiles are either `c + G,
//! c + 2G, ...` (static: with `G` = number of tiles, one tile per CTA, scheduled by the
//! hardware; with `G` = number of SMs, persistent), or claimed from a global counter
//! (dynamic persistent: whichever CTA frees up first takes the next tile, which balances
//! causal tiles of unequal cost). With warp specialization the producer claims and
//! publishes each tile to the consumers through a shared-memory [`TileHandoff`].
use super::pipeline::{CountState, PipelineState, TmaPipeline};
use crate::ptx::{global, math, smem, sreg};
use common::FwdParams;
use common::fa3::TILE_HANDOFF_STAGES;

/// One tile of work: `BLOCK_M` query rows of one (batch, head), and the key blocks
/// `0..n_blocks` it must visit (visited from the last down, so masked blocks come first).
#[derive(Clone, Copy)]
pub struct Tile {
    pub m_block: u32,
    pub head: u32,
    pub head_k: u32,
    pub batch: u32,
    pub n_blocks: u32,
}

/// The numbering of tiles.
#[derive(Clone, Copy)]
pub struct TileOrder<const BLOCK_M: u32, const BLOCK_N: u32> {
    pub total: u32,
    m_blocks: u32,
}

impl<const BLOCK_M: u32, const BLOCK_N: u32> TileOrder<BLOCK_M, BLOCK_N> {
    #[inline(always)]
    pub fn new(p: &FwdParams) -> Self {
        let m_blocks = p.seqlen_q.div_ceil(BLOCK_M);
        TileOrder { total: m_blocks * p.heads_q * p.batch, m_blocks }
    }

    /// Tile number `t` (< `total`).
    #[inline(always)]
    pub fn tile(&self, t: u32, p: &FwdParams) -> Tile {
        // The host guarantees non-zero sizes; checked ops keep panics out of the kernel.
        let m_block = self.m_blocks - 1 - t.checked_rem(self.m_blocks).unwrap_or(0);
        let hb = t.checked_div(self.m_blocks).unwrap_or(0);
        let head = hb.checked_rem(p.heads_q).unwrap_or(0);
        Tile {
            m_block,
            head,
            head_k: p.kv_head(head),
            batch: hb.checked_div(p.heads_q).unwrap_or(0),
            n_blocks: p.n_blocks(m_block, BLOCK_M, BLOCK_N),
        }
    }
}

/// Claims this CTA's tile numbers, one at a time (a number `>= total` means done).
#[derive(Clone, Copy)]
pub struct TileClaims {
    current: u32,
    stride: u32,
    /// Global address of the shared counter; 0: static order.
    counter: u64,
}

impl TileClaims {
    /// Claims from `p.tile_counter` when the host gave one.
    #[inline(always)]
    pub fn new(p: &FwdParams) -> Self {
        TileClaims { current: sreg::block_idx_x(), stride: sreg::grid_dim_x(), counter: p.tile_counter }
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
            // SAFETY: the host passes a zeroed, 4-byte aligned u32 that outlives the launch.
            unsafe { global::atom_add_u32(self.counter, 1) }.saturating_add(self.stride)
        } else {
            self.current.saturating_add(self.stride)
        };
    }
}

/// Where the consumers get their next tile from.
pub trait TileSource<const BLOCK_M: u32, const BLOCK_N: u32> {
    fn next_tile(&mut self, p: &FwdParams) -> Option<Tile>;
}

/// Every thread follows the static order itself (no warp specialization).
#[derive(Clone, Copy)]
pub struct StaticTiles<const BLOCK_M: u32, const BLOCK_N: u32> {
    order: TileOrder<BLOCK_M, BLOCK_N>,
    next: u32,
    stride: u32,
}

impl<const BLOCK_M: u32, const BLOCK_N: u32> StaticTiles<BLOCK_M, BLOCK_N> {
    #[inline(always)]
    pub fn new(order: TileOrder<BLOCK_M, BLOCK_N>) -> Self {
        StaticTiles { order, next: sreg::block_idx_x(), stride: sreg::grid_dim_x() }
    }
}

impl<const BLOCK_M: u32, const BLOCK_N: u32> TileSource<BLOCK_M, BLOCK_N> for StaticTiles<BLOCK_M, BLOCK_N> {
    #[inline(always)]
    fn next_tile(&mut self, p: &FwdParams) -> Option<Tile> {
        let t = self.next;
        self.next = t.saturating_add(self.stride);
        if t < self.order.total { Some(self.order.tile(t, p)) } else { None }
    }
}

/// The producer's tile numbers, handed to the consumer warpgroups through shared memory:
/// per slot a "full" barrier (the producer's arrival after writing the number) and an
/// "empty" one (every consumer thread's arrival after reading it).
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

    /// Producer: writes tile number `t` into the next slot once it is free.
    #[inline(always)]
    pub fn publish(&self, st: &mut CountState<TILE_HANDOFF_STAGES>, t: u32) {
        self.ring.empty(st.index()).wait(st.phase() ^ 1);
        // SAFETY: the slot is inside the handoff area and no consumer reads it now.
        unsafe { smem::st_u32(self.ring.slot(st.index()), t) };
        // The arrival releases the store to the consumers' acquiring wait.
        self.ring.full(st.index()).arrive();
        st.advance();
    }
}

/// A consumer's view of the handoff.
#[derive(Clone, Copy)]
pub struct HandoffTiles<const BLOCK_M: u32, const BLOCK_N: u32> {
    pub order: TileOrder<BLOCK_M, BLOCK_N>,
    pub handoff: TileHandoff,
    pub state: PipelineState<TILE_HANDOFF_STAGES>,
}

impl<const BLOCK_M: u32, const BLOCK_N: u32> TileSource<BLOCK_M, BLOCK_N> for HandoffTiles<BLOCK_M, BLOCK_N> {
    #[inline(always)]
    fn next_tile(&mut self, p: &FwdParams) -> Option<Tile> {
        let ring = &self.handoff.ring;
        ring.consumer_wait(self.state);
        // SAFETY: published by the producer before the barrier phase completed.
        let t = math::shfl_broadcast_u32(unsafe { smem::ld_u32(ring.slot(self.state.index())) });
        ring.consumer_release(self.state);
        self.state.advance();
        if t < self.order.total { Some(self.order.tile(t, p)) } else { None }
    }
}
