//! Shapes of the FlashAttention-3 backward kernels, shared by kernel and host.
//!
//! A call is three launches:
//! 1. **preprocess**: per query row, `D = rowsum(dO ∘ O)` and the LSE in the log2 domain
//!    (`lse · log2 e`, `+inf` for rows past `seqlen_q`, so that they give `P = 0`), into
//!    padded f32 workspaces; the fp32 dQ accumulator and the semaphores zeroed;
//! 2. **main**: one CTA per (key block of [`block_n`] keys, K/V head, batch). K and V are
//!    loaded once; the CTA loops over the query heads of its K/V head (GQA: their dK and
//!    dV sum in registers, no atomics) and over the query blocks that see its keys,
//!    recomputing `Sᵀ = K Qᵀ`, `dPᵀ = V dOᵀ`, `Pᵀ`, `dSᵀ`, accumulating `dV += Pᵀ dO`
//!    and `dK += dSᵀ Q` in registers, and adding `dQ += dS K` to the fp32 accumulator;
//! 3. **postprocess**: dQ = accumulator × softmax scale, to the output type.
//!
//! Two consumer warpgroups each own 64 of the block's keys (FA3's "swapAB": the score
//! accumulator's rows are keys, so `Pᵀ` and `dSᵀ` are already the register A operands
//! of the dV and dK products); a producer warpgroup issues the TMA loads. At hdim 256 a
//! warpgroup's dK and dV of 64 keys would take 256 registers a thread, so there the two
//! warpgroups share the block's 64 keys ([`splits_head_dim`]): each computes `Sᵀ` and
//! `dPᵀ` for half of the step's queries and dK, dV and dQ for half of the head dimension,
//! `Pᵀ` and `dSᵀ` passing through shared memory.
use crate::window::{Documents, KeyRanges};
use crate::{DType, KernelEntry, Strides};

/// Keys per CTA: two consumer warpgroups of 64 (at hdim 256 both on the same 64 keys,
/// [`splits_head_dim`]).
pub const fn block_n(hdim: u32) -> u32 {
    if splits_head_dim(hdim) { 64 } else { 128 }
}

/// Whether the consumer warpgroups split the head dimension of dK, dV and dQ (and the
/// step's queries of `Sᵀ` and `dPᵀ`) rather than the keys: at hdim 256, where 64 keys'
/// dK and dV take 256 registers a thread.
pub const fn splits_head_dim(hdim: u32) -> bool {
    hdim == 256
}
/// Slots of `dSᵀ` (and `Pᵀ`) in shared memory. Two where the warpgroups split the keys,
/// one per Q stage: a warpgroup writes the step's `dSᵀ` while the previous step's dQ
/// product may still read the other slot, so no barrier waits for that product (the
/// step's `DsReady` barrier, which the warpgroups reach after their previous step's
/// products are done, already orders the slot's reuse two steps later). One where they
/// split the head dimension: no room for a second beside the stages.
pub const fn ds_stages(hdim: u32) -> u32 {
    if splits_head_dim(hdim) { 1 } else { STAGES }
}

/// Consumer (MMA) warpgroups.
pub const MMA_WGS: u32 = 2;
/// Threads per main-kernel CTA: a producer warpgroup and the consumers.
pub const THREADS: u32 = 128 * (MMA_WGS + 1);
/// Depth of the Q (+LSE) and dO (+D) rings.
pub const STAGES: u32 = 2;
/// Threads per CTA of the preprocess and postprocess kernels.
pub const AUX_THREADS: u32 = 256;
/// Query rows of a preprocess and postprocess row block (8 a warp in the preprocess).
pub const PREPROCESS_ROWS: u32 = 64;
/// Rows of a preprocess row block per warp.
pub const PREPROCESS_WARP_ROWS: u32 = PREPROCESS_ROWS / (AUX_THREADS / 32);

/// The sinks' partial gradients of one (batch, query head): one f32 per preprocess warp
/// of each row block of `padded_rows` rows (`BwdParams::sink_partials` holds them
/// `[batch, heads_q, row block, warp]`).
pub const fn sink_partials_per_head(padded_rows: u32) -> u32 {
    padded_rows.div_ceil(PREPROCESS_ROWS) * (AUX_THREADS / 32)
}

/// How a preprocess warp reads its rows of O and dO: 16 bytes (8 elements) a lane, so a
/// row takes `lanes` lanes (8, 16, 32 at hdim 64, 128, 256) and one warp-wide load
/// `32 / lanes` rows; warp `w`'s rows of a block are `w · 8 ..+ 8`, in `passes` loads a
/// lane. A row's lanes are an aligned group of `lanes` (its D is summed by xor shuffles
/// inside the group), and the group's first lane leads the row (its LSE, D and stores).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreprocessLanes {
    /// Lanes a row.
    pub lanes: u32,
    /// Loads of O (and of dO) a lane for the warp's rows.
    pub passes: u32,
}

impl PreprocessLanes {
    #[inline(always)]
    pub const fn new(hdim: u32) -> Self {
        let lanes = hdim / 8;
        PreprocessLanes { lanes, passes: PREPROCESS_WARP_ROWS * lanes / 32 }
    }

    /// The row (within the block) that lane `lane` of warp `warp` loads at pass `pass`.
    #[inline(always)]
    pub const fn row(self, warp: u32, lane: u32, pass: u32) -> u32 {
        warp * PREPROCESS_WARP_ROWS + pass * (32 / self.lanes) + lane / self.lanes
    }

    /// The first of the 8 columns lane `lane` loads.
    #[inline(always)]
    pub const fn col(self, lane: u32) -> u32 {
        8 * (lane % self.lanes)
    }

    /// Whether lane `lane` leads its row.
    #[inline(always)]
    pub const fn leads(self, lane: u32) -> bool {
        lane % self.lanes == 0
    }
}

/// Queries of a step (of `block_m` rows) whose `Sᵀ` and `dPᵀ` a consumer warpgroup
/// computes: all, or half where the warpgroups split the head dimension.
pub const fn wg_queries(hdim: u32, block_m: u32) -> u32 {
    if splits_head_dim(hdim) { block_m / 2 } else { block_m }
}

/// Columns of the head dimension of a consumer warpgroup's dK and dV: all, or half where
/// the warpgroups split it.
pub const fn wg_grad_cols(hdim: u32) -> u32 {
    if splits_head_dim(hdim) { hdim / 2 } else { hdim }
}

/// Columns of a consumer warpgroup's dQ product per step (of `block_m` rows), over all
/// the block's keys: half the head dimension, or all of it where the warpgroups split
/// the rows ([`splits_dq_rows`]). (At hdim 64 each warpgroup once took every column over
/// its own 64 keys: the two pieces then added to the same floats, twice the L2
/// reduction bytes per FLOP of hdim 128, and those reductions bounded the kernel.)
pub const fn wg_dq_cols(hdim: u32, block_m: u32) -> u32 {
    if splits_dq_rows(block_m) { hdim } else { hdim / 2 }
}

/// Whether the consumer warpgroups split a step's dQ by rows (64 query rows each, every
/// column) rather than by columns: where a step has 128 query rows.
pub const fn splits_dq_rows(block_m: u32) -> bool {
    block_m == 128
}

/// Head dimensions with a backward kernel.
pub const HEAD_DIMS: [u32; 3] = [64, 128, 256];

/// Query rows per step of the main kernel: 128 for hdim 64's wide kernels ([`wide_steps`]),
/// else 64. At hdim 128 and 256 dK and dV of a warpgroup's keys take 128 registers a
/// thread; at hdim 64 with 128 rows `Sᵀ` and `dPᵀ` take 64 each, which fits the plain
/// kernels (half the per-step fixed work per FLOP: +8-12%, deterministic +15-24%), while
/// the score modifications' and masks' extra registers spilled 16-80 bytes.
pub const fn block_m(hdim: u32, wide: bool) -> u32 {
    if hdim == 64 && wide { 128 } else { 64 }
}

/// Whether the built-in backward kernel of this head dimension, score modification and
/// mask runs 128-row steps ([`block_m`]): hdim 64 without a score modification or with
/// ALiBi, causal or not, with a sliding window too (soft-capping, user variants'
/// kernels, `ScoreModKind::User`, and documents run 64-row steps: with documents the
/// consumers spilled 4 bytes). The kernels' traits and the host's plan both read it.
pub const fn wide_steps(hdim: u32, score_mod: crate::ScoreModKind, mask: crate::MaskKind) -> bool {
    hdim == 64 && matches!(score_mod, crate::ScoreModKind::None | crate::ScoreModKind::Alibi) && matches!(mask, crate::MaskKind::Causal | crate::MaskKind::Local)
}

/// Query rows per step of a backward main-kernel entry.
pub const fn entry_block_m(k: &KernelEntry) -> u32 {
    block_m(k.hdim, wide_steps(k.hdim, k.score_mod, k.mask))
}

