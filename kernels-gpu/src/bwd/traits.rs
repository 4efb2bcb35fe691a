//! The configuration of one backward kernel as a traits type (as the forward's
//! [`crate::fa3::KernelTraits`]): the kernel table (`common::bwd_kernel_table`) gives each
//! entry point one, and every part of the kernel reads its shapes and register tiles from
//! it.
use crate::element::Element;
use crate::fa3::mask::DocSource;
use crate::fa3::variant::LogitHook;
use crate::fa3::traits::{FragTile, ScoreTile};
use crate::ptx::wgmma::WgmmaAcc;
use crate::fa3::traits::WARPGROUP_ROWS;
use common::bwd::{self, SmemLayout};

/// One backward kernel configuration.
pub trait BwdTraits: Copy + 'static {
    /// The 16-bit element type of Q, K, V, O, dO and the gradients.
    type Element: Element;
    /// A consumer warpgroup's `Sᵀ` (and `dPᵀ`) accumulator: its 64 keys by its queries
    /// of the step (`common::bwd::wg_queries`: `BLOCK_M`, or half where the warpgroups
    /// split the head dimension).
    type Scores: ScoreTile;
    /// A consumer warpgroup's dK (and dV) accumulator: its 64 keys by its columns
    /// (`common::bwd::wg_grad_cols`).
    type KeyGrads: FragTile + WgmmaAcc;
    /// A consumer warpgroup's dQ product per step: `BLOCK_M` query rows by
    /// `common::bwd::wg_dq_cols` columns.
    type DqTile: FragTile + WgmmaAcc;
    const HDIM: u32;
    /// dQ summed in a fixed order per query block, each CTA waiting for its turn
    /// (`dq_semaphore`, `common::bwd::DqOrder`).
    const DETERMINISTIC: bool;
    /// Soft-capped logits `c · tanh(S · scale / c)` (`common::ScoreModKind::Softcap`, and
    /// `SoftcapAlibi` with ALiBi after the tanh): `P` from them, and `dS` times their
    /// derivative `1 − tanh²`.
    const SOFTCAP: bool;
    /// ALiBi: `S − (slope / scale) · |query + seqlen_k − seqlen_q − key|` before the
    /// softmax's scale (`common::ScoreModKind::Alibi`); dS is unchanged (the bias does
    /// not depend on Q or K).
    const ALIBI: bool;
    /// Per-row key ranges (`common::MaskKind::Local` and `Document`, `BwdParams::window`
    /// and `docs`): a key block's query blocks are a range, and a key row hides queries
    /// outside its window and document too.
    const LOCAL: bool;
    /// The documents of a local kernel (`NoDocuments` but for `common::MaskKind::Document`).
    type Docs: DocSource;
    /// A user-defined variant's logit and derivative (`common::ScoreModKind::User`;
    /// `NoVariant` in the built-in kernels): `P` from its logits and `dS` times its
    /// derivative, as soft-capping.
    type Variant: LogitHook;
    /// Query rows per step (`common::bwd::block_m`: 128 for hdim 64's plain kernels).
    const BLOCK_M: u32;
    /// Keys per CTA.
    const BLOCK_N: u32 = bwd::block_n(Self::HDIM);
    /// The consumer warpgroups share the block's keys and split the step's queries (for
    /// `Sᵀ`, `dPᵀ`) and the head dimension (for dK, dV, dQ); `Pᵀ` and `dSᵀ` meet in
    /// shared memory (`common::bwd::splits_head_dim`).
    const SPLIT: bool = bwd::splits_head_dim(Self::HDIM);
    /// The consumer warpgroups hand each step's dQ piece to the dQ writer warp without
    /// waiting: each thread fences its stores and arrives at [`NamedBarrier::DqFull`]
    /// (`DqFullSplit` where the head dimension is split), which the writer waits at
    /// (+2.3% geomean, +6% at hdim 128 16k, over a warpgroup-wide sync before one
    /// thread's mbarrier arrival). Not where the logits are modified per score
    /// (soft-capping, user variants) or with ALiBi and documents at hdim 128: there it
    /// spilled 8-16 bytes, and they keep the mbarrier.
    ///
    /// [`NamedBarrier::DqFull`]: crate::fa3::barriers::NamedBarrier::DqFull
    const DQ_ARRIVE_ONLY: bool = !Self::SOFTCAP
        && !<Self::Variant as LogitHook>::SCORE
        && !(Self::HDIM == 128 && Self::ALIBI && <Self::Docs as DocSource>::DOCS);
    /// The shared-memory layout.
    const SMEM: SmemLayout = SmemLayout::new(Self::HDIM, Self::BLOCK_M);
    /// Bytes of a Q or dO tile, and of a stage's LSE or D vector.
    const Q_BYTES: u32 = Self::BLOCK_M * Self::HDIM * 2;
    const VECTOR_BYTES: u32 = SmemLayout::vector_bytes(Self::BLOCK_M);
}

/// Where a consumer warpgroup works in the CTA's block: its keys (of the score tiles, dK
/// and dV), its queries of the step (of the score tiles) and its columns of dK and dV.
#[derive(Clone, Copy)]
pub struct WgTile {
    /// First key of the block.
    pub key0: u32,
    /// First query of the step.
    pub query0: u32,
    /// First column of dK and dV.
    pub col0: u32,
}

impl WgTile {
    #[inline(always)]
    pub fn of<K: BwdTraits>(wg: u32) -> Self {
        if K::SPLIT {
            WgTile { key0: 0, query0: wg * bwd::wg_queries(K::HDIM, K::BLOCK_M), col0: wg * bwd::wg_grad_cols(K::HDIM) }
        } else {
            WgTile { key0: wg * WARPGROUP_ROWS, query0: 0, col0: 0 }
        }
    }
}

/// Which part of the step's dQ (`BLOCK_M` rows by `HDIM`) a consumer warpgroup
/// computes over all the block's keys (so both warpgroups' rows of `dSᵀ` must be in
/// shared memory first): with 64-row steps columns `wg_dq_cols · wg ..` (half the head
/// dimension), with 128-row steps (hdim 64) rows `64 wg ..`, every column
/// (`common::bwd::splits_dq_rows`).
#[derive(Clone, Copy)]
pub struct DqSplit {
    /// First row of the step's query block.
    pub row0: u32,
    /// First column.
    pub col0: u32,
}

impl DqSplit {
    #[inline(always)]
    pub fn of<K: BwdTraits>(wg: u32) -> Self {
        const { assert!(K::BLOCK_M == 64 || (K::BLOCK_M == 128 && !K::SPLIT)) };
        if bwd::splits_dq_rows(K::BLOCK_M) {
            DqSplit { row0: WARPGROUP_ROWS * wg, col0: 0 }
        } else {
            DqSplit { row0: 0, col0: bwd::wg_dq_cols(K::HDIM, K::BLOCK_M) * wg }
        }
    }

    /// This part's first float in the query block's accumulator
    /// (`common::bwd::dq_accum_index` order).
    #[inline(always)]
    pub fn accum_offset<K: BwdTraits>(self) -> u32 {
        self.row0 * K::HDIM + self.col0 / bwd::dq_piece_cols(K::HDIM) * bwd::dq_piece(K::HDIM)
    }
}
