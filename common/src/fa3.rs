//! Shapes of the FlashAttention-3 forward kernel, shared by kernel and host.
//!
//! One CTA computes `block_m = 64 * consumer_wgs` query rows of one (batch, head):
//! a producer warpgroup issues TMA loads, each consumer warpgroup owns 64 rows and runs
//! S = QK^T (SS WGMMA, or RS with Q in registers at hdim 128), the online softmax and
//! O += PV (RS WGMMA). K and V stream through their own `STAGES`-deep shared-memory
//! rings.
use crate::{Algo, DType, FwdParams, KernelEntry};

/// The seed techniques a kernel variant uses; each can be turned off at compile time so
/// its contribution can be measured (the ablation kernels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Techniques {
    /// A producer warpgroup does only TMA (with `setmaxnreg`); otherwise a consumer thread
    /// issues the loads itself, ahead of use.
    pub warp_specialized: bool,
    /// Named barriers order the consumer warpgroups' GEMMs so one's softmax overlaps the
    /// other's GEMMs.
    pub pingpong: bool,
    /// The softmax of step j overlaps the PV GEMM of step j-1 inside one warpgroup.
    pub intra_overlap: bool,
}

impl Techniques {
    pub const FULL: Self = Techniques { warp_specialized: true, pingpong: true, intra_overlap: true };
    pub const NO_PINGPONG: Self = Techniques { pingpong: false, ..Self::FULL };
    pub const NO_OVERLAP: Self = Techniques { intra_overlap: false, ..Self::FULL };
    pub const NO_WARP_SPECIALIZATION: Self = Techniques { warp_specialized: false, ..Self::FULL };
}

/// Lazy rescaling (FlashAttention-4): the kernels keep a row's running max, and skip the
/// rescale of the output accumulator, while the row's scores exceed it by at most this
/// much in `exp2` units (`(s - max) * softmax_scale * log2 e <= 2`), so the unnormalised
/// probabilities stay at most 4. Not FA4's 8: with P rounded to f16/bf16, 8 raised the
/// error against the naive low-precision implementation and failed the 2x rule in one
/// GPU test. On the kernels' own tiles, the CPU model's mean error ratio rises by 10%
/// (f16) and 6% (bf16) at 2, with a worst case of 1.80x naive; at 4 and above, f16's
/// worst case exceeds 2x. 2 gives 60% of 8's speed-up.
/// Shared with the CPU model of the algorithm.
pub const RESCALE_THRESHOLD_LOG2: f32 = 2.0;

/// Q as the register (A) operand of QK^T, loaded once per tile with `ldmatrix`, so that
/// the QK wgmmas read only K from shared memory (RS instead of SS): a third less shared
/// memory traffic for QK^T, for 32 registers, and Q's buffer is released as soon as it is
/// read. hdim 128 only: hdim 64's consumers have 160 registers, and hdim 256 stages O in
/// Q's buffer. A compile-time switch so that its worth can be measured.
pub const Q_IN_REGISTERS: bool = true;

/// Under a causal mask, query tiles end at the last row instead of starting at row 0: when
/// `block_m` does not divide `seqlen_q`, the short tile is the first, whose rows see the
/// fewest key blocks, not the last, which sees the most. At hdim 64 1k that last tile was
/// one warpgroup running all 8 key blocks with no pingpong partner, 7% of the call.
/// Without a mask every tile sees every key: nothing moves. Only where warpgroups skip
/// masked key blocks (tiles and key blocks of different sizes,
/// [`KernelConfig::skips_masked_blocks`]): with square 128 x 128 tiles a shift of 64
/// rows or more would leave warpgroup 0 a fully masked block in every tile. A
/// compile-time switch so that its worth can be measured.
pub const CAUSAL_TILES_END_AT_LAST_ROW: bool = true;

/// Whether causal tiles of `block_m` rows over key blocks of `block_n` end at the last
/// row ([`CAUSAL_TILES_END_AT_LAST_ROW`]).
#[inline(always)]
pub const fn tiles_end_at_last_row(block_m: u32, block_n: u32) -> bool {
    CAUSAL_TILES_END_AT_LAST_ROW && block_m != block_n
}

/// First query row of tile `m_block` of `block_m` rows; negative (rows that do not exist,
/// loaded as zeros and never stored) for the first tile when causal tiles end at the last
/// row ([`tiles_end_at_last_row`]). Shared by the kernels and their tests.
#[inline(always)]
pub fn tile_row0(p: &FwdParams, m_block: u32, block_m: u32, block_n: u32) -> i32 {
    // Not through `tile_row_shift`: ptxas got other instructions for it at hdim 256.
    let shift = if tiles_end_at_last_row(block_m, block_n) && p.causal != 0 { (block_m - p.seqlen_q % block_m) % block_m } else { 0 };
    (m_block * block_m) as i32 - shift as i32
}

/// How many rows before row 0 the first tile starts ([`tile_row0`]; the host's block
/// masks follow the kernels' tiles).
#[inline(always)]
pub const fn tile_row_shift(causal: bool, seqlen_q: u32, block_m: u32, block_n: u32) -> u32 {
    if tiles_end_at_last_row(block_m, block_n) && causal { (block_m - seqlen_q % block_m) % block_m } else { 0 }
}

/// Whether a kernel keeps Q in registers (see [`Q_IN_REGISTERS`]): hdim 128. The
/// no-overlap mainloop is rotated for it: in its plain loop shape, ptxas 13.0 (the driver
/// JIT of driver 580) reused Q's registers for P.
/// `tests/tests/ptx.rs` checks the JIT's SASS for such writes, and that these kernels
/// load Q with `ldmatrix`.
pub const fn q_in_registers(hdim: u32) -> bool {
    Q_IN_REGISTERS && hdim == 128
}

/// How many leading key blocks (of `block_n` keys, from key 0) every query row from `row0`
/// on sees whole, under the sequence end `seqlen_k` and, with `causal_offset = Some(off)`,
/// the causal limit `key <= row + off`: those blocks need no mask. (Later rows see at
/// least as much as `row0`.) The kernels' `CausalMask` splits the mainloop here.
#[inline(always)]
pub fn whole_key_blocks(seqlen_k: i32, causal_offset: Option<i32>, row0: i32, block_n: u32) -> u32 {
    let keys = match causal_offset {
        Some(off) => seqlen_k.min(row0 + off + 1),
        None => seqlen_k,
    };
    keys.max(0) as u32 / block_n
}

/// Tile number `t` of the FA3 kernels' order, as (query unit, (batch, head) index):
/// sections of `2^section_log2` (batch, head) pairs (the host guarantees that this
/// divides `batch * heads_q`), and within a section the query unit is the slow index,
/// last (heaviest under a causal mask) first. `units`: query units per (batch, head),
/// non-zero; a unit is one query block, or one per CTA of a cluster. Checked ops keep
/// panics out of the kernels.
#[inline(always)]
pub fn tile_unit_and_head(t: u32, units: u32, section_log2: u32) -> (u32, u32) {
    let k = section_log2;
    let section = t.checked_div(units << k).unwrap_or(0);
    let r = t - section * (units << k);
    (units - 1 - (r >> k), (section << k) | (r & ((1 << k) - 1)))
}