/// The key blocks `[first, end)` of a sliding window's call whose query range neither
/// end of the sequence clips: each sees as many query blocks as any (the window's
/// plateau); those before and after see fewer. `[0, key_blocks)` where there is no
/// plateau. (Approximate at the edges is harmless: it only orders the CTAs.)
pub fn full_key_blocks(window: crate::window::KeyWindow, seqlen_q: u32, seqlen_k: u32, block_n: u32) -> [u32; 2] {
    let key_blocks = seqlen_k.div_ceil(block_n);
    let (bn, off) = (block_n as i64, seqlen_k as i64 - seqlen_q as i64);
    // Key block n's queries run from n·bn − off − right to n·bn + bn − 1 − off + left.
    let first = ((off + window.right as i64).max(0) + bn - 1) / bn;
    let top = seqlen_q as i64 - bn + off - window.left as i64;
    let end = if top < 0 { 0 } else { top / bn + 1 }.min(key_blocks as i64);
    if end <= first { [0, key_blocks] } else { [first as u32, end as u32] }
}

/// Whether the backward main kernel of head dim `hdim` in this mode, with a sliding
/// window and no documents (`window_only`), launches its CTAs in [`cta_block`]'s order
/// (the host and the kernels both read it): at hdim 128 outside the deterministic mode
/// (whose dQ order is the grid's): +1.6-1.8% at 8k-16k with a 4096-key causal window.
/// Not at hdim 64 (-3% at 8k, level at 16k: its 128-row steps make twice as many waves
/// of shorter CTAs, so less tail to fill, while every head's tail read at once costs L2
/// hits) nor 256 (-2% at 8k, level at 16k).
pub const fn reorders_ctas(hdim: u32, deterministic: bool, window_only: bool) -> bool {
    hdim == 128 && !deterministic && window_only
}

/// The (key block before [`DqOrder::key_block`], K/V head, batch) of the CTA at grid
/// position `(x, y, z)` of a grid `(key_blocks, heads_k, batch)` in a local kernel: the
/// CTAs launch in the grid's linear order, and the first ones take the key blocks
/// `full` ([`full_key_blocks`]) head by head; then come the others, every head's key
/// block `full[1]`, then `full[1] + 1`, ..., then `full[0] - 1` down to 0 (by and large
/// the shorter the later), so that the short CTAs fill the last wave instead of
/// leaving one head's run of full ones to end it alone (the window backward's tail).
/// With `full` every key block, the grid's own order.
pub const fn cta_block(x: u32, y: u32, z: u32, key_blocks: u32, heads_k: u32, batch: u32, full: [u32; 2]) -> (u32, u32, u32) {
    let launch = x + key_blocks * (y + heads_k * z);
    let [first, end] = full;
    // Every divisor is at least 1 already (the host gives `end > first`); `max` says so
    // to the compiler, so that the kernels have no division-by-zero panic path.
    const fn at_least_1(x: u32) -> u32 {
        if x == 0 { 1 } else { x }
    }
    let (wide, heads_k, heads) = (at_least_1(end - first), at_least_1(heads_k), at_least_1(heads_k * batch));
    if launch < wide * heads {
        let rest = launch / wide;
        return (first + launch % wide, rest % heads_k, rest / heads_k);
    }
    let later = launch - wide * heads;
    let (k, r) = (later / heads, later % heads);
    let n = if k < key_blocks - end { end + k } else { first - 1 - (k - (key_blocks - end)) };
    (n, r % heads_k, r / heads_k)
}

/// The query blocks of the dQ accumulator and of the deterministic counters: 64 rows
/// (a 128-row step covers two; every kernel of a head dimension shares the workspace
/// layout and the preprocess).
pub const ACCUM_ROWS: u32 = 64;

/// Rows of the LSE, D and dQ workspaces per (batch, head): `seqlen_q` rounded up to a
/// whole query block of the widest kernel of the head dimension, so the main kernel's
/// loads never leave them.
pub const fn padded_rows(seqlen_q: u32, hdim: u32) -> u32 {
    seqlen_q.div_ceil(block_m(hdim, true)) * block_m(hdim, true)
}

/// The first query block (of `block_m` rows) that sees key block `n` (of `block_n` keys)
/// under a bottom-right causal mask (query `i` sees key `j` iff `j <= i + seqlen_k -
/// seqlen_q`); `blocks` (the number of query blocks) when none does. Without a mask, 0.
pub const fn first_query_block(causal: bool, n: u32, block_m: u32, block_n: u32, seqlen_q: u32, seqlen_k: u32) -> u32 {
    let blocks = seqlen_q.div_ceil(block_m);
    if !causal {
        return 0;
    }
    // The first row that sees key n * block_n: i >= n * block_n - (seqlen_k - seqlen_q).
    let first_row = (n * block_n) as i64 - seqlen_k as i64 + seqlen_q as i64;
    if first_row <= 0 {
        0
    } else if first_row >= seqlen_q as i64 {
        blocks
    } else {
        first_row as u32 / block_m
    }
}

/// Whether the step of query block `m` over key block `n` needs the causal mask: some
/// (query, key) pair of the two blocks is hidden. Its first row must see its last key.
pub const fn step_needs_mask(causal: bool, m: u32, n: u32, block_m: u32, block_n: u32, seqlen_q: u32, seqlen_k: u32) -> bool {
    causal && ((m * block_m) as i64 + seqlen_k as i64 - seqlen_q as i64) < ((n + 1) * block_n) as i64 - 1
}

/// How the main kernel orders the CTAs' dQ additions to a query block.
///
/// The deterministic mode fixes, for every query block, the order in which the key
/// blocks' CTAs add to its dQ, and a CTA waits for its turn. The order follows the order
/// in which the CTAs reach the block, so that a CTA's predecessor got there earlier and
/// the wait is short; and a CTA only ever waits for CTAs that are resident or launched
/// before it, so that the grid cannot deadlock.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DqOrder {
    /// Whatever order the CTAs come in (the default, non-deterministic mode).
    Unordered = 0,
    /// Without a mask: the CTA of key block `n` starts at query block `n` and goes round
    /// (`n, n + 1, ..., blocks - 1, 0, ..., n - 1`), so at any step no two CTAs add to the
    /// same block and each one reaches a block one step after its predecessor. A CTA
    /// waits for CTAs launched after it, so this order needs every key block of a
    /// (head, batch) resident at once: at most one key block per SM, and at least as
    /// many query blocks as key blocks (else two CTAs would reach a block together).
    Rotated = 1,
    /// From the last key block down, CTAs launched in that order (the last key block
    /// first). Under a causal mask a key block's first query block is later the higher
    /// the key block, so CTAs reach a block in this order, two steps apart at equal
    /// lengths. Without a mask (where [`DqOrder::Rotated`] does not apply) every CTA
    /// reaches a block at the same step and they take turns.
    Descending = 2,
}

impl DqOrder {
    /// The order of a call (`causal`: any mask that narrows the query blocks a key block
    /// sees, a window's too, which rules out [`DqOrder::Rotated`]).
    pub const fn choose(deterministic: bool, causal: bool, query_blocks: u32, key_blocks: u32, sm_count: u32) -> DqOrder {
        if !deterministic {
            DqOrder::Unordered
        } else if !causal && query_blocks >= key_blocks && key_blocks <= sm_count {
            DqOrder::Rotated
        } else {
            DqOrder::Descending
        }
    }

    /// The key block of the CTA with `blockIdx.x = x` (CTAs launch in `x` order).
    #[inline(always)]
    pub const fn key_block(self, x: u32, key_blocks: u32) -> u32 {
        match self {
            DqOrder::Descending => key_blocks - 1 - x,
            _ => x,
        }
    }

    /// The query block of the `i`-th step (of `end - first`) over one query head of the
    /// CTA of key block `n`, which sees query blocks `first..end` (`end` is every query
    /// block for [`DqOrder::Rotated`]).
    #[inline(always)]
    pub const fn query_block(self, i: u32, n: u32, first: u32, end: u32) -> u32 {
        match self {
            // first = 0 and n < key_blocks <= blocks: one subtraction wraps it.
            DqOrder::Rotated => {
                let m = i + n;
                if m >= end { m - end } else { m }
            }
            _ => first + i,
        }
    }

    /// How many CTAs add to query block `m`'s dQ before the CTA of key block `n` does
    /// (deterministic orders only). `ranges`: the local kernels' key ranges (window and
    /// documents), whose query blocks see a range of key blocks that ends where theirs does.
    #[inline(always)]
    pub fn turn<D: Documents>(self, n: u32, m: u32, causal: bool, block_m: u32, block_n: u32, seqlen_q: u32, seqlen_k: u32, ranges: Option<&KeyRanges<D>>) -> u32 {
        let key_blocks = seqlen_k.div_ceil(block_n);
        match self {
            // Arrival order at m: min(m, key_blocks - 1), then down, going round.
            DqOrder::Rotated => {
                let t = if m < key_blocks { m } else { key_blocks - 1 } + key_blocks - n;
                if t >= key_blocks { t - key_blocks } else { t }
            }
            _ => {
                let end = match ranges {
                    Some(r) => r.key_blocks_end((m * block_m) as i32, block_m, block_n),
                    None => key_blocks_seeing(causal, m, block_m, block_n, seqlen_q, seqlen_k),
                };
                end - 1 - n
            }
        }
    }
}

