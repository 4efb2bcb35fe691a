//! Block-sparse masks on the GPU (`common::sparse`): the lists' reader, which the forward
//! and backward kernels of `MaskKind::Sparse` walk instead of a range of blocks, and the
//! kernel that builds the lists from a variant's mask mod.
use crate::ptx::{barrier, global, math, sreg};
use common::sparse::{BUILD_THREADS, BlockLists, BlockState, BuildParams, END, header, split_header};
use common::variant::{Coords, Variant};

/// One list of a block mask in device memory (written by an earlier launch, read-only
/// during the attention kernels), as its row index: the address is derived at each read
/// from the lists' parameters, which sit in the constant bank, so that a walk holds one
/// register (the producers run on 24).
#[derive(Clone, Copy)]
pub struct BlockList {
    row: u32,
}

impl BlockList {
    /// No list (the kernels that walk ranges of blocks).
    pub const NONE: BlockList = BlockList { row: 0 };

    /// The list of block `block` of `head` in `batch`.
    #[inline(always)]
    pub fn of(lists: &BlockLists, batch: u32, head: u32, block: u32) -> Self {
        BlockList { row: lists.row_index(batch, head, block) }
    }

    /// `(blocks, partial)`: how many blocks the list holds, and how many of its leading
    /// ones need the mask.
    #[inline(always)]
    pub fn header(&self, lists: &BlockLists) -> (u32, u32) {
        split_header(self.header_word(lists))
    }

    /// The header word (`common::sparse::header`).
    #[inline(always)]
    pub fn header_word(&self, lists: &BlockLists) -> u32 {
        // SAFETY: the host checked that the lists cover every (batch, head, block) of the
        // call, and built them before the launch.
        unsafe { global::ld_nc_u32(lists.word(self.row, 0)) }
    }

    /// Entry `i` (<= blocks): a block index, or `common::sparse::END` past the last.
    #[inline(always)]
    pub fn block(&self, lists: &BlockLists, i: u32) -> u32 {
        // SAFETY: as above; `i` is at most the header's count, inside the row.
        unsafe { global::ld_nc_u32(lists.word(self.row, 1 + i)) }
    }

    /// A cursor at entry 0, for a walk up to `common::sparse::END` that holds one
    /// register (the forward's producer, on 24: a row and a step index spilled).
    #[inline(always)]
    pub fn cursor(&self, lists: &BlockLists) -> ListCursor {
        ListCursor { word: self.row * lists.row_words + 1 }
    }
}

/// A position in a list: the index of its word among all lists' (below 2^32: the host
/// checks the lists' size).
#[derive(Clone, Copy)]
pub struct ListCursor {
    word: u32,
}

impl ListCursor {
    /// The entry `back` entries before the cursor's (0: its own).
    #[inline(always)]
    pub fn block(&self, lists: &BlockLists, back: u32) -> u32 {
        // An opaque word: hoisted out of the walk, the 64-bit addresses held registers.
        let word = crate::ptx::compiler::opaque_u32(self.word - back);
        // SAFETY: inside the row (the walk stops at its end mark).
        unsafe { global::ld_nc_u32(lists.addr + 4 * word as u64) }
    }

    /// Moves to the next entry.
    #[inline(always)]
    pub fn advance(&mut self) {
        self.word += 1;
    }
}

/// The variant's buffer, as the attention kernels read it.
#[inline(always)]
fn data(p: &BuildParams) -> crate::fa3::variant::DeviceData {
    crate::fa3::variant::DeviceData::new(&p.variant)
}