/// Bytes of one TMA descriptor (`CUtensorMap`) in the kernels' descriptor block.
pub const TMA_DESCRIPTOR_BYTES: u32 = 128;

/// The tensor maps of the descriptor block (`TmaDescriptors`), in order.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorMapSlot {
    Q = 0,
    K = 1,
    V = 2,
    O = 3,
}

impl TensorMapSlot {
    /// Byte offset of this map in the descriptor block.
    pub const fn offset(self) -> u32 {
        self as u32 * TMA_DESCRIPTOR_BYTES
    }
}

/// A named place in a kernel's descriptor block ([`TensorMapSlot`] for the forward,
/// `bwd::BwdTensorMap` for the backward).
pub trait DescriptorSlot: Copy {
    /// Byte offset of the map in the descriptor block.
    fn offset(self) -> u32;
}

impl DescriptorSlot for TensorMapSlot {
    #[inline(always)]
    fn offset(self) -> u32 {
        TensorMapSlot::offset(self)
    }
}

/// Bytes of the TMA descriptor block (q, k, v, o).
pub const TMA_PARAM_BYTES: u32 = 4 * TMA_DESCRIPTOR_BYTES;

/// Depth of the K and V rings of every FA3 kernel: at hdim 256 no third stage fits, and
/// at hdim 64 and 128 a third measured no faster.
pub const KV_STAGES: u32 = 2;

/// Largest number of consumer warpgroups in a CTA (the named-barrier ids are laid out
/// for it).
pub const MAX_CONSUMER_WGS: u32 = 3;

/// One FA3 kernel: every other constant of the kernel (tile rows, register split, shared
/// memory layout, which optional steps run) derives from these fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelConfig {
    pub hdim: u32,
    /// Consumer warpgroups per CTA, 64 query rows each.
    pub consumer_wgs: u32,
    /// Keys per K/V block.
    pub block_n: u32,
    /// CTAs per cluster (1: none; [`MULTICAST_CLUSTER`]: K/V shared by TMA multicast).
    pub cluster: u32,
    pub techniques: Techniques,
    /// e4m3 Q, K and V (one byte each, V transposed; `crate::fp8`), O 16-bit.
    pub fp8: bool,
    /// FP8 only: V comes as stored (`[b, s, h, d]`, loaded as K is) and the producer
    /// warpgroup transposes each tile in shared memory (`crate::fp8::transpose_op`).
    pub transpose_v: bool,
    /// FP8 only: K and V may have per-block factors (`crate::fp8::VUnit`); else one per
    /// (batch, head) each, and the kernel has no per-block code.
    pub fp8_block_factors: bool,
    /// ALiBi's column term on the tensor cores ([`key_offsets`]): a tile of each key's
    /// offset in its block in shared memory, the B operand of one more k-step of QKᵀ.
    pub key_offsets: bool,
}

impl KernelConfig {
    /// Bytes of one Q, K or V element.
    pub const fn operand_bytes(&self) -> u32 {
        if self.fp8 { 1 } else { 2 }
    }

    /// Query rows per CTA.
    pub const fn block_m(&self) -> u32 {
        64 * self.consumer_wgs
    }

    /// Threads per CTA: the consumer warpgroups, and a producer warpgroup with warp
    /// specialization.
    pub const fn threads(&self) -> u32 {
        if self.techniques.warp_specialized { 128 * (self.consumer_wgs + 1) } else { 128 * self.consumer_wgs }
    }

    /// Registers per thread after `setmaxnreg`, (producer, consumers) (FA3's splits: with
    /// two consumer warpgroups 128 * (24 + 2 * 240) = 64512, with three 128 * (32 + 3 *
    /// 160) = 65536, of the 65536 per SM; the multicast kernels 128 * (40 + 2 * 232) =
    /// 64512, since their producer issues half-tile loads per chunk and spills on 24).
    pub const fn register_split(&self) -> (u32, u32) {
        match (self.consumer_wgs, self.cluster) {
            // The FP8 producer warpgroup that also transposes V spilled on 24.
            (2, 1) if self.transpose_v => (32, 232),
            (2, 1) => (24, 240),
            (2, _) => (40, 232),
            _ => (32, 160),
        }
    }

    /// Whether a consumer warpgroup skips a tile's leading key blocks that are masked
    /// for all of its rows (past its causal diagonal, or all blocks for rows past the
    /// sequence end). Only where tiles and key blocks differ in size (hdim 64's 192-row
    /// tiles, hdim 256's 64- and 80-key blocks) does a warpgroup of a causal tile have
    /// such blocks; with square 128 x 128 tiles (never shifted, [`tiles_end_at_last_row`])
    /// it always sees part of the last one, and the bookkeeping cost 2-3% at hdim 128.
    pub const fn skips_masked_blocks(&self) -> bool {
        self.block_m() != self.block_n
    }

    /// Whether Q is the register operand of QK^T ([`q_in_registers`]).
    pub const fn q_in_registers(&self) -> bool {
        q_in_registers(self.hdim) && !self.fp8
    }

    /// The kernel's shared memory.
    pub const fn smem(&self) -> SmemLayout {
        SmemLayout::new(self)
    }
}

/// Consumer warpgroups of the FA3 kernels at a head dim: three at hdim 64 (its softmax
/// costs as much as its GEMMs, and a third warpgroup hides more of it, as in FA3), two
/// otherwise.
pub const fn consumer_wgs(hdim: u32) -> u32 {
    if hdim == 64 { 3 } else { 2 }
}

/// Consumer warpgroups of the kernel with score modification `score_mod` and mask
/// `mask`: the plain kernels' [`consumer_wgs`], except two at hdim 64 with a score
/// modification or documents (at three with 128-key blocks, soft-capping's tanh, ALiBi's
/// distances and the documents' loaded bounds made the 160-register consumers spill),
/// and three on 64-key blocks where [`three_wgs_short_keys`].
pub const fn consumer_wgs_of(hdim: u32, score_mod: crate::ScoreModKind, mask: crate::MaskKind) -> u32 {
    if three_wgs_short_keys(hdim, score_mod, mask) {
        return 3;
    }
    match (score_mod, mask) {
        (crate::ScoreModKind::None, crate::MaskKind::Causal | crate::MaskKind::Local) => consumer_wgs(hdim),
        _ if hdim == 64 => 2,
        _ => consumer_wgs(hdim),
    }
}