/// The steps of the main kernel's CTA of key block `n`, in order: for each query head of
/// its K/V head (`h` of `kv_group`), the query blocks that see its keys (`first..end`), in
/// the [`DqOrder`]'s order. The producer, the consumers and the dQ writer walk it alike.
#[derive(Clone, Copy)]
pub struct CtaSteps {
    order: DqOrder,
    n: u32,
    first: u32,
    end: u32,
    kv_group: u32,
}

impl CtaSteps {
    /// `ranges`: the key ranges of a local kernel ([`crate::MaskKind::Local`]: `p`'s
    /// window and documents), `None` for the others.
    #[inline(always)]
    pub fn new<D: Documents>(p: &BwdParams, n: u32, block_m: u32, block_n: u32, ranges: Option<&KeyRanges<D>>) -> Self {
        let (first, end) = match ranges {
            Some(r) => r.query_blocks(n, block_n, block_m),
            None => (first_query_block(p.causal != 0, n, block_m, block_n, p.seqlen_q, p.seqlen_k), p.query_blocks(block_m)),
        };
        CtaSteps { order: p.dq_order_of(ranges.is_some()), n, first, end, kv_group: p.kv_group }
    }

    /// The steps of a block-sparse CTA of key block `n`: entries `0..blocks` of its list
    /// (the kernel maps each to its query block), for each query head of the group.
    #[inline(always)]
    pub const fn listed(n: u32, blocks: u32, kv_group: u32) -> Self {
        CtaSteps { order: DqOrder::Unordered, n, first: 0, end: blocks, kv_group }
    }

    /// The steps from query block `first` on (a user variant's bound on the keys each
    /// row sees: the blocks before it see none of this CTA's keys).
    #[inline(always)]
    pub fn from_block(self, first: u32) -> Self {
        CtaSteps { first: if first > self.first { first } else { self.first }, ..self }
    }

    /// No query block sees the CTA's keys (its dK and dV are zero).
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.first >= self.end
    }

    /// Calls `f(m)` for every step, the query block alone: the same walk as
    /// [`CtaSteps::for_each`] as one cycle through `first..end` (each head's order
    /// continues where the previous one ended), which keeps one counter fewer live (the
    /// consumers, whose registers are all taken, need no head index).
    /// `f(step, m)`: the step's index too, from which [`CtaSteps::head_of`] derives its head.
    #[inline(always)]
    pub fn for_each_query_block(&self, mut f: impl FnMut(u32, u32)) {
        if self.is_empty() {
            return;
        }
        let mut m = self.order.query_block(0, self.n, self.first, self.end);
        for step in 0..self.kv_group * (self.end - self.first) {
            f(step, m);
            m += 1;
            if m == self.end {
                m = self.first;
            }
        }
    }

    /// The query head (`h` of `kv_group`) of step `step` of the walk.
    #[inline(always)]
    pub fn head_of(&self, step: u32) -> u32 {
        step / (self.end - self.first)
    }

    /// Calls `f(h, m)` for every step.
    #[inline(always)]
    pub fn for_each(&self, mut f: impl FnMut(u32, u32)) {
        if self.is_empty() {
            return;
        }
        for h in 0..self.kv_group {
            for i in 0..self.end - self.first {
                f(h, self.order.query_block(i, self.n, self.first, self.end));
            }
        }
    }
}

/// How many key blocks (of `block_n` keys, from key 0) query block `m` sees: all of them
/// without a mask; under a bottom-right causal mask those up to its last row's last key.
pub const fn key_blocks_seeing(causal: bool, m: u32, block_m: u32, block_n: u32, seqlen_q: u32, seqlen_k: u32) -> u32 {
    let key_blocks = seqlen_k.div_ceil(block_n);
    if !causal {
        return key_blocks;
    }
    // i32: sequence lengths are below 2^31 (the host's limit), and the dQ writer that
    // derives a turn per step runs on 24 registers.
    let last_row = if (m + 1) * block_m < seqlen_q { (m + 1) * block_m } else { seqlen_q } as i32 - 1;
    let last_key = last_row + (seqlen_k as i32 - seqlen_q as i32);
    if last_key < 0 {
        0
    } else {
        let n = last_key as u32 / block_n + 1;
        if n < key_blocks { n } else { key_blocks }
    }
}

/// The tensor maps of the main kernel's descriptor block, in order.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BwdTensorMap {
    Q = 0,
    K = 1,
    V = 2,
    DOut = 3,
}

impl crate::fa3::DescriptorSlot for BwdTensorMap {
    #[inline(always)]
    fn offset(self) -> u32 {
        self as u32 * crate::fa3::TMA_DESCRIPTOR_BYTES
    }
}

/// Columns of a piece of the dQ accumulator: 32 at hdim 64 (a warpgroup's columns of a
/// 64-row step), else 64.
pub const fn dq_piece_cols(hdim: u32) -> u32 {
    if hdim == 64 { 32 } else { 64 }
}

/// Floats of one piece of the dQ accumulator (64 query rows by [`dq_piece_cols`]): a
/// warpgroup's dQ product of a step is one or more consecutive pieces.
pub const fn dq_piece(hdim: u32) -> u32 {
    64 * dq_piece_cols(hdim)
}

/// Where element (`row`, `col`) of a query block's dQ (64 rows by `hdim`) lives in the
/// fp32 accumulator, relative to the block's first float: the block is pieces of
/// [`dq_piece_cols`] columns, and inside a piece the floats are in the order the
/// consumer threads hold them (thread (warp w, lane l), n-tile j: `[c0, c1, c2, c3]` of
/// rows `16 w + l / 4` and `+ 8`, columns `8 j + 2 (l % 4)` and `+ 1`), so that each
/// thread stages its fragments with 16-byte stores ([`dq_stage_index`]) and a
/// warpgroup's columns leave shared memory as one contiguous bulk reduction.
pub const fn dq_accum_index(hdim: u32, row: u32, col: u32) -> u32 {
    // A 128-row block is two 64-row blocks in a row.
    let (block, row) = (row / 64, row % 64);
    let cols = dq_piece_cols(hdim);
    let (piece, c) = (col / cols, col % cols);
    let (warp, half, g) = (row / 16, (row % 16) / 8, row % 8);
    let (j, t, e) = (c / 8, (c % 8) / 2, c % 2);
    block * 64 * hdim + dq_stage_index(hdim, warp, g * 4 + t, piece * (cols / 8) + j) + half * 2 + e
}

/// The first of the four floats of n-tile `j` (8 columns, from a warpgroup's first
/// column) of thread (`warp`, `lane`) in a warpgroup's staged dQ, relative to its
/// first piece: [`dq_accum_index`]'s order.
pub const fn dq_stage_index(hdim: u32, warp: u32, lane: u32, j: u32) -> u32 {
    let tiles = dq_piece_cols(hdim) / 8;
    (j / tiles) * dq_piece(hdim) + ((warp * tiles + j % tiles) * 32 + lane) * 4
}

/// The parameters of the three backward launches (one by-value kernel argument).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BwdParams {
    /// Inputs: device addresses of q, k, v, the forward's output o, and dO.
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub dout: u64,
    /// The forward's LSE, `[batch, heads_q, seqlen_q]` f32, contiguous.
    pub lse: u64,
    /// Outputs (the input dtype, strided like the inputs).
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    /// Workspaces, f32 `[batch, heads_q, padded_rows]`: the LSE times log2 e, and D.
    pub lse_log2: u64,
    pub dpsum: u64,
    /// f32 `[batch, heads_q, padded_rows, hdim]`: dQ before the softmax scale, each query
    /// block's `64 x hdim` floats in [`dq_accum_index`] order.
    pub dq_accum: u64,
    /// u32 `[batch, heads_q, query blocks]`: in deterministic mode, how many consumer
    /// warpgroups have added to a query block's dQ (two per CTA, in [`DqOrder`]); 0
    /// otherwise.
    pub dq_semaphore: u64,
    /// A [`DqOrder`]: which key block each CTA takes, the order of its query blocks and
    /// its turn at each.
    pub dq_order: u32,
    pub q_strides: Strides,
    pub k_strides: Strides,
    pub v_strides: Strides,
    pub o_strides: Strides,
    pub dout_strides: Strides,
    pub dq_strides: Strides,
    pub dk_strides: Strides,
    pub dv_strides: Strides,
    pub batch: u32,
    pub heads_q: u32,
    pub heads_k: u32,
    /// `heads_q / heads_k`.
    pub kv_group: u32,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    /// [`padded_rows`] of this call.
    pub padded_rows: u32,
    pub hdim: u32,
    /// `softmax_scale * log2(e)` (`c · log2 e` for the soft-capping kernels, as
    /// `FwdParams::softcap_scale` explains).
    pub scale_log2: f32,
    pub softmax_scale: f32,
    /// Non-zero: causal (bottom-right).
    pub causal: u32,
    /// Soft-capping kernels: `softmax_scale / c` (as `FwdParams::softcap_scale`; here
    /// `softmax_scale` stays the call's scale, by which dQ and dK are multiplied).
    pub softcap_scale: f32,
    /// ALiBi kernels: as `FwdParams::alibi_slopes` and the fields after it.
    pub alibi_slopes: u64,
    pub alibi_batch_stride: u32,
    pub alibi_inv_scale: f32,
    /// Local kernels: the window, as `FwdParams::window`.
    pub window: crate::window::KeyWindow,
    /// Local kernels: the documents, as `FwdParams::docs`.
    pub docs: crate::window::DocumentBounds,
    /// Attention sinks: f32 logits `[heads_q]` (as `FwdParams::sinks`; the forward's LSE
    /// includes them, so the main kernel needs nothing), their gradient `dsinks`
    /// (`[heads_q]`, written by the postprocess) and its partial sums
    /// `sink_partials` (f32, [`sink_partials_per_head`] per (batch, query head), one per
    /// preprocess warp). 0: no sinks.
    pub sinks: u64,
    pub dsinks: u64,
    pub sink_partials: u64,
    /// User-defined variants (`ScoreModKind::User`): the buffer their functions read.
    pub variant: crate::variant::VariantArgs,
    /// Block-sparse kernels (`MaskKind::Sparse`): each key block's query blocks.
    pub block_mask: crate::sparse::BlockMaskArgs,
    /// Local kernels: the key blocks launched first, as [`cta_block`] orders them
    /// (`[0, key blocks)`: the grid's own order).
    pub full_key_blocks: [u32; 2],
}

