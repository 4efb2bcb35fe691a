//! Which tiles a CTA computes, in which order, and which key blocks each visits.
//!
//! Tiles are numbered with query blocks fastest (heaviest first: under a causal mask the
//! last query block sees the most keys), then heads, then batch, so the tiles running at
//! one time share K/V in L2. CTA `c` of a grid of `G` takes tiles `c, c + G, c + 2G, ...`:
//! with `G` = number of tiles that is one tile per CTA (the hardware schedules them);
//! with `G` = number of SMs the kernel is persistent and each CTA's next tile is loaded
//! while the current one finishes.
use crate::ptx::sreg;
use common::FwdParams;

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

/// This CTA's sequence of tiles.
#[derive(Clone, Copy)]
pub struct TileIter<const BLOCK_M: u32, const BLOCK_N: u32> {
    next: u32,
    stride: u32,
    total: u32,
    m_blocks: u32,
}

impl<const BLOCK_M: u32, const BLOCK_N: u32> TileIter<BLOCK_M, BLOCK_N> {
    #[inline(always)]
    pub fn new(p: &FwdParams) -> Self {
        let m_blocks = p.seqlen_q.div_ceil(BLOCK_M);
        TileIter { next: sreg::block_idx_x(), stride: sreg::grid_dim_x(), total: m_blocks * p.heads_q * p.batch, m_blocks }
    }

    #[inline(always)]
    pub fn next(&mut self, p: &FwdParams) -> Option<Tile> {
        if self.next >= self.total {
            return None;
        }
        let t = self.next;
        self.next += self.stride;
        // The host guarantees non-zero sizes; checked ops keep panics out of the kernel.
        let m_block = self.m_blocks - 1 - t.checked_rem(self.m_blocks).unwrap_or(0);
        let hb = t.checked_div(self.m_blocks).unwrap_or(0);
        let head = hb.checked_rem(p.heads_q).unwrap_or(0);
        Some(Tile {
            m_block,
            head,
            head_k: p.kv_head(head),
            batch: hb.checked_div(p.heads_q).unwrap_or(0),
            n_blocks: p.n_blocks(m_block, BLOCK_M, BLOCK_N),
        })
    }
}