/// The state of block `(m, n)` for the query heads of list head `head` in `batch`, by one
/// warp (`common::sparse::classify`'s rule): each lane takes every 32nd pair, and the
/// warp stops as soon as it has seen a visible and a hidden pair.
#[inline(always)]
fn classify_warp<V: Variant>(p: &BuildParams, m: u32, n: u32, head: u32, batch: u32, lane: u32) -> BlockState {
    let (rows, keys, past_end) = p.extent(m, n);
    let height = rows[1] - rows[0];
    // Non-zero by type: the divisions below have no panic path.
    let Some(width) = core::num::NonZeroU32::new(keys[1] - keys[0]) else {
        return BlockState::Empty;
    };
    if height == 0 {
        return BlockState::Empty;
    }
    let d = data(p);
    let pairs = height * width.get();
    let (mut any, mut all) = (false, !past_end);
    for h in 0..p.heads_per_list {
        let mut base = 0;
        while base < pairs {
            let i = base + lane;
            if i < pairs {
                let (q, kv) = (rows[0] + i / width, keys[0] + i % width);
                let at = Coords { batch, head: head * p.heads_per_list + h, q, kv, seqlen_q: p.seqlen_q, seqlen_k: p.seqlen_k };
                let v = p.in_call(q, kv) && V::visible(&d, at);
                any |= v;
                all &= v;
            }
            base += 32;
            // Warp-uniform: both answers are every lane's.
            if math::vote_any(any) && !math::vote_all(all) {
                return BlockState::Partial;
            }
        }
    }
    if !math::vote_any(any) {
        BlockState::Empty
    } else if math::vote_all(all) {
        BlockState::Full
    } else {
        BlockState::Partial
    }
}

/// The build kernel's body: one CTA per list (grid `(lists per head, list heads, list
/// batches)`, [`BUILD_THREADS`] threads). Its warps classify the list's blocks into the
/// scratch, then warp 0 gathers them into the row (`common::sparse::list_of`'s order:
/// the partial blocks from the highest down, then the full ones).
///
/// # Safety
/// The host sized the lists and the scratch for the grid, and the variant's buffer.
#[inline(always)]
pub unsafe fn build<V: Variant>(p: BuildParams) {
    // A variant without a mask mod (`visible` is always true) gets the lists of the causal
    // mask and the lengths: its full blocks then run the score alone.
    let (list, head, batch) = (sreg::block_idx_x(), sreg::block_idx_y(), sreg::block_idx_z());
    let tid = sreg::thread_idx_x();
    let (warp, lane) = (tid / 32, tid % 32);
    let len = p.list_len();
    let scratch = p.states + ((batch * p.list_heads + head) as u64 * sreg::grid_dim_x() as u64 + list as u64) * len as u64;
    let mut i = warp;
    while i < len {
        let (m, n) = p.block_of(list, i);
        let state = classify_warp::<V>(&p, m, n, head, batch, lane);
        if lane == 0 {
            // SAFETY: inside this list's `len` scratch bytes.
            unsafe { global::st_u8(scratch + i as u64, state as u8) };
        }
        i += BUILD_THREADS / 32;
    }
    // Orders the scratch's stores before warp 0's loads (CTA scope).
    barrier::sync_threads();
    if warp != 0 {
        return;
    }
    let row = p.lists.row(batch, head, list);
    let partial = gather(BlockState::Partial, scratch, len, row, 0, lane);
    let blocks = gather(BlockState::Full, scratch, len, row, partial, lane);
    if lane == 0 {
        // SAFETY: the row's first word, and the one after its last entry (the row has
        // `2 + len`).
        unsafe {
            global::st_u32(row, header(blocks, partial));
            global::st_u32(row + 4 * (1 + blocks as u64), END);
        }
    }
}

/// Appends the blocks of state `want` (of the `len` in `scratch`), from the highest down,
/// to the row at `row` from entry `at` on, by one warp; returns the entries then held.
#[inline(always)]
fn gather(want: BlockState, scratch: u64, len: u32, row: u64, mut at: u32, lane: u32) -> u32 {
    let below = (1u32 << lane) - 1;
    let mut c = 0;
    while c < len {
        let k = c + lane;
        let i = len.wrapping_sub(1 + k);
        // SAFETY: inside this list's scratch, stored before the barrier.
        let hit = k < len && BlockState::from_u8(unsafe { global::ld_u8(scratch + i as u64) }) == want;
        let hits = math::ballot(hit);
        if hit {
            let pos = at + (hits & below).count_ones();
            // SAFETY: `pos` < `len` < the row's words.
            unsafe { global::st_u32(row + 4 * (1 + pos as u64), i) };
        }
        at += hits.count_ones();
        c += 32;
    }
    at
}