/// Whether the kernel with score modification `score_mod` and mask `mask` runs three
/// consumer warpgroups on 64-key blocks: soft-capping at hdim 64 without a window. Its
/// softmax (two SFU ops per score) outlasts the GEMMs of one other warpgroup; with three it
/// hides behind two others' GEMMs, and 64-key blocks keep S, O and P within the 160
/// registers (128-key blocks spilled). +1.5-6% over two warpgroups; the same at hdim 128
/// (Q out of registers) and for ALiBi at hdim 64 measured level (`docs/perf-history.md`).
pub const fn three_wgs_short_keys(hdim: u32, score_mod: crate::ScoreModKind, mask: crate::MaskKind) -> bool {
    hdim == 64 && matches!(score_mod, crate::ScoreModKind::Softcap) && matches!(mask, crate::MaskKind::Causal)
}

/// Query rows per CTA of the FA3 kernels at a head dim.
pub const fn block_m(hdim: u32) -> u32 {
    64 * consumer_wgs(hdim)
}

/// Up to this many keys, hdim 256 runs 64-key blocks instead of 80: 80 does not divide
/// the usual lengths, so the last block is padded (512 keys take 7 blocks of 80 = 560,
/// 1k takes 1040), and a causal diagonal is coarser. Beyond, 80's fewer blocks win: in
/// an A/B of the two, 64 was ahead by 6.2% / 3.5% at 512 (non-causal / causal), 0.7% /
/// 4.1% at 1k, level at 2k-4k, and 1.4% behind at 16k non-causal; a block costs about its
/// keys plus 5 keys' worth of fixed work, which puts the break-even near 4k. (80 rather
/// than 128 at hdim 256: Q, two K and two V stages must fit in 227 KB.)
pub const SHORT_KEYS_HDIM256: u32 = 4096;

/// Keys per K/V block of the FA3 kernel the planner picks for `seqlen_k` keys.
pub const fn key_block(hdim: u32, seqlen_k: u32) -> u32 {
    match hdim {
        256 if seqlen_k <= SHORT_KEYS_HDIM256 => 64,
        256 => 80,
        _ => 128,
    }
}

/// The key block of the kernel with mask `mask`: [`key_block`], except 64 at hdim 256
/// with a sliding window (its 80-key kernel spilled: the window's bounds on top of the
/// 188 registers O, S and P take there; 64 is 1.4% behind 80 at 16k without a mask).
pub const fn key_block_of(hdim: u32, seqlen_k: u32, score_mod: crate::ScoreModKind, mask: crate::MaskKind) -> u32 {
    if three_wgs_short_keys(hdim, score_mod, mask) {
        return 64;
    }
    match (mask, score_mod) {
        (crate::MaskKind::Local | crate::MaskKind::Document, _) if hdim == 256 => 64,
        // Documents with ALiBi spilled 32-72 bytes on 128-key blocks at hdim 128.
        (crate::MaskKind::Document, crate::ScoreModKind::Alibi | crate::ScoreModKind::SoftcapAlibi) if hdim == 128 => 64,
        _ => key_block(hdim, seqlen_k),
    }
}

/// The configuration of an FA3 forward kernel of the table (`None` for FA2 and backward
/// kernels).
pub const fn kernel_config(k: &KernelEntry) -> Option<KernelConfig> {
    let (fp8, transpose_v, fp8_block_factors) = match k.kind {
        crate::KernelKind::Forward => (false, false, false),
        crate::KernelKind::ForwardFp8 { transpose_v, block_factors } => (true, transpose_v, block_factors),
        _ => return None,
    };
    match k.algo {
        Algo::Fa3(techniques) => Some(KernelConfig {
            hdim: k.hdim,
            consumer_wgs: k.consumer_wgs,
            block_n: k.block_n,
            cluster: k.cluster,
            techniques,
            fp8,
            transpose_v,
            fp8_block_factors,
            key_offsets: key_offsets(k.hdim, k.score_mod) && !fp8,
        }),
        Algo::Fa2 => None,
    }
}

/// A buffer in dynamic shared memory: byte offset from the (1024 B aligned) base, size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmemBuffer {
    pub offset: u32,
    pub bytes: u32,
}

/// A ring of `stages` equal slots and its mbarriers: `stages` "full" barriers, then
/// `stages` "empty" ones, 8 bytes each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmemRing {
    /// The first slot.
    pub data: u32,
    pub stage_bytes: u32,
    pub stages: u32,
    /// The first barrier.
    pub barriers: u32,
}

impl SmemRing {
    /// Byte offset of slot `stage`.
    pub const fn slot(&self, stage: u32) -> u32 {
        self.data + stage * self.stage_bytes
    }

    /// Bytes of its barriers.
    pub const fn barrier_bytes(&self) -> u32 {
        2 * MBARRIER_BYTES * self.stages
    }
}

/// Bytes of one mbarrier.
pub const MBARRIER_BYTES: u32 = 8;

/// Slots of the producer-to-consumer tile handoff: the producer may publish the next
/// tile while the consumers still read the current one.
pub const TILE_HANDOFF_STAGES: u32 = 2;
/// A handoff slot: a decoded tile (query block, head, batch, key blocks), moved with one
/// 16-byte vector store and load.
pub const TILE_HANDOFF_SLOT_BYTES: u32 = 16;

/// Largest dynamic shared memory per CTA on sm_90 (227 KB).
pub const MAX_SMEM: u32 = 227 * 1024;

/// Alignment of every operand tile (the 128 B swizzle atom), and the slack requested at
/// launch so that the kernel can round the dynamic base up to it.
pub const SMEM_ALIGN: u32 = 1024;

/// The dynamic shared memory of an FA3 kernel, after rounding its base up to
/// [`SMEM_ALIGN`]: the operand tiles first (each 1024 B aligned), then the barriers and
/// the tile handoff.
///
/// ```text
/// | Q | K stage 0 .. | V stage 0 .. | raw V stages (FP8 transposing) | key offsets (ALiBi) | O (if it fits) | Q bars | K bars | V bars | raw V bars | handoff bars | handoff slots |
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmemLayout {
    /// Q of the current tile: a ring of one slot (`block_m x hdim`).
    pub q: SmemRing,
    /// K blocks (`block_n x hdim` each).
    pub k: SmemRing,
    /// V blocks, as K (transposed in the FP8 kernels).
    pub v: SmemRing,
    /// The FP8 kernels that transpose V ([`KernelConfig::transpose_v`]): V blocks as
    /// stored, `block_n x hdim` as K, before the producer transposes them into `v`. No
    /// stage elsewhere.
    pub v_raw: SmemRing,
    /// Staging tile of O for the TMA store: its own buffer when it fits, so a tile's
    /// epilogue overlaps the next tile's Q load; else Q's buffer (then Q is released
    /// only once the store has read O).
    pub o: SmemBuffer,
    /// The tile handoff from the producer to the consumers.
    pub tile_handoff: SmemRing,
    /// [`KernelConfig::key_offsets`]: `block_n` keys by [`KEY_OFFSET_COLS`] elements,
    /// K-major without swizzle ([`crate::gmma::k_major_plain_offset`]); empty elsewhere.
    pub key_offsets: SmemBuffer,
    /// Bytes to request at launch (includes [`SMEM_ALIGN`] of slack).
    pub total: u32,
}