impl BwdParams {
    /// The causal offset `seqlen_k - seqlen_q`, or `None` without a mask.
    #[inline(always)]
    pub fn causal_offset(&self) -> Option<i32> {
        if self.causal != 0 { Some(self.seqlen_k as i32 - self.seqlen_q as i32) } else { None }
    }

    /// The key ranges of the local kernels (window and documents) of one batch.
    #[inline(always)]
    pub fn key_ranges<D: Documents>(&self, docs: D) -> KeyRanges<D> {
        KeyRanges { window: self.window, seqlen_q: self.seqlen_q, seqlen_k: self.seqlen_k, docs }
    }

    /// The call's [`DqOrder`].
    #[inline(always)]
    pub fn dq_order(&self) -> DqOrder {
        match self.dq_order {
            1 => DqOrder::Rotated,
            2 => DqOrder::Descending,
            _ => DqOrder::Unordered,
        }
    }

    /// The call's [`DqOrder`] in a kernel with (`local`) or without a sliding window:
    /// the host never gives a window the rotated order, and saying so at compile time
    /// keeps its code out of the 24-register dQ writer.
    #[inline(always)]
    pub fn dq_order_of(&self, local: bool) -> DqOrder {
        match self.dq_order {
            1 if !local => DqOrder::Rotated,
            0 => DqOrder::Unordered,
            _ => DqOrder::Descending,
        }
    }

    /// Key blocks of `block_n` keys.
    #[inline(always)]
    pub fn key_blocks(&self, block_n: u32) -> u32 {
        self.seqlen_k.div_ceil(block_n)
    }

    /// Query blocks of `block_m` rows.
    #[inline(always)]
    pub fn query_blocks(&self, block_m: u32) -> u32 {
        self.seqlen_q.div_ceil(block_m)
    }
}

/// Which kernel of the backward a [`KernelEntry`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BwdStage {
    Preprocess,
    /// The main kernel, dQ summed in whatever order the CTAs come.
    Main,
    /// The main kernel of the deterministic mode (dQ summed in key-block order).
    MainDeterministic,
    Postprocess,
}

impl BwdStage {
    /// One of the two main kernels.
    pub const fn is_main(self) -> bool {
        matches!(self, BwdStage::Main | BwdStage::MainDeterministic)
    }
}

