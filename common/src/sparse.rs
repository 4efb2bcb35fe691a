//! Block-sparse masks (FlexAttention's `BlockMask`): for each block of query rows, the key
//! blocks it must visit, split into *partial* blocks (some pair hidden: the kernel runs
//! the mask) and *full* blocks (every pair visible: no mask code); blocks no pair of
//! which is visible are *empty* and never loaded nor computed. The backward's lists are
//! the transpose: for each key block, the query blocks that see it.
//!
//! The lists are built on the GPU from a user variant's mask mod
//! (`variant::Variant::visible`) together with the call's causal flag and lengths, once
//! per tile shape: the forward's (`block_m` rows of the kernel's tiles, shifted as its
//! tiles are, [`crate::fa3::tile_row_shift`]) and the backward's. [`classify`] and
//! [`list_of`] are the rules the build kernel follows, written once for it and for the
//! CPU tests.
//!
//! # Layout
//!
//! A list is a row of `row_words` u32 words: a header ([`header`]: the count of blocks
//! and of partial blocks), then the block indices, partial blocks first, each group from
//! the highest index down (the order the forward visits a dense tile's blocks in), then
//! [`END`] (so that a walk needs no count: the forward's producer has 24 registers). Rows
//! are indexed `[batch][head][block]`; a mask built for every batch or head alike has
//! that stride 0 ([`BlockLists`]).

/// What a block of (query, key) pairs holds.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// No visible pair: skipped.
    Empty = 0,
    /// Some visible and some hidden pairs: visited with the mask.
    Partial = 1,
    /// Every pair visible (and inside the call's lengths): visited without mask code.
    Full = 2,
}

impl BlockState {
    /// From a stored byte (anything else reads as `Partial`, the safe answer).
    #[inline(always)]
    pub const fn from_u8(v: u8) -> Self {
        match v {
            0 => BlockState::Empty,
            2 => BlockState::Full,
            _ => BlockState::Partial,
        }
    }
}

/// The most blocks a list holds (its counts are 16-bit).
pub const MAX_BLOCKS: u32 = 0xffff;

/// The entry after a list's last.
pub const END: u32 = u32::MAX;

/// A list's header word: `blocks` in the low half, `partial` (the leading entries that
/// need the mask) in the high half.
#[inline(always)]
pub const fn header(blocks: u32, partial: u32) -> u32 {
    blocks | (partial << 16)
}

/// `(blocks, partial)` of a header word.
#[inline(always)]
pub const fn split_header(h: u32) -> (u32, u32) {
    (h & 0xffff, h >> 16)
}

/// Where the lists of one pass live (device address of `u32` rows; 0: no block mask).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockLists {
    pub addr: u64,
    /// Words per row: 2 + the blocks a row may list (header, entries, [`END`]).
    pub row_words: u32,
    /// Rows between heads (0: one mask for every head) and between batches (0: for every
    /// batch).
    pub head_rows: u32,
    pub batch_rows: u32,
    pub _pad: u32,
}

impl BlockLists {
    /// The index of the row of block `block` of `head` in `batch` (below 2^32: the host
    /// checks the lists' size).
    #[inline(always)]
    pub const fn row_index(&self, batch: u32, head: u32, block: u32) -> u32 {
        batch * self.batch_rows + head * self.head_rows + block
    }

    /// The address of word `i` of row `row`.
    #[inline(always)]
    pub const fn word(&self, row: u32, i: u32) -> u64 {
        self.addr + 4 * (row as u64 * self.row_words as u64 + i as u64)
    }

    /// The address of the row of block `block` of `head` in `batch`.
    #[inline(always)]
    pub const fn row(&self, batch: u32, head: u32, block: u32) -> u64 {
        self.word(self.row_index(batch, head, block), 0)
    }
}

/// A call's block mask as the kernels take it: the forward's lists (per query block,
/// per query head) and the backward's (per key block, per K/V head: the union over the
/// query heads that share it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockMaskArgs {
    pub fwd: BlockLists,
    pub bwd: BlockLists,
    /// The forward's tile order: for each (batch, head) of the lists, its query blocks
    /// from the most listed blocks down (u32, indexed as the forward's rows: position `i`
    /// of `(batch, head)` at `fwd.row_index(batch, head, i)`), so that the scheduler hands
    /// out the heaviest tiles first. 0: the dense order.
    pub fwd_order: u64,
}

/// Threads of the build kernel's CTA (one CTA per list).
pub const BUILD_THREADS: u32 = 256;