impl SmemLayout {
    pub const fn new(cfg: &KernelConfig) -> SmemLayout {
        let q_bytes = cfg.block_m() * cfg.hdim * cfg.operand_bytes();
        let kv_stage_bytes = cfg.block_n * cfg.hdim * cfg.operand_bytes();
        // O is 16-bit whatever the operands.
        let o_bytes = cfg.block_m() * cfg.hdim * 2;
        // Data first; the barriers' offsets are filled in once O's place is known.
        let q = SmemRing { data: 0, stage_bytes: q_bytes, stages: 1, barriers: 0 };
        let k = SmemRing { data: q_bytes, stage_bytes: kv_stage_bytes, stages: KV_STAGES, barriers: 0 };
        let v = SmemRing { data: k.slot(KV_STAGES), ..k };
        let v_raw = SmemRing { data: v.slot(KV_STAGES), stages: if cfg.transpose_v { KV_STAGES } else { 0 }, ..k };
        let key_offsets = SmemBuffer { offset: v_raw.slot(v_raw.stages), bytes: if cfg.key_offsets { cfg.block_n * KEY_OFFSET_COLS * 2 } else { 0 } };
        let kv_end = key_offsets.offset + key_offsets.bytes;
        let handoff_bytes = TILE_HANDOFF_STAGES * (2 * MBARRIER_BYTES + TILE_HANDOFF_SLOT_BYTES);
        let tail = q.barrier_bytes() + k.barrier_bytes() + v.barrier_bytes() + v_raw.barrier_bytes() + handoff_bytes + SMEM_ALIGN;
        let (o, barriers) = if kv_end + o_bytes + tail <= MAX_SMEM { (kv_end, kv_end + o_bytes) } else { (0, kv_end) };
        let q = SmemRing { barriers, ..q };
        let k = SmemRing { barriers: q.barriers + q.barrier_bytes(), ..k };
        let v = SmemRing { barriers: k.barriers + k.barrier_bytes(), ..v };
        let v_raw = SmemRing { barriers: v.barriers + v.barrier_bytes(), ..v_raw };
        let handoff_barriers = v_raw.barriers + v_raw.barrier_bytes();
        let tile_handoff = SmemRing {
            data: handoff_barriers + 2 * MBARRIER_BYTES * TILE_HANDOFF_STAGES,
            stage_bytes: TILE_HANDOFF_SLOT_BYTES,
            stages: TILE_HANDOFF_STAGES,
            barriers: handoff_barriers,
        };
        SmemLayout { q, k, v, v_raw, o: SmemBuffer { offset: o, bytes: o_bytes }, tile_handoff, key_offsets, total: barriers + tail }
    }

    /// Whether O is staged in Q's buffer.
    pub const fn o_shares_q(&self) -> bool {
        self.o.offset == self.q.data
    }
}

/// Whether the forward kernels of this head dimension and score modification add
/// ALiBi's column term on the tensor cores: on a key block that lies on one side of
/// every diagonal of a warp's rows the bias is a row constant plus `±slope` times the
/// key's offset in the block, and one more k16 step of QKᵀ adds the latter, with A
/// the slope split into three 16-bit parts (exact to f32's precision) and B the block's
/// key offsets ([`KEY_OFFSET_COLS`] columns, three of them the offset): no per-score
/// instruction. Where ALiBi keeps per-row constants (hdim 64 and 128; hdim 256 and
/// soft-capping with ALiBi pay the distance per score).
pub const fn key_offsets(hdim: u32, score_mod: crate::ScoreModKind) -> bool {
    matches!(score_mod, crate::ScoreModKind::Alibi) && hdim != 256
}

/// Columns (the k16 step's K) of the key-offset tile ([`key_offsets`]).
pub const KEY_OFFSET_COLS: u32 = 16;

/// CTAs per cluster of the multicast kernels: two CTAs on neighbouring query blocks of
/// one head share every K/V tile, each loading half and multicasting it to both, which
/// halves the K/V traffic from L2 (FA3 does this for hdim >= 128 without a causal mask,
/// where both CTAs visit the same key blocks).
pub const MULTICAST_CLUSTER: u32 = 2;

/// From this many query rows and keys, the planner runs hdim 128 without a mask in
/// multicast clusters: against the persistent kernel it measured +1.8% at 4k, +2.3% at
/// 8k and +0.4% at 16k, but -1.9% at 2k.
pub const MULTICAST_MIN_SEQLEN: u32 = 4096;

/// Whether the planner's default picks multicast clusters (no causal mask, every
/// technique: the only multicast kernels).
pub const fn multicast_pays(hdim: u32, seqlen_q: u32, seqlen_k: u32) -> bool {
    hdim == 128 && seqlen_q >= MULTICAST_MIN_SEQLEN && seqlen_k >= MULTICAST_MIN_SEQLEN
}