/// The backward kernel table, written once: `callback! { NAME => DTYPE, hdim D, STAGE, SCORE_MOD, MASK; ... }`
/// builds both [`KERNELS`] (the host's list) and the kernel crate's entry points.
#[macro_export]
macro_rules! bwd_kernel_table {
    ($callback:ident) => {
        $callback! {
            bwd_preprocess_hdim64_f16 => F16, hdim 64, Preprocess, None, Causal;
            bwd_preprocess_hdim128_f16 => F16, hdim 128, Preprocess, None, Causal;
            bwd_preprocess_hdim64_bf16 => BF16, hdim 64, Preprocess, None, Causal;
            bwd_preprocess_hdim128_bf16 => BF16, hdim 128, Preprocess, None, Causal;
            bwd_hdim64_f16 => F16, hdim 64, Main, None, Causal;
            bwd_hdim128_f16 => F16, hdim 128, Main, None, Causal;
            bwd_hdim64_bf16 => BF16, hdim 64, Main, None, Causal;
            bwd_hdim128_bf16 => BF16, hdim 128, Main, None, Causal;
            bwd_hdim64_f16_deterministic => F16, hdim 64, MainDeterministic, None, Causal;
            bwd_hdim128_f16_deterministic => F16, hdim 128, MainDeterministic, None, Causal;
            bwd_hdim64_bf16_deterministic => BF16, hdim 64, MainDeterministic, None, Causal;
            bwd_hdim128_bf16_deterministic => BF16, hdim 128, MainDeterministic, None, Causal;
            bwd_postprocess_hdim64_f16 => F16, hdim 64, Postprocess, None, Causal;
            bwd_postprocess_hdim128_f16 => F16, hdim 128, Postprocess, None, Causal;
            bwd_postprocess_hdim64_bf16 => BF16, hdim 64, Postprocess, None, Causal;
            bwd_postprocess_hdim128_bf16 => BF16, hdim 128, Postprocess, None, Causal;
            bwd_preprocess_hdim256_f16 => F16, hdim 256, Preprocess, None, Causal;
            bwd_preprocess_hdim256_bf16 => BF16, hdim 256, Preprocess, None, Causal;
            bwd_hdim256_f16 => F16, hdim 256, Main, None, Causal;
            bwd_hdim256_bf16 => BF16, hdim 256, Main, None, Causal;
            bwd_hdim256_f16_deterministic => F16, hdim 256, MainDeterministic, None, Causal;
            bwd_hdim256_bf16_deterministic => BF16, hdim 256, MainDeterministic, None, Causal;
            bwd_postprocess_hdim256_f16 => F16, hdim 256, Postprocess, None, Causal;
            bwd_postprocess_hdim256_bf16 => BF16, hdim 256, Postprocess, None, Causal;
            bwd_hdim64_f16_softcap => F16, hdim 64, Main, Softcap, Causal;
            bwd_hdim64_f16_deterministic_softcap => F16, hdim 64, MainDeterministic, Softcap, Causal;
            bwd_hdim64_bf16_softcap => BF16, hdim 64, Main, Softcap, Causal;
            bwd_hdim64_bf16_deterministic_softcap => BF16, hdim 64, MainDeterministic, Softcap, Causal;
            bwd_hdim128_f16_softcap => F16, hdim 128, Main, Softcap, Causal;
            bwd_hdim128_f16_deterministic_softcap => F16, hdim 128, MainDeterministic, Softcap, Causal;
            bwd_hdim128_bf16_softcap => BF16, hdim 128, Main, Softcap, Causal;
            bwd_hdim128_bf16_deterministic_softcap => BF16, hdim 128, MainDeterministic, Softcap, Causal;
            bwd_hdim64_f16_alibi => F16, hdim 64, Main, Alibi, Causal;
            bwd_hdim64_f16_deterministic_alibi => F16, hdim 64, MainDeterministic, Alibi, Causal;
            bwd_hdim64_bf16_alibi => BF16, hdim 64, Main, Alibi, Causal;
            bwd_hdim64_bf16_deterministic_alibi => BF16, hdim 64, MainDeterministic, Alibi, Causal;
            bwd_hdim128_f16_alibi => F16, hdim 128, Main, Alibi, Causal;
            bwd_hdim128_f16_deterministic_alibi => F16, hdim 128, MainDeterministic, Alibi, Causal;
            bwd_hdim128_bf16_alibi => BF16, hdim 128, Main, Alibi, Causal;
            bwd_hdim128_bf16_deterministic_alibi => BF16, hdim 128, MainDeterministic, Alibi, Causal;
            bwd_hdim64_f16_local => F16, hdim 64, Main, None, Local;
            bwd_hdim128_f16_local => F16, hdim 128, Main, None, Local;
            bwd_hdim64_bf16_local => BF16, hdim 64, Main, None, Local;
            bwd_hdim128_bf16_local => BF16, hdim 128, Main, None, Local;
            bwd_hdim64_f16_deterministic_local => F16, hdim 64, MainDeterministic, None, Local;
            bwd_hdim128_f16_deterministic_local => F16, hdim 128, MainDeterministic, None, Local;
            bwd_hdim64_bf16_deterministic_local => BF16, hdim 64, MainDeterministic, None, Local;
            bwd_hdim128_bf16_deterministic_local => BF16, hdim 128, MainDeterministic, None, Local;
            bwd_hdim64_f16_softcap_local => F16, hdim 64, Main, Softcap, Local;
            bwd_hdim64_f16_deterministic_softcap_local => F16, hdim 64, MainDeterministic, Softcap, Local;
            bwd_hdim64_bf16_softcap_local => BF16, hdim 64, Main, Softcap, Local;
            bwd_hdim64_bf16_deterministic_softcap_local => BF16, hdim 64, MainDeterministic, Softcap, Local;
            bwd_hdim128_f16_softcap_local => F16, hdim 128, Main, Softcap, Local;
            bwd_hdim128_f16_deterministic_softcap_local => F16, hdim 128, MainDeterministic, Softcap, Local;
            bwd_hdim128_bf16_softcap_local => BF16, hdim 128, Main, Softcap, Local;
            bwd_hdim128_bf16_deterministic_softcap_local => BF16, hdim 128, MainDeterministic, Softcap, Local;
            bwd_hdim64_f16_alibi_local => F16, hdim 64, Main, Alibi, Local;
            bwd_hdim64_f16_deterministic_alibi_local => F16, hdim 64, MainDeterministic, Alibi, Local;
            bwd_hdim64_bf16_alibi_local => BF16, hdim 64, Main, Alibi, Local;
            bwd_hdim64_bf16_deterministic_alibi_local => BF16, hdim 64, MainDeterministic, Alibi, Local;
            bwd_hdim128_f16_alibi_local => F16, hdim 128, Main, Alibi, Local;
            bwd_hdim128_f16_deterministic_alibi_local => F16, hdim 128, MainDeterministic, Alibi, Local;
            bwd_hdim128_bf16_alibi_local => BF16, hdim 128, Main, Alibi, Local;
            bwd_hdim128_bf16_deterministic_alibi_local => BF16, hdim 128, MainDeterministic, Alibi, Local;
            bwd_hdim64_f16_softcap_alibi => F16, hdim 64, Main, SoftcapAlibi, Causal;
            bwd_hdim64_f16_deterministic_softcap_alibi => F16, hdim 64, MainDeterministic, SoftcapAlibi, Causal;
            bwd_hdim64_bf16_softcap_alibi => BF16, hdim 64, Main, SoftcapAlibi, Causal;
            bwd_hdim64_bf16_deterministic_softcap_alibi => BF16, hdim 64, MainDeterministic, SoftcapAlibi, Causal;
            bwd_hdim128_f16_softcap_alibi => F16, hdim 128, Main, SoftcapAlibi, Causal;
            bwd_hdim128_f16_deterministic_softcap_alibi => F16, hdim 128, MainDeterministic, SoftcapAlibi, Causal;
            bwd_hdim128_bf16_softcap_alibi => BF16, hdim 128, Main, SoftcapAlibi, Causal;
            bwd_hdim128_bf16_deterministic_softcap_alibi => BF16, hdim 128, MainDeterministic, SoftcapAlibi, Causal;
            bwd_hdim64_f16_softcap_alibi_local => F16, hdim 64, Main, SoftcapAlibi, Local;
            bwd_hdim64_f16_deterministic_softcap_alibi_local => F16, hdim 64, MainDeterministic, SoftcapAlibi, Local;
            bwd_hdim64_bf16_softcap_alibi_local => BF16, hdim 64, Main, SoftcapAlibi, Local;
            bwd_hdim64_bf16_deterministic_softcap_alibi_local => BF16, hdim 64, MainDeterministic, SoftcapAlibi, Local;
            bwd_hdim128_f16_softcap_alibi_local => F16, hdim 128, Main, SoftcapAlibi, Local;
            bwd_hdim128_f16_deterministic_softcap_alibi_local => F16, hdim 128, MainDeterministic, SoftcapAlibi, Local;
            bwd_hdim128_bf16_softcap_alibi_local => BF16, hdim 128, Main, SoftcapAlibi, Local;
            bwd_hdim128_bf16_deterministic_softcap_alibi_local => BF16, hdim 128, MainDeterministic, SoftcapAlibi, Local;
            bwd_hdim64_f16_document => F16, hdim 64, Main, None, Document;
            bwd_hdim128_f16_document => F16, hdim 128, Main, None, Document;
            bwd_hdim64_bf16_document => BF16, hdim 64, Main, None, Document;
            bwd_hdim128_bf16_document => BF16, hdim 128, Main, None, Document;
            bwd_hdim64_f16_deterministic_document => F16, hdim 64, MainDeterministic, None, Document;
            bwd_hdim128_f16_deterministic_document => F16, hdim 128, MainDeterministic, None, Document;
            bwd_hdim64_bf16_deterministic_document => BF16, hdim 64, MainDeterministic, None, Document;
            bwd_hdim128_bf16_deterministic_document => BF16, hdim 128, MainDeterministic, None, Document;
            bwd_hdim64_f16_softcap_document => F16, hdim 64, Main, Softcap, Document;
            bwd_hdim64_bf16_softcap_document => BF16, hdim 64, Main, Softcap, Document;
            bwd_hdim64_f16_deterministic_softcap_document => F16, hdim 64, MainDeterministic, Softcap, Document;
            bwd_hdim64_bf16_deterministic_softcap_document => BF16, hdim 64, MainDeterministic, Softcap, Document;
            bwd_hdim128_f16_softcap_document => F16, hdim 128, Main, Softcap, Document;
            bwd_hdim128_f16_deterministic_softcap_document => F16, hdim 128, MainDeterministic, Softcap, Document;
            bwd_hdim64_f16_alibi_document => F16, hdim 64, Main, Alibi, Document;
            bwd_hdim64_f16_deterministic_alibi_document => F16, hdim 64, MainDeterministic, Alibi, Document;
            bwd_hdim128_f16_alibi_document => F16, hdim 128, Main, Alibi, Document;
            bwd_hdim64_f16_softcap_alibi_document => F16, hdim 64, Main, SoftcapAlibi, Document;
            bwd_hdim64_f16_deterministic_softcap_alibi_document => F16, hdim 64, MainDeterministic, SoftcapAlibi, Document;
            bwd_hdim128_bf16_softcap_document => BF16, hdim 128, Main, Softcap, Document;
            bwd_hdim128_bf16_deterministic_softcap_document => BF16, hdim 128, MainDeterministic, Softcap, Document;
            bwd_hdim64_bf16_alibi_document => BF16, hdim 64, Main, Alibi, Document;
            bwd_hdim64_bf16_deterministic_alibi_document => BF16, hdim 64, MainDeterministic, Alibi, Document;
            bwd_hdim128_bf16_alibi_document => BF16, hdim 128, Main, Alibi, Document;
            bwd_hdim64_bf16_softcap_alibi_document => BF16, hdim 64, Main, SoftcapAlibi, Document;
            bwd_hdim64_bf16_deterministic_softcap_alibi_document => BF16, hdim 64, MainDeterministic, SoftcapAlibi, Document;
            bwd_hdim256_f16_softcap => F16, hdim 256, Main, Softcap, Causal;
            bwd_hdim256_f16_deterministic_softcap => F16, hdim 256, MainDeterministic, Softcap, Causal;
            bwd_hdim256_bf16_softcap => BF16, hdim 256, Main, Softcap, Causal;
            bwd_hdim256_bf16_deterministic_softcap => BF16, hdim 256, MainDeterministic, Softcap, Causal;
            bwd_hdim256_f16_alibi => F16, hdim 256, Main, Alibi, Causal;
            bwd_hdim256_f16_deterministic_alibi => F16, hdim 256, MainDeterministic, Alibi, Causal;
            bwd_hdim256_bf16_alibi => BF16, hdim 256, Main, Alibi, Causal;
            bwd_hdim256_bf16_deterministic_alibi => BF16, hdim 256, MainDeterministic, Alibi, Causal;
            bwd_hdim256_f16_local => F16, hdim 256, Main, None, Local;
            bwd_hdim256_bf16_local => BF16, hdim 256, Main, None, Local;
            bwd_hdim256_f16_deterministic_local => F16, hdim 256, MainDeterministic, None, Local;
            bwd_hdim256_bf16_deterministic_local => BF16, hdim 256, MainDeterministic, None, Local;
            bwd_hdim256_f16_softcap_local => F16, hdim 256, Main, Softcap, Local;
            bwd_hdim256_f16_deterministic_softcap_local => F16, hdim 256, MainDeterministic, Softcap, Local;
            bwd_hdim256_bf16_softcap_local => BF16, hdim 256, Main, Softcap, Local;
            bwd_hdim256_bf16_deterministic_softcap_local => BF16, hdim 256, MainDeterministic, Softcap, Local;
            bwd_hdim256_f16_alibi_local => F16, hdim 256, Main, Alibi, Local;
            bwd_hdim256_f16_deterministic_alibi_local => F16, hdim 256, MainDeterministic, Alibi, Local;
            bwd_hdim256_bf16_alibi_local => BF16, hdim 256, Main, Alibi, Local;
            bwd_hdim256_bf16_deterministic_alibi_local => BF16, hdim 256, MainDeterministic, Alibi, Local;
            bwd_hdim256_f16_softcap_alibi => F16, hdim 256, Main, SoftcapAlibi, Causal;
            bwd_hdim256_f16_deterministic_softcap_alibi => F16, hdim 256, MainDeterministic, SoftcapAlibi, Causal;
            bwd_hdim256_bf16_softcap_alibi => BF16, hdim 256, Main, SoftcapAlibi, Causal;
            bwd_hdim256_bf16_deterministic_softcap_alibi => BF16, hdim 256, MainDeterministic, SoftcapAlibi, Causal;
            bwd_hdim256_f16_softcap_alibi_local => F16, hdim 256, Main, SoftcapAlibi, Local;
            bwd_hdim256_f16_deterministic_softcap_alibi_local => F16, hdim 256, MainDeterministic, SoftcapAlibi, Local;
            bwd_hdim256_bf16_softcap_alibi_local => BF16, hdim 256, Main, SoftcapAlibi, Local;
            bwd_hdim256_bf16_deterministic_softcap_alibi_local => BF16, hdim 256, MainDeterministic, SoftcapAlibi, Local;
            bwd_hdim256_f16_document => F16, hdim 256, Main, None, Document;
            bwd_hdim256_bf16_document => BF16, hdim 256, Main, None, Document;
            bwd_hdim256_f16_deterministic_document => F16, hdim 256, MainDeterministic, None, Document;
            bwd_hdim256_bf16_deterministic_document => BF16, hdim 256, MainDeterministic, None, Document;
            bwd_hdim256_f16_softcap_document => F16, hdim 256, Main, Softcap, Document;
            bwd_hdim256_bf16_softcap_document => BF16, hdim 256, Main, Softcap, Document;
            bwd_hdim256_f16_deterministic_softcap_document => F16, hdim 256, MainDeterministic, Softcap, Document;
            bwd_hdim256_bf16_deterministic_softcap_document => BF16, hdim 256, MainDeterministic, Softcap, Document;
            bwd_hdim128_f16_deterministic_alibi_document => F16, hdim 128, MainDeterministic, Alibi, Document;
            bwd_hdim128_f16_softcap_alibi_document => F16, hdim 128, Main, SoftcapAlibi, Document;
            bwd_hdim256_f16_alibi_document => F16, hdim 256, Main, Alibi, Document;
            bwd_hdim256_f16_softcap_alibi_document => F16, hdim 256, Main, SoftcapAlibi, Document;
            bwd_hdim128_f16_deterministic_softcap_alibi_document => F16, hdim 128, MainDeterministic, SoftcapAlibi, Document;
            bwd_hdim256_f16_deterministic_alibi_document => F16, hdim 256, MainDeterministic, Alibi, Document;
            bwd_hdim256_f16_deterministic_softcap_alibi_document => F16, hdim 256, MainDeterministic, SoftcapAlibi, Document;
            bwd_hdim128_bf16_deterministic_alibi_document => BF16, hdim 128, MainDeterministic, Alibi, Document;
            bwd_hdim128_bf16_softcap_alibi_document => BF16, hdim 128, Main, SoftcapAlibi, Document;
            bwd_hdim256_bf16_alibi_document => BF16, hdim 256, Main, Alibi, Document;
            bwd_hdim256_bf16_softcap_alibi_document => BF16, hdim 256, Main, SoftcapAlibi, Document;
            bwd_hdim128_bf16_deterministic_softcap_alibi_document => BF16, hdim 128, MainDeterministic, SoftcapAlibi, Document;
            bwd_hdim256_bf16_deterministic_alibi_document => BF16, hdim 256, MainDeterministic, Alibi, Document;
            bwd_hdim256_bf16_deterministic_softcap_alibi_document => BF16, hdim 256, MainDeterministic, SoftcapAlibi, Document;
        }
    };
}