/// The build kernel's parameters: one pass's lists (one CTA per list, grid
/// `(lists per head, list heads, list batches)`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuildParams {
    /// The lists written, and a byte per block of scratch (`[list][blocks]`, the states
    /// before they are gathered).
    pub lists: BlockLists,
    pub states: u64,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub block_m: u32,
    pub block_n: u32,
    /// Query block `m` starts at row `m · block_m − row_shift` ([`crate::fa3::tile_row_shift`]).
    pub row_shift: u32,
    /// Non-zero: the call is causal (bottom-right).
    pub causal: u32,
    /// Non-zero: lists run over query blocks, one per key block (the backward's).
    pub transposed: u32,
    /// Query heads each list covers: the mask mod's `Coords::head` of list head `h` is
    /// `h · heads_per_list + i` for `i < heads_per_list` (the backward's K/V group; 1 for
    /// the forward, and for a mask built for every head alike, whose one list head is 0).
    /// `Coords::batch` is the list's batch (0 for a mask built for every batch alike).
    pub heads_per_list: u32,
    /// List heads (the grid's y): the scratch is `[batch][list head][list][block]`.
    pub list_heads: u32,
    /// The variant's buffer.
    pub variant: crate::variant::VariantArgs,
}

impl BuildParams {
    /// Blocks along a list: key blocks (forward) or query blocks (backward).
    #[inline(always)]
    pub const fn list_len(&self) -> u32 {
        if self.transposed != 0 { self.query_blocks() } else { self.key_blocks() }
    }

    /// Query blocks of the call's tiles.
    #[inline(always)]
    pub const fn query_blocks(&self) -> u32 {
        blocks_of(self.seqlen_q + self.row_shift, self.block_m)
    }

    /// Key blocks.
    #[inline(always)]
    pub const fn key_blocks(&self) -> u32 {
        blocks_of(self.seqlen_k, self.block_n)
    }

    /// `(m, n)` of entry `i` of list `list` (a query block, or a key block when
    /// transposed).
    #[inline(always)]
    pub const fn block_of(&self, list: u32, i: u32) -> (u32, u32) {
        if self.transposed != 0 { (i, list) } else { (list, i) }
    }

    /// The query rows `[lo, hi)` of block `m` inside the call, and its keys `[lo, hi)`
    /// of block `n` (cut at `seqlen_k`), and whether the key block runs past `seqlen_k`.
    #[inline(always)]
    pub const fn extent(&self, m: u32, n: u32) -> ([u32; 2], [u32; 2], bool) {
        let row0 = (m * self.block_m) as i64 - self.row_shift as i64;
        let lo = if row0 < 0 { 0 } else { row0 as u32 };
        let end = row0 + self.block_m as i64;
        let hi = if end > self.seqlen_q as i64 { self.seqlen_q } else if end < 0 { 0 } else { end as u32 };
        let k0 = n * self.block_n;
        let k1 = k0 + self.block_n;
        ([lo, if hi > lo { hi } else { lo }], [k0, if k1 > self.seqlen_k { self.seqlen_k } else { k1 }], k1 > self.seqlen_k)
    }

    /// Whether the call's causal mask and lengths let query `q` see key `kv` (the mask
    /// mod is asked too, by the caller).
    #[inline(always)]
    pub const fn in_call(&self, q: u32, kv: u32) -> bool {
        q < self.seqlen_q && kv < self.seqlen_k && (self.causal == 0 || kv as i64 <= q as i64 + self.seqlen_k as i64 - self.seqlen_q as i64)
    }
}

/// Blocks of `size` covering `len` (0 for a zero size, without the panic path of a
/// division by zero: the build kernel has no panic handler to reach).
#[inline(always)]
const fn blocks_of(len: u32, size: u32) -> u32 {
    match core::num::NonZeroU32::new(size) {
        Some(size) => len.div_ceil(size.get()),
        None => 0,
    }
}

/// The state of block `(m, n)` given `visible(head_index, q, kv)` over `heads` heads (the
/// call's causal mask and lengths are applied here): the build kernel's rule, pair by pair.
pub fn classify(p: &BuildParams, m: u32, n: u32, heads: u32, mut visible: impl FnMut(u32, u32, u32) -> bool) -> BlockState {
    let (rows, keys, past_end) = p.extent(m, n);
    let (mut any, mut all) = (false, !past_end);
    for h in 0..heads {
        for q in rows[0]..rows[1] {
            for kv in keys[0]..keys[1] {
                let v = p.in_call(q, kv) && visible(h, q, kv);
                any |= v;
                all &= v;
            }
        }
    }
    if rows[0] == rows[1] || keys[0] == keys[1] || !any {
        BlockState::Empty
    } else if all {
        BlockState::Full
    } else {
        BlockState::Partial
    }
}