/// The FA3 kernel table, written once: it expands to `callback! { NAME => DTYPE, hdim D,
/// wgs W, keys N, cluster C, TECHNIQUES, SCORE_MOD, MASK; ... }`, from which this crate builds
/// [`KERNELS`] (what the host launches) and the kernel crate its entry points (what the
/// PTX exports). Every head dim and dtype with all techniques (hdim 256 with 80- and
/// 64-key blocks, [`key_block`]); the 2-CTA multicast kernels (hdim 128: at hdim 256 the
/// consumers need all 240 registers, which leaves the multicast producer too few);
/// hdim 128 without pingpong in both dtypes, and the other ablation kernels at hdim 128
/// fp16; each score modification (`ScoreModKind`) and the sliding window
/// (`MaskKind::Local`, at hdim 256 with 64-key blocks only, [`key_block_of`]) with every
/// technique; documents (`MaskKind::Document`, with a window or not) with every score
/// modification, with ALiBi on 64-key blocks at hdim 128 and not at hdim 256 (their
/// consumers spilled on 128 keys at hdim 128, and at hdim 256 under ptxas 13.5).
#[macro_export]
macro_rules! fa3_kernel_table {
    ($callback:ident) => {
        $callback! {
            fa3_fwd_hdim64_f16 => F16, hdim 64, wgs 3, keys 128, cluster 1, FULL, None, Causal;
            fa3_fwd_hdim128_f16 => F16, hdim 128, wgs 2, keys 128, cluster 1, FULL, None, Causal;
            fa3_fwd_hdim256_f16 => F16, hdim 256, wgs 2, keys 80, cluster 1, FULL, None, Causal;
            fa3_fwd_hdim256_f16_n64 => F16, hdim 256, wgs 2, keys 64, cluster 1, FULL, None, Causal;
            fa3_fwd_hdim64_bf16 => BF16, hdim 64, wgs 3, keys 128, cluster 1, FULL, None, Causal;
            fa3_fwd_hdim128_bf16 => BF16, hdim 128, wgs 2, keys 128, cluster 1, FULL, None, Causal;
            fa3_fwd_hdim256_bf16 => BF16, hdim 256, wgs 2, keys 80, cluster 1, FULL, None, Causal;
            fa3_fwd_hdim256_bf16_n64 => BF16, hdim 256, wgs 2, keys 64, cluster 1, FULL, None, Causal;
            fa3_fwd_hdim128_f16_multicast => F16, hdim 128, wgs 2, keys 128, cluster 2, FULL, None, Causal;
            fa3_fwd_hdim128_bf16_multicast => BF16, hdim 128, wgs 2, keys 128, cluster 2, FULL, None, Causal;
            fa3_fwd_hdim128_f16_nopingpong => F16, hdim 128, wgs 2, keys 128, cluster 1, NO_PINGPONG, None, Causal;
            fa3_fwd_hdim128_bf16_nopingpong => BF16, hdim 128, wgs 2, keys 128, cluster 1, NO_PINGPONG, None, Causal;
            fa3_fwd_hdim128_f16_nooverlap => F16, hdim 128, wgs 2, keys 128, cluster 1, NO_OVERLAP, None, Causal;
            fa3_fwd_hdim128_f16_nows => F16, hdim 128, wgs 2, keys 128, cluster 1, NO_WARP_SPECIALIZATION, None, Causal;
            fa3_fwd_hdim64_f16_softcap => F16, hdim 64, wgs 3, keys 64, cluster 1, FULL, Softcap, Causal;
            fa3_fwd_hdim128_f16_softcap => F16, hdim 128, wgs 2, keys 128, cluster 1, FULL, Softcap, Causal;
            fa3_fwd_hdim256_f16_softcap => F16, hdim 256, wgs 2, keys 80, cluster 1, FULL, Softcap, Causal;
            fa3_fwd_hdim256_f16_n64_softcap => F16, hdim 256, wgs 2, keys 64, cluster 1, FULL, Softcap, Causal;
            fa3_fwd_hdim64_bf16_softcap => BF16, hdim 64, wgs 3, keys 64, cluster 1, FULL, Softcap, Causal;
            fa3_fwd_hdim128_bf16_softcap => BF16, hdim 128, wgs 2, keys 128, cluster 1, FULL, Softcap, Causal;
            fa3_fwd_hdim256_bf16_softcap => BF16, hdim 256, wgs 2, keys 80, cluster 1, FULL, Softcap, Causal;
            fa3_fwd_hdim256_bf16_n64_softcap => BF16, hdim 256, wgs 2, keys 64, cluster 1, FULL, Softcap, Causal;
            fa3_fwd_hdim64_f16_alibi => F16, hdim 64, wgs 2, keys 128, cluster 1, FULL, Alibi, Causal;
            fa3_fwd_hdim128_f16_alibi => F16, hdim 128, wgs 2, keys 128, cluster 1, FULL, Alibi, Causal;
            fa3_fwd_hdim256_f16_alibi => F16, hdim 256, wgs 2, keys 80, cluster 1, FULL, Alibi, Causal;
            fa3_fwd_hdim256_f16_n64_alibi => F16, hdim 256, wgs 2, keys 64, cluster 1, FULL, Alibi, Causal;
            fa3_fwd_hdim64_bf16_alibi => BF16, hdim 64, wgs 2, keys 128, cluster 1, FULL, Alibi, Causal;
            fa3_fwd_hdim128_bf16_alibi => BF16, hdim 128, wgs 2, keys 128, cluster 1, FULL, Alibi, Causal;
            fa3_fwd_hdim256_bf16_alibi => BF16, hdim 256, wgs 2, keys 80, cluster 1, FULL, Alibi, Causal;
            fa3_fwd_hdim256_bf16_n64_alibi => BF16, hdim 256, wgs 2, keys 64, cluster 1, FULL, Alibi, Causal;
            fa3_fwd_hdim64_f16_local => F16, hdim 64, wgs 3, keys 128, cluster 1, FULL, None, Local;
            fa3_fwd_hdim128_f16_local => F16, hdim 128, wgs 2, keys 128, cluster 1, FULL, None, Local;
            fa3_fwd_hdim256_f16_n64_local => F16, hdim 256, wgs 2, keys 64, cluster 1, FULL, None, Local;
            fa3_fwd_hdim64_bf16_local => BF16, hdim 64, wgs 3, keys 128, cluster 1, FULL, None, Local;
            fa3_fwd_hdim128_bf16_local => BF16, hdim 128, wgs 2, keys 128, cluster 1, FULL, None, Local;
            fa3_fwd_hdim256_bf16_n64_local => BF16, hdim 256, wgs 2, keys 64, cluster 1, FULL, None, Local;
            fa3_fwd_hdim64_f16_softcap_local => F16, hdim 64, wgs 2, keys 128, cluster 1, FULL, Softcap, Local;
            fa3_fwd_hdim128_f16_softcap_local => F16, hdim 128, wgs 2, keys 128, cluster 1, FULL, Softcap, Local;
            fa3_fwd_hdim256_f16_n64_softcap_local => F16, hdim 256, wgs 2, keys 64, cluster 1, FULL, Softcap, Local;
            fa3_fwd_hdim64_bf16_softcap_local => BF16, hdim 64, wgs 2, keys 128, cluster 1, FULL, Softcap, Local;
            fa3_fwd_hdim128_bf16_softcap_local => BF16, hdim 128, wgs 2, keys 128, cluster 1, FULL, Softcap, Local;
            fa3_fwd_hdim256_bf16_n64_softcap_local => BF16, hdim 256, wgs 2, keys 64, cluster 1, FULL, Softcap, Local;
            fa3_fwd_hdim64_f16_alibi_local => F16, hdim 64, wgs 2, keys 128, cluster 1, FULL, Alibi, Local;
            fa3_fwd_hdim128_f16_alibi_local => F16, hdim 128, wgs 2, keys 128, cluster 1, FULL, Alibi, Local;
            fa3_fwd_hdim256_f16_n64_alibi_local => F16, hdim 256, wgs 2, keys 64, cluster 1, FULL, Alibi, Local;
            fa3_fwd_hdim64_bf16_alibi_local => BF16, hdim 64, wgs 2, keys 128, cluster 1, FULL, Alibi, Local;
            fa3_fwd_hdim128_bf16_alibi_local => BF16, hdim 128, wgs 2, keys 128, cluster 1, FULL, Alibi, Local;
            fa3_fwd_hdim256_bf16_n64_alibi_local => BF16, hdim 256, wgs 2, keys 64, cluster 1, FULL, Alibi, Local;
            fa3_fwd_hdim64_f16_softcap_alibi => F16, hdim 64, wgs 2, keys 128, cluster 1, FULL, SoftcapAlibi, Causal;
            fa3_fwd_hdim128_f16_softcap_alibi => F16, hdim 128, wgs 2, keys 128, cluster 1, FULL, SoftcapAlibi, Causal;
            fa3_fwd_hdim256_f16_softcap_alibi => F16, hdim 256, wgs 2, keys 80, cluster 1, FULL, SoftcapAlibi, Causal;
            fa3_fwd_hdim256_f16_n64_softcap_alibi => F16, hdim 256, wgs 2, keys 64, cluster 1, FULL, SoftcapAlibi, Causal;
            fa3_fwd_hdim64_bf16_softcap_alibi => BF16, hdim 64, wgs 2, keys 128, cluster 1, FULL, SoftcapAlibi, Causal;
            fa3_fwd_hdim128_bf16_softcap_alibi => BF16, hdim 128, wgs 2, keys 128, cluster 1, FULL, SoftcapAlibi, Causal;
            fa3_fwd_hdim256_bf16_softcap_alibi => BF16, hdim 256, wgs 2, keys 80, cluster 1, FULL, SoftcapAlibi, Causal;
            fa3_fwd_hdim256_bf16_n64_softcap_alibi => BF16, hdim 256, wgs 2, keys 64, cluster 1, FULL, SoftcapAlibi, Causal;
            fa3_fwd_hdim64_f16_softcap_alibi_local => F16, hdim 64, wgs 2, keys 128, cluster 1, FULL, SoftcapAlibi, Local;
            fa3_fwd_hdim128_f16_softcap_alibi_local => F16, hdim 128, wgs 2, keys 128, cluster 1, FULL, SoftcapAlibi, Local;
            fa3_fwd_hdim256_f16_n64_softcap_alibi_local => F16, hdim 256, wgs 2, keys 64, cluster 1, FULL, SoftcapAlibi, Local;
            fa3_fwd_hdim64_bf16_softcap_alibi_local => BF16, hdim 64, wgs 2, keys 128, cluster 1, FULL, SoftcapAlibi, Local;
            fa3_fwd_hdim128_bf16_softcap_alibi_local => BF16, hdim 128, wgs 2, keys 128, cluster 1, FULL, SoftcapAlibi, Local;
            fa3_fwd_hdim256_bf16_n64_softcap_alibi_local => BF16, hdim 256, wgs 2, keys 64, cluster 1, FULL, SoftcapAlibi, Local;
            fa3_fwd_hdim64_f16_document => F16, hdim 64, wgs 2, keys 128, cluster 1, FULL, None, Document;
            fa3_fwd_hdim128_f16_document => F16, hdim 128, wgs 2, keys 128, cluster 1, FULL, None, Document;
            fa3_fwd_hdim256_f16_n64_document => F16, hdim 256, wgs 2, keys 64, cluster 1, FULL, None, Document;
            fa3_fwd_hdim64_bf16_document => BF16, hdim 64, wgs 2, keys 128, cluster 1, FULL, None, Document;
            fa3_fwd_hdim128_bf16_document => BF16, hdim 128, wgs 2, keys 128, cluster 1, FULL, None, Document;
            fa3_fwd_hdim256_bf16_n64_document => BF16, hdim 256, wgs 2, keys 64, cluster 1, FULL, None, Document;
            fa3_fwd_hdim64_f16_softcap_document => F16, hdim 64, wgs 2, keys 128, cluster 1, FULL, Softcap, Document;
            fa3_fwd_hdim128_f16_softcap_document => F16, hdim 128, wgs 2, keys 128, cluster 1, FULL, Softcap, Document;
            fa3_fwd_hdim256_f16_n64_softcap_document => F16, hdim 256, wgs 2, keys 64, cluster 1, FULL, Softcap, Document;
            fa3_fwd_hdim64_bf16_softcap_document => BF16, hdim 64, wgs 2, keys 128, cluster 1, FULL, Softcap, Document;
            fa3_fwd_hdim128_bf16_softcap_document => BF16, hdim 128, wgs 2, keys 128, cluster 1, FULL, Softcap, Document;
            fa3_fwd_hdim256_bf16_n64_softcap_document => BF16, hdim 256, wgs 2, keys 64, cluster 1, FULL, Softcap, Document;
            fa3_fwd_hdim64_f16_alibi_document => F16, hdim 64, wgs 2, keys 128, cluster 1, FULL, Alibi, Document;
            fa3_fwd_hdim128_f16_n64_alibi_document => F16, hdim 128, wgs 2, keys 64, cluster 1, FULL, Alibi, Document;
            fa3_fwd_hdim64_f16_softcap_alibi_document => F16, hdim 64, wgs 2, keys 128, cluster 1, FULL, SoftcapAlibi, Document;
            fa3_fwd_hdim128_f16_n64_softcap_alibi_document => F16, hdim 128, wgs 2, keys 64, cluster 1, FULL, SoftcapAlibi, Document;
            fa3_fwd_hdim64_bf16_alibi_document => BF16, hdim 64, wgs 2, keys 128, cluster 1, FULL, Alibi, Document;
            fa3_fwd_hdim128_bf16_n64_alibi_document => BF16, hdim 128, wgs 2, keys 64, cluster 1, FULL, Alibi, Document;
            fa3_fwd_hdim64_bf16_softcap_alibi_document => BF16, hdim 64, wgs 2, keys 128, cluster 1, FULL, SoftcapAlibi, Document;
            fa3_fwd_hdim128_bf16_n64_softcap_alibi_document => BF16, hdim 128, wgs 2, keys 64, cluster 1, FULL, SoftcapAlibi, Document;
            fa3_fwd_hdim256_f16_n64_alibi_document => F16, hdim 256, wgs 2, keys 64, cluster 1, FULL, Alibi, Document;
            fa3_fwd_hdim256_f16_n64_softcap_alibi_document => F16, hdim 256, wgs 2, keys 64, cluster 1, FULL, SoftcapAlibi, Document;
            fa3_fwd_hdim256_bf16_n64_alibi_document => BF16, hdim 256, wgs 2, keys 64, cluster 1, FULL, Alibi, Document;
            fa3_fwd_hdim256_bf16_n64_softcap_alibi_document => BF16, hdim 256, wgs 2, keys 64, cluster 1, FULL, SoftcapAlibi, Document;
        }
    };
}