macro_rules! bwd_entries {
    ($($name:ident => $dtype:ident, hdim $hdim:literal, $stage:ident, $score_mod:ident, $mask:ident;)*) => {
        &[$(KernelEntry {
            name: stringify!($name),
            algo: crate::Algo::Fa3(crate::fa3::Techniques::FULL),
            kind: crate::KernelKind::Backward(BwdStage::$stage),
            hdim: $hdim,
            dtype: DType::$dtype,
            tma_param_bytes: if BwdStage::$stage.is_main() { crate::fa3::TMA_PARAM_BYTES } else { 0 },
            launch_bounds: if BwdStage::$stage.is_main() { THREADS } else { 0 },
            cluster: 1,
            consumer_wgs: if BwdStage::$stage.is_main() { MMA_WGS } else { 0 },
            block_n: if BwdStage::$stage.is_main() { block_n($hdim) } else { 0 },
            score_mod: crate::ScoreModKind::$score_mod,
            mask: crate::MaskKind::$mask,
        },)*]
    };
}

/// The backward kernels ([`bwd_kernel_table`]).
pub const KERNELS: &[KernelEntry] = bwd_kernel_table!(bwd_entries);

/// The backward main kernels of a user-defined variant's module (`crate::variant`).
pub const VARIANT_KERNELS: &[KernelEntry] = crate::variant_bwd_kernel_table!(bwd_entries);

/// Looks up a backward kernel (the preprocess and postprocess serve every score
/// modification).
pub fn find(stage: BwdStage, hdim: u32, dtype: DType, score_mod: crate::ScoreModKind, mask: crate::MaskKind) -> Option<&'static KernelEntry> {
    let (score_mod, mask) = if stage.is_main() { (score_mod, mask) } else { (crate::ScoreModKind::None, crate::MaskKind::Causal) };
    KERNELS.iter().find(|k| {
        k.kind == crate::KernelKind::Backward(stage) && k.hdim == hdim && k.dtype == dtype && k.score_mod == score_mod && k.mask == mask
    })
}

/// The dynamic shared memory of the main kernel, from its (1024 B aligned) base:
///
/// ```text
/// | K | V | Q stage 0, 1 | dO stage 0, 1 | dSᵀ | Pᵀ | LSE stage 0, 1 | D stage 0, 1 | dQ pieces | barriers |
/// ```
/// `Pᵀ` only where the warpgroups split the head dimension ([`splits_head_dim`]); the dQ
/// pieces only where they do not (split, each warpgroup stages its dQ in the step's Q or
/// dO slot once the step's products are done).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmemLayout {
    /// K and V of the CTA's key block (`block_n × hdim` each), one slot each.
    pub k: crate::fa3::SmemRing,
    pub v: crate::fa3::SmemRing,
    /// Q and dO of a query block (`block_m × hdim`), [`STAGES`] slots each; the Q ring's
    /// stage also carries that block's LSE (log2), the dO ring's its D.
    pub q: crate::fa3::SmemRing,
    pub dout: crate::fa3::SmemRing,
    /// `dSᵀ` of a step (`block_n` rows of `block_m` elements, 128 B swizzled), in
    /// [`ds_stages`] slots: the A operand of `dQ = dS K`, written by both consumer
    /// warpgroups.
    pub ds: crate::fa3::SmemBuffer,
    /// `Pᵀ` of the current step, laid out as `dSᵀ`: the A operand of `dV += Pᵀ dO` where
    /// the warpgroups split the head dimension (empty elsewhere: `Pᵀ` stays in registers).
    pub p: crate::fa3::SmemBuffer,
    /// `block_m` f32 per stage.
    pub lse: crate::fa3::SmemBuffer,
    pub dpsum: crate::fa3::SmemBuffer,
    /// Each consumer warpgroup's dQ product (64 rows by [`wg_dq_cols`] f32), staged for the dQ writer
    /// warp's bulk reduction into the accumulator: one slot per consumer warpgroup, with
    /// its full (staged) and empty (read) barriers. Where the head dimension is split
    /// the slots are empty (dQ is staged in the Q and dO slots) and full barrier `s`
    /// counts both warpgroups' dQ of Q stage `s`.
    pub dq: crate::fa3::SmemRing,
    /// Bytes to request at launch (with [`crate::fa3::SMEM_ALIGN`] of slack).
    pub total: u32,
}

impl SmemLayout {
    pub const fn new(hdim: u32, bm: u32) -> Self {
        use crate::fa3::{SMEM_ALIGN, SmemBuffer, SmemRing};
        let (bn, split) = (block_n(hdim), splits_head_dim(hdim));
        let kv_bytes = bn * hdim * 2;
        let q_bytes = bm * hdim * 2;
        let k = SmemRing { data: 0, stage_bytes: kv_bytes, stages: 1, barriers: 0 };
        let v = SmemRing { data: kv_bytes, ..k };
        let q = SmemRing { data: 2 * kv_bytes, stage_bytes: q_bytes, stages: STAGES, barriers: 0 };
        let dout = SmemRing { data: q.slot(STAGES), ..q };
        let ds = SmemBuffer { offset: dout.slot(STAGES), bytes: ds_stages(hdim) * bn * bm * 2 };
        let p = SmemBuffer { offset: ds.offset + ds.bytes, bytes: if split { bn * bm * 2 } else { 0 } };
        let vec_bytes = bm * 4;
        let lse = SmemBuffer { offset: p.offset + p.bytes, bytes: STAGES * vec_bytes };
        let dpsum = SmemBuffer { offset: lse.offset + lse.bytes, bytes: STAGES * vec_bytes };
        let dq = SmemRing { data: dpsum.offset + dpsum.bytes, stage_bytes: if split { 0 } else { 64 * wg_dq_cols(hdim, bm) * 4 }, stages: MMA_WGS, barriers: 0 };
        let barriers = dq.slot(MMA_WGS);
        let k = SmemRing { barriers, ..k };
        let v = SmemRing { barriers: k.barriers + k.barrier_bytes(), ..v };
        let q = SmemRing { barriers: v.barriers + v.barrier_bytes(), ..q };
        let dout = SmemRing { barriers: q.barriers + q.barrier_bytes(), ..dout };
        let dq = SmemRing { barriers: dout.barriers + dout.barrier_bytes(), ..dq };
        let end = dq.barriers + dq.barrier_bytes();
        SmemLayout { k, v, q, dout, ds, p, lse, dpsum, dq, total: end + SMEM_ALIGN }
    }

