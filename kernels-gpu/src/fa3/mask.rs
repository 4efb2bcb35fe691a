//! The mask and score-modification hooks of the mainloop (FA3's `mask_fn` and
//! FlexAttention's `mask_mod` / `score_mod`, as types of the kernel traits).
//!
//! The mainloop visits a tile's key blocks from the last down, so the blocks that need
//! masking (those that cross the sequence end or a row's limit) come first: it runs them
//! in a masked loop and the rest in a loop with no mask code at all, split where
//! [`Mask::whole_blocks`] says. A sliding window ([`LocalMask`]) also cuts the first
//! blocks of the range, which come last: its kernels run one loop whose step branches
//! around the mask. A score modification runs on every block, before the
//! mask and the softmax; [`NoScoreMod`] compiles to nothing.
//!
//! Coordinates: a lane's scores are its two rows (`row_g` and `row_g + 8`) and, in n-tile
//! `j`, keys `col_2t + 8j` and `+1` (the tensor-core C layout, see `crate::softmax`).
use super::scheduler::Tile;
use super::traits::FragTile;
use crate::ptx::math::{abs, fma, vote_all};
use common::FwdParams;
use common::fa3::whole_key_blocks;
use common::window::{DocumentBounds, Documents, KeyRanges, NoDocuments};
use core::marker::PhantomData;

/// Where a local mask's documents come from: none ([`NoDocuments`], the window kernels,
/// which compile no document code) or device memory ([`DeviceDocs`], the document
/// kernels, `common::MaskKind::Document`).
pub trait DocSource: Documents {
    /// Whether there are documents to read.
    const DOCS: bool;
    /// The documents of batch `batch` of a call.
    fn of(docs: &DocumentBounds, batch: u32) -> Self;
}

impl DocSource for NoDocuments {
    const DOCS: bool = false;
    #[inline(always)]
    fn of(_: &DocumentBounds, _: u32) -> Self {
        NoDocuments
    }
}

/// The document bounds of one batch in device memory (`common::window::DocumentBounds`).
#[derive(Clone, Copy)]
pub struct DeviceDocs {
    addr: u64,
}

impl DocSource for DeviceDocs {
    const DOCS: bool = true;
    #[inline(always)]
    fn of(docs: &DocumentBounds, batch: u32) -> Self {
        // Derived where it is used (opaque batch): hoisted out of a mainloop, the address
        // held two registers that the soft-capping consumers lack.
        DeviceDocs { addr: docs.batch_addr(crate::ptx::compiler::opaque_u32(batch)) }
    }
}

impl Documents for DeviceDocs {
    #[inline(always)]
    fn doc(&self, pos: u32) -> Option<(i32, i32)> {
        // SAFETY: the host checked that the bounds (a non-null address) cover every key
        // position of every batch; only document kernels read them.
        let [start, end] = unsafe { crate::ptx::global::ld_nc_v2_u32(self.addr + 8 * pos as u64) };
        Some((start as i32, end as i32))
    }
}

/// The local kernels' key ranges of `batch`.
#[inline(always)]
fn ranges<D: DocSource>(p: &FwdParams, batch: u32) -> KeyRanges<D> {
    p.key_ranges(D::of(&p.docs, batch))
}

/// Which keys a query row may see, for this lane's two rows.
///
/// Block ranges are half-open `(first, end)` in key blocks of `block_n` keys.
pub trait Mask: Copy {
    /// Key ranges start past key 0, so that a tile's masked blocks may sit at both ends
    /// of its range (the mainloop then checks each step, `KernelTraits::SEPARATE_MASKED_LOOP`).
    const LOCAL: bool;

    /// Each tile's key blocks are those of its list in a block mask (`common::sparse`;
    /// [`super::scheduler::Tile::new`]), the partial ones first: the range methods below
    /// are not asked, and [`Mask::apply_with`] runs on the partial blocks.
    const SPARSE: bool = false;

