//! Which tile a CTA computes and which key blocks it visits.
use crate::ptx::sreg;
use common::FwdParams;

/// One CTA's work: `BLOCK_M` query rows of one (batch, head), and the key blocks
/// `0..n_blocks` it must visit (visited from the last down, so masked blocks come first).
#[derive(Clone, Copy)]
pub struct Tile {
    pub m_block: u32,
    pub head: u32,
    pub head_k: u32,
    pub batch: u32,
    pub n_blocks: u32,
}

/// Grid `(m_blocks, heads_q, batch)`; `x` runs over query blocks heaviest first, so the
/// long causal rows start at launch and short ones fill the tail.
#[inline(always)]
pub fn current_tile<const BLOCK_M: u32, const BLOCK_N: u32>(p: &FwdParams) -> Tile {
    let m_block = sreg::grid_dim_x() - 1 - sreg::block_idx_x();
    let head = sreg::block_idx_y();
    let batch = sreg::block_idx_z();
    Tile {
        m_block,
        head,
        head_k: head.checked_div(p.kv_group).unwrap_or(0),
        batch,
        n_blocks: n_blocks::<BLOCK_M, BLOCK_N>(p, m_block),
    }
}

/// Key blocks any row of query block `m_block` can see: all of them, or with a causal
/// mask those up to the last row's diagonal (none if even that row sees no key).
#[inline(always)]
pub fn n_blocks<const BLOCK_M: u32, const BLOCK_N: u32>(p: &FwdParams, m_block: u32) -> u32 {
    let total = p.seqlen_k.div_ceil(BLOCK_N);
    if p.causal == 0 {
        return total;
    }
    let last_key = (m_block * BLOCK_M + BLOCK_M - 1) as i32 + p.seqlen_k as i32 - p.seqlen_q as i32;
    if last_key < 0 {
        0
    } else {
        let n = last_key as u32 / BLOCK_N + 1;
        if n < total { n } else { total }
    }
}