    /// Bytes of one stage's f32 vector (LSE or D) of `block_m` rows.
    pub const fn vector_bytes(block_m: u32) -> u32 {
        block_m * 4
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::fa3::MAX_SMEM;
    use crate::window::KeyWindow;
    use std::format;

    #[test]
    fn preprocess_lanes_cover_each_row_block_element_once_with_one_leader_a_row() {
        for hdim in HEAD_DIMS {
            let l = PreprocessLanes::new(hdim);
            let mut seen = std::vec![0u32; (PREPROCESS_ROWS * hdim / 8) as usize];
            let mut leaders = std::vec![0u32; PREPROCESS_ROWS as usize];
            for warp in 0..AUX_THREADS / 32 {
                for pass in 0..l.passes {
                    for lane in 0..32 {
                        let (row, col) = (l.row(warp, lane, pass), l.col(lane));
                        assert!(row < PREPROCESS_ROWS && col + 8 <= hdim && col % 8 == 0);
                        assert!((warp * PREPROCESS_WARP_ROWS..(warp + 1) * PREPROCESS_WARP_ROWS).contains(&row), "a warp keeps to its rows");
                        seen[(row * hdim / 8 + col / 8) as usize] += 1;
                        // The row's lanes: the aligned group of `lanes` holding this lane.
                        let group = lane / l.lanes * l.lanes;
                        assert!((group..group + l.lanes).all(|g| l.row(warp, g, pass) == row));
                        if l.leads(lane) {
                            assert_eq!(lane, group);
                            leaders[row as usize] += 1;
                        }
                    }
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "hdim {hdim}: every 16 bytes of the block once");
            assert!(leaders.iter().all(|&n| n == 1), "hdim {hdim}: one leader a row");
        }
    }

    /// Simulates the deterministic orders: every CTA of a (head, batch) steps through its
    /// query blocks, one per step. At each query block the turns of the CTAs that visit
    /// it are 0, 1, ... in the order they arrive; a CTA's predecessor arrives no later
    /// (strictly earlier for the rotated order, which has no ties), and under the
    /// descending order was launched earlier, so no CTA waits for one that cannot run.
    /// With and without a sliding window, and with documents (window unbounded or not).
    #[test]
    fn deterministic_dq_turns_follow_arrival_and_launch_order() {
        for hdim in HEAD_DIMS {
            for wide in [false, true] {
                deterministic_dq_turns_at(block_m(hdim, wide), block_n(hdim));
            }
        }
    }

    fn deterministic_dq_turns_at(bm: u32, bn: u32) {
        let windows = [None, Some((Some(0), Some(0))), Some((Some(100), Some(0))), Some((Some(1000), None)), Some((None, Some(300))), Some((Some(64), Some(64))), Some((None, None))];
        for causal in [false, true] {
            for (sq, sk) in [(1u32, 1u32), (64, 128), (700, 1000), (1000, 700), (8192, 8192), (4096, 8192), (8192, 1000), (200, 5000), (5000, 129)] {
                for (window, with_docs) in windows.into_iter().flat_map(|w| [(w, false), (w, true)]) {
                    // Documents of 1, 300, 5, 1000, 77, ... keys (rows must sit at key positions).
                    if with_docs && (window.is_none() || sq > sk) {
                        continue;
                    }
                    let mut bounds = std::vec::Vec::new();
                    for len in [1u32, 300, 5, 1000, 77].into_iter().cycle() {
                        let start = bounds.len() as u32;
                        if start >= sk {
                            break;
                        }
                        let end = (start + len).min(sk);
                        bounds.extend((start..end).map(|_| [start, end]));
                    }
                    let docs: &[[u32; 2]] = if with_docs { &bounds } else { &[] };
                    let window = window.map(|(l, r)| KeyWindow::new(l, r, causal, sq, sk));
                    let ranges = window.map(|w| KeyRanges { window: w, seqlen_q: sq, seqlen_k: sk, docs });
                    let (blocks, nb) = (sq.div_ceil(bm), sk.div_ceil(bn));
                    for sms in [132, 8] {
                        let order = DqOrder::choose(true, causal || window.is_some(), blocks, nb, sms);
                        assert!(order != DqOrder::Rotated || (!causal && window.is_none() && blocks >= nb && nb <= sms));
                        let p = BwdParams {
                            seqlen_q: sq,
                            seqlen_k: sk,
                            kv_group: 1,
                            causal: causal as u32,
                            dq_order: order as u32,
                            window: window.unwrap_or_default(),
                            ..Default::default()
                        };
                        // arrivals[m] = (turn, step, launch index x) of each CTA visiting m.
                        let mut arrivals = std::vec![std::vec::Vec::new(); blocks as usize];
                        for x in 0..nb {
                            let n = order.key_block(x, nb);
                            let mut i = 0;
                            CtaSteps::new(&p, n, bm, bn, ranges.as_ref()).for_each(|_, m| {
                                arrivals[m as usize].push((order.turn(n, m, causal, bm, bn, sq, sk, ranges.as_ref()), i, x));
                                i += 1;
                            });
                        }
                        for (m, a) in arrivals.iter_mut().enumerate() {
                            let ctx = format!("{order:?} block_n {bn} causal {causal} window {window:?} docs {with_docs} sq {sq} sk {sk} m {m}");
                            let seeing = match ranges {
                                Some(r) => {
                                    let (lo, hi) = r.key_blocks(m as i32 * bm as i32, bm, bn);
                                    hi.saturating_sub(lo)
                                }
                                None => key_blocks_seeing(causal, m as u32, bm, bn, sq, sk),
                            };
                            assert_eq!(a.len() as u32, seeing, "{ctx}");
                            a.sort();
                            for (t, w) in a.iter().enumerate() {
                                assert_eq!(w.0, t as u32, "{ctx}: turns must be 0, 1, ...");
                            }
                            for w in a.windows(2) {
                                let (prev, next) = (w[0], w[1]);
                                assert!(prev.1 <= next.1, "{ctx}: turn {} arrives at step {} after its successor's {}", prev.0, prev.1, next.1);
                                match order {
                                    DqOrder::Rotated => assert!(prev.1 < next.1, "{ctx}: two CTAs arrive together"),
                                    _ => assert!(prev.2 < next.2, "{ctx}: waits for a CTA launched later"),
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The consumers' one-cycle walk visits the same query blocks in the same order as
    /// the producer's and the writer's per-head walk.
    #[test]
    fn query_block_cycle_matches_the_per_head_walk() {
        for causal in [false, true] {
            for (sq, sk, group) in [(1u32, 1u32, 1u32), (700, 1000, 3), (1000, 700, 2), (4096, 8192, 1), (8192, 1000, 4)] {
                let (blocks, nb) = (sq.div_ceil(64), sk.div_ceil(block_n(128)));
                for deterministic in [false, true] {
                    let order = DqOrder::choose(deterministic, causal, blocks, nb, 132);
                    let p = BwdParams { seqlen_q: sq, seqlen_k: sk, kv_group: group, causal: causal as u32, dq_order: order as u32, ..Default::default() };
                    for n in 0..nb {
                        let steps = CtaSteps::new(&p, n, 64, block_n(128), None::<&KeyRanges<crate::window::NoDocuments>>);
                        let (mut a, mut b) = (std::vec::Vec::new(), std::vec::Vec::new());
                        steps.for_each(|h, m| a.push((h, m)));
                        steps.for_each_query_block(|step, m| b.push((steps.head_of(step), m)));
                        assert_eq!(a, b, "{order:?} sq {sq} sk {sk} group {group} n {n}");
                    }
                }
            }
        }
    }

    #[test]
    fn every_backward_layout_fits_and_its_tiles_are_swizzle_aligned() {
        for (hdim, bm) in HEAD_DIMS.into_iter().flat_map(|d| [(d, block_m(d, false)), (d, block_m(d, true))]) {
            let l = SmemLayout::new(hdim, bm);
            assert!(l.total <= MAX_SMEM, "hdim {hdim}: {} bytes", l.total);
            for (name, off) in [("k", l.k.data), ("v", l.v.data), ("q", l.q.data), ("q1", l.q.slot(1)), ("dout", l.dout.data), ("dout1", l.dout.slot(1)), ("ds", l.ds.offset), ("p", l.p.offset)] {
                assert_eq!(off % 1024, 0, "hdim {hdim}: {name} at {off}");
            }
            assert_eq!(l.lse.offset % 16, 0, "bulk copies need 16-byte alignment");
            assert_eq!(l.dq.data % 16, 0);
            assert_eq!(l.dpsum.offset % 16, 0);
            assert_eq!(l.k.barriers % 8, 0);
            // Nothing overlaps: the regions are in increasing order.
            assert_eq!(l.p.bytes != 0, splits_head_dim(hdim), "hdim {hdim}: Pᵀ in shared memory iff split");
            assert_eq!(l.dq.stage_bytes == 0, splits_head_dim(hdim), "hdim {hdim}: dQ staged iff not split");
            let ends = [l.k.slot(1), l.v.slot(1), l.q.slot(STAGES), l.dout.slot(STAGES), l.ds.offset + l.ds.bytes, l.p.offset + l.p.bytes, l.lse.offset + l.lse.bytes, l.dpsum.offset + l.dpsum.bytes, l.dq.slot(MMA_WGS), l.k.barriers];
            let starts = [l.k.data, l.v.data, l.q.data, l.dout.data, l.ds.offset, l.p.offset, l.lse.offset, l.dpsum.offset, l.dq.data, l.k.barriers];
            // The barriers: K, V, Q, dO, dQ rings in a row, inside the allocation.
            assert_eq!(l.dq.barriers + l.dq.barrier_bytes() + crate::fa3::SMEM_ALIGN, l.total);
            for i in 1..starts.len() {
                assert!(ends[i - 1] <= starts[i], "hdim {hdim}: region {i}");
            }
        }
    }

    /// Brute force: query block `m` sees some key of key block `n` iff `m >=
    /// first_query_block(n)`, and a step needs the mask iff some pair of it is hidden.
    #[test]
    fn first_query_block_and_mask_rule_match_the_visible_pairs() {
        for (sq, sk) in [(1, 1), (5, 9), (9, 5), (17, 40), (40, 17), (130, 130), (200, 70), (70, 200)] {
            for (bm, bn) in [(1, 1), (4, 8), (16, 16), (64, 128), (128, 128)] {
                let off = sk as i64 - sq as i64;
                let sees = |i: u32, j: u32| i < sq && j < sk && (j as i64) <= i as i64 + off;
                let blocks = sq.div_ceil(bm);
                for n in 0..sk.div_ceil(bn) {
                    let first = first_query_block(true, n, bm, bn, sq, sk);
                    for m in 0..blocks {
                        let any = (m * bm..(m + 1) * bm).any(|i| (n * bn..(n + 1) * bn).any(|j| sees(i, j)));
                        let ctx = format!("sq {sq} sk {sk} tile {bm}x{bn} m {m} n {n}");
                        assert_eq!(any, m >= first, "{ctx}: first {first}");
                        // Rows past seqlen_q and keys past seqlen_k do not count as hidden:
                        // their P is zero by the LSE padding and the zero-filled K/V.
                        let hidden = (m * bm..((m + 1) * bm).min(sq))
                            .any(|i| (n * bn..((n + 1) * bn).min(sk)).any(|j| !sees(i, j)));
                        if hidden {
                            assert!(step_needs_mask(true, m, n, bm, bn, sq, sk), "{ctx}: a hidden pair unmasked");
                        }
                    }
                    assert_eq!(first_query_block(false, n, bm, bn, sq, sk), 0);
                }
            }
        }
    }

    /// The accumulator order is a bijection of a query block's `64 x hdim` floats, and it
    /// is where each consumer thread's fragment elements go, four at a time.
    #[test]
    fn dq_accum_index_is_a_bijection_in_fragment_order() {
        for (hdim, rows) in HEAD_DIMS.into_iter().flat_map(|d| [(d, block_m(d, false)), (d, block_m(d, true))]) {
            let mut seen = std::vec![false; (rows * hdim) as usize];
            for row in 0..rows {
                for col in 0..hdim {
                    let i = dq_accum_index(hdim, row, col) as usize;
                    assert!(!seen[i], "hdim {hdim}: ({row}, {col}) collides");
                    seen[i] = true;
                }
            }
            assert!(seen.iter().all(|&s| s));
            // Thread (warp w, lane l), n-tile j of a warpgroup's part (from `row0`,
            // `col0`): elements c0..c3 at 4 consecutive floats from `dq_stage_index(w, l,
            // j)` past the part's first float.
            for wg in 0..MMA_WGS {
                let (row0, col0) = if splits_dq_rows(rows) { (64 * wg, 0) } else { (0, wg * wg_dq_cols(hdim, rows)) };
                for (w, l, j) in [(0, 0, 0), (3, 31, 3), (1, 6, 2), (2, 17, 1), (3, 9, 0)] {
                    let (row, col) = (row0 + 16 * w + l / 4, col0 + 8 * j + 2 * (l % 4));
                    let base = row0 * hdim + col0 / dq_piece_cols(hdim) * dq_piece(hdim) + dq_stage_index(hdim, w, l, j);
                    assert_eq!(
                        [dq_accum_index(hdim, row, col), dq_accum_index(hdim, row, col + 1), dq_accum_index(hdim, row + 8, col), dq_accum_index(hdim, row + 8, col + 1)],
                        [base, base + 1, base + 2, base + 3]
                    );
                }
            }
        }
        // Pieces of 32 columns at hdim 64, else 64; 16-byte groups in (warp, n-tile,
        // lane) order; rows 64..128 follow rows 0..64.
        assert_eq!([dq_accum_index(64, 8, 1), dq_accum_index(64, 0, 32), dq_accum_index(64, 0, 8), dq_accum_index(64, 16, 0), dq_accum_index(64, 64, 0)], [3, 2048, 128, 512, 4096]);
        assert_eq!([dq_accum_index(128, 0, 32), dq_accum_index(128, 0, 64), dq_accum_index(128, 16, 0)], [512, 4096, 1024]);
        assert_eq!(dq_accum_index(128, 55, 126), 8188);
    }

    #[test]
    fn cta_block_takes_every_block_once_and_the_full_ones_first() {
        let mut seed = 7u64;
        let mut next = |n: u32| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as u32 % n
        };
        for _ in 0..200 {
            let (key_blocks, heads_k, batch) = (1 + next(40), 1 + next(5), 1 + next(3));
            let first = next(key_blocks);
            let end = first + 1 + next(key_blocks - first);
            for full in [[first, end], [0, key_blocks]] {
                let mut seen = std::vec![false; (key_blocks * heads_k * batch) as usize];
                let mut launch = 0;
                for z in 0..batch {
                    for y in 0..heads_k {
                        for x in 0..key_blocks {
                            let (n, h, b) = cta_block(x, y, z, key_blocks, heads_k, batch, full);
                            assert!(n < key_blocks && h < heads_k && b < batch);
                            let i = (n + key_blocks * (h + heads_k * b)) as usize;
                            assert!(!seen[i], "{n} {h} {b} twice");
                            seen[i] = true;
                            let early = launch < (full[1] - full[0]) * heads_k * batch;
                            assert_eq!(early, (full[0]..full[1]).contains(&n), "launch {launch}: key block {n}, full {full:?}");
                            if full == [0, key_blocks] {
                                assert_eq!((n, h, b), (x, y, z));
                            }
                            launch += 1;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn full_key_blocks_are_those_the_sequence_edges_do_not_clip() {
        use crate::window::KeyWindow;
        for (sq, sk) in [(16384, 16384), (1000, 1000), (700, 1000), (1000, 700), (129, 5000)] {
            for (left, right) in [(4096, 0), (100, 30), (0, 0), (127, 200), (5000, 5000), (16384, 0)] {
                let window = KeyWindow { left, right };
                let bn = 128;
                let key_blocks = (sk as u32).div_ceil(bn);
                let unclipped: std::vec::Vec<u32> = (0..key_blocks)
                    .filter(|&n| {
                        let off = sk - sq;
                        let (lo, hi) = ((n * bn) as i32 - off - right, (n * bn + bn - 1) as i32 - off + left);
                        lo >= 0 && hi <= sq - 1
                    })
                    .collect();
                let [first, end] = full_key_blocks(window, sq as u32, sk as u32, bn);
                if unclipped.is_empty() {
                    assert_eq!([first, end], [0, key_blocks], "{sq} {sk} {left} {right}");
                } else {
                    assert_eq!(unclipped, (first..end).collect::<std::vec::Vec<_>>(), "{sq} {sk} {left} {right}");
                }
            }
        }
    }

    #[test]
    fn the_table_has_every_stage_for_every_head_dim_and_dtype() {
        for &hdim in &HEAD_DIMS {
            for dtype in DType::ALL {
                for stage in [BwdStage::Preprocess, BwdStage::Main, BwdStage::MainDeterministic, BwdStage::Postprocess] {
                    assert!(find(stage, hdim, dtype, crate::ScoreModKind::None, crate::MaskKind::Causal).is_some(), "{stage:?} hdim {hdim} {dtype:?}");
                }
            }
        }
    }
}