    /// Rows also see only their document's keys (bounds loaded from device memory).
    const DOCS: bool = false;

    /// The mask of the rows `row_g` and `row_g + 8` of `tile`.
    fn new(p: &FwdParams, tile: &Tile, row_g: i32) -> Self;

    /// The key blocks a tile of `block_m` rows from `row0` of batch `batch` visits.
    fn tile_blocks(p: &FwdParams, batch: u32, row0: i32, block_m: u32, block_n: u32) -> (u32, u32);

    /// The key blocks some row of `[row0, row0 + rows)` sees (a warpgroup skips the rest
    /// of its tile's).
    fn visible_blocks(p: &FwdParams, batch: u32, row0: i32, rows: u32, block_n: u32) -> (u32, u32);

    /// The key blocks every row of `[row0, row0 + rows)` sees whole: those need no mask,
    /// the others of the tile run the masked loop. (Only `LOCAL` masks have a first
    /// block past 0.)
    fn whole_blocks(p: &FwdParams, batch: u32, row0: i32, rows: u32, block_n: u32) -> (u32, u32);

    /// Sets to `-inf` the scores of the keys this lane's rows (of batch `batch`) may not
    /// see (`p`: the call's parameters, for masks that derive their bounds where they run).
    fn apply_with<S: FragTile>(&self, p: &FwdParams, batch: u32, s: &mut S, col_2t: i32);
}

/// What is applied to the raw scores `S = Q K^T` (before the softmax scale) of a block.
pub trait ScoreMod: Copy {
    /// A bias that depends on the query and key positions (ALiBi).
    const BIAS: bool = false;

    /// The modification of query head `head` of batch `batch`.
    fn new(p: &FwdParams, batch: u32, head: u32) -> Self;

    /// Modifies this lane's scores in place (coordinates as for [`Mask::apply_with`]).
    /// May return a bias per row (this lane's rows g, g + 8) still to be added to each of
    /// the lane's scores of the row: the softmax adds it once per row (to the lane's block
    /// maximum before the quad's reduction, and to the `exp2` offset), so a hook that
    /// splits its change into a per-score part and a row constant saves an operation per
    /// score. Lanes may return different constants. `None` (the usual answer) adds
    /// nothing.
    /// (No parameter block here: passing it moved ALiBi's offset into the loop, -1.2% at
    /// hdim 128.)
    fn apply<S: FragTile>(&self, s: &mut S, row_g: i32, col_2t: i32) -> Option<[f32; 2]>;

    /// A bias whose column term the tensor cores add (`common::fa3::key_offsets`): on
    /// the blocks [`ScoreMod::key_offset_side`] names, QKᵀ gets one more k-step that adds
    /// `±key_offset_slope()` times each key's offset in its block, and `apply` adds only
    /// the rest. Must equal the kernel's `KernelConfig::key_offsets`.
    const KEY_OFFSETS: bool = false;

    /// [`ScoreMod::KEY_OFFSETS`]: the factor of a key's offset in its block.
    #[inline(always)]
    fn key_offset_slope(&self) -> f32 {
        0.0
    }

    /// [`ScoreMod::KEY_OFFSETS`]: whether the tensor cores add the column term on the
    /// block of lane column `col_2t` for this warp's rows (`Some(true)`: `+slope` times
    /// the offset, `Some(false)`: `-slope`), or `apply` adds the whole bias (`None`).
    /// Warp-uniform; the same answer before the GEMM and in `apply`.
    #[inline(always)]
    fn key_offset_side<S: FragTile>(&self, _row_g: i32, _col_2t: i32) -> Option<bool> {
        None
    }
}

/// The keys past `seqlen_k`, and when the call is causal (a run-time flag of the
/// parameters), the keys past a row's bottom-right diagonal: query `i` sees key `j` iff
/// `j <= i + seqlen_k - seqlen_q`. Kept as each row's first hidden key, so that the
/// masked loop holds two registers for it.
#[derive(Clone, Copy)]
pub struct CausalMask {
    pub(crate) limits: [i32; 2],
}