/// The row of a list from its blocks' states (`states[i]`: entry `i`'s block along the
/// list): the header, the partial blocks from the highest down, then the full ones, then
/// [`END`]. Written into `row` (at least `2 + states.len()` words; the words past
/// [`END`] are left as they were).
pub fn list_of(states: &[BlockState], row: &mut [u32]) {
    let mut at = 1;
    for want in [BlockState::Partial, BlockState::Full] {
        for i in (0..states.len()).rev() {
            if states[i] == want {
                row[at] = i as u32;
                at += 1;
            }
        }
    }
    row[at] = END;
    let partial = states.iter().filter(|s| **s == BlockState::Partial).count() as u32;
    row[0] = header(at as u32 - 1, partial);
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    fn params(sq: u32, sk: u32, bm: u32, bn: u32, shift: u32, causal: bool, transposed: bool) -> BuildParams {
        BuildParams { seqlen_q: sq, seqlen_k: sk, block_m: bm, block_n: bn, row_shift: shift, causal: causal as u32, transposed: transposed as u32, heads_per_list: 1, ..Default::default() }
    }

    #[test]
    fn blocks_are_empty_partial_or_full_by_their_pairs() {
        let p = params(100, 90, 32, 16, 0, false, false);
        assert_eq!(classify(&p, 0, 0, 1, |_, _, _| true), BlockState::Full);
        assert_eq!(classify(&p, 0, 0, 1, |_, _, _| false), BlockState::Empty);
        assert_eq!(classify(&p, 0, 0, 1, |_, q, kv| q != 3 || kv != 7), BlockState::Partial);
        // Key block 5 runs past seqlen_k = 90: never full (its padding keys need the mask).
        assert_eq!(classify(&p, 0, 5, 1, |_, _, _| true), BlockState::Partial);
        // Rows past seqlen_q do not count: block 3 holds rows 96..100 only.
        assert_eq!(classify(&p, 3, 0, 1, |_, q, _| q < 100), BlockState::Full);
        // Causal (bottom-right, offset -10): row 0 sees no key, so block (0, 0) is partial.
        let c = params(100, 90, 32, 16, 0, true, false);
        assert_eq!(classify(&c, 0, 0, 1, |_, _, _| true), BlockState::Partial);
        assert_eq!(classify(&c, 3, 0, 1, |_, _, _| true), BlockState::Full);
        // A shifted first tile: rows -12..20.
        let s = params(116, 116, 32, 16, 12, true, false);
        assert_eq!(s.extent(0, 0).0, [0, 20]);
        // A head that hides everything does not make the union's block empty.
        assert_eq!(classify(&p, 1, 1, 2, |h, _, _| h == 1), BlockState::Partial);
        assert_eq!(classify(&p, 1, 1, 2, |_, _, _| true), BlockState::Full);
    }

    #[test]
    fn lists_hold_the_partial_blocks_then_the_full_ones_each_from_the_top() {
        use BlockState::*;
        let states = [Full, Empty, Partial, Full, Partial, Empty];
        let mut row = vec![7; 9];
        list_of(&states, &mut row);
        assert_eq!(split_header(row[0]), (4, 2));
        assert_eq!(&row[1..6], &[4, 2, 3, 0, END]);
        assert_eq!(&row[6..], &[7; 3], "words past the list untouched");
        list_of(&[Empty; 3], &mut row);
        assert_eq!((split_header(row[0]), row[1]), ((0, 0), END));
    }

    /// Every visible pair of the call lies in a listed block, and a full block's pairs
    /// are all visible: over random masks, shapes, shifts, causal and both directions.
    #[test]
    fn listed_blocks_cover_every_visible_pair_and_full_blocks_need_no_mask() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..60 {
            let (sq, sk) = (1 + (rand() % 70) as u32, 1 + (rand() % 70) as u32);
            let (bm, bn) = ([8u32, 16][(rand() % 2) as usize], [8u32, 16][(rand() % 2) as usize]);
            let causal = rand() % 2 == 0;
            let shift = if causal { (bm - sq % bm) % bm } else { 0 };
            let hole = (rand() % 5) as u32;
            let visible = |_: u32, q: u32, kv: u32| (q / 3 + kv / 5 + hole) % 4 != 0;
            for transposed in [false, true] {
                let p = params(sq, sk, bm, bn, if transposed { 0 } else { shift }, causal, transposed);
                let lists = if transposed { p.key_blocks() } else { p.query_blocks() };
                let mut seen = vec![vec![false; sk as usize]; sq as usize];
                for l in 0..lists {
                    let states: Vec<BlockState> = (0..p.list_len()).map(|i| {
                        let (m, n) = p.block_of(l, i);
                        classify(&p, m, n, 1, visible)
                    }).collect();
                    let mut row = vec![0u32; 2 + states.len()];
                    list_of(&states, &mut row);
                    let (blocks, partial) = split_header(row[0]);
                    for (k, &i) in row[1..1 + blocks as usize].iter().enumerate() {
                        let (m, n) = p.block_of(l, i);
                        let (rows, keys, _) = p.extent(m, n);
                        for q in rows[0]..rows[1] {
                            for kv in keys[0]..keys[1] {
                                let v = p.in_call(q, kv) && visible(0, q, kv);
                                assert!(k < partial as usize || v, "full block ({m}, {n}) hides ({q}, {kv})");
                                seen[q as usize][kv as usize] |= v;
                            }
                        }
                    }
                }
                for q in 0..sq {
                    for kv in 0..sk {
                        let v = p.in_call(q, kv) && visible(0, q, kv);
                        assert_eq!(seen[q as usize][kv as usize], v, "pair ({q}, {kv}) sq {sq} sk {sk} bm {bm} bn {bn} causal {causal}");
                    }
                }
            }
        }
    }
}