macro_rules! fa3_entries {
    ($($name:ident => $dtype:ident, hdim $hdim:literal, wgs $wgs:literal, keys $keys:literal, cluster $cluster:literal, $tech:ident, $score_mod:ident, $mask:ident;)*) => {
        &[$({
            let config = KernelConfig { hdim: $hdim, consumer_wgs: $wgs, block_n: $keys, cluster: $cluster, techniques: Techniques::$tech, fp8: false, transpose_v: false, fp8_block_factors: false, key_offsets: key_offsets($hdim, crate::ScoreModKind::$score_mod) };
            KernelEntry {
                name: stringify!($name),
                algo: Algo::Fa3(Techniques::$tech),
                kind: crate::KernelKind::Forward,
                hdim: $hdim,
                dtype: DType::$dtype,
                tma_param_bytes: TMA_PARAM_BYTES,
                launch_bounds: config.threads(),
                cluster: $cluster,
                consumer_wgs: $wgs,
                block_n: $keys,
                score_mod: crate::ScoreModKind::$score_mod,
                mask: crate::MaskKind::$mask,
            }
        },)*]
    };
}

/// The FA3 kernels ([`fa3_kernel_table`]).
pub const KERNELS: &[KernelEntry] = fa3_kernel_table!(fa3_entries);