impl Mask for CausalMask {
    const LOCAL: bool = false;

    #[inline(always)]
    fn new(p: &FwdParams, _: &Tile, row_g: i32) -> Self {
        let seqlen_k = p.seqlen_k as i32;
        let limit = |row: i32| match p.causal_offset() {
            Some(off) => seqlen_k.min(row + off + 1),
            None => seqlen_k,
        };
        CausalMask { limits: [limit(row_g), limit(row_g + 8)] }
    }

    #[inline(always)]
    fn tile_blocks(p: &FwdParams, _: u32, row0: i32, block_m: u32, block_n: u32) -> (u32, u32) {
        (0, p.n_blocks(row0, block_m, block_n))
    }

    #[inline(always)]
    fn visible_blocks(p: &FwdParams, _: u32, row0: i32, rows: u32, block_n: u32) -> (u32, u32) {
        (0, p.visible_blocks(row0, rows, block_n))
    }

    /// From the first row alone: later rows see at least as much.
    #[inline(always)]
    fn whole_blocks(p: &FwdParams, _: u32, row0: i32, _rows: u32, block_n: u32) -> (u32, u32) {
        (0, whole_key_blocks(p.seqlen_k as i32, p.causal_offset(), row0, block_n))
    }

    #[inline(always)]
    fn apply_with<S: FragTile>(&self, _: &FwdParams, _: u32, s: &mut S, col_2t: i32) {
        s.mask_columns(col_2t, self.limits)
    }
}

/// Per-row key ranges (`common::window`): a sliding window, causal folded in by the
/// host (`common::MaskKind::Local`, `D` = [`NoDocuments`]), and packed documents
/// (`common::MaskKind::Document`, `D` = [`DeviceDocs`]). Row `i` sees keys
/// `[first_key(i), end_key(i))`. Kept as the first row alone, the bounds derived where
/// the mask runs (documents: one 8-byte load per row, from L1): the consumers of the
/// 256-dim and soft-capping kernels have no four registers to hold them.
#[derive(Clone, Copy)]
pub struct LocalMask<D = NoDocuments> {
    row_g: i32,
    docs: PhantomData<D>,
}

impl<D: DocSource> Mask for LocalMask<D> {
    const LOCAL: bool = true;
    const DOCS: bool = D::DOCS;

    #[inline(always)]
    fn new(_: &FwdParams, _: &Tile, row_g: i32) -> Self {
        LocalMask { row_g, docs: PhantomData }
    }

    #[inline(always)]
    fn tile_blocks(p: &FwdParams, batch: u32, row0: i32, block_m: u32, block_n: u32) -> (u32, u32) {
        Self::visible_blocks(p, batch, row0, block_m, block_n)
    }

    #[inline(always)]
    fn visible_blocks(p: &FwdParams, batch: u32, row0: i32, rows: u32, block_n: u32) -> (u32, u32) {
        ranges::<D>(p, batch).key_blocks(row0, rows, block_n)
    }

    #[inline(always)]
    fn whole_blocks(p: &FwdParams, batch: u32, row0: i32, rows: u32, block_n: u32) -> (u32, u32) {
        ranges::<D>(p, batch).whole_blocks(row0, rows, block_n)
    }

    #[inline(always)]
    fn apply_with<S: FragTile>(&self, p: &FwdParams, batch: u32, s: &mut S, col_2t: i32) {
        let r = ranges::<D>(p, batch);
        // With documents the bounds are derived in each masked step (opaque row): hoisted
        // out of the mainloop, the loaded bounds would pin four registers through it.
        let row_g = if !D::DOCS { self.row_g } else { crate::ptx::compiler::opaque_u32(self.row_g as u32) as i32 };
        let rows = [row_g, row_g + 8];
        s.mask_columns_outside(col_2t, rows.map(|row| r.first_key(row)), rows.map(|row| r.end_key(row)))
    }
}

/// No score modification.
#[derive(Clone, Copy)]
pub struct NoScoreMod;

impl ScoreMod for NoScoreMod {
    #[inline(always)]
    fn new(_: &FwdParams, _: u32, _: u32) -> Self {
        NoScoreMod
    }

    #[inline(always)]
    fn apply<S: FragTile>(&self, _: &mut S, _: i32, _: i32) -> Option<[f32; 2]> {
        None
    }
}

/// Soft-capping (`common::ScoreModKind::Softcap`): logits `c · tanh(S · scale / c)`. The
/// score becomes `tanh(S · scale / c)` and the host folds `c` into the softmax's scale
/// (`FwdParams::softcap_scale`), which saves a multiply and a register per element.
#[derive(Clone, Copy)]
pub struct Softcap {
    scale: f32,
}

impl ScoreMod for Softcap {
    #[inline(always)]
    fn new(p: &FwdParams, _: u32, _: u32) -> Self {
        Softcap { scale: p.softcap_scale }
    }

    #[inline(always)]
    fn apply<S: FragTile>(&self, s: &mut S, _: i32, _: i32) -> Option<[f32; 2]> {
        for j in 0..S::FRAGS {
            let f = s.frag_mut(j);
            for i in 0..4 {
                f[i] = crate::ptx::math::tanh(f[i] * self.scale);
            }
        }
        None
    }
}

/// Soft-capping then ALiBi (`common::ScoreModKind::SoftcapAlibi`): the score
/// `tanh(S · scale / c)` less the bias in the same units (the host sets
/// `FwdParams::alibi_inv_scale = 1 / c`), so the logits are `c · tanh(..) − slope · |..|`.
#[derive(Clone, Copy)]
pub struct SoftcapAlibi {
    softcap: Softcap,
    alibi: Alibi<false>,
}

impl ScoreMod for SoftcapAlibi {
    const BIAS: bool = true;

    #[inline(always)]
    fn new(p: &FwdParams, batch: u32, head: u32) -> Self {
        SoftcapAlibi { softcap: Softcap::new(p, batch, head), alibi: Alibi::new(p, batch, head) }
    }

    #[inline(always)]
    fn apply<S: FragTile>(&self, s: &mut S, row_g: i32, col_2t: i32) -> Option<[f32; 2]> {
        self.softcap.apply(s, row_g, col_2t);
        self.alibi.apply(s, row_g, col_2t)
    }
}

/// ALiBi (`common::ScoreModKind::Alibi`): `S − (slope / scale) · |i + seqlen_k − seqlen_q − j|`,
/// which the softmax's scale turns into the logits `scale · S − slope · |...|`.
/// `ROW_SPLIT`: on blocks on one side of every diagonal of a warp's rows the bias is a
/// column term, which the tensor cores add ([`ScoreMod::KEY_OFFSETS`]), and a row
/// constant ([`Alibi::apply_one_side`]); without it (the kernels whose consumers have no
/// registers to spare: hdim 256, and with soft-capping) every score pays the distance.
#[derive(Clone, Copy)]
pub struct Alibi<const ROW_SPLIT: bool = true> {
    /// The head's slope in raw-score units.
    slope: f32,
    /// `seqlen_k − seqlen_q`: row `i`'s diagonal key.
    offset: i32,
}

impl<const ROW_SPLIT: bool> ScoreMod for Alibi<ROW_SPLIT> {
    const BIAS: bool = true;
    const KEY_OFFSETS: bool = ROW_SPLIT;

    #[inline(always)]
    fn key_offset_slope(&self) -> f32 {
        self.slope
    }

    #[inline(always)]
    fn key_offset_side<S: FragTile>(&self, row_g: i32, col_2t: i32) -> Option<bool> {
        if ROW_SPLIT { self.side::<S>(row_g, col_2t) } else { None }
    }