/// The forward kernels of a user-defined variant's module (`crate::variant`).
pub const VARIANT_KERNELS: &[KernelEntry] = crate::variant_fwd_kernel_table!(fa3_entries);

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;

    #[test]
    fn tile_order_visits_every_tile_once_heaviest_first_within_a_section() {
        for units in 1..=9 {
            for heads in 1..=24u32 {
                for k in 0..=heads.trailing_zeros() {
                    let total = units * heads;
                    let mut seen = [false; 9 * 24];
                    let mut last = (0, u32::MAX);
                    for t in 0..total {
                        let (unit, hb) = tile_unit_and_head(t, units, k);
                        assert!(unit < units && hb < heads, "units {units} heads {heads} k {k} t {t}");
                        let i = (hb * units + unit) as usize;
                        assert!(!seen[i], "units {units} heads {heads} k {k}: tile {i} twice");
                        seen[i] = true;
                        // Within a section the unit never rises; a section spans 2^k heads.
                        let section = hb >> k;
                        if section == last.0 {
                            assert!(unit <= last.1, "units {units} heads {heads} k {k} t {t}");
                        } else {
                            assert_eq!(unit, units - 1, "a section starts with its heaviest unit");
                        }
                        last = (section, unit);
                    }
                    // One head per section: the old order, query units fastest.
                    if k == 0 {
                        assert!((0..total).all(|t| tile_unit_and_head(t, units, 0) == (units - 1 - t % units, t / units)));
                    }
                }
            }
        }
    }

    /// The tiles of one (batch, head) cover each query row exactly once; under a causal
    /// mask the short tile is the first (it starts above row 0, never wholly) and the
    /// last ends on the last row; without one the tiles start at row 0.
    #[test]
    fn causal_tiles_cover_every_row_once_with_the_short_tile_first() {
        for causal in [false, true] {
            for (block_m, block_n) in [(64, 128), (128, 128), (128, 80), (128, 64), (192, 128)] {
                let shifted = causal && tiles_end_at_last_row(block_m, block_n);
                for seqlen_q in 1..=400u32 {
                    let p = FwdParams { seqlen_q, seqlen_k: seqlen_q, causal: causal as u32, ..Default::default() };
                    let units = seqlen_q.div_ceil(block_m);
                    let mut next = 0i32;
                    for m in 0..units {
                        let row0 = tile_row0(&p, m, block_m, block_n);
                        let ctx = format!("causal {causal} tile {block_m}x{block_n} seqlen {seqlen_q} tile {m}");
                        assert!(row0 > -(block_m as i32), "{ctx}: starts {row0}");
                        assert_eq!(row0.max(0), next, "{ctx}: a gap or an overlap");
                        next = row0 + block_m as i32;
                        if m > 0 {
                            assert!(row0 >= 0, "{ctx}: only the first tile may start above row 0");
                        }
                        if !shifted {
                            assert_eq!(row0, (m * block_m) as i32, "{ctx}");
                        }
                    }
                    if shifted {
                        assert_eq!(next, seqlen_q as i32, "tile {block_m}x{block_n} seqlen {seqlen_q}: the last tile ends on the last row");
                    }
                    assert!(next >= seqlen_q as i32);
                }
            }
        }
        // Causal calls with seqlen_k != seqlen_q (a diagonal offset of either sign): every
        // key a row attends lies in a block its tile visits, and no warpgroup sees past
        // the tile's blocks.
        for (seqlen_q, seqlen_k) in [(1, 9), (9, 1), (200, 333), (333, 200), (1000, 300), (300, 1000), (1025, 1025)] {
            let p = FwdParams { seqlen_q, seqlen_k, causal: 1, ..Default::default() };
            let off = seqlen_k as i32 - seqlen_q as i32;
            for (block_m, block_n) in [(192, 128), (128, 128), (128, 80)] {
                let mut next = 0i32;
                for m in 0..seqlen_q.div_ceil(block_m) {
                    let row0 = tile_row0(&p, m, block_m, block_n);
                    let n = p.n_blocks(row0, block_m, block_n);
                    let ctx = format!("sq {seqlen_q} sk {seqlen_k} tile {block_m}x{block_n} m {m}");
                    assert_eq!(row0.max(0), next, "{ctx}: a gap or an overlap");
                    next = row0 + block_m as i32;
                    for r in row0.max(0)..(row0 + block_m as i32).min(seqlen_q as i32) {
                        let last_key = (r + off).min(seqlen_k as i32 - 1);
                        assert!(last_key < 0 || (last_key as u32) < n * block_n, "{ctx}: row {r} needs key {last_key}, visits {n} blocks");
                    }
                    for wg in 0..block_m / 64 {
                        assert!(p.visible_blocks(row0 + 64 * wg as i32, 64, block_n) <= n, "{ctx}: warpgroup {wg}");
                    }
                }
                if tiles_end_at_last_row(block_m, block_n) {
                    assert_eq!(next, seqlen_q as i32, "sq {seqlen_q} sk {seqlen_k} block_m {block_m}: the last tile ends on the last row");
                }
            }
        }
        // hdim 64 at 1k: 64 rows first (one key block), the 192-row tiles after them.
        let p = FwdParams { seqlen_q: 1024, seqlen_k: 1024, causal: 1, ..Default::default() };
        let starts: std::vec::Vec<i32> = (0..6).map(|m| tile_row0(&p, m, 192, 128)).collect();
        assert_eq!(starts, [-128, 64, 256, 448, 640, 832]);
        assert_eq!((p.n_blocks(starts[0], 192, 128), p.n_blocks(starts[5], 192, 128)), (1, 8));
    }

    #[test]
    fn shared_memory_fits_the_h100_for_every_kernel() {
        for k in KERNELS.iter() {
            let cfg = kernel_config(k).unwrap();
            let (hdim, l) = (k.hdim, cfg.smem());
            assert!(l.total <= MAX_SMEM, "{}: {} bytes", k.name, l.total);
            // hdim 64 and 128 stage O apart from Q; 256 has no room and reuses Q.
            assert_eq!(l.o_shares_q(), hdim == 256, "hdim {hdim}");
            // Every tile starts on a 1024 B swizzle-atom boundary.
            let tiles = [l.q.slot(0), l.k.slot(0), l.k.slot(1), l.v.slot(0), l.v.slot(1), l.o.offset];
            for off in tiles {
                assert_eq!(off % SMEM_ALIGN, 0, "{}: tile at {off}", k.name);
            }
            // The buffers do not overlap (O may alias Q only), and barriers and handoff
            // slots lie after them, inside the allocation, 8- and 16-byte aligned.
            let mut regions = std::vec![(l.q.data, l.q.stage_bytes), (l.k.data, 2 * l.k.stage_bytes), (l.v.data, 2 * l.v.stage_bytes)];
            if !l.o_shares_q() {
                regions.push((l.o.offset, l.o.bytes));
            }
            // ALiBi's key-offset tile where its column term is on the tensor cores.
            assert_eq!(l.key_offsets.bytes != 0, key_offsets(hdim, k.score_mod), "{}", k.name);
            if l.key_offsets.bytes != 0 {
                assert_eq!((l.key_offsets.bytes, l.key_offsets.offset % 16), (k.block_n * KEY_OFFSET_COLS * 2, 0), "{}", k.name);
                regions.push((l.key_offsets.offset, l.key_offsets.bytes));
            }
            for ring in [l.q, l.k, l.v, l.tile_handoff] {
                assert_eq!(ring.barriers % MBARRIER_BYTES, 0, "{}", k.name);
                regions.push((ring.barriers, ring.barrier_bytes()));
            }
            regions.push((l.tile_handoff.data, TILE_HANDOFF_STAGES * TILE_HANDOFF_SLOT_BYTES));
            assert_eq!(l.tile_handoff.data % 16, 0, "{}: handoff slots", k.name);
            regions.sort();
            for w in regions.windows(2) {
                assert!(w[0].0 + w[0].1 <= w[1].0, "{}: regions {:?} and {:?} overlap", k.name, w[0], w[1]);
            }
            let (last, bytes) = regions[regions.len() - 1];
            assert!(last + bytes + SMEM_ALIGN <= l.total, "{}: the alignment slack is missing", k.name);
            assert_eq!(l.k.stages, KV_STAGES);
        }
    }

    #[test]
    fn register_split_fits_the_register_file() {
        for k in KERNELS.iter().filter(|k| k.algo == Algo::Fa3(Techniques::FULL)) {
            let c = kernel_config(k).unwrap();
            let (producer, consumer) = c.register_split();
            let threads = c.threads();
            assert!(128 * (producer + c.consumer_wgs * consumer) <= 65536, "{}", k.name);
            assert_eq!((producer % 8, consumer % 8), (0, 0));
            // setmaxnreg moves registers within what the CTA got at launch (the
            // `.maxntid` cap, rounded down to 8): the consumers' increase must fit in
            // what the producer gives back, or `setmaxnreg.inc` would wait forever.
            let at_launch = (65536 / threads) / 8 * 8;
            assert!(producer <= at_launch && at_launch <= consumer, "{}", k.name);
            assert!((at_launch - producer) * 128 >= (consumer - at_launch) * 128 * c.consumer_wgs, "{}", k.name);
        }
    }

    #[test]
    fn tma_boxes_and_tiles_fit_hardware_limits() {
        for k in KERNELS {
            let c = kernel_config(k).unwrap();
            // A TMA box dimension is at most 256 elements; WGMMA N is a multiple of 8 up to 256.
            assert!(c.block_m() <= 256 && c.block_n <= 256 && c.block_n % 16 == 0, "{}", k.name);
            // The named barriers are laid out for at most this many consumer warpgroups.
            assert!(c.consumer_wgs <= MAX_CONSUMER_WGS, "{}", k.name);
            assert_eq!(k.launch_bounds, c.threads(), "{}", k.name);
        }
    }

    /// The planner's kernel for every head dim and key count is in the table.
    #[test]
    fn the_table_has_the_planned_kernel_of_every_head_dim_and_key_count() {
        for hdim in crate::HEAD_DIMS {
            for seqlen_k in [1, 64, 4096, 4097, 16384] {
                for score_mod in [crate::ScoreModKind::None, crate::ScoreModKind::Softcap, crate::ScoreModKind::Alibi, crate::ScoreModKind::SoftcapAlibi] {
                    for dtype in [crate::DType::F16, crate::DType::BF16] {
                        for mask in [crate::MaskKind::Causal, crate::MaskKind::Local, crate::MaskKind::Document] {
                            if mask == crate::MaskKind::Document && matches!(score_mod, crate::ScoreModKind::Alibi | crate::ScoreModKind::SoftcapAlibi) && hdim == 256 {
                                continue;
                            }
                            let (wgs, keys) = (consumer_wgs_of(hdim, score_mod, mask), key_block_of(hdim, seqlen_k, score_mod, mask));
                            assert!(
                                crate::find_kernel(Algo::Fa3(Techniques::FULL), hdim, dtype, 1, seqlen_k, score_mod, mask)
                                    .is_some_and(|k| k.consumer_wgs == wgs && k.block_n == keys),
                                "hdim {hdim} seqlen_k {seqlen_k} {score_mod:?} {mask:?} {dtype:?}"
                            );
                        }
                    }
                }
            }
        }
        let mut names: std::vec::Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), KERNELS.len(), "a kernel name twice");
    }

    /// Brute force: a block before the count has every key visible to every row from
    /// `row0` on (the masked loop may skip it), and the block at the count, when it
    /// exists below `seqlen_k`'s blocks, hides some key from some row (the count is tight).
    #[test]
    fn whole_key_blocks_are_exactly_the_blocks_no_row_needs_masked() {
        for causal in [false, true] {
            for (sq, sk) in [(1, 1), (5, 9), (9, 5), (17, 17), (40, 23), (23, 40), (130, 300), (300, 130)] {
                let off = causal.then_some(sk - sq);
                let sees = |r: i32, c: i32| c < sk && off.is_none_or(|o| c <= r + o);
                for row0 in [-70, -8, -1, 0, 1, 7, 8, 63, 64, 100, 129] {
                    for block_n in [1u32, 8, 16, 64, 80, 128] {
                        let w = whole_key_blocks(sk, off, row0, block_n);
                        let whole = |b: u32| {
                            let keys = (b * block_n) as i32..((b + 1) * block_n) as i32;
                            keys.clone().all(|c| (row0..row0 + 64).all(|r| sees(r, c)))
                        };
                        let ctx = format!("causal {causal} sq {sq} sk {sk} row0 {row0} block_n {block_n}");
                        assert!((0..w).all(whole), "{ctx}: counts a block that needs a mask -> {w}");
                        assert!(!whole(w), "{ctx}: not tight -> {w}");
                    }
                }
            }
        }
    }
}