    #[inline(always)]
    fn new(p: &FwdParams, batch: u32, head: u32) -> Self {
        let at = p.alibi_slopes + 4 * (batch as u64 * p.alibi_batch_stride as u64 + head as u64);
        // SAFETY: the host checked that the slopes array covers every (batch, head).
        let slope = f32::from_bits(unsafe { crate::ptx::global::ld_nc_u32(at) });
        Alibi { slope: slope * p.alibi_inv_scale, offset: p.seqlen_k as i32 - p.seqlen_q as i32 }
    }

    #[inline(always)]
    fn apply<S: FragTile>(&self, s: &mut S, row_g: i32, col_2t: i32) -> Option<[f32; 2]> {
        if !ROW_SPLIT {
            for j in 0..S::FRAGS {
                let f = s.frag_mut(j);
                for r in 0..2 {
                    let diag = self.diag(row_g, col_2t, r) - 8 * j as i32;
                    for c in 0..2 {
                        let dist = (diag - c as i32).unsigned_abs() as f32;
                        f[2 * r + c] = fma(-self.slope, dist, f[2 * r + c]);
                    }
                }
            }
            return None;
        }
        if let Some(bias) = self.apply_one_side::<S>(row_g, col_2t) {
            return Some(bias);
        }
        // A diagonal crosses the block: the distance per score, in f32 (an FMA with an
        // immediate and a subtraction of its absolute value).
        let at_diag = [0, 1].map(|r| self.slope * self.diag(row_g, col_2t, r) as f32);
        for j in 0..S::FRAGS {
            let f = s.frag_mut(j);
            for i in 0..4 {
                let k = (8 * j + i % 2) as f32;
                f[i] -= abs(fma(-self.slope, k, at_diag[i / 2]));
            }
        }
        Some([0.0; 2])
    }
}

impl<const ROW_SPLIT: bool> Alibi<ROW_SPLIT> {
    /// Row `r`'s (g, g + 8) diagonal key relative to the lane's first column `col_2t`:
    /// the lane's score `(r, 8j + c)` lies `diag - 8j - c` keys left of it.
    #[inline(always)]
    fn diag(&self, row_g: i32, col_2t: i32, r: usize) -> i32 {
        row_g + 8 * r as i32 + self.offset - col_2t
    }

    /// Whether the block lies right (`Some(true)`) or left (`Some(false)`) of every
    /// diagonal of the warp's rows (all blocks but those the diagonals cross, `None`):
    /// there `|diag - k| = σ (diag - k)` over the block's columns with one sign `σ`.
    /// Warp votes keep the choice warp-uniform.
    #[inline(always)]
    fn side<S: FragTile>(&self, row_g: i32, col_2t: i32) -> Option<bool> {
        // Row g + 8's diagonal lies 8 keys right of row g's.
        let right = vote_all(self.diag(row_g, col_2t, 0) >= 8 * S::FRAGS as i32 - 7);
        let left = vote_all(self.diag(row_g, col_2t, 1) <= 0);
        if right { Some(true) } else if left { Some(false) } else { None }
    }

    /// Where the block lies on one side of every diagonal of the warp's rows
    /// ([`Alibi::side`]): the tensor cores added each score's `σ · slope · k` (`k` from
    /// the block's first column, [`ScoreMod::KEY_OFFSETS`]), and the rows'
    /// `-σ · slope · diag` (from the same column) is returned, for the softmax to add per
    /// row. `None` where a diagonal crosses the block.
    #[inline(always)]
    fn apply_one_side<S: FragTile>(&self, row_g: i32, col_2t: i32) -> Option<[f32; 2]> {
        let right = self.side::<S>(row_g, col_2t)?;
        let signed = if right { self.slope } else { -self.slope };
        // The block's first column (blocks are whole multiples of 8 keys).
        let col0 = col_2t & !7;
        Some([0, 1].map(|r| -signed * self.diag(row_g, col0, r) as f32))
    }
}
